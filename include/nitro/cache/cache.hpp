#pragma once
// nitro::Cache<EvictionPolicy>: a cache of tensors (or any value) under a byte budget, the eviction
// policy picked as a type. Policies live in cache/evict/ (each header's banner says when to use it):
//
//   evict::Lru         recency; the usual default, and the wrong one for shuffled epochs
//   evict::Lfu         in-cache frequency, O(1)
//   evict::Fifo        insertion order; cheapest books
//   evict::Sieve       FIFO with a visited bit and a moving hand (NSDI'24): LRU's hits, FIFO's cost
//   evict::S3Fifo      small + main FIFO queues and a ghost queue (SOSP'23): scan resistant
//   evict::WTinyLfu    Caffeine's: LRU window, segmented main, frequency sketch admission
//   evict::NoEvict     admit until full, never evict: optimal for shuffled epochs (CoorDL's MinIO)
//   evict::Clairvoyant Belady's rule, given the future access order (a seeded shuffle gives it)
//
// Which one for a training data set: every sample is read once per epoch in a fresh random order,
// so no online policy can beat keeping a fixed C of the N samples (C/N hits after the first epoch);
// NoEvict does exactly that and costs least. Clairvoyant reaches Belady's bound when the order is
// known. For skewed, repeated reads (a serving cache, a lookup table), WTinyLfu.
//
//   nitro::Cache_mt<nitro::evict::NoEvict> samples{{.capacity_bytes = 8ull << 30}};
//   if (auto x = samples.get(i)) use(*x); else samples.put(i, decode(i));
//
// Thread safety follows spdlog: Cache_st (no lock), Cache_mt (one mutex), ShardedCache_mt (a mutex
// per shard, for concurrent readers). Values come back by value (a tensor shares storage, it is not
// copied): a concurrent put never invalidates what get returned. Writing into a returned tensor in
// place writes into the cached one; clone first if you augment in place.
#include <nitro/core/config.hpp>
#include <nitro/cache/detail/flat_index.hpp>
#include <nitro/core/concepts.hpp>
#include <nitro/core/device.hpp>
#include <nitro/core/error.hpp>

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace nitro {

// ---- weighers and locks --------------------------------------------------------------------------

/// The default weigher: the bytes of storage a value keeps alive, summed over its tensors (a tensor,
/// a tuple, torch::data::Example, or a user type with `nitro_map_tensors`). A view counts its whole
/// storage, because that is what caching it keeps in memory.
struct TensorBytes {
  /// The bytes of storage `t` keeps alive; 0 for an undefined tensor or one without storage.
  std::int64_t operator()(const at::Tensor& t) const {
    return t.defined() && t.has_storage() ? static_cast<std::int64_t>(t.storage().nbytes()) : 0;
  }
  /// The bytes summed over every tensor in a composite or user batch (see nitro::Batch).
  template <Batch V>
    requires(!std::same_as<V, at::Tensor>)
  std::int64_t operator()(const V& value) const {
    std::int64_t bytes = 0;
    for_each_tensor(value, [&](const at::Tensor& t) { bytes += (*this)(t); });
    return bytes;
  }
};

/// A lock that does nothing, for single-threaded caches (spdlog's null_mutex).
struct NullMutex {
  /// Does nothing.
  void lock() noexcept {}
  /// Does nothing.
  void unlock() noexcept {}
  /// Does nothing and succeeds: always true.
  bool try_lock() noexcept { return true; }
};

/// Why the eviction callback was called.
enum class RemovalCause {
  evicted,   ///< dropped to stay within the byte budget
  rejected,  ///< refused admission: larger than the budget, or the policy kept the others
};

/// What a cache has done since it was made (or since reset_stats()).
struct CacheStats {
  std::uint64_t hits = 0;        ///< gets that found their key
  std::uint64_t misses = 0;      ///< gets that did not
  std::uint64_t admissions = 0;  ///< puts that stayed
  std::uint64_t rejections = 0;  ///< puts refused (too large, or the policy preferred what it had)
  std::uint64_t evictions = 0;   ///< entries dropped for room
  std::size_t bytes = 0;         ///< weight now held
  std::size_t entries = 0;       ///< entries now held
  /// hits / (hits + misses), from 0 to 1; 0 before any get.
  [[nodiscard]] NITRO_INLINE double hit_ratio() const noexcept;
  /// Adds another cache's (or shard's) counts to these, field by field.
  NITRO_INLINE CacheStats& operator+=(const CacheStats& o) noexcept;
};

namespace detail {
template <class E, class Key>
concept HasOnMiss = requires(E& e, const Key& k) { e.on_miss(k); };
template <class P>
concept NeedsGlobalOrder = requires { requires static_cast<bool>(P::needs_global_order); };
}  // namespace detail

// ---- Cache ---------------------------------------------------------------------------------------

/// A byte-budgeted cache.
/// @tparam Policy  an eviction policy (cache/evict/), required
/// @tparam Key     the key; optional, default std::int64_t (a sample index). Hashable and equality comparable.
/// @tparam Value   the value; optional, default at::Tensor. Default constructible and movable.
/// @tparam Weigher `(const Value&) -> integer bytes`; optional, default TensorBytes. A negative weight throws.
/// @tparam Lock    a BasicLockable; optional, default std::mutex (NullMutex for one thread: Cache_st).
/// @tparam Hash    `(const Key&) -> std::uint64_t`, well mixed in its low bits; optional, default cache::KeyHash.
template <EvictionPolicy Policy, class Key = std::int64_t, class Value = at::Tensor, class Weigher = TensorBytes,
          class Lock = std::mutex, class Hash = cache::KeyHash<Key>>
class Cache {
  static_assert(std::default_initializable<Value> && std::movable<Value>,
                "nitro::Cache: Value must be default constructible and movable (wrap it in std::optional otherwise)");
  static_assert(std::equality_comparable<Key> && std::copyable<Key> && std::default_initializable<Key>,
                "nitro::Cache: Key must be copyable, default constructible and equality comparable");
  static_assert(std::is_invocable_v<const Weigher&, const Value&> &&
                    std::is_integral_v<std::invoke_result_t<const Weigher&, const Value&>>,
                "nitro::Cache: Weigher must be callable as weigher(const Value&) and return an integer byte count");

 public:
  /// The eviction policy type (cache/evict/).
  using policy_type = Policy;
  /// The key type.
  using key_type = Key;
  /// The value type.
  using value_type = Value;
  /// The policy's bookkeeping for this Key, reachable through evictor().
  using evictor_type = typename Policy::template Evictor<Key>;
  /// Called outside the cache's lock, once per entry evicted or refused; it may use the cache.
  using Callback = std::function<void(const Key&, const Value&, RemovalCause)>;
  /// What one put removed, in order: each entry evicted for room, or the put value itself when refused.
  using Removed = std::vector<std::tuple<Key, Value, RemovalCause>>;

  /// What a cache is made from.
  struct Options {
    /// The byte budget, > 0: the sum of the weights held never exceeds it.
    std::size_t capacity_bytes = 0;
    /// The policy's own knobs.
    typename Policy::Options policy{};
  };

  /// A cache of `options.capacity_bytes` with a default-constructed Weigher. Throws nitro::Error when
  /// capacity_bytes is 0.
  /// @code
  /// nitro::Cache_mt<nitro::evict::Lru> cache{{.capacity_bytes = 1ull << 30}};
  /// @endcode
  explicit Cache(Options options) : Cache(std::move(options), Weigher{}) {}
  /// A cache with a weigher of its own (for a Weigher that is not default constructible, or carries state).
  /// Throws nitro::Error when capacity_bytes is 0.
  Cache(Options options, Weigher weigher)
      : capacity_(checked_capacity(options.capacity_bytes)),
        weigher_(std::move(weigher)),
        evictor_(options.policy, capacity_) {
    ::nitro::detail::check_library_version();
  }

  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  /// Stores `value` under `key` (replacing what was there) and evicts what the policy picks until the
  /// budget holds. Returns whether the value stayed: a value larger than the budget is refused (not an
  /// error), and a policy may refuse a newcomer in favour of what it holds.
  bool put(const Key& key, Value value) {
    Removed removed;
    const bool admitted = put_collecting(key, std::move(value), removed, /*always=*/false);
    notify(removed);
    return admitted;
  }

  /// put(), but what it removes is appended to `removed` for the caller instead of going to the
  /// on_evict callback (which is not called). For a layer that must act on removals itself, in its
  /// own order and under its own locks: TieredCache spills them to disk.
  ///   Cache_mt<evict::Lru>::Removed removed;
  ///   cache.put(i, x, removed);  // then handle each (key, value, cause) in removed
  bool put(const Key& key, Value value, Removed& removed) {
    return put_collecting(key, std::move(value), removed, /*always=*/true);
  }

  /// The value under `key`, or nothing; a hit counts as an access for the policy.
  [[nodiscard]] std::optional<Value> get(const Key& key) {
    std::lock_guard guard(lock_);
    const cache::Slot s = index_.find(key);
    if (s == cache::no_slot) [[unlikely]] {
      ++stats_.misses;
      if constexpr (detail::HasOnMiss<evictor_type, Key>) evictor_.on_miss(key);
      return std::nullopt;
    }
    ++stats_.hits;
    evictor_.on_access(key, s);
    return entries_[s].value;
  }

  /// Whether `key` is held; not an access (the policy is not told, the stats do not change).
  [[nodiscard]] bool contains(const Key& key) const {
    std::lock_guard guard(lock_);
    return index_.find(key) != cache::no_slot;
  }

  /// Removes `key`; false when it was not held. No callback (the caller knows).
  bool erase(const Key& key) {
    [[maybe_unused]] Value dropped;  // released outside the lock
    std::lock_guard guard(lock_);
    const cache::Slot s = index_.find(key);
    if (s == cache::no_slot) return false;
    evictor_.on_erase(s);
    dropped = std::move(entries_[s].value);
    remove(s);
    return true;
  }

  /// Removes everything (no callbacks); the statistics stay.
  void clear() {
    std::vector<Entry> dropped;  // released outside the lock
    std::lock_guard guard(lock_);
    dropped.swap(entries_);
    free_.clear();
    index_.clear();
    evictor_.clear();
    bytes_ = 0;
  }

  /// Called for each entry evicted or refused, outside the lock (set it before sharing the cache).
  void on_evict(Callback callback) {
    std::lock_guard guard(lock_);
    callback_ = std::move(callback);
  }

  /// The number of entries held.
  [[nodiscard]] std::size_t size() const {
    std::lock_guard guard(lock_);
    return index_.size();
  }
  /// The weight held, in bytes (at most capacity()).
  [[nodiscard]] std::size_t bytes() const {
    std::lock_guard guard(lock_);
    return bytes_;
  }
  /// The byte budget given at construction.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// The counters since construction or reset_stats(), with the bytes and entries held now.
  [[nodiscard]] CacheStats stats() const {
    std::lock_guard guard(lock_);
    CacheStats s = stats_;
    s.bytes = bytes_;
    s.entries = index_.size();
    return s;
  }
  /// Sets hits, misses, admissions, rejections and evictions back to 0.
  void reset_stats() {
    std::lock_guard guard(lock_);
    stats_ = {};
  }
  /// The cache's own bookkeeping in bytes (index, entry table, policy), not counting what the values
  /// hold; divided by size(), the overhead per entry.
  [[nodiscard]] std::size_t overhead_bytes() const {
    std::lock_guard guard(lock_);
    return index_.memory_bytes() + entries_.capacity() * sizeof(Entry) + free_.capacity() * sizeof(cache::Slot) +
           evictor_.memory_bytes();
  }
  /// The policy's books, e.g. to give Clairvoyant the next epoch's order. Not synchronised.
  [[nodiscard]] evictor_type& evictor() noexcept { return evictor_; }
  /// The eviction policy's name (Policy::name), e.g. "lru".
  [[nodiscard]] static constexpr std::string_view policy_name() noexcept { return Policy::name; }

 private:
  struct Entry {
    Key key{};
    Value value{};
    std::size_t weight = 0;
  };

  static std::size_t checked_capacity(std::size_t capacity) {
    NITRO_CHECK(capacity > 0, "nitro::Cache<", Policy::name,
                ">: capacity_bytes is 0; give the byte budget, e.g. {.capacity_bytes = 1ull << 30} for 1 GiB");
    return capacity;
  }

  // Keeps what it removes in `removed` when `always`, or when there is a callback to hand it to.
  bool put_collecting(const Key& key, Value&& value, Removed& removed, bool always) {
    const std::size_t weight = weigh(value);
    std::lock_guard guard(lock_);
    const bool keep = always || static_cast<bool>(callback_);
    const std::uint64_t h = index_.hash_function()(key);
    if (const cache::Slot old = index_.find_hashed(key, h); old != cache::no_slot) {
      evictor_.on_erase(old);
      remove(old);
    }
    if (weight > capacity_) {
      ++stats_.rejections;
      if (keep) removed.emplace_back(key, std::move(value), RemovalCause::rejected);
      return false;
    }
    return insert(key, std::move(value), weight, removed, keep);
  }

  std::size_t weigh(const Value& value) const {
    const auto w = weigher_(value);
    if constexpr (std::is_signed_v<decltype(w)>) {
      NITRO_CHECK(w >= 0, "nitro::Cache<", Policy::name, ">: the weigher returned ", w,
                  " bytes for a value; a weight must be >= 0 (fix the weigher)");
    }
    return static_cast<std::size_t>(w);
  }

  bool insert(const Key& key, Value&& value, std::size_t weight, Removed& removed, bool keep) {
    cache::Slot slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      NITRO_CHECK(entries_.size() < cache::no_slot - 1, "nitro::Cache: more than 2^32 - 2 entries");
      slot = static_cast<cache::Slot>(entries_.size());
      entries_.emplace_back();
    }
    Entry& e = entries_[slot];
    e.key = key;
    e.value = std::move(value);
    e.weight = weight;
    index_.insert(key, slot);
    bytes_ += weight;
    evictor_.on_insert(key, slot, weight);

    bool admitted = true;
    while (bytes_ > capacity_) {
      const std::optional<cache::Slot> v = evictor_.victim();
      NITRO_ENSURES(v.has_value() && *v < entries_.size());
      const bool self = *v == slot;
      admitted = admitted && !self;
      ++(self ? stats_.rejections : stats_.evictions);
      if (keep)
        removed.emplace_back(entries_[*v].key, std::move(entries_[*v].value),
                             self ? RemovalCause::rejected : RemovalCause::evicted);
      remove(*v);
    }
    if (admitted) ++stats_.admissions;
    return admitted;
  }

  /// Drops a slot the evictor has already forgotten.
  void remove(cache::Slot s) {
    Entry& e = entries_[s];
    index_.erase(e.key);
    bytes_ -= e.weight;
    e.value = Value{};
    e.weight = 0;
    free_.push_back(s);
  }

  void notify(Removed& removed) {
    for (auto& [key, value, cause] : removed) callback_(key, value, cause);  // not empty only with a callback
  }

  const std::size_t capacity_;
  [[no_unique_address]] Weigher weigher_;
  mutable Lock lock_;
  cache::detail::FlatIndex<Key, Hash> index_;
  std::vector<Entry> entries_;
  std::vector<cache::Slot> free_;
  evictor_type evictor_;
  std::size_t bytes_ = 0;
  CacheStats stats_;
  Callback callback_;
};

