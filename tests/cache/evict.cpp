// The eviction policies Lfu, Sieve, S3Fifo and Clairvoyant, each replayed through nitro::Cache
// against a slow, key-based reference written straight from its paper (exact outcome of every get,
// bytes and entries after every step, unit and mixed weights), and on small traces whose outcomes
// were worked out by hand.
#include "testing.hpp"

#include <nitro/cache/cache.hpp>
#include <nitro/cache/evict/clairvoyant.hpp>
#include <nitro/cache/evict/fifo.hpp>
#include <nitro/cache/evict/lfu.hpp>
#include <nitro/cache/evict/lru.hpp>
#include <nitro/cache/evict/no_evict.hpp>
#include <nitro/cache/evict/s3fifo.hpp>
#include <nitro/cache/evict/sieve.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <list>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace nitro_test_cache_evict {  // one namespace per file: an area is compiled as one translation unit

namespace {

using namespace nitro;
using Key = std::int64_t;

// ---- references: key-based, slow, obviously correct ----------------------------------------------
// Each makes room before it admits (the classic algorithms), except Clairvoyant, which admits and
// then evicts, the newcomer included (OPT with bypass).

struct RefBase {
  std::size_t cap = 0, bytes = 0;
  std::uint64_t hits = 0;
};

struct RefLfu : RefBase {
  struct E {
    std::uint64_t freq, stamp;
    std::size_t w;
  };
  std::map<Key, E> m;
  std::uint64_t t = 0;
  explicit RefLfu(std::size_t c) { cap = c; }
  bool contains(Key k) const { return m.contains(k); }
  std::size_t size() const { return m.size(); }
  bool get(Key k) {
    const auto it = m.find(k);
    if (it == m.end()) return false;
    ++hits, ++it->second.freq, it->second.stamp = ++t;
    return true;
  }
  void erase(Key k) {
    if (const auto it = m.find(k); it != m.end()) bytes -= it->second.w, m.erase(it);
  }
  void put(Key k, std::size_t w) {
    erase(k);
    if (w > cap) return;
    while (bytes + w > cap) {
      auto v = m.begin();
      for (auto it = m.begin(); it != m.end(); ++it)
        if (std::pair(it->second.freq, it->second.stamp) < std::pair(v->second.freq, v->second.stamp)) v = it;
      bytes -= v->second.w, m.erase(v);
    }
    m[k] = {1, ++t, w}, bytes += w;
  }
};

// The list's front is the head (newest); the hand moves toward the head.
struct RefSieve : RefBase {
  std::list<Key> q;
  struct E {
    bool visited;
    std::list<Key>::iterator it;
    std::size_t w;
  };
  std::map<Key, E> m;
  std::list<Key>::iterator hand = q.end();  // end(): start at the tail
  explicit RefSieve(std::size_t c) { cap = c; }
  bool contains(Key k) const { return m.contains(k); }
  std::size_t size() const { return m.size(); }
  std::list<Key>::iterator toward_head(std::list<Key>::iterator it) { return it == q.begin() ? q.end() : std::prev(it); }
  bool get(Key k) {
    const auto it = m.find(k);
    if (it == m.end()) return false;
    ++hits, it->second.visited = true;
    return true;
  }
  void erase(Key k) {
    const auto it = m.find(k);
    if (it == m.end()) return;
    if (hand == it->second.it) hand = toward_head(hand);
    q.erase(it->second.it), bytes -= it->second.w, m.erase(it);
  }
  void put(Key k, std::size_t w) {
    erase(k);
    if (w > cap) return;
    while (bytes + w > cap) {
      auto o = hand != q.end() ? hand : std::prev(q.end());
      while (m[*o].visited) {
        m[*o].visited = false;
        o = toward_head(o);
        if (o == q.end()) o = std::prev(q.end());
      }
      hand = toward_head(o);
      bytes -= m[*o].w, m.erase(*o), q.erase(o);
    }
    q.push_front(k), m[k] = {false, q.begin(), w}, bytes += w;
  }
};

// Fronts are the heads (newest). The ghost keeps as many keys as M holds entries.
struct RefS3Fifo : RefBase {
  double share;
  std::list<Key> s, main, ghost;
  struct E {
    bool in_main;
    int freq;
    std::size_t w;
  };
  std::map<Key, E> m;
  std::size_t small_bytes = 0;
  explicit RefS3Fifo(std::size_t c, double ratio = 0.10) : share(ratio * static_cast<double>(c)) { cap = c; }
  bool contains(Key k) const { return m.contains(k); }
  std::size_t size() const { return m.size(); }
  bool get(Key k) {
    const auto it = m.find(k);
    if (it == m.end()) return false;
    ++hits, it->second.freq = std::min(3, it->second.freq + 1);
    return true;
  }
  void erase(Key k) {
    const auto it = m.find(k);
    if (it == m.end()) return;
    if (it->second.in_main) main.remove(k);
    else s.remove(k), small_bytes -= it->second.w;
    bytes -= it->second.w, m.erase(it);
  }
  void evict() {
    if (!s.empty() && (static_cast<double>(small_bytes) >= share || main.empty())) {
      while (!s.empty()) {
        const Key t = s.back();
        s.pop_back();
        E& e = m[t];
        small_bytes -= e.w;
        if (e.freq >= 2) {
          e.freq = 0, e.in_main = true, main.push_front(t);
          continue;
        }
        ghost.remove(t), ghost.push_front(t);
        while (ghost.size() > main.size()) ghost.pop_back();
        bytes -= e.w, m.erase(t);
        return;
      }
    }
    while (true) {
      const Key t = main.back();
      E& e = m[t];
      main.pop_back();
      if (e.freq == 0) {
        bytes -= e.w, m.erase(t);
        return;
      }
      --e.freq, main.push_front(t);
    }
  }
  void put(Key k, std::size_t w) {
    erase(k);
    if (w > cap) return;
    const bool in_ghost = std::find(ghost.begin(), ghost.end(), k) != ghost.end();
    ghost.remove(k);
    while (bytes + w > cap) evict();
    if (in_ghost) main.push_front(k);
    else s.push_front(k), small_bytes += w;
    m[k] = {in_ghost, 0, w}, bytes += w;
  }
};

// Next uses by a linear scan of the order; the victim is the furthest next use, the larger key on a tie.
struct RefClairvoyant : RefBase {
  std::vector<Key> order;
  std::size_t pos = 0;
  std::uint64_t mismatches = 0;
  static constexpr std::uint64_t never = ~0ull;
  struct E {
    std::uint64_t next;
    std::size_t w;
  };
  std::map<Key, E> m;
  RefClairvoyant(std::size_t c, std::vector<Key> o) : order(std::move(o)) { cap = c; }
  bool contains(Key k) const { return m.contains(k); }
  std::size_t size() const { return m.size(); }
  std::uint64_t scan(Key k, std::size_t from) const {
    for (std::size_t i = from; i < order.size(); ++i)
      if (order[i] == k) return i;
    return never;
  }
  bool get(Key k) {
    if (pos < order.size() && order[pos] == k) ++pos;
    else ++mismatches, pos = std::min(pos + 1, order.size());
    const auto it = m.find(k);
    if (it == m.end()) return false;
    ++hits, it->second.next = scan(k, pos);
    return true;
  }
  void erase(Key k) {
    if (const auto it = m.find(k); it != m.end()) bytes -= it->second.w, m.erase(it);
  }
  void put(Key k, std::size_t w) {
    erase(k);
    if (w > cap) return;
    m[k] = {scan(k, pos), w}, bytes += w;
    while (bytes > cap) {
      auto v = m.begin();
      for (auto it = m.begin(); it != m.end(); ++it)
        if (std::pair(it->second.next, it->first) > std::pair(v->second.next, v->first)) v = it;
      bytes -= v->second.w, m.erase(v);
    }
  }
  void append(const std::vector<Key>& more) {
    order.insert(order.end(), more.begin(), more.end());
    for (auto& [k, e] : m)
      if (e.next == never) e.next = scan(k, pos);
  }
};

// ---- traces ---------------------------------------------------------------------------------------

enum class Op { get, put, erase, append };
struct Step {
  Op op;
  Key key;
};
using Trace = std::vector<Step>;

std::vector<Key> gets_of(const Trace& t) {
  std::vector<Key> keys;
  for (const Step& s : t)
    if (s.op == Op::get) keys.push_back(s.key);
  return keys;
}
Trace uniform(int n, int len, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Trace t;
  for (int i = 0; i < len; ++i) t.push_back({Op::get, static_cast<Key>(rng() % static_cast<std::uint64_t>(n))});
  return t;
}
Trace zipf(int n, int len, double s, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> w(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) w[static_cast<std::size_t>(i)] = 1.0 / std::pow(i + 1, s);
  std::discrete_distribution<int> pick(w.begin(), w.end());
  std::vector<Key> keys(static_cast<std::size_t>(n));
  std::iota(keys.begin(), keys.end(), Key{0});
  std::shuffle(keys.begin(), keys.end(), rng);
  Trace t;
  for (int i = 0; i < len; ++i) t.push_back({Op::get, keys[static_cast<std::size_t>(pick(rng))]});
  return t;
}
Trace epochs(int n, int e, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Key> keys(static_cast<std::size_t>(n));
  std::iota(keys.begin(), keys.end(), Key{0});
  Trace t;
  for (int i = 0; i < e; ++i) {
    std::shuffle(keys.begin(), keys.end(), rng);
    for (const Key k : keys) t.push_back({Op::get, k});
  }
  return t;
}
// Zipf gets with 5% puts without a get (some replacing a held key) and 3% erases.
Trace mixed(int n, int len, std::uint64_t seed) {
  Trace t = zipf(n, len, 0.8, seed);
  std::mt19937_64 rng(seed + 1);
  for (Step& s : t) {
    const auto x = rng() % 100;
    if (x < 5) s.op = Op::put;
    else if (x < 8) s = {Op::erase, static_cast<Key>(rng() % static_cast<std::uint64_t>(n))};
  }
  return t;
}

std::int64_t unit_weight(Key) { return 1; }
// 1..16 mostly, some weightless, some a third of a 120-byte budget, some larger than any budget here.
std::int64_t mixed_weight(Key k) {
  const std::uint64_t h = cache::KeyHash<Key>{}(k);
  if (h % 50 == 0) return 40;
  if (h % 97 == 1) return 5000;
  if (h % 13 == 2) return 0;
  return 1 + static_cast<std::int64_t>(h % 16);
}

// The value is its own weight.
struct Self {
  std::int64_t operator()(int v) const { return v; }
};
template <class P>
using TestCache = Cache_st<P, Key, int, Self>;

struct Replay {
  std::uint64_t hits = 0, ref_hits = 0;
  std::int64_t first_divergence = -1;  // the first step where cache and reference differ
  bool over_budget = false;
};

// Replays `t` through the cache and the reference side by side: every get (a miss is followed by a
// put), put, erase; the outcome of each get, the bytes and the entries must agree after every step,
// and the resident keys every 61 steps.
template <class P, class Ref>
Replay replay(const Trace& t, std::size_t cap, std::int64_t (*weight)(Key), Ref ref, typename P::Options options = {},
              const std::vector<Key>* appended = nullptr) {
  TestCache<P> cache{{.capacity_bytes = cap, .policy = options}};
  Key max_key = 0;
  for (const Step& s : t) max_key = std::max(max_key, s.key);
  Replay r;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const Step& s = t[i];
    const int w = static_cast<int>(weight(s.key));
    bool same = true;
    switch (s.op) {
      case Op::get: {
        const bool hit = cache.get(s.key).has_value();
        same = hit == ref.get(s.key);
        if (!hit) cache.put(s.key, w), ref.put(s.key, static_cast<std::size_t>(w));
        break;
      }
      case Op::put: cache.put(s.key, w), ref.put(s.key, static_cast<std::size_t>(w)); break;
      case Op::erase: cache.erase(s.key), ref.erase(s.key); break;
      case Op::append:
        if constexpr (requires { ref.append(*appended); }) cache.evictor().append(*appended), ref.append(*appended);
        break;
    }
    same = same && cache.bytes() == ref.bytes && cache.size() == ref.size();
    if (i % 61 == 0)
      for (Key k = 0; k <= max_key; ++k) same = same && cache.contains(k) == ref.contains(k);
    r.over_budget = r.over_budget || cache.bytes() > cap;
    if (!same && r.first_divergence < 0) r.first_divergence = static_cast<std::int64_t>(i);
  }
  r.hits = cache.stats().hits;
  r.ref_hits = ref.hits;
  if constexpr (requires { ref.mismatches; }) {
    if (cache.evictor().mismatches() != ref.mismatches && r.first_divergence < 0)
      r.first_divergence = static_cast<std::int64_t>(t.size());
  }
  return r;
}

