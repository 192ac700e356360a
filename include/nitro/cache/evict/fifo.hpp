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

/// Evicts the oldest insert; hits change nothing (the banner above says when to use it).
struct Fifo {
  /// The policy family this belongs to.
  using family = family::Eviction;
  /// Name shown in reports and cache messages.
  static constexpr std::string_view name = "fifo";
  /// No knobs.
  struct Options {};

  /// The books for a cache of Key: a queue of the slots in insertion order.
  template <class Key>
  class Evictor : public cache::detail::QueueEvictor<Key, false> {
   public:
    /// Made by the cache from the policy's options and its byte budget (not used).
    Evictor(const Options&, std::size_t) {}
  };
};
static_assert(EvictionPolicy<Fifo>);

}  // namespace nitro::evict

namespace nitro {
/// A single-threaded FIFO cache of tensors by sample index.
using FifoCache_st = Cache_st<evict::Fifo>;
/// A thread-safe FIFO cache of tensors by sample index.
using FifoCache_mt = Cache_mt<evict::Fifo>;
}  // namespace nitro