// ---- ShardedCache ----------------------------------------------------------------------------------

/// A cache split into independent shards by key hash, each with its own lock and an equal share of
/// the budget, so concurrent readers rarely wait on each other. A value larger than one shard's share
/// is refused. Policies that need the global access order (Clairvoyant) cannot be sharded. The
/// template parameters are Cache's; any Hash that keeps Cache's contract (well mixed in its low bits)
/// spreads the keys over the shards, as the shard is picked from the hash remixed.
template <EvictionPolicy Policy, class Key = std::int64_t, class Value = at::Tensor, class Weigher = TensorBytes,
          class Lock = std::mutex, class Hash = cache::KeyHash<Key>>
class ShardedCache {
  static_assert(!detail::NeedsGlobalOrder<Policy>,
                "nitro::ShardedCache: this policy needs every access in order (Clairvoyant); use one Cache_mt instead");
  using Shard = Cache<Policy, Key, Value, Weigher, Lock, Hash>;

 public:
  /// The eviction policy type (cache/evict/).
  using policy_type = Policy;
  /// The key type.
  using key_type = Key;
  /// The value type.
  using value_type = Value;
  /// Called outside a shard's lock, once per entry evicted or refused (Cache::Callback).
  using Callback = typename Shard::Callback;

  /// What a sharded cache is made from.
  struct Options {
    /// The byte budget of all shards together, > 0.
    std::size_t capacity_bytes = 0;
    /// Number of shards, a power of two from 1 to 4096; 0 picks 4 x the hardware threads (at least 8,
    /// at most 4096).
    std::size_t shards = 0;
    typename Policy::Options policy{};  ///< the policy's own knobs, given to every shard
  };