#define CHECK_REPLAY(r)                   \
  do {                                    \
    const Replay& r_ = (r);               \
    CHECK(r_.first_divergence == -1);     \
    CHECK(r_.hits == r_.ref_hits);        \
    CHECK_FALSE(r_.over_budget);          \
  } while (false)

struct NamedTrace {
  std::string name;
  Trace trace;
};
std::vector<NamedTrace> random_traces() {
  std::vector<NamedTrace> out;
  for (const std::uint64_t seed : {1, 2}) {
    out.push_back({"uniform " + std::to_string(seed), uniform(300, 3000, seed)});
    out.push_back({"zipf " + std::to_string(seed), zipf(1000, 4000, 0.9, seed)});
    out.push_back({"epochs " + std::to_string(seed), epochs(300, 4, seed)});
    out.push_back({"mixed " + std::to_string(seed), mixed(500, 4000, seed)});
  }
  return out;
}

// Each policy against its reference over every random trace, at unit weights (budgets in entries)
// and at mixed weights.
template <class P, class MakeRef>
void against_reference(MakeRef make_ref, typename P::Options options = {}) {
  for (const auto& [name, trace] : random_traces()) {
    for (const std::size_t cap : {1, 7, 60}) {
      CAPTURE(name);
      CAPTURE(cap);
      CHECK_REPLAY(replay<P>(trace, cap, unit_weight, make_ref(cap, trace), options));
    }
    for (const std::size_t cap : {120, 900}) {
      CAPTURE(name);
      CAPTURE(cap);
      CHECK_REPLAY(replay<P>(trace, cap, mixed_weight, make_ref(cap, trace), options));
    }
  }
}

