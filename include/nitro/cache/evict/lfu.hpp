#pragma once
// evict::Lfu: evicts the least frequently used entry, the least recently used among those read
// equally often. Counts are kept only while an entry is held (an evicted entry starts again at 1), so
// it suits a stable popularity (a lookup table, a fixed hot set), and it ages badly: entries that were
// hot once stay until enough newcomers out-count them. For shuffled epochs prefer NoEvict; for skewed
// reads that drift, WTinyLfu or S3Fifo.
// O(1) per operation with the frequency buckets of Shah, Mitra & Matani ("An O(1) algorithm for
// implementing the LFU cache eviction scheme", 2010): a list of the frequencies held, in increasing
// order, each with the queue of its entries (oldest arrival first, which is least recent use).
//
// Like the classic algorithm, it makes room before it admits: the entry being put is not a candidate
// while anything else is held, otherwise a cache whose entries were all read twice would refuse every
// newcomer (a newcomer's count, 1, is the lowest there is).
#include <nitro/cache/cache.hpp>
#include <nitro/cache/detail/slot_list.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace nitro::evict {

/// Evicts the least frequently used entry, the least recently used among equals (the banner above
/// says when to use it).
struct Lfu {
  /// The policy family this belongs to.
  using family = family::Eviction;
  /// Name shown in reports and cache messages.
  static constexpr std::string_view name = "lfu";
  /// No knobs.
  struct Options {};

  /// The books for a cache of Key: frequency buckets, each a queue of its slots. The members are what
  /// the cache calls (nitro::EvictorFor).
  template <class Key>
  class Evictor {
   public:
    /// Made by the cache from the policy's options and its byte budget (not used).
    Evictor(const Options&, std::size_t) {}

    // The newcomer waits outside the buckets until the cache has made room (see the banner).
    /// Takes in slot `s` with a count of 1 once the cache has made room for it.
    void on_insert(const Key&, cache::Slot s, std::size_t) {
      admit_pending();
      links_.ensure(s);
      if (s >= bucket_of_.size()) bucket_of_.resize(std::max<std::size_t>(s + 1, 2 * bucket_of_.size()), no_bucket);
      pending_ = s;
    }
    /// A hit: moves slot `s` up to the next frequency, at the back of its queue.
    void on_access(const Key&, cache::Slot s) {
      admit_pending();
      const Index b = bucket_of_[s];
      const std::uint64_t f = buckets_[b].freq + 1;
      Index up = buckets_[b].next;
      if (up == no_bucket || buckets_[up].freq != f) up = make_bucket(f, b);
      buckets_[b].queue.remove(links_, s);
      buckets_[up].queue.push_back(links_, s);
      bucket_of_[s] = up;
      drop_if_empty(b);
    }
    /// Forgets slot `s` (an erase, or a put replacing it).
    void on_erase(cache::Slot s) {
      if (s == pending_) {
        pending_ = cache::no_slot;
        return;
      }
      admit_pending();
      const Index b = bucket_of_[s];
      buckets_[b].queue.remove(links_, s);
      drop_if_empty(b);
    }
    /// The least frequently used slot, oldest first among equals (forgotten); the newcomer only when
    /// nothing else is held; nothing when empty.
    std::optional<cache::Slot> victim() {
      if (head_ == no_bucket) {
        if (pending_ == cache::no_slot) return std::nullopt;
        return std::exchange(pending_, cache::no_slot);
      }
      const Index b = head_;
      const cache::Slot s = buckets_[b].queue.pop_front(links_);
      drop_if_empty(b);
      return s;
    }
    /// Forgets every slot.
    void clear() {
      links_.clear();
      bucket_of_.clear();
      buckets_.clear();
      free_.clear();
      head_ = no_bucket;
      pending_ = cache::no_slot;
    }
    /// The bytes these books hold in their tables.
    [[nodiscard]] std::size_t memory_bytes() const noexcept {
      return links_.memory_bytes() + bucket_of_.capacity() * sizeof(Index) + buckets_.capacity() * sizeof(Bucket) +
             free_.capacity() * sizeof(Index);
    }

   private:
    using Index = std::uint32_t;
    static constexpr Index no_bucket = static_cast<Index>(-1);
    struct Bucket {
      std::uint64_t freq = 0;
      Index prev = no_bucket, next = no_bucket;
      cache::detail::SlotQueue queue;
    };

    // A new bucket of frequency `freq` right after `after` (at the head when no_bucket).
    Index make_bucket(std::uint64_t freq, Index after) {
      Index b;
      if (!free_.empty()) {
        b = free_.back();
        free_.pop_back();
        buckets_[b] = Bucket{};
      } else {
        b = static_cast<Index>(buckets_.size());
        buckets_.emplace_back();
      }
      Bucket& n = buckets_[b];
      n.freq = freq;
      n.prev = after;
      n.next = after == no_bucket ? head_ : buckets_[after].next;
      if (n.next != no_bucket) buckets_[n.next].prev = b;
      if (after == no_bucket) head_ = b;
      else buckets_[after].next = b;
      return b;
    }
    void drop_if_empty(Index b) {
      Bucket& n = buckets_[b];
      if (!n.queue.empty()) return;
      if (n.prev != no_bucket) buckets_[n.prev].next = n.next;
      else head_ = n.next;
      if (n.next != no_bucket) buckets_[n.next].prev = n.prev;
      free_.push_back(b);
    }
    void admit_pending() {
      if (pending_ == cache::no_slot) return;
      const cache::Slot s = std::exchange(pending_, cache::no_slot);
      Index b = head_;
      if (b == no_bucket || buckets_[b].freq != 1) b = make_bucket(1, no_bucket);
      buckets_[b].queue.push_back(links_, s);
      bucket_of_[s] = b;
    }

    cache::detail::SlotLinks links_;
    std::vector<Index> bucket_of_;  // per slot
    std::vector<Bucket> buckets_;   // a pool; the list through prev/next is in increasing freq
    std::vector<Index> free_;       // unused buckets of the pool
    Index head_ = no_bucket;        // the lowest frequency held
    cache::Slot pending_ = cache::no_slot;
  };
};
static_assert(EvictionPolicy<Lfu>);

}  // namespace nitro::evict

namespace nitro {
/// A single-threaded LFU cache of tensors by sample index.
using LfuCache_st = Cache_st<evict::Lfu>;
/// A thread-safe LFU cache of tensors by sample index.
using LfuCache_mt = Cache_mt<evict::Lfu>;
}  // namespace nitro
