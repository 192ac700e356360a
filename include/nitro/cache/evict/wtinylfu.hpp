#pragma once
// evict::WTinyLfu: Caffeine's policy (Einziger, Friedman & Manes, "TinyLFU: A Highly Efficient Cache
// Admission Policy", ACM TOS 2017). A small LRU window (1% of the budget) takes every newcomer; what
// leaves the window competes for the main area (segmented LRU: probation, and protected at 80% of
// main) against main's LRU victim, and the one a count-min sketch has seen more often stays. The
// sketch has four 4-bit counters per key and halves them all every 10 x entries increments (aging),
// so it follows a changing popularity (it has room for twice the entries held, and halves every
// 10 x its size increments). Near-optimal for skewed reads (Zipf, search, databases) and
// resistant to scans; for shuffled training epochs prefer NoEvict, which is optimal there.
// O(1) per operation; the sketch is 16 bytes per expected entry.
#include <nitro/core/config.hpp>
#include <nitro/cache/cache.hpp>
#include <nitro/cache/detail/slot_list.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace nitro::evict {

namespace detail {

/// Caffeine's FrequencySketch: a count-min sketch of 4-bit counters, sixteen to a 64-bit word, a key's
/// four counters in one cache line, with periodic halving.
class FrequencySketch {
 public:
  /// Sized for `entries` keys (rounded up to a power of two). Growing forgets every count but those
  /// of `keep` (hashes), whose estimates carry over.
  template <class Hashes = std::vector<std::uint64_t>>
  void ensure_capacity(std::size_t entries, std::uint32_t sample_factor, const Hashes& keep = {}) {
    const std::size_t n = std::bit_ceil(std::max<std::size_t>(entries, 8));
    if (n <= capacity()) return;
    std::vector<unsigned> kept;
    kept.reserve(keep.size());
    for (const std::uint64_t h : keep) kept.push_back(table_.empty() ? 0u : frequency(h));
    table_.assign(n + 7, 0);  // room to start the blocks on a 64-byte boundary
    const auto address = reinterpret_cast<std::uintptr_t>(table_.data());
    base_ = ((64 - address % 64) % 64) / sizeof(std::uint64_t);
    block_mask_ = (n >> 3) - 1;
    sample_size_ = sample_factor * n;
    additions_ = 0;
    auto f = kept.begin();
    for (const std::uint64_t h : keep) {
      for (unsigned i = *f++; i > 0; --i) increment(h);
    }
  }
  [[nodiscard]] std::size_t capacity() const noexcept { return table_.empty() ? 0 : table_.size() - 7; }

  /// The estimated number of times `hash` was seen (0..15).
  [[nodiscard]] NITRO_INLINE unsigned frequency(std::uint64_t hash) const noexcept;

  NITRO_INLINE void increment(std::uint64_t hash) noexcept;

  NITRO_INLINE void clear() noexcept;
  [[nodiscard]] std::size_t memory_bytes() const noexcept { return table_.capacity() * sizeof(std::uint64_t); }

 private:
  // Caffeine 3's layout: a key's four counters lie in one 64-byte block of eight words (one cache
  // line), two words per counter row, so a lookup touches one line instead of four.
  struct Where {
    std::size_t block;
    std::uint32_t counters;
  };
  [[nodiscard]] NITRO_INLINE Where where(std::uint64_t h) const noexcept;
  NITRO_INLINE bool increment_at(std::size_t i, unsigned j) noexcept;
  // Halves every counter; the odd counts lost to the shift are taken off the addition count.
  NITRO_INLINE void reset() noexcept;

  std::vector<std::uint64_t> table_;
  std::size_t block_mask_ = 0;
  std::size_t base_ = 0;
  std::size_t sample_size_ = 0;
  std::size_t additions_ = 0;
};

}  // namespace detail

/// W-TinyLFU (Caffeine's): an LRU window, a segmented LRU main area and a frequency sketch that decides
/// admission; for skewed, repeated reads (the banner above says how it works and when to use it).
struct WTinyLfu {
  /// The policy family this belongs to.
  using family = family::Eviction;
  /// Name shown in reports and cache messages.
  static constexpr std::string_view name = "wtinylfu";
  /// The policy's knobs.
  struct Options {
    /// Share of the byte budget for the LRU window that takes newcomers, in (0, 1).
    double window_share = 0.01;
    /// Share of the main area that is protected (entries hit while on probation), in (0, 1).
    double protected_share = 0.80;
    /// Entries the cache is expected to hold (the budget over a typical entry's bytes); the sketch has
    /// room for twice as many keys, which on the published traces matches Caffeine's figures. 0 grows it
    /// with the entries held (on growth only the counts of the entries held carry over).
    std::size_t expected_entries = 0;
    /// The sketch halves its counters every sample_factor x (its size) increments, >= 1.
    std::uint32_t sample_factor = 10;
  };