// ---- hand-made traces -----------------------------------------------------------------------------
// Keys are letters; `gets` is a string of them; each miss is followed by a put of weight 1. The
// result is the outcome of each get, 'H' or 'M'.

Key key_of(char c) { return c - 'a' + 1; }

template <class P>
std::string outcomes(TestCache<P>& cache, std::string_view gets) {
  std::string out;
  for (const char c : gets) {
    const bool hit = cache.get(key_of(c)).has_value();
    if (!hit) cache.put(key_of(c), 1);
    out += hit ? 'H' : 'M';
  }
  return out;
}
template <class P>
std::string held(const TestCache<P>& cache) {
  std::string out;
  for (char c = 'a'; c <= 'z'; ++c)
    if (cache.contains(key_of(c))) out += c;
  return out;
}
std::vector<Key> keys_of(std::string_view letters) {
  std::vector<Key> keys;
  for (const char c : letters) keys.push_back(key_of(c));
  return keys;
}

}  // namespace

// ---- against the references -----------------------------------------------------------------------

TEST_CASE("Lfu matches a reference LFU on random traces") {
  against_reference<evict::Lfu>([](std::size_t cap, const Trace&) { return RefLfu(cap); });
}

TEST_CASE("Sieve matches a reference SIEVE on random traces") {
  against_reference<evict::Sieve>([](std::size_t cap, const Trace&) { return RefSieve(cap); });
}

