#pragma once
// Intrusive doubly linked queues over cache slots, for the eviction policies: one `SlotLinks` holds
// prev/next per slot, shared by every `SlotQueue` of a policy (a slot is in at most one queue at a
// time), so moving an entry between queues allocates nothing. Internal to cache/evict/.
#include <nitro/cache/detail/flat_index.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <vector>

namespace nitro::cache::detail {

class SlotLinks {
 public:
  /// Makes room for `slot` (the cache hands out dense slots, so this grows rarely).
  void ensure(Slot slot) {
    if (slot >= prev_.size()) {
      const std::size_t n = std::max<std::size_t>(slot + 1, 2 * prev_.size());
      prev_.resize(n, no_slot);
      next_.resize(n, no_slot);
    }
  }
  [[nodiscard]] Slot prev(Slot s) const noexcept { return prev_[s]; }
  [[nodiscard]] Slot next(Slot s) const noexcept { return next_[s]; }
  [[nodiscard]] std::size_t memory_bytes() const noexcept { return (prev_.capacity() + next_.capacity()) * sizeof(Slot); }
  void clear() {
    prev_.clear();
    next_.clear();
  }

 private:
  friend class SlotQueue;
  std::vector<Slot> prev_, next_;
};

/// A queue of slots, front = oldest. Tracks its length and the total weight its owner adds.
class SlotQueue {
 public:
  [[nodiscard]] Slot front() const noexcept { return head_; }
  [[nodiscard]] Slot back() const noexcept { return tail_; }
  [[nodiscard]] bool empty() const noexcept { return head_ == no_slot; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  void push_back(SlotLinks& l, Slot s) noexcept {
    l.prev_[s] = tail_;
    l.next_[s] = no_slot;
    if (tail_ != no_slot) l.next_[tail_] = s;
    else head_ = s;
    tail_ = s;
    ++size_;
  }
  void remove(SlotLinks& l, Slot s) noexcept {
    const Slot p = l.prev_[s], n = l.next_[s];
    if (p != no_slot) l.next_[p] = n;
    else head_ = n;
    if (n != no_slot) l.prev_[n] = p;
    else tail_ = p;
    --size_;
  }
  /// Moves `s` (a member) to the back.
  void move_to_back(SlotLinks& l, Slot s) noexcept {
    if (s == tail_) return;
    remove(l, s);
    push_back(l, s);
  }
  Slot pop_front(SlotLinks& l) noexcept {
    const Slot s = head_;
    remove(l, s);
    return s;
  }
  void clear() noexcept {
    head_ = tail_ = no_slot;
    size_ = 0;
  }

 private:
  Slot head_ = no_slot, tail_ = no_slot;
  std::size_t size_ = 0;
};

}  // namespace nitro::cache::detail

namespace nitro::cache::detail {

/// The books of the one-queue policies: entries in insertion order, oldest out first; with
/// `ReorderOnHit` a hit moves its entry to the back (LRU), without it a hit changes nothing (FIFO).
template <class Key, bool ReorderOnHit>
class QueueEvictor {
 public:
  void on_insert(const Key&, Slot s, std::size_t) {
    links_.ensure(s);
    queue_.push_back(links_, s);
  }
  void on_access(const Key&, Slot s) noexcept {
    if constexpr (ReorderOnHit) queue_.move_to_back(links_, s);
  }
  void on_erase(Slot s) noexcept { queue_.remove(links_, s); }
  std::optional<Slot> victim() noexcept {
    if (queue_.empty()) return std::nullopt;
    return queue_.pop_front(links_);
  }
  void clear() {
    links_.clear();
    queue_.clear();
  }
  [[nodiscard]] std::size_t memory_bytes() const noexcept { return links_.memory_bytes(); }

 private:
  SlotLinks links_;
  SlotQueue queue_;
};

}  // namespace nitro::cache::detail
