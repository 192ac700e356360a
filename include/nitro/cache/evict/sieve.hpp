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

struct Sieve {
  using family = family::Eviction;
  static constexpr std::string_view name = "sieve";
  struct Options {};

  // The queue's front is the paper's tail (oldest), its back the head (newest); the hand moves with
  // SlotLinks::next, toward the back.
  template <class Key>
  class Evictor {
   public:
    Evictor(const Options&, std::size_t) {}

    void on_insert(const Key&, cache::Slot s, std::size_t) {
      admit_pending();
      links_.ensure(s);
      if (s >= visited_.size()) visited_.resize(std::max<std::size_t>(s + 1, 2 * visited_.size()), 0);
      visited_[s] = 0;
      pending_ = s;
    }
    void on_access(const Key&, cache::Slot s) noexcept {
      admit_pending();
      visited_[s] = 1;
    }
    void on_erase(cache::Slot s) noexcept {
      if (s == pending_) {
        pending_ = cache::no_slot;
        return;
      }
      admit_pending();
      if (s == hand_) hand_ = links_.next(s);
      queue_.remove(links_, s);
    }
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
    void clear() {
      links_.clear();
      queue_.clear();
      visited_.clear();
      hand_ = pending_ = cache::no_slot;
    }
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
using SieveCache_st = Cache_st<evict::Sieve>;
using SieveCache_mt = Cache_mt<evict::Sieve>;
}  // namespace nitro