TEST_CASE("S3Fifo matches a reference S3-FIFO on random traces") {
  against_reference<evict::S3Fifo>([](std::size_t cap, const Trace&) { return RefS3Fifo(cap); });
  against_reference<evict::S3Fifo>([](std::size_t cap, const Trace&) { return RefS3Fifo(cap, 0.3); },
                                   {.small_ratio = 0.3});
}

TEST_CASE("Clairvoyant matches a reference Belady on random traces given the order or a drifted one") {
  for (const auto& [name, trace] : random_traces()) {
    const std::vector<Key> order = gets_of(trace);
    // Every 10th key replaced and the last tenth cut: mismatches, and gets past the end.
    std::vector<Key> drifted = order;
    for (std::size_t i = 0; i < drifted.size(); i += 10) drifted[i] = static_cast<Key>((i * 7919) % 300);
    drifted.resize(drifted.size() * 9 / 10);
    for (const std::size_t cap : {1, 7, 60}) {
      CAPTURE(name);
      CAPTURE(cap);
      CHECK_REPLAY(replay<evict::Clairvoyant>(trace, cap, unit_weight, RefClairvoyant(cap, order), {.accesses = order}));
      CHECK_REPLAY(
          replay<evict::Clairvoyant>(trace, cap, unit_weight, RefClairvoyant(cap, drifted), {.accesses = drifted}));
      CHECK_REPLAY(replay<evict::Clairvoyant>(trace, cap, unit_weight, RefClairvoyant(cap, {}), {}));
    }
    for (const std::size_t cap : {120, 900}) {
      CAPTURE(name);
      CAPTURE(cap);
      CHECK_REPLAY(
          replay<evict::Clairvoyant>(trace, cap, mixed_weight, RefClairvoyant(cap, order), {.accesses = order}));
      CHECK_REPLAY(
          replay<evict::Clairvoyant>(trace, cap, mixed_weight, RefClairvoyant(cap, drifted), {.accesses = drifted}));
    }
  }
}

