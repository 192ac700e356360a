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
  class Evictor : public cache::detail::QueueEvictor<Key, false> {
   public:
    Evictor(const Options&, std::size_t) {}
  };
};
static_assert(EvictionPolicy<Fifo>);

}  // namespace nitro::evict

namespace nitro {
using FifoCache_st = Cache_st<evict::Fifo>;
using FifoCache_mt = Cache_mt<evict::Fifo>;
}  // namespace nitro
