// Throughput of the cache's operations, one thread, for every eviction policy (Cache_st of small
// tensors), against the LRU cache most header-only C++ caches are: a std::list of (key, value) and a
// std::unordered_map from key to list iterator, get returning a std::optional copy and splicing the
// entry to the front, put evicting the back by entry count. Then ShardedCache_mt<Lru> against
// Cache_mt<Lru> (one mutex) with two threads reading at once.
//
//   RESULT lru_get_speedup   baseline get time / nitro Lru get time (all hits), goal >= 1.5
//   RESULT sharded_speedup   Cache_mt time / ShardedCache_mt time, 2 threads of gets, goal >= 1.3
//
// Every subject sees the same keys in the same order; warm-up passes are excluded, the subjects run
// in turn within each repetition (the first one rotating), and the median pass is reported.
#include "cache_policies.hpp"
#include "common.hpp"

#include <ATen/Parallel.h>
#include <ATen/ops/full.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

using Key = std::int64_t;
using nitro::bench::CachePolicies;

/// The usual header-only LRU cache (e.g. lamerman/cpp-lru-cache, lrucache11), bounded by entry count.
template <class K, class V>
class ListLru {
 public:
  explicit ListLru(std::size_t max_entries) : max_(max_entries) {}
  std::optional<V> get(const K& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    items_.splice(items_.begin(), items_, it->second);
    return it->second->second;
  }
  void put(const K& key, V value) {
    if (const auto it = index_.find(key); it != index_.end()) {
      it->second->second = std::move(value);
      items_.splice(items_.begin(), items_, it->second);
      return;
    }
    if (index_.size() >= max_) {
      index_.erase(items_.back().first);
      items_.pop_back();
    }
    items_.emplace_front(key, std::move(value));
    index_.emplace(key, items_.begin());
  }
  [[nodiscard]] std::size_t size() const { return index_.size(); }
  /// An estimate of the bytes per entry: a list node and a hash node (each rounded to glibc's malloc
  /// chunk: + 8 bytes of header, a multiple of 16, at least 32) and the share of the bucket array.
  [[nodiscard]] double overhead_per_entry() const {
    auto chunk = [](std::size_t n) { return std::max<std::size_t>(32, (n + 8 + 15) / 16 * 16); };
    const std::size_t list_node = 2 * sizeof(void*) + sizeof(std::pair<K, V>);
    const std::size_t hash_node = sizeof(void*) + sizeof(std::pair<const K, typename List::iterator>);
    return static_cast<double>(chunk(list_node) + chunk(hash_node)) +
           static_cast<double>(index_.bucket_count() * sizeof(void*)) / static_cast<double>(size());
  }

 private:
  using List = std::list<std::pair<K, V>>;
  List items_;
  std::unordered_map<K, typename List::iterator> index_;
  std::size_t max_;
};

std::uintptr_t sink = 0;  // what the loops read, so they are not optimised away

template <class C>
double get_pass(C& cache, const std::vector<Key>& keys) {
  std::uintptr_t s = 0;
  const double t = nitro::bench::seconds([&] {
    for (const Key k : keys)
      if (auto v = cache.get(k)) s += reinterpret_cast<std::uintptr_t>(v->unsafeGetTensorImpl());
  });
  sink += s;
  return t;
}

template <class C>
double put_pass(C& cache, const std::vector<Key>& keys, const std::vector<at::Tensor>& values) {
  return nitro::bench::seconds([&] {
    for (const Key k : keys) cache.put(k, values[static_cast<std::size_t>(k) % values.size()]);
  });
}

struct Subject {
  std::string name;
  std::function<double()> get, put;
  double overhead = 0;  // bytes per entry
  bool estimate = false;
  std::uint64_t misses = 0;
  std::function<std::uint64_t()> count_misses;
  std::vector<double> get_s{}, put_s{};
};