TEST_CASE("Clairvoyant append extends the order before or after the gets reach its end") {
  const Trace base = zipf(300, 3000, 0.9, 21);
  const std::vector<Key> order = gets_of(base);
  const std::vector<Key> first(order.begin(), order.begin() + 1500), rest(order.begin() + 1500, order.end());
  for (const std::ptrdiff_t at : {700, 1500, 2200}) {  // before, at, and 700 gets past the end of `first`
    Trace t = base;
    t.insert(t.begin() + at, Step{Op::append, 0});
    for (const std::size_t cap : {7, 60}) {
      CAPTURE(at);
      CAPTURE(cap);
      CHECK_REPLAY(replay<evict::Clairvoyant>(t, cap, unit_weight, RefClairvoyant(cap, first), {.accesses = first},
                                              &rest));
      CHECK_REPLAY(replay<evict::Clairvoyant>(t, cap * 8, mixed_weight, RefClairvoyant(cap * 8, first),
                                              {.accesses = first}, &rest));
    }
  }
  // Given in two parts in time, the order is as good as given whole.
  Trace t = base;
  t.insert(t.begin() + 700, Step{Op::append, 0});
  const Replay parts = replay<evict::Clairvoyant>(t, 60, unit_weight, RefClairvoyant(60, first), {.accesses = first}, &rest);
  const Replay whole = replay<evict::Clairvoyant>(base, 60, unit_weight, RefClairvoyant(60, order), {.accesses = order});
  CHECK(parts.hits >= whole.hits * 99 / 100);
}

// ---- hand-made traces -----------------------------------------------------------------------------

TEST_CASE("Lfu evicts the least frequent entry and the least recent among equals") {
  TestCache<evict::Lfu> cache{{.capacity_bytes = 3}};
  // After "abcbac" all three are read twice, reaching count 2 in the order b a c: d evicts b. Then
  // b evicts d (count 1), and d evicts b again (a and c have count 3 by then).
  CHECK(outcomes(cache, "abcbacdbacd") == "MMMHHHMMHHM");
  CHECK(held(cache) == "acd");
}