  /// The books for a cache of Key: the window, probation and protected queues and the frequency sketch.
  /// The members are what the cache calls (nitro::EvictorFor), then a few to inspect.
  template <class Key>
  class Evictor {
    enum Queue : std::uint8_t { window, probation, protect };

   public:
    /// Made by the cache from the policy's options and its byte budget in bytes. Throws nitro::Error when
    /// window_share or protected_share is not in (0, 1), or sample_factor is 0.
    Evictor(const Options& o, std::size_t capacity) : sample_factor_(o.sample_factor), expected_(o.expected_entries) {
      NITRO_CHECK(o.window_share > 0 && o.window_share < 1, "evict::WTinyLfu: window_share is ", o.window_share,
                  "; give a share of the budget in (0, 1), e.g. 0.01");
      NITRO_CHECK(o.protected_share > 0 && o.protected_share < 1, "evict::WTinyLfu: protected_share is ",
                  o.protected_share, "; give a share of the main area in (0, 1), e.g. 0.8");
      NITRO_CHECK(o.sample_factor >= 1, "evict::WTinyLfu: sample_factor is 0; give >= 1 (Caffeine uses 10)");
      // Caffeine's split: main is floor(99% of the budget), the window the rest.
      const auto main = static_cast<std::size_t>(static_cast<double>(capacity) * (1.0 - o.window_share));
      window_max_ = capacity - main;
      protected_max_ = static_cast<std::size_t>(static_cast<double>(main) * o.protected_share);
      sketch_.ensure_capacity(2 * expected_, sample_factor_);
    }

    /// Takes in slot `s` of `w` bytes at the window's back and counts its key in the sketch; what overflows
    /// the window moves to probation and becomes the candidate for admission.
    void on_insert(const Key& key, cache::Slot s, std::size_t w) {
      if (s >= weight_.size()) {
        links_.ensure(s);
        weight_.resize(std::max<std::size_t>(s + 1, 2 * weight_.size()));
        queue_.resize(weight_.size());
        hash_.resize(weight_.size());
      }
      // Entries held before this one: the newcomer may be refused, and must not grow the sketch.
      if (expected_ == 0 && 2 * entries_ > sketch_.capacity()) grow_sketch();
      ++entries_;
      const std::uint64_t h = cache::KeyHash<Key>{}(key);
      sketch_.increment(h);
      weight_[s] = w;
      hash_[s] = h;
      queue_[s] = window;
      window_q_.push_back(links_, s);
      bytes_[window] += w;
      // What overflows the window moves to probation; those moved now are this insert's candidates.
      candidate_ = cache::no_slot;
      candidate_from_window_ = false;
      while (bytes_[window] > window_max_ && !window_q_.empty()) {
        const cache::Slot c = window_q_.pop_front(links_);
        bytes_[window] -= weight_[c];
        probation_q_.push_back(links_, c);
        bytes_[probation] += weight_[c];
        queue_[c] = probation;
        if (candidate_ == cache::no_slot) candidate_ = c;
      }
    }

    /// A hit: counts the key; in the window or protected area it moves to the back, on probation it is
    /// promoted to protected (demoting protected's oldest to probation while over its share).
    void on_access(const Key&, cache::Slot s) {
      sketch_.increment(hash_[s]);
      switch (queue_[s]) {
        case window: window_q_.move_to_back(links_, s); break;
        case probation:
          probation_q_.remove(links_, s);
          bytes_[probation] -= weight_[s];
          protected_q_.push_back(links_, s);
          bytes_[protect] += weight_[s];
          queue_[s] = protect;
          while (bytes_[protect] > protected_max_ && protected_q_.front() != s) {
            const cache::Slot d = protected_q_.pop_front(links_);
            bytes_[protect] -= weight_[d];
            probation_q_.push_back(links_, d);
            bytes_[probation] += weight_[d];
            queue_[d] = probation;
          }
          break;
        case protect: protected_q_.move_to_back(links_, s); break;
      }
    }

    /// Forgets slot `s` (an erase, or a put replacing it).
    void on_erase(cache::Slot s) { drop(s); }

