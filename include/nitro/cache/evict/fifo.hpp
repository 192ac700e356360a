#pragma once
// evict::Fifo: evicts the oldest insert; hits change nothing. The cheapest books (a hit touches no
// policy state, so concurrent readers write nothing shared but the stats), and often close to LRU.
// O(1) per operation.
#include <nitro/cache/cache.hpp>
#include <nitro/cache/detail/slot_list.hpp>

#include <optional>
#include <string_view>
#include <utility>

namespace nitro::evict {

struct Fifo {
  using family = family::Eviction;
  static constexpr std::string_view name = "fifo";
  struct Options {};

  template <class Key>
  class Evictor {
   public:
    Evictor(const Options&, std::size_t) {}
    void on_insert(const Key&, cache::Slot s, std::size_t) {
      links_.ensure(s);
      queue_.push_back(links_, s);
    }
    void on_access(const Key&, cache::Slot) noexcept {}
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
static_assert(EvictionPolicy<Fifo>);

}  // namespace nitro::evict

namespace nitro {
using FifoCache_st = Cache_st<evict::Fifo>;
using FifoCache_mt = Cache_mt<evict::Fifo>;
}  // namespace nitro
