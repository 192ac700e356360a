#pragma once
// evict::S3Fifo: S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction", SOSP'23).
// Three FIFO queues: a small one S (10% of the budget) that takes newcomers, a main one M, and a
// ghost G of the keys S dropped lately (as many as M holds entries). Each entry counts its hits,
// 0..3. Evicting from S (when S holds its share, or M is empty): the oldest entry of S moves to M if
// it was read at least twice while in S, else it is dropped and its key goes to G. Evicting from M:
// the oldest entry is dropped if its count is 0, else the count drops by one and it goes back to
// M's head (a 2-bit CLOCK). A newcomer whose key is in G goes straight to M. Most keys are read once
// (one-hit wonders); S lets them go after a short stay without disturbing M, so it is scan resistant
// and on skewed reads close to W-TinyLFU at FIFO's cost (a hit writes one byte and moves nothing).
// For shuffled epochs prefer NoEvict.
// O(1) per operation, amortised for eviction (each reinsertion uses up a hit) and for the ghost
// (a FIFO of key hashes with a hash table of the live ones, compacted when half of it is stale).
//
// Like the paper, it makes room before it admits: the entry being put joins its queue after the
// evictions it caused, so it is never the victim while anything else is held.
#include <nitro/cache/cache.hpp>
#include <nitro/cache/detail/slot_list.hpp>
#include <nitro/core/error.hpp>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nitro::evict {

/// S3-FIFO: a small and a main FIFO queue and a ghost queue; scan resistant at FIFO's cost (the
/// banner above says how it works and when to use it).
struct S3Fifo {
  /// The policy family this belongs to.
  using family = family::Eviction;
  /// Name shown in reports and cache messages.
  static constexpr std::string_view name = "s3fifo";
  /// The policy's knobs.
  struct Options {
    /// The share of the byte budget for the small queue S, in (0, 1); the paper's 10%.
    double small_ratio = 0.10;
  };

  // Queue fronts are the paper's tails (oldest).
  /// The books for a cache of Key: the two queues, a hit count per slot and the ghost of key hashes.
  /// The members are what the cache calls (nitro::EvictorFor), then a few to inspect.
  template <class Key>
  class Evictor {
    // G holds 64-bit hashes, not keys: eight bytes a key whatever the key, and for integer keys
    // KeyHash is a bijection, so G never confuses two keys.
    using Hash = cache::KeyHash<Key>;

   public:
    /// Made by the cache from the policy's options and its byte budget in bytes (S's share is
    /// small_ratio of it). Throws nitro::Error when small_ratio is not in (0, 1).
    Evictor(const Options& o, std::size_t capacity_bytes)
        : small_share_(o.small_ratio * static_cast<double>(capacity_bytes)) {
      NITRO_CHECK(o.small_ratio > 0.0 && o.small_ratio < 1.0, "evict::S3Fifo: small_ratio is ", o.small_ratio,
                  "; give the small queue's share of the budget in (0, 1), e.g. 0.10");
    }

    /// Takes in slot `s` of `weight` bytes: bound for M if its key is in the ghost (it leaves the ghost),
    /// else for S; it joins its queue after the evictions its put causes.
    void on_insert(const Key& key, cache::Slot s, std::size_t weight) {
      admit_pending();
      links_.ensure(s);
      if (s >= books_.size()) books_.resize(std::max<std::size_t>(s + 1, 2 * books_.size()));
      Books& b = books_[s];
      b = Books{.hash = Hash{}(key), .weight = weight};
      // A key S let go lately and read again was dropped too early: it goes to M (and leaves G). Looked
      // up now, before the evictions this put causes can push it out of G (libCacheSim looks on the miss).
      if (const auto it = ghost_.find(b.hash); it != ghost_.end()) {
        ghost_.erase(it);
        b.in_main = true;
      }
      pending_ = s;
    }
    /// A hit: raises slot `s`'s count, up to 3.
    void on_access(const Key&, cache::Slot s) noexcept {
      admit_pending();
      Books& b = books_[s];
      if (b.freq < max_freq) ++b.freq;
    }
    /// Forgets slot `s` (an erase, or a put replacing it).
    void on_erase(cache::Slot s) noexcept {
      if (s == pending_) {
        pending_ = cache::no_slot;
        return;
      }
      admit_pending();
      if (books_[s].in_main) {
        main_.remove(links_, s);
      } else {
        small_.remove(links_, s);
        small_bytes_ -= books_[s].weight;
      }
    }
    /// Evicts from S (promoting to M the entries read twice, sending the others' keys to the ghost) or from
    /// M (giving each counted entry another round), and returns the slot dropped, forgotten. The newcomer
    /// only when nothing else is held; nothing when empty.
    std::optional<cache::Slot> victim() {
      if (!small_.empty() && (static_cast<double>(small_bytes_) >= small_share_ || main_.empty())) {
        // Once S is picked, it gives up one entry or empties (libCacheSim's S3FIFO_evict_small).
        while (!small_.empty()) {
          const cache::Slot t = small_.pop_front(links_);
          Books& b = books_[t];
          small_bytes_ -= b.weight;
          // Promoted when read at least twice in S: the paper's "t.freq > 1", and the reference
          // implementation's default move-to-main-threshold=2 (`freq >= move_to_main_threshold`,
          // libCacheSim/cache/eviction/S3FIFO.c). The count starts again in M.
          if (b.freq >= move_to_main_threshold) {
            b.freq = 0;
            b.in_main = true;
            main_.push_back(links_, t);
            continue;
          }
          remember(b.hash);
          return t;
        }
      }
      while (!main_.empty()) {
        const cache::Slot t = main_.front();
        Books& b = books_[t];
        if (b.freq == 0) {
          main_.remove(links_, t);
          return t;
        }
        --b.freq;
        main_.move_to_back(links_, t);
      }
      if (pending_ == cache::no_slot) return std::nullopt;
      return std::exchange(pending_, cache::no_slot);
    }
    /// Forgets every slot and the ghost.
    void clear() {
      links_.clear();
      small_.clear();
      main_.clear();
      books_.clear();
      ghost_fifo_.clear();
      ghost_.clear();
      small_bytes_ = 0;
      ghost_seq_ = 0;
      pending_ = cache::no_slot;
    }
    /// The bytes these books hold: slot tables, the ghost's FIFO and hash table (estimated).
    [[nodiscard]] std::size_t memory_bytes() const noexcept {
      // The hash table's nodes and buckets, roughly: a node holds the pair and a next pointer.
      return links_.memory_bytes() + books_.capacity() * sizeof(Books) + ghost_fifo_.size() * sizeof(GhostEntry) +
             ghost_.size() * (sizeof(GhostEntry) + sizeof(void*)) + ghost_.bucket_count() * sizeof(void*);
    }