    /// Caffeine's evictFromMain, one eviction per call: the candidate (oldest of those that just
    /// left the window, then the window's oldest) against main's LRU victim; the less frequent goes.
    std::optional<cache::Slot> victim() {
      if (candidate_ == cache::no_slot && !candidate_from_window_) {
        candidate_ = window_q_.front();
        candidate_from_window_ = true;
      }
      cache::Slot v = probation_q_.front();
      if (v == cache::no_slot) v = protected_q_.front();
      if (v == cache::no_slot && candidate_ == cache::no_slot) v = window_q_.front();
      if (v == cache::no_slot && candidate_ == cache::no_slot) return std::nullopt;

      cache::Slot evict;
      if (v == cache::no_slot || candidate_ == v) {
        evict = candidate_;
        candidate_ = next_candidate(candidate_);
      } else if (candidate_ == cache::no_slot) {
        evict = v;
      } else {
        const bool admit = sketch_.frequency(hash_[candidate_]) > sketch_.frequency(hash_[v]);
        evict = admit ? v : candidate_;
        candidate_ = next_candidate(candidate_);
      }
      drop(evict);
      return evict;
    }

    /// Forgets every slot and every count.
    void clear() {
      links_.clear();
      window_q_.clear();
      probation_q_.clear();
      protected_q_.clear();
      weight_.clear();
      queue_.clear();
      hash_.clear();
      bytes_[0] = bytes_[1] = bytes_[2] = 0;
      entries_ = 0;
      candidate_ = cache::no_slot;
      sketch_.clear();
    }
    /// The bytes these books hold: slot tables and the sketch.
    [[nodiscard]] std::size_t memory_bytes() const noexcept {
      return links_.memory_bytes() + weight_.capacity() * sizeof(std::size_t) + queue_.capacity() +
             hash_.capacity() * sizeof(std::uint64_t) + sketch_.memory_bytes();
    }
    /// Bytes in the window (for tests and tuning, as the two below).
    [[nodiscard]] std::size_t window_bytes() const noexcept { return bytes_[window]; }
    /// Bytes in the probation area.
    [[nodiscard]] std::size_t probation_bytes() const noexcept { return bytes_[probation]; }
    /// Bytes in the protected area.
    [[nodiscard]] std::size_t protected_bytes() const noexcept { return bytes_[protect]; }
    /// The sketch's estimate of how often `key` was seen, 0 to 15.
    [[nodiscard]] unsigned frequency(const Key& key) const noexcept { return sketch_.frequency(cache::KeyHash<Key>{}(key)); }

   private:
    // The sketch follows the number of entries when none was given; the counts of what is held carry over.
    void grow_sketch() {
      std::vector<std::uint64_t> held;
      held.reserve(entries_);
      for (const auto* q : {&window_q_, &probation_q_, &protected_q_})
        for (cache::Slot s = q->front(); s != cache::no_slot; s = links_.next(s)) held.push_back(hash_[s]);
      sketch_.ensure_capacity(2 * entries_, sample_factor_, held);
    }
    cache::Slot next_candidate(cache::Slot c) const noexcept {
      return c == cache::no_slot ? c : links_.next(c);
    }
    cache::detail::SlotQueue& queue_of(cache::Slot s) noexcept {
      return queue_[s] == window ? window_q_ : queue_[s] == probation ? probation_q_ : protected_q_;
    }
    void drop(cache::Slot s) {
      if (s == candidate_) candidate_ = next_candidate(s);
      queue_of(s).remove(links_, s);
      bytes_[queue_[s]] -= weight_[s];
      --entries_;
    }

    std::uint32_t sample_factor_;
    std::size_t expected_;
    std::size_t window_max_ = 0, protected_max_ = 0;
    cache::detail::SlotLinks links_;
    cache::detail::SlotQueue window_q_, probation_q_, protected_q_;
    std::vector<std::size_t> weight_;
    std::vector<Queue> queue_;
    std::vector<std::uint64_t> hash_;
    std::size_t bytes_[3] = {0, 0, 0};
    std::size_t entries_ = 0;
    cache::Slot candidate_ = cache::no_slot;
    bool candidate_from_window_ = false;
    detail::FrequencySketch sketch_;
  };
};
static_assert(EvictionPolicy<WTinyLfu>);

}  // namespace nitro::evict

namespace nitro {
/// A single-threaded W-TinyLFU cache of tensors by sample index.
using WTinyLfuCache_st = Cache_st<evict::WTinyLfu>;
/// A thread-safe W-TinyLFU cache of tensors by sample index.
using WTinyLfuCache_mt = Cache_mt<evict::WTinyLfu>;
}  // namespace nitro

#if !NITRO_COMPILED
#include <nitro/cache/evict/wtinylfu-inl.hpp>
#endif