  /// A sharded cache with a default-constructed Weigher; see the other constructor.
  explicit ShardedCache(Options options) : ShardedCache(std::move(options), Weigher{}) {}
  /// Splits `options.capacity_bytes` evenly over the shards (each shard gets capacity_bytes / shards; the
  /// remainder is unused). Throws nitro::Error when shards is not 0 or a power of two up to 4096, or
  /// when capacity_bytes is less than one byte per shard.
  ShardedCache(Options options, Weigher weigher) {
    std::size_t n = options.shards;
    if (n == 0)
      n = std::min(max_shards, std::bit_ceil(std::max<std::size_t>(8, 4 * std::thread::hardware_concurrency())));
    NITRO_CHECK(std::has_single_bit(n) && n <= max_shards, "nitro::ShardedCache: shards is ", options.shards,
                "; give a power of two up to ", max_shards, ", or 0 for the default");
    NITRO_CHECK(options.capacity_bytes >= n, "nitro::ShardedCache: capacity_bytes ", options.capacity_bytes,
                " is less than one byte per shard (", n, " shards); give a larger budget or fewer shards");
    mask_ = n - 1;
    shards_.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      shards_.push_back(std::make_unique<Padded>(
          typename Shard::Options{.capacity_bytes = options.capacity_bytes / n, .policy = options.policy}, weigher));
  }

