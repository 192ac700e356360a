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

/// Admits until the budget is full, then refuses every newcomer and never evicts (the banner above
/// says why that is optimal for shuffled epochs).
struct NoEvict {
  /// The policy family this belongs to.
  using family = family::Eviction;
  /// Name shown in reports and cache messages.
  static constexpr std::string_view name = "no_evict";
  /// No knobs.
  struct Options {};

  /// The books for a cache of Key: only the slot last inserted. The members are what the cache calls
  /// (nitro::EvictorFor).
  template <class Key>
  class Evictor {
   public:
    /// Made by the cache from the policy's options and its byte budget (not used).
    Evictor(const Options&, std::size_t) {}
    /// Remembers slot `s`, the newcomer, as the only possible victim.
    void on_insert(const Key&, cache::Slot s, std::size_t) noexcept { newest_ = s; }
    /// A hit changes nothing.
    void on_access(const Key&, cache::Slot) noexcept {}
    /// Forgets slot `s` if it is the newcomer.
    void on_erase(cache::Slot s) noexcept {
      if (s == newest_) newest_ = cache::no_slot;
    }
    /// Only the newcomer that does not fit is ever given up.
    /// Returns the newcomer's slot once (the put is refused); nothing when there is none.
    std::optional<cache::Slot> victim() noexcept {
      if (newest_ == cache::no_slot) return std::nullopt;
      return std::exchange(newest_, cache::no_slot);
    }
    /// Forgets the newcomer.
    void clear() noexcept { newest_ = cache::no_slot; }
    /// The bytes of these books beyond the object itself: 0.
    [[nodiscard]] std::size_t memory_bytes() const noexcept { return 0; }

   private:
    cache::Slot newest_ = cache::no_slot;
  };
};
static_assert(EvictionPolicy<NoEvict>);

}  // namespace nitro::evict

namespace nitro {
/// A single-threaded cache of tensors by sample index that never evicts.
using NoEvictCache_st = Cache_st<evict::NoEvict>;
/// A thread-safe cache of tensors by sample index that never evicts.
using NoEvictCache_mt = Cache_mt<evict::NoEvict>;
}  // namespace nitro
