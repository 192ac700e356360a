#pragma once
// evict::Clairvoyant: Belady's rule (MIN/OPT), given the order of the gets to come: it evicts the
// entry whose next read is furthest away (never again counts as furthest), and that may be the entry
// being put, which is then refused (OPT with bypass, as in Caffeine's simulator's ClairvoyantPolicy).
// With unit weights and gets that follow the order, no policy hits more; it is the bound the others
// are measured against. For training, a seeded sampler knows its coming epochs' orders: give their
// concatenation, or append() each epoch's before it starts. On shuffled epochs of N samples with room
// for C it hits (E-1)*C/(E*N) over E epochs, exactly what NoEvict hits (no read repeats within an
// epoch, so no policy does better), and NoEvict needs no order and costs less: Clairvoyant is for
// judging the others, and for reads known ahead that repeat unevenly.
// With weights it is Belady's rule on entries, not the (NP-hard) byte-optimal choice.
//
// Every get advances a position in the order, hit (on_access) or miss (on_miss). A get whose key is
// not the one the order has there counts as a mismatch() and still advances, so a real order that
// drifts from the given one degrades the choices, never the correctness. A put right after the get
// of its key takes the next use from a precomputed table; any other put (a put without a get, a
// drifted order) looks its key's next use up in the key's list of positions, at or after the current
// position: correct for any order of calls. Gets past the end of the order are mismatches and do not
// advance, so what append() adds is the order of the gets from there on. With no order at all
// (empty accesses) every entry is "never again" and the largest key goes first: arbitrary, but
// deterministic. Among entries never read again the largest key goes first too; for unit weights
// any choice among them hits the same.
// O(log n) per operation (a std::set of the resident entries by next use); the order costs 16 bytes
// a get (the key, its next position, and its entry in its key's list). It needs every get in order,
// so it cannot be sharded (ShardedCache refuses it); clear() forgets the entries, not the order.
#include <nitro/cache/cache.hpp>
#include <nitro/core/error.hpp>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nitro::evict {

/// Belady's rule given the order of the gets to come: evicts the entry read again furthest in the
/// future, or refuses the newcomer (the banner above says how it follows the order and when to use it).
struct Clairvoyant {
  /// The policy family this belongs to.
  using family = family::Eviction;
  /// Name shown in reports and cache messages.
  static constexpr std::string_view name = "clairvoyant";
  /// Every get must reach the one evictor, in order: ShardedCache refuses this policy.
  static constexpr bool needs_global_order = true;
  /// The policy's knobs.
  struct Options {
    /// The keys of the coming gets, in order (e.g. the concatenated orders of the coming epochs).
    std::vector<std::int64_t> accesses;
  };

  /// The books for a cache of Key (convertible to std::int64_t): the order, the position in it, and the
  /// entries held by next use. The members are what the cache calls (nitro::EvictorFor, plus on_miss),
  /// then append() and a few to inspect.
  template <class Key>
  class Evictor {
    static_assert(std::is_convertible_v<const Key&, std::int64_t>,
                  "evict::Clairvoyant: the cache's Key must convert to std::int64_t, the type of the future "
                  "order's keys (Options::accesses); use integer keys such as sample indices");

   public:
    /// Made by the cache from the policy's options (the order) and its byte budget (not used). Throws
    /// nitro::Error when the order holds 2^32 - 1 gets or more.
    Evictor(const Options& o, std::size_t) { append(o.accesses); }

    /// Takes in slot `s` of `key`, with the position of the key's next get.
    void on_insert(const Key& key, cache::Slot s, std::size_t) {
      const std::int64_t k = static_cast<std::int64_t>(key);
      // The common case, put after a missed get of the same key, needs no search.
      const Position next = has_last_ && last_key_ == k ? last_next_ : next_use(k, pos_);
      has_last_ = false;
      if (s >= books_.size()) books_.resize(std::max<std::size_t>(s + 1, 2 * books_.size()));
      books_[s] = {next, k};
      resident_.emplace(next, k, s);
    }
    /// A hit of `key`: advances the order one get and moves slot `s` to its key's next get.
    void on_access(const Key& key, cache::Slot s) {
      const Position next = consume(static_cast<std::int64_t>(key));
      Books& b = books_[s];
      resident_.erase({b.next, b.key, s});
      b.next = next;
      resident_.emplace(next, b.key, s);
    }
    /// A miss of `key`: advances the order one get.
    void on_miss(const Key& key) { consume(static_cast<std::int64_t>(key)); }
    /// Forgets slot `s` (an erase, or a put replacing it).
    void on_erase(cache::Slot s) { resident_.erase({books_[s].next, books_[s].key, s}); }
    /// The slot whose next get is furthest (never read again counts as furthest; the larger key first among
    /// equals), forgotten; it may be the newcomer. Nothing when empty.
    std::optional<cache::Slot> victim() {
      if (resident_.empty()) return std::nullopt;
      const auto last = std::prev(resident_.end());
      const cache::Slot s = std::get<2>(*last);
      resident_.erase(last);
      return s;
    }
    /// Forgets the entries; the order and the position in it stay (the gets go on).
    void clear() {
      resident_.clear();
      books_.clear();
      has_last_ = false;
    }
    /// The bytes these books hold: the order, the per-key position lists and the entries held (estimated).
    [[nodiscard]] std::size_t memory_bytes() const noexcept {
      // A set node is the tuple and three pointers and a colour; a hash node the pair, a vector and a next pointer.
      constexpr std::size_t set_node = sizeof(std::tuple<Position, std::int64_t, cache::Slot>) + 4 * sizeof(void*);
      constexpr std::size_t map_node = sizeof(std::int64_t) + sizeof(std::vector<Position>) + 2 * sizeof(void*);
      // Every position is in one key's list once (their spare capacity is not counted: O(1), not O(keys)).
      const std::size_t lists = accesses_.size() * sizeof(Position);
      return resident_.size() * set_node + books_.capacity() * sizeof(Books) +
             accesses_.capacity() * sizeof(std::int64_t) + next_.capacity() * sizeof(Position) + lists +
             positions_.size() * map_node + positions_.bucket_count() * sizeof(void*);
    }