  /// Cache::put on the key's shard: false when the value was refused (larger than a shard's share, or
  /// the policy kept the others).
  bool put(const Key& key, Value value) { return shard(key).put(key, std::move(value)); }
  /// Cache::get on the key's shard: the value, or nothing.
  [[nodiscard]] std::optional<Value> get(const Key& key) { return shard(key).get(key); }
  /// Whether `key` is held; not an access.
  [[nodiscard]] bool contains(const Key& key) const { return shard(key).contains(key); }
  /// Removes `key`; false when it was not held. No callback.
  bool erase(const Key& key) { return shard(key).erase(key); }
  /// Removes everything from every shard (no callbacks); the statistics stay.
  void clear() {
    for (auto& s : shards_) s->cache.clear();
  }
  /// Sets the callback of every shard (set it before sharing the cache).
  void on_evict(Callback callback) {
    for (auto& s : shards_) s->cache.on_evict(callback);
  }
  /// The number of entries held, summed over the shards.
  [[nodiscard]] std::size_t size() const { return sum([](const Shard& s) { return s.size(); }); }
  /// The weight held in bytes, summed over the shards.
  [[nodiscard]] std::size_t bytes() const { return sum([](const Shard& s) { return s.bytes(); }); }
  /// The byte budget summed over the shards (capacity_bytes rounded down to a multiple of the shard count).
  [[nodiscard]] std::size_t capacity() const { return sum([](const Shard& s) { return s.capacity(); }); }
  /// The bookkeeping in bytes of every shard and of the shard table, not counting what the values hold.
  [[nodiscard]] std::size_t overhead_bytes() const {
    return sum([](const Shard& s) { return s.overhead_bytes(); }) + shards_.capacity() * sizeof(void*) +
           shards_.size() * sizeof(Padded);
  }
  /// The counters of all shards added together.
  [[nodiscard]] CacheStats stats() const {
    CacheStats total;
    for (const auto& s : shards_) total += s->cache.stats();
    return total;
  }
  /// Resets every shard's counters (Cache::reset_stats).
  void reset_stats() {
    for (auto& s : shards_) s->cache.reset_stats();
  }
  /// The number of shards.
  [[nodiscard]] std::size_t shard_count() const noexcept { return shards_.size(); }
  /// The eviction policy's name (Policy::name).
  [[nodiscard]] static constexpr std::string_view policy_name() noexcept { return Policy::name; }