TEST_CASE("Lfu makes room before it admits so a newcomer replaces the least frequent") {
  TestCache<evict::Lfu> cache{{.capacity_bytes = 2}};
  // a and b are read twice; c (count 1) still goes in, in place of a (count 2, least recent).
  CHECK(outcomes(cache, "aabbc") == "MHMHM");
  CHECK(held(cache) == "bc");
  CHECK(cache.stats().rejections == 0);
}

TEST_CASE("Sieve keeps a visited entry that LRU would evict") {
  TestCache<evict::Sieve> sieve{{.capacity_bytes = 3}};
  TestCache<evict::Lru> lru{{.capacity_bytes = 3}};
  // Queue head..tail c b a; a is hit. d: the hand clears a and evicts b, resting at c. e evicts c and
  // the hand rests at d. f evicts d; a, visited before, survives where LRU drops it.
  CHECK(outcomes(sieve, "abcadefa") == "MMMHMMMH");
  CHECK(held(sieve) == "aef");
  CHECK(outcomes(lru, "abcadefa") == "MMMHMMMM");
}

TEST_CASE("Sieve hand wraps to the tail when it passes the head") {
  TestCache<evict::Sieve> cache{{.capacity_bytes = 2}};
  // a and b are both visited: c's eviction clears a and b, wraps, and evicts a; the hand rests at b.
  // Then a evicts b, c is hit, and b's eviction clears c and evicts a (the head), so the hand wraps.
  CHECK(outcomes(cache, "ababcacb") == "MMHHMMHM");
  CHECK(held(cache) == "bc");
  // The hand starts at the tail again: c (visited earlier, cleared) goes, b stays.
  CHECK(outcomes(cache, "d") == "M");
  CHECK(held(cache) == "bd");
}

TEST_CASE("S3Fifo promotes entries read twice and sends ghost keys to the main queue") {
  TestCache<evict::S3Fifo> cache{{.capacity_bytes = 4, .policy = {.small_ratio = 0.5}}};
  auto& books = cache.evictor();
  // a b c d fill S; a is read twice. e: S is at its share (4 >= 2), a moves to M, b is dropped to
  // the ghost (which holds as many keys as M: 1).
  CHECK(outcomes(cache, "abcdaae") == "MMMMHHM");
  CHECK(held(cache) == "acde");
  CHECK(books.in_ghost(key_of('b')));
  CHECK(books.main_size() == 1);
  // b is in the ghost: it goes to M (and leaves the ghost); making room drops c from S to the ghost.
  CHECK(outcomes(cache, "b") == "M");
  CHECK(held(cache) == "abde");
  CHECK(books.in_ghost(key_of('c')));
  CHECK_FALSE(books.in_ghost(key_of('b')));
  CHECK(books.main_size() == 2);
  // c (ghost) goes to M and drops d from S; d (ghost) goes to M, and S is now under its share (e
  // alone), so M gives up its oldest, a (count 0 since its promotion).
  CHECK(outcomes(cache, "cd") == "MM");
  CHECK(held(cache) == "bcde");
  CHECK(books.main_size() == 3);
  CHECK(books.small_size() == 1);
  // A key read once in S is dropped, not promoted: e is hit once; f makes room from M (b, count 0),
  // then g from S, where e is the oldest.
  CHECK(outcomes(cache, "efg") == "HMM");
  CHECK(held(cache) == "cdfg");
  CHECK(books.in_ghost(key_of('e')));
}

TEST_CASE("S3Fifo gives an entry read in the main queue another round") {
  TestCache<evict::S3Fifo> cache{{.capacity_bytes = 3, .policy = {.small_ratio = 0.34}}};
  // a and b are read twice in S; d's arrival moves both to M and drops c (read never) to the ghost.
  CHECK(outcomes(cache, "aaabbbcd") == "MHHMHHMM");
  CHECK(held(cache) == "abd");
  CHECK(cache.evictor().main_size() == 2);
  // a is hit in M. e: S (d alone) is under its share, so M evicts: a, its count 1, goes back to M's
  // head with count 0, and b (count 0) goes.
  CHECK(outcomes(cache, "ae") == "HM");
  CHECK(held(cache) == "ade");
  CHECK(cache.evictor().main_size() == 1);
  CHECK(cache.evictor().small_size() == 2);
}

