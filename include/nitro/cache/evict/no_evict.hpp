#pragma once
// evict::NoEvict: admits until the budget is full, then refuses newcomers and never evicts. For a
// training data set read in a fresh random order each epoch this is optimal: after the first epoch a
// cache of C of the N samples' bytes hits C/N of the reads, the most any policy can (every hit of an
// epoch must have been in the cache when the epoch began), while LRU hits far fewer. It is the
// policy of CoorDL's MinIO cache (Mohan et al., VLDB'21), and the cheapest: a hit touches nothing.
// O(1) per operation; the books are one slot.
#include <nitro/cache/cache.hpp>

#include <optional>
#include <string_view>
#include <utility>

namespace nitro::evict {

struct NoEvict {
  using family = family::Eviction;
  static constexpr std::string_view name = "no_evict";
  struct Options {};

  template <class Key>
  class Evictor {
   public:
    Evictor(const Options&, std::size_t) {}
    void on_insert(const Key&, cache::Slot s, std::size_t) noexcept { newest_ = s; }
    void on_access(const Key&, cache::Slot) noexcept {}
    void on_erase(cache::Slot s) noexcept {
      if (s == newest_) newest_ = cache::no_slot;
    }
    // Only the newcomer that does not fit is ever given up.
    std::optional<cache::Slot> victim() noexcept {
      if (newest_ == cache::no_slot) return std::nullopt;
      return std::exchange(newest_, cache::no_slot);
    }
    void clear() noexcept { newest_ = cache::no_slot; }
    [[nodiscard]] std::size_t memory_bytes() const noexcept { return 0; }

   private:
    cache::Slot newest_ = cache::no_slot;
  };
};
static_assert(EvictionPolicy<NoEvict>);

}  // namespace nitro::evict

namespace nitro {
using NoEvictCache_st = Cache_st<evict::NoEvict>;
using NoEvictCache_mt = Cache_mt<evict::NoEvict>;
}  // namespace nitro