    /// Extends the order with the gets that follow it (e.g. the next epoch's order). O(keys given) plus
    /// O(log n) for each entry held that was never to be read again and now is.
    void append(std::span<const std::int64_t> keys) {
      NITRO_CHECK(keys.size() < never - accesses_.size(), "evict::Clairvoyant: the order would hold more than ",
                  never - 1, " gets; give fewer epochs at a time (append() adds the next ones)");
      accesses_.reserve(accesses_.size() + keys.size());
      next_.reserve(next_.size() + keys.size());
      for (const std::int64_t k : keys) {
        const auto i = static_cast<Position>(accesses_.size());
        accesses_.push_back(k);
        next_.push_back(never);
        auto& positions = positions_[k];
        if (!positions.empty()) next_[positions.back()] = i;
        positions.push_back(i);
      }
      // Entries (and the last get) that had no next use may have one now.
      if (has_last_ && last_next_ == never) last_next_ = next_use(last_key_, pos_);
      std::vector<std::tuple<Position, std::int64_t, cache::Slot>> renewed;
      for (auto it = resident_.rbegin(); it != resident_.rend() && std::get<0>(*it) == never; ++it) {
        const auto& [next, k, s] = *it;
        if (const Position n = next_use(k, pos_); n != never) renewed.emplace_back(n, k, s);
      }
      for (const auto& [n, k, s] : renewed) {
        resident_.erase({never, k, s});
        resident_.emplace(n, k, s);
        books_[s].next = n;
      }
    }

    /// Gets so far whose key was not the one the order had there (or that came past its end).
    [[nodiscard]] std::uint64_t mismatches() const noexcept { return mismatches_; }
    /// The gets of the order consumed so far.
    [[nodiscard]] std::size_t position() const noexcept { return pos_; }
    /// The length of the order given so far.
    [[nodiscard]] std::size_t order_size() const noexcept { return accesses_.size(); }

   private:
    using Position = std::uint32_t;
    static constexpr Position never = std::numeric_limits<Position>::max();
    struct Books {
      Position next = never;
      std::int64_t key = 0;
    };

    // Advances past one get of `k`; returns the position of k's next get.
    Position consume(std::int64_t k) {
      Position next;
      if (pos_ < accesses_.size() && accesses_[pos_] == k) {
        next = next_[pos_];
        ++pos_;
      } else {
        ++mismatches_;
        if (pos_ < accesses_.size()) ++pos_;
        next = next_use(k, pos_);
      }
      has_last_ = true;
      last_key_ = k;
      last_next_ = next;
      return next;
    }
    // The first get of `k` at or after position `from`.
    [[nodiscard]] Position next_use(std::int64_t k, std::size_t from) const {
      const auto it = positions_.find(k);
      if (it == positions_.end()) return never;
      const auto& p = it->second;
      const auto at = std::lower_bound(p.begin(), p.end(), from);
      return at == p.end() ? never : *at;
    }

    std::vector<std::int64_t> accesses_;  // the order
    std::vector<Position> next_;          // per position: the next position of the same key, or never
    std::unordered_map<std::int64_t, std::vector<Position>> positions_;  // per key, increasing
    std::size_t pos_ = 0;                                               // the next get's position
    std::uint64_t mismatches_ = 0;
    bool has_last_ = false;  // the last get, for the put that usually follows it
    std::int64_t last_key_ = 0;
    Position last_next_ = never;
    std::set<std::tuple<Position, std::int64_t, cache::Slot>> resident_;  // by next use; the victim is last
    std::vector<Books> books_;                                            // per slot
  };
};
static_assert(EvictionPolicy<Clairvoyant>);

}  // namespace nitro::evict

namespace nitro {
/// A single-threaded Belady cache of tensors by sample index (give it the order of the gets).
using ClairvoyantCache_st = Cache_st<evict::Clairvoyant>;
/// A thread-safe Belady cache of tensors by sample index (give it the order of the gets).
using ClairvoyantCache_mt = Cache_mt<evict::Clairvoyant>;
}  // namespace nitro