TEST_CASE("S3Fifo rejects a small queue share outside 0 to 1") {
  CHECK_THROWS_AS(TestCache<evict::S3Fifo>({.capacity_bytes = 10, .policy = {.small_ratio = 0.0}}), Error);
  CHECK_THROWS_AS(TestCache<evict::S3Fifo>({.capacity_bytes = 10, .policy = {.small_ratio = 1.0}}), Error);
  CHECK_NOTHROW(TestCache<evict::S3Fifo>({.capacity_bytes = 10, .policy = {.small_ratio = 0.5}}));
}

TEST_CASE("Clairvoyant bypasses a newcomer used later than everything held") {
  // Order a b c a b, room for 2: c is used never again, so it is refused and a and b both hit.
  TestCache<evict::Clairvoyant> cache{{.capacity_bytes = 2, .policy = {.accesses = keys_of("abcab")}}};
  CHECK(outcomes(cache, "abcab") == "MMMHH");
  CHECK(held(cache) == "ab");
  CHECK(cache.stats().rejections == 1);
  CHECK(cache.stats().evictions == 0);
  CHECK(cache.evictor().mismatches() == 0);
  // LRU hits none of them.
  TestCache<evict::Lru> lru{{.capacity_bytes = 2}};
  CHECK(outcomes(lru, "abcab") == "MMMMM");
}

TEST_CASE("Clairvoyant evicts the entry used furthest ahead") {
  // Order a b c b c a, room for 2. c (next at 4) evicts a (next at 5); b and c hit; a misses and,
  // with b and c never used again, the largest key, c, goes.
  TestCache<evict::Clairvoyant> cache{{.capacity_bytes = 2, .policy = {.accesses = keys_of("abcbca")}}};
  CHECK(outcomes(cache, "abcbca") == "MMMHHM");
  CHECK(held(cache) == "ab");
}

TEST_CASE("Clairvoyant counts the gets that leave the given order") {
  TestCache<evict::Clairvoyant> cache{{.capacity_bytes = 2, .policy = {.accesses = keys_of("abc")}}};
  auto& books = cache.evictor();
  CHECK(outcomes(cache, "a") == "M");
  CHECK(books.mismatches() == 0);
  CHECK(outcomes(cache, "e") == "M");  // the order says b here
  CHECK(books.mismatches() == 1);
  CHECK(books.position() == 2);
  CHECK(outcomes(cache, "c") == "M");
  CHECK(books.mismatches() == 1);
  CHECK(books.position() == 3);
  CHECK(outcomes(cache, "a") == "H");  // past the end: a mismatch, and the position stays
  CHECK(books.mismatches() == 2);
  CHECK(books.position() == 3);
  CHECK(books.order_size() == 3);
}

TEST_CASE("Clairvoyant places a put without a get by its key's next use") {
  // Order a b a c, room for 1. b is put before any get (next use 1); a's miss puts a (next use 2),
  // which is refused; b hits; a misses again.
  TestCache<evict::Clairvoyant> cache{{.capacity_bytes = 1, .policy = {.accesses = keys_of("abac")}}};
  CHECK(cache.put(key_of('b'), 1));
  CHECK(outcomes(cache, "a") == "M");
  CHECK(held(cache) == "b");
  // A key the order never reads is refused while b's use is ahead.
  CHECK_FALSE(cache.put(key_of('z'), 1));
  CHECK(outcomes(cache, "b") == "H");
  // Now b is never used again: a put of a (next use 2) replaces it.
  CHECK(cache.put(key_of('a'), 1));
  CHECK(held(cache) == "a");
  CHECK(outcomes(cache, "a") == "H");
  CHECK(cache.evictor().mismatches() == 0);
}