 private:
  // One shard per cache line pair, so two threads on two shards do not share a line.
  struct alignas(128) Padded {
    Padded(typename Shard::Options o, const Weigher& w) : cache(std::move(o), w) {}
    Shard cache;
  };
  static constexpr std::size_t max_shards = 4096;
  // The top 12 bits of the hash remixed, masked, pick the shard. Hash is only asked to be well mixed
  // in its low bits (the shard's own index uses them, unchanged), so its high bits may be constant:
  // taken as they were, a hash mixed in its low 32 bits put every key in one shard. The remix
  // (splitmix64's finaliser, not KeyHash's murmur3 one again) spreads every bit over the top ones. A
  // fixed shift rather than `>> (64 - log2 n)`: one shard would shift by 64, which is undefined (x86
  // shifts by 0 and indexes out of range); the mask of one shard is 0.
  static constexpr int shard_shift = 64 - std::countr_zero(max_shards);
  static constexpr std::uint64_t remix(std::uint64_t x) noexcept {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }
  Shard& shard(const Key& key) const {
    return shards_[static_cast<std::size_t>(remix(Hash{}(key)) >> shard_shift) & mask_]->cache;
  }
  template <class F>
  std::size_t sum(F f) const {
    std::size_t n = 0;
    for (const auto& s : shards_) n += f(s->cache);
    return n;
  }

