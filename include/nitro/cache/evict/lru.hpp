#pragma once
// evict::Lru: evicts the least recently used entry. The usual default and a good one when recent
// reads predict the next ones; the worst choice for shuffled epochs (each sample is read once per
// epoch, so the most recent reads are the least likely to come back soon), and scans flush it.
// O(1) per operation: an intrusive list over the cache's slots.
#include <nitro/cache/cache.hpp>
#include <nitro/cache/detail/slot_list.hpp>

#include <optional>
#include <string_view>
#include <utility>

namespace nitro::evict {

struct Lru {
  using family = family::Eviction;
  static constexpr std::string_view name = "lru";
  struct Options {};

  template <class Key>
  class Evictor {
   public:
    Evictor(const Options&, std::size_t) {}
    void on_insert(const Key&, cache::Slot s, std::size_t) {
      links_.ensure(s);
      queue_.push_back(links_, s);
    }
    void on_access(const Key&, cache::Slot s) noexcept { queue_.move_to_back(links_, s); }
    void on_erase(cache::Slot s) noexcept { queue_.remove(links_, s); }
    std::optional<cache::Slot> victim() noexcept {
      if (queue_.empty()) return std::nullopt;
      return queue_.pop_front(links_);
    }
    void clear() {
      links_.clear();
      queue_.clear();
    }
    [[nodiscard]] std::size_t memory_bytes() const noexcept { return links_.memory_bytes(); }

   private:
    cache::detail::SlotLinks links_;
    cache::detail::SlotQueue queue_;
  };
};
static_assert(EvictionPolicy<Lru>);

}  // namespace nitro::evict

namespace nitro {
using LruCache_st = Cache_st<evict::Lru>;
using LruCache_mt = Cache_mt<evict::Lru>;
}  // namespace nitro
