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

/// Evicts the least recently used entry (the banner above says when to use it).
struct Lru {
  /// The policy family this belongs to.
  using family = family::Eviction;
  /// Name shown in reports and cache messages.
  static constexpr std::string_view name = "lru";
  /// No knobs.
  struct Options {};

  /// The books for a cache of Key: a list of the slots, least recently used first.
  template <class Key>
  class Evictor : public cache::detail::QueueEvictor<Key, true> {
   public:
    /// Made by the cache from the policy's options and its byte budget (not used).
    Evictor(const Options&, std::size_t) {}
  };
};
static_assert(EvictionPolicy<Lru>);

}  // namespace nitro::evict

namespace nitro {
/// A single-threaded LRU cache of tensors by sample index.
using LruCache_st = Cache_st<evict::Lru>;
/// A thread-safe LRU cache of tensors by sample index.
using LruCache_mt = Cache_mt<evict::Lru>;
}  // namespace nitro