  std::vector<std::unique_ptr<Padded>> shards_;
  std::size_t mask_ = 0;  // shards - 1
};

// ---- aliases (spdlog's _st / _mt) ------------------------------------------------------------------

/// One thread: no lock.
template <EvictionPolicy Policy, class Key = std::int64_t, class Value = at::Tensor, class Weigher = TensorBytes>
using Cache_st = Cache<Policy, Key, Value, Weigher, NullMutex>;
/// Any threads: one mutex.
template <EvictionPolicy Policy, class Key = std::int64_t, class Value = at::Tensor, class Weigher = TensorBytes>
using Cache_mt = Cache<Policy, Key, Value, Weigher, std::mutex>;
/// Many concurrent readers: a mutex per shard.
template <EvictionPolicy Policy, class Key = std::int64_t, class Value = at::Tensor, class Weigher = TensorBytes>
using ShardedCache_mt = ShardedCache<Policy, Key, Value, Weigher, std::mutex>;

/// Byte sizes, to write budgets: `using namespace nitro::literals; {.capacity_bytes = 8_GiB}`.
namespace literals {
/// `n` kibibytes in bytes (n * 1024).
constexpr std::size_t operator""_KiB(unsigned long long n) { return static_cast<std::size_t>(n) << 10; }
/// `n` mebibytes in bytes (n * 2^20).
constexpr std::size_t operator""_MiB(unsigned long long n) { return static_cast<std::size_t>(n) << 20; }
/// `n` gibibytes in bytes (n * 2^30).
constexpr std::size_t operator""_GiB(unsigned long long n) { return static_cast<std::size_t>(n) << 30; }
}  // namespace literals

}  // namespace nitro

#if !NITRO_COMPILED
#include <nitro/cache/cache-inl.hpp>
#endif