/// Wall time for every thread to do its gets, started together.
template <class C>
double concurrent_gets(C& cache, const std::vector<std::vector<Key>>& orders) {
  std::atomic<std::size_t> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  std::vector<std::uintptr_t> sums(orders.size());
  for (std::size_t t = 0; t < orders.size(); ++t)
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      std::uintptr_t s = 0;
      for (const Key k : orders[t])
        if (auto v = cache.get(k)) s += reinterpret_cast<std::uintptr_t>(v->unsafeGetTensorImpl());
      sums[t] = s;
    });
  while (ready.load() < orders.size()) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : threads) th.join();
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const auto s : sums) sink += s;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  constexpr std::size_t entries = 100'000, gets = 500'000, puts = 250'000, mt_gets = 500'000;
  const auto t0 = std::chrono::steady_clock::now();
  at::set_num_threads(1);

  // The values: small tensors made once (16 bytes of storage each), shared by every cache.
  std::vector<at::Tensor> values;
  values.reserve(entries);
  for (std::size_t i = 0; i < entries; ++i) values.push_back(at::full({4}, static_cast<float>(i)));
  const std::size_t weight = values[0].storage().nbytes();
  const std::size_t budget = entries * weight;  // exactly `entries` values

  std::mt19937_64 rng(42);
  std::uniform_int_distribution<Key> existing(0, static_cast<Key>(entries) - 1), wider(0, 4 * static_cast<Key>(entries) - 1);
  std::vector<Key> get_keys(gets), put_keys(puts);
  for (auto& k : get_keys) k = existing(rng);
  for (auto& k : put_keys) k = wider(rng);  // 3 in 4 are not held: an eviction each
  // What Clairvoyant is told: the gets of the warm-up pass and of every repetition.
  std::vector<Key> get_future;
  for (int r = 0; r < reps + 1; ++r) get_future.insert(get_future.end(), get_keys.begin(), get_keys.end());

  std::vector<Subject> subjects;
  {
    auto cache = std::make_shared<ListLru<Key, at::Tensor>>(entries);
    auto churn = std::make_shared<ListLru<Key, at::Tensor>>(entries);
    for (std::size_t k = 0; k < entries; ++k) cache->put(static_cast<Key>(k), values[k]), churn->put(static_cast<Key>(k), values[k]);
    subjects.push_back({.name = "std::list + unordered_map",
                        .get = [cache, &get_keys] { return get_pass(*cache, get_keys); },
                        .put = [churn, &put_keys, &values] { return put_pass(*churn, put_keys, values); },
                        .overhead = cache->overhead_per_entry(),
                        .estimate = true});
  }
  nitro::bench::for_each_policy(CachePolicies{}, [&](auto tag) {
    using P = typename decltype(tag)::type;
    using Cache = nitro::Cache_st<P>;
    auto cache = std::make_shared<Cache>(typename Cache::Options{
        .capacity_bytes = budget, .policy = nitro::bench::policy_options<P>(entries, get_future)});
    auto churn = std::make_shared<Cache>(
        typename Cache::Options{.capacity_bytes = budget, .policy = nitro::bench::policy_options<P>(entries)});
    for (std::size_t k = 0; k < entries; ++k) cache->put(static_cast<Key>(k), values[k]), churn->put(static_cast<Key>(k), values[k]);
    cache->reset_stats();
    subjects.push_back({.name = "nitro " + std::string(P::name),
                        .get = [cache, &get_keys] { return get_pass(*cache, get_keys); },
                        .put = [churn, &put_keys, &values] { return put_pass(*churn, put_keys, values); },
                        .overhead = static_cast<double>(cache->overhead_bytes()) / static_cast<double>(cache->size()),
                        .count_misses = [cache] { return cache->stats().misses; }});
  });

  // Warm-up, then the repetitions, subjects in turn (the first one rotating).
  for (auto& s : subjects) s.get(), s.put();
  for (int r = 0; r < reps; ++r) {
    for (std::size_t i = 0; i < subjects.size(); ++i) {
      Subject& s = subjects[(i + static_cast<std::size_t>(r)) % subjects.size()];
      s.get_s.push_back(s.get());
    }
    for (std::size_t i = 0; i < subjects.size(); ++i) {
      Subject& s = subjects[(i + static_cast<std::size_t>(r)) % subjects.size()];
      s.put_s.push_back(s.put());
    }
  }

  std::printf("bench_cache_ops: %zu entries of 4-float tensors, %zu gets (all hits, uniform keys) and %zu puts "
              "(keys over 4x as many, 3 in 4 evict) a pass, median of %d passes, one thread (%s)\n",
              entries, gets, puts, reps, nitro::bench::machine().c_str());
  std::printf("%-28s %10s %10s %10s %10s %14s\n", "cache", "get ns", "get Mops/s", "put ns", "put Mops/s",
              "overhead B/ent");
  double baseline_get = 0, lru_get = 0;
  for (auto& s : subjects) {
    const double g = nitro::bench::median(s.get_s) / static_cast<double>(gets);
    const double p = nitro::bench::median(s.put_s) / static_cast<double>(puts);
    if (s.estimate) baseline_get = g;
    if (s.name == "nitro lru") lru_get = g;
    std::printf("%-28s %10.1f %10.2f %10.1f %10.2f %13.1f%s\n", s.name.c_str(), g * 1e9, 1e-6 / g, p * 1e9, 1e-6 / p,
                s.overhead, s.estimate ? "*" : " ");
    if (s.count_misses && s.count_misses() != 0)
      std::printf("  note: %s missed %llu gets that should all hit\n", s.name.c_str(),
                  static_cast<unsigned long long>(s.count_misses()));
  }
  std::printf("  (clairvoyant's overhead includes its order: the %zu gets it is told of, 16 bytes each)\n",
              get_future.size());
  std::printf("* estimate: list node (2 pointers + key + tensor handle) and hash node (next + key + iterator), each "
              "rounded to a glibc malloc chunk, plus the bucket array's share; nitro: overhead_bytes() / size()\n");

  // Two threads reading at once: one mutex against a mutex per shard.
  {
    constexpr std::size_t threads = 2;
    std::vector<std::vector<Key>> orders(threads, std::vector<Key>(mt_gets));
    for (auto& o : orders)
      for (auto& k : o) k = existing(rng);
    // Twice the room, so that every shard (an equal share of the budget) holds all its keys.
    nitro::Cache_mt<nitro::evict::Lru> single({.capacity_bytes = 2 * budget});
    nitro::ShardedCache_mt<nitro::evict::Lru> sharded({.capacity_bytes = 2 * budget});
    for (std::size_t k = 0; k < entries; ++k) single.put(static_cast<Key>(k), values[k]), sharded.put(static_cast<Key>(k), values[k]);
    concurrent_gets(single, orders), concurrent_gets(sharded, orders);  // warm-up
    single.reset_stats(), sharded.reset_stats();
    std::vector<double> single_s, sharded_s;
    for (int r = 0; r < reps; ++r) {
      if (r % 2 == 0) single_s.push_back(concurrent_gets(single, orders)), sharded_s.push_back(concurrent_gets(sharded, orders));
      else sharded_s.push_back(concurrent_gets(sharded, orders)), single_s.push_back(concurrent_gets(single, orders));
    }
    const double a = nitro::bench::median(single_s), b = nitro::bench::median(sharded_s);
    const double ops = static_cast<double>(threads * mt_gets);
    double load[1] = {0};
    if (::getloadavg(load, 1) != 1) load[0] = -1;
    std::printf("\n%zu threads x %zu gets (all hits), median of %d, wall time (load average %.2f on %u CPU threads)\n",
                threads, mt_gets, reps, load[0], std::thread::hardware_concurrency());
    std::printf("%-34s %10s %12s %8s\n", "cache", "ms", "Mops/s total", "misses");
    std::printf("%-34s %10.1f %12.2f %8llu\n", "Cache_mt<Lru> (one mutex)", a * 1e3, ops / a * 1e-6,
                static_cast<unsigned long long>(single.stats().misses));
    std::printf("%-34s %10.1f %12.2f %8llu\n", ("ShardedCache_mt<Lru> (" + std::to_string(sharded.shard_count()) + " shards)").c_str(),
                b * 1e3, ops / b * 1e-6, static_cast<unsigned long long>(sharded.stats().misses));
    std::printf("info: %.1f s (checksum %zu)\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                static_cast<std::size_t>(sink % 10));
    nitro::bench::result("lru_get_speedup", baseline_get / lru_get, ">=", 1.5);
    nitro::bench::result("sharded_speedup", a / b, ">=", 1.3);
  }
  return 0;
}