TEST_CASE("Clairvoyant reaches the epoch optimum and beats every online policy on zipf") {
  {
    const int n = 1000, c = 500, e = 5;
    const Trace t = epochs(n, e, 42);
    const auto order = gets_of(t);
    TestCache<evict::Clairvoyant> cache{{.capacity_bytes = c, .policy = {.accesses = order}}};
    for (const Step& s : t)
      if (!cache.get(s.key)) cache.put(s.key, 1);
    // (E-1)*C/(E*N) = 0.4: every epoch after the first hits all C held.
    CHECK(cache.stats().hits == static_cast<std::uint64_t>((e - 1) * c));
    CHECK(cache.stats().hits + cache.stats().misses == static_cast<std::uint64_t>(e * n));
  }
  const Trace t = zipf(3000, 30000, 0.9, 11);
  const auto order = gets_of(t);
  auto hits = [&]<class P>(std::type_identity<P>, typename P::Options o = {}) {
    TestCache<P> cache{{.capacity_bytes = 300, .policy = o}};
    for (const Step& s : t)
      if (!cache.get(s.key)) cache.put(s.key, 1);
    return cache.stats().hits;
  };
  const auto opt = hits(std::type_identity<evict::Clairvoyant>{}, {.accesses = order});
  CHECK(opt >= hits(std::type_identity<evict::Lru>{}));
  CHECK(opt >= hits(std::type_identity<evict::Fifo>{}));
  CHECK(opt >= hits(std::type_identity<evict::NoEvict>{}));
  CHECK(opt >= hits(std::type_identity<evict::Lfu>{}));
  CHECK(opt >= hits(std::type_identity<evict::Sieve>{}));
  CHECK(opt >= hits(std::type_identity<evict::S3Fifo>{}));
}

// Cache::clear() clears the evictor; here the evictors are driven directly (slots as the cache hands them out).
TEST_CASE("evictors forget their entries on clear") {
  auto drain = [](auto& e) {
    std::vector<cache::Slot> out;
    while (const auto v = e.victim()) out.push_back(*v);
    return out;
  };
  const std::vector<cache::Slot> none;
  {
    evict::Lfu::Evictor<Key> e({}, 10);
    for (cache::Slot s = 0; s < 5; ++s) e.on_insert(Key{s}, s, 1);
    e.on_access(Key{0}, 0);
    e.clear();
    CHECK(drain(e) == none);
    for (cache::Slot s = 0; s < 3; ++s) e.on_insert(Key{s}, s, 1);
    e.on_access(Key{0}, 0);
    CHECK(drain(e) == std::vector<cache::Slot>{1, 2, 0});
  }
  {
    evict::Sieve::Evictor<Key> e({}, 10);
    for (cache::Slot s = 0; s < 5; ++s) e.on_insert(Key{s}, s, 1);
    e.on_access(Key{1}, 1);
    (void)e.victim();  // moves the hand
    e.clear();
    CHECK(drain(e) == none);
    for (cache::Slot s = 0; s < 3; ++s) e.on_insert(Key{s}, s, 1);
    e.on_access(Key{0}, 0);
    CHECK(drain(e) == std::vector<cache::Slot>{1, 2, 0});
  }
  {
    evict::S3Fifo::Evictor<Key> e({}, 10);
    for (cache::Slot s = 0; s < 5; ++s) e.on_insert(Key{s}, s, 1);
    (void)e.victim();
    e.clear();
    CHECK_FALSE(e.in_ghost(Key{0}));
    CHECK(drain(e) == none);
    for (cache::Slot s = 0; s < 3; ++s) e.on_insert(Key{s}, s, 1);
    CHECK(drain(e) == std::vector<cache::Slot>{0, 1, 2});
  }
  {
    evict::Clairvoyant::Evictor<Key> e({.accesses = {0, 1, 2, 2, 1, 0}}, 10);
    e.on_miss(Key{0});
    e.on_insert(Key{0}, 0, 1);
    e.clear();
    CHECK(drain(e) == none);
    CHECK(e.position() == 1);  // the order and the position stay
    for (cache::Slot s = 0; s < 3; ++s) e.on_insert(Key{s}, s, 1);
    CHECK(drain(e) == std::vector<cache::Slot>{0, 2, 1});  // next uses 5, 1, 2
  }
}

}  // namespace nitro_test_cache_evict
