#pragma once
// evict::Sieve: SIEVE (Zhang et al., "SIEVE is Simpler than LRU", NSDI'24). A FIFO queue, newcomers
// at the head, a visited bit that a hit sets, and a hand that walks from the tail (oldest) toward the
// head: a visited entry has its bit cleared and stays where it is, the first unvisited one is
// evicted, and the hand rests at its neighbour toward the head for the next eviction (back to the
// tail once it passes the head). Hits cost one store and never move an entry (no list update under
// the lock, unlike LRU), one-hit wonders leave quickly, and on skewed web-like reads it matches or
// beats LRU. Less scan resistant than S3Fifo; for shuffled epochs prefer NoEvict.
// O(1) per operation, amortised for eviction (each step of the hand clears a bit a hit has set).
//
// Like the paper, it makes room before it admits: the entry being put joins the head after the
// evictions it caused, so it is never the victim while anything else is held.
#include <nitro/cache/cache.hpp>
#include <nitro/cache/detail/slot_list.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace nitro::evict {

/// SIEVE: a FIFO queue with a visited bit per entry and a moving hand (the banner above says when to
/// use it).
struct Sieve {
  /// The policy family this belongs to.
  using family = family::Eviction;
  /// Name shown in reports and cache messages.
  static constexpr std::string_view name = "sieve";
  /// No knobs.
  struct Options {};

  // The queue's front is the paper's tail (oldest), its back the head (newest); the hand moves with
  // SlotLinks::next, toward the back.
  /// The books for a cache of Key: the queue, a visited bit per slot and the hand. The members are what
  /// the cache calls (nitro::EvictorFor).
  template <class Key>
  class Evictor {
   public:
    /// Made by the cache from the policy's options and its byte budget (not used).
    Evictor(const Options&, std::size_t) {}

    /// Takes in slot `s`, unvisited; it joins the queue after the evictions its put causes.
    void on_insert(const Key&, cache::Slot s, std::size_t) {
      admit_pending();
      links_.ensure(s);
      if (s >= visited_.size()) visited_.resize(std::max<std::size_t>(s + 1, 2 * visited_.size()), 0);
      visited_[s] = 0;
      pending_ = s;
    }
    /// A hit: marks slot `s` visited.
    void on_access(const Key&, cache::Slot s) noexcept {
      admit_pending();
      visited_[s] = 1;
    }
    /// Forgets slot `s` (an erase, or a put replacing it), moving the hand past it.
    void on_erase(cache::Slot s) noexcept {
      if (s == pending_) {
        pending_ = cache::no_slot;
        return;
      }
      admit_pending();
      if (s == hand_) hand_ = links_.next(s);
      queue_.remove(links_, s);
    }
    /// Moves the hand from the oldest end, clearing visited bits, to the first unvisited slot, and
    /// returns it (forgotten). The newcomer only when nothing else is held; nothing when empty.
    std::optional<cache::Slot> victim() noexcept {
      if (queue_.empty()) {
        if (pending_ == cache::no_slot) return std::nullopt;
        return std::exchange(pending_, cache::no_slot);
      }
      cache::Slot s = hand_ != cache::no_slot ? hand_ : queue_.front();
      while (visited_[s]) {
        visited_[s] = 0;
        s = links_.next(s);
        if (s == cache::no_slot) s = queue_.front();
      }
      hand_ = links_.next(s);
      queue_.remove(links_, s);
      return s;
    }
    /// Forgets every slot.
    void clear() {
      links_.clear();
      queue_.clear();
      visited_.clear();
      hand_ = pending_ = cache::no_slot;
    }
    /// The bytes these books hold in their tables.
    [[nodiscard]] std::size_t memory_bytes() const noexcept { return links_.memory_bytes() + visited_.capacity(); }

   private:
    void admit_pending() noexcept {
      if (pending_ == cache::no_slot) return;
      queue_.push_back(links_, std::exchange(pending_, cache::no_slot));
    }

    cache::detail::SlotLinks links_;
    cache::detail::SlotQueue queue_;
    std::vector<std::uint8_t> visited_;     // per slot
    cache::Slot hand_ = cache::no_slot;     // no_slot: start at the tail
    cache::Slot pending_ = cache::no_slot;  // the entry being put, not yet queued
  };
};
static_assert(EvictionPolicy<Sieve>);

}  // namespace nitro::evict

namespace nitro {
/// A single-threaded SIEVE cache of tensors by sample index.
using SieveCache_st = Cache_st<evict::Sieve>;
/// A thread-safe SIEVE cache of tensors by sample index.
using SieveCache_mt = Cache_mt<evict::Sieve>;
}  // namespace nitro