    /// Whether `key` is in the ghost (for tests and diagnostics).
    [[nodiscard]] bool in_ghost(const Key& key) const { return ghost_.contains(Hash{}(key)); }
    /// The entries in the small queue (the one being put counts in the queue it will join).
    [[nodiscard]] std::size_t small_size() const noexcept { return small_.size() + (pending_in(false) ? 1 : 0); }
    /// The entries in the main queue (the one being put counts in the queue it will join).
    [[nodiscard]] std::size_t main_size() const noexcept { return main_.size() + (pending_in(true) ? 1 : 0); }

   private:
    static constexpr std::uint8_t max_freq = 3;
    static constexpr std::uint8_t move_to_main_threshold = 2;

    struct Books {
      std::uint64_t hash = 0;
      std::size_t weight = 0;
      std::uint8_t freq = 0;
      bool in_main = false;
    };
    struct GhostEntry {
      std::uint64_t hash;
      std::uint64_t seq;  // when it was recorded; a FIFO entry whose seq the table does not hold is stale
    };

    [[nodiscard]] bool pending_in(bool main) const noexcept {
      return pending_ != cache::no_slot && books_[pending_].in_main == main;
    }
    void admit_pending() {
      if (pending_ == cache::no_slot) return;
      const cache::Slot s = std::exchange(pending_, cache::no_slot);
      const Books& b = books_[s];
      if (b.in_main) {
        main_.push_back(links_, s);
      } else {
        small_.push_back(links_, s);
        small_bytes_ += b.weight;
      }
    }

    // Records a key dropped from S, then keeps the newest main_.size() keys.
    void remember(std::uint64_t hash) {
      const std::uint64_t seq = ghost_seq_++;
      ghost_fifo_.push_back({hash, seq});
      ghost_[hash] = seq;  // a key already there moves to the newest end; its old FIFO entry goes stale
      const std::size_t limit = main_.size();
      while (ghost_.size() > limit) pop_ghost();
      while (!ghost_fifo_.empty() && stale(ghost_fifo_.front())) ghost_fifo_.pop_front();
      // Stale entries in the middle (keys re-admitted or re-recorded) are swept out in one pass once
      // they are half the FIFO: amortised O(1) per record.
      if (ghost_fifo_.size() > 2 * ghost_.size() + 16) {
        std::erase_if(ghost_fifo_, [this](const GhostEntry& e) { return stale(e); });
      }
    }
    void pop_ghost() {
      const GhostEntry e = ghost_fifo_.front();
      ghost_fifo_.pop_front();
      if (!stale(e)) ghost_.erase(e.hash);
    }
    [[nodiscard]] bool stale(const GhostEntry& e) const {
      const auto it = ghost_.find(e.hash);
      return it == ghost_.end() || it->second != e.seq;
    }

    double small_share_;
    cache::detail::SlotLinks links_;
    cache::detail::SlotQueue small_, main_;
    std::vector<Books> books_;  // per slot
    std::size_t small_bytes_ = 0;
    std::deque<GhostEntry> ghost_fifo_;                   // oldest first
    std::unordered_map<std::uint64_t, std::uint64_t> ghost_;  // live key hash -> its seq in the FIFO
    std::uint64_t ghost_seq_ = 0;
    cache::Slot pending_ = cache::no_slot;  // the entry being put, not yet queued
  };
};
static_assert(EvictionPolicy<S3Fifo>);

}  // namespace nitro::evict

namespace nitro {
/// A single-threaded S3-FIFO cache of tensors by sample index.
using S3FifoCache_st = Cache_st<evict::S3Fifo>;
/// A thread-safe S3-FIFO cache of tensors by sample index.
using S3FifoCache_mt = Cache_mt<evict::S3Fifo>;
}  // namespace nitro
