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
  class Evictor : public cache::detail::QueueEvictor<Key, true> {
   public:
    Evictor(const Options&, std::size_t) {}
  };
};
static_assert(EvictionPolicy<Lru>);

}  // namespace nitro::evict

namespace nitro {
using LruCache_st = Cache_st<evict::Lru>;
using LruCache_mt = Cache_mt<evict::Lru>;
}  // namespace nitro
