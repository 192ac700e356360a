// nitro::data::ResumableSampler: every epoch a permutation fixed by (seed, epoch) on every platform,
// exact resume alone and behind a Prefetcher with workers and depth (batches made ahead are made
// again), validated load_state, reset semantics, and save/load through torch archives.
#include "testing.hpp"

#include <nitro/data/sampler.hpp>

#include <nitro/data/prefetcher.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace nitro_test_data_sampler {  // one namespace per file: an area is compiled as one translation unit

namespace {

using Indices = std::vector<std::size_t>;
using nitro::data::ResumableSampler;
using nitro::data::SamplerState;

// Sample i holds i (data and target); reading it takes 0, 0.2 or 0.4 ms so workers finish out of
// order. `fail_at`: get() throws for that index.
// Threads that have ever read a sample: a thread-local made on each thread's first get() (a new
// thread counts even if it reuses an old thread's id).
std::atomic<int> reader_threads{0};
struct CountThread {
  CountThread() { ++reader_threads; }
};

struct Numbers : torch::data::datasets::Dataset<Numbers> {
  std::size_t n = 0;
  std::int64_t fail_at = -1;
  explicit Numbers(std::size_t n_) : n(n_) {}
  torch::data::Example<> get(std::size_t index) override {
    thread_local CountThread counted;
    (void)counted;
    std::this_thread::sleep_for(std::chrono::microseconds(200 * ((index * 7) % 3)));
    if (static_cast<std::int64_t>(index) == fail_at) throw std::runtime_error("bad sample " + std::to_string(index));
    const auto i = static_cast<std::int64_t>(index);
    return {torch::tensor(i), torch::tensor(i)};
  }
  std::optional<std::size_t> size() const override { return n; }
};

using Stacked = torch::data::datasets::MapDataset<Numbers, torch::data::transforms::Stack<>>;
using Source = nitro::DatasetSource<Stacked, ResumableSampler>;
using Batches = nitro::Prefetcher<nitro::Cpu, Source>;

Stacked stacked(std::size_t n, std::int64_t fail_at = -1) {
  Numbers d(n);
  d.fail_at = fail_at;
  return d.map(torch::data::transforms::Stack<>());
}

Indices values(const at::Tensor& t) {
  auto c = t.contiguous();
  Indices out;
  for (std::int64_t i = 0; i < c.numel(); ++i) out.push_back(static_cast<std::size_t>(c.data_ptr<std::int64_t>()[i]));
  return out;
}

// The uninterrupted epoch, cut into batches: the exact expected answer.
std::vector<Indices> batches_of(const Indices& order, std::size_t batch) {
  std::vector<Indices> out;
  for (std::size_t i = 0; i < order.size(); i += batch)
    out.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(i),
                     order.begin() + static_cast<std::ptrdiff_t>(std::min(order.size(), i + batch)));
  return out;
}

std::vector<Indices> drain(ResumableSampler& s, std::size_t batch) {
  std::vector<Indices> out;
  while (auto b = s.next(batch)) out.push_back(*b);
  return out;
}

std::vector<Indices> drain(Batches& p) {
  std::vector<Indices> out;
  while (auto b = p.next()) out.push_back(values(b->data));
  return out;
}

// Waits (bounded) until the prefetcher has made `count` batches ahead.
void wait_in_flight(const Batches& p, std::size_t count) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (p.in_flight() < count && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

bool is_permutation_of_iota(Indices v) {
  std::sort(v.begin(), v.end());
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] != i) return false;
  return true;
}

}  // namespace

TEST_CASE("the generator is splitmix64: its published test vector") {
  // splitmix64 from seed 1234567 (Vigna's reference splitmix64.c), as used by xoshiro's seeding.
  nitro::data::detail::SplitMix64 g(1234567);
  CHECK(g() == 6457827717110365317ULL);
  CHECK(g() == 3203168211198807973ULL);
  CHECK(g() == 9817491932198370423ULL);
  CHECK(g() == 4593380528125082431ULL);
  CHECK(g() == 16408922859458223821ULL);
}

TEST_CASE("every epoch is a permutation, fixed by (seed, epoch), the same on every platform") {
  // Pinned: computed by an independent Python transcription of the algorithm (splitmix64, rejection
  // below 2^64 mod bound, Fisher-Yates from the top); any platform or library must give these.
  CHECK(nitro::data::epoch_order(42, 0, 10) == Indices{2, 8, 9, 7, 1, 4, 6, 0, 5, 3});
  CHECK(nitro::data::epoch_order(42, 1, 10) == Indices{3, 1, 6, 8, 4, 5, 9, 7, 2, 0});
  CHECK(nitro::data::epoch_order(0, 0, 10) == Indices{6, 3, 2, 9, 8, 1, 4, 7, 0, 5});
  const Indices big = nitro::data::epoch_order(2024, 3, 1000);
  CHECK(Indices(big.begin(), big.begin() + 8) == Indices{339, 786, 824, 165, 468, 7, 340, 737});

  // The sampler reads exactly that order, in batches, the last one short.
  ResumableSampler s(10, {.seed = 42});
  CHECK(drain(s, 4) == std::vector<Indices>{{2, 8, 9, 7}, {1, 4, 6, 0}, {5, 3}});
  CHECK_FALSE(s.next(4).has_value());
  s.set_epoch(1);
  CHECK(s.epoch() == 1);
  CHECK(drain(s, 4) == std::vector<Indices>{{3, 1, 6, 8}, {4, 5, 9, 7}, {2, 0}});

  // Every epoch a permutation, no two epochs alike, the same order again for the same (seed, epoch).
  std::set<Indices> seen;
  for (std::int64_t e = 0; e < 20; ++e) {
    const Indices o = nitro::data::epoch_order(7, e, 257);
    CHECK(is_permutation_of_iota(o));
    CHECK(seen.insert(o).second);
    ResumableSampler again(257, {.seed = 7});
    again.set_epoch(e);
    Indices read;
    for (const auto& b : drain(again, 16)) read.insert(read.end(), b.begin(), b.end());
    CHECK(read == o);
  }
  CHECK(nitro::data::epoch_order(8, 0, 257) != nitro::data::epoch_order(7, 0, 257));  // the seed matters
  CHECK(nitro::data::epoch_order(1, 0, 1) == Indices{0});

  // shuffle = false: the identity, every epoch.
  ResumableSampler plain(5, {.shuffle = false});
  plain.set_epoch(3);
  CHECK(drain(plain, 2) == std::vector<Indices>{{0, 1}, {2, 3}, {4}});
}

TEST_CASE("size 0 and batch size 0 are refused with what to do") {
  CHECK_THROWS_WITH_AS(ResumableSampler(0), doctest::Contains("size is 0; give the number of samples"), nitro::Error);
  ResumableSampler s(4);
  CHECK_THROWS_WITH_AS(s.next(0), doctest::Contains("batch_size is 0"), nitro::Error);
  CHECK_THROWS_WITH_AS(s.set_epoch(-1), doctest::Contains("epoch is -1"), nitro::Error);
}

TEST_CASE("standalone: a sampler loaded from a state reads the rest of the uninterrupted epoch") {
  const std::size_t n = 103, batch = 8;
  ResumableSampler whole(n, {.seed = 11});
  whole.set_epoch(4);
  const std::vector<Indices> expected = drain(whole, batch);
  REQUIRE(expected.size() == 13);
  REQUIRE(expected == batches_of(nitro::data::epoch_order(11, 4, n), batch));

  for (const std::size_t k : {0u, 1u, 6u, 12u, 13u}) {
    CAPTURE(k);
    ResumableSampler first(n, {.seed = 11});
    first.set_epoch(4);
    for (std::size_t i = 0; i < k; ++i) REQUIRE(first.next(batch).has_value());
    const SamplerState st = first.state();
    CHECK(st == SamplerState{.seed = 11, .epoch = 4, .index = static_cast<std::int64_t>(std::min(n, k * batch)),
                             .size = static_cast<std::int64_t>(n), .shuffle = true});

    ResumableSampler resumed(n);  // seed and epoch come from the state
    resumed.load_state(st);
    CHECK(resumed.state() == st);
    resumed.reset(n);  // as a data loader does first: the position stays
    CHECK(drain(resumed, batch) == std::vector<Indices>(expected.begin() + static_cast<std::ptrdiff_t>(k), expected.end()));
  }
}

TEST_CASE("behind a prefetcher with 3 workers and depth 4, a resumed run reads exactly the batches not consumed") {
  const std::size_t n = 61, batch = 4;  // 16 batches, the last of 1
  const std::vector<Indices> expected = batches_of(nitro::data::epoch_order(5, 2, n), batch);
  REQUIRE(expected.size() == 16);

  // Uninterrupted, through the prefetcher: the same batches.
  {
    ResumableSampler sampler(n, {.seed = 5});
    sampler.set_epoch(2);
    Batches p{nitro::from_dataset(stacked(n), sampler, batch), {.depth = 4, .workers = 3}};
    CHECK(drain(p) == expected);
    CHECK(sampler.state().index == static_cast<std::int64_t>(n));
  }

  for (const std::size_t k : {1u, 5u, 9u}) {
    CAPTURE(k);
    ResumableSampler sampler(n, {.seed = 5});
    sampler.set_epoch(2);
    SamplerState st;
    {
      Batches p{nitro::from_dataset(stacked(n), sampler, batch), {.depth = 4, .workers = 3}};
      std::vector<Indices> got;
      for (std::size_t i = 0; i < k; ++i) got.push_back(values(p.next()->data));
      CHECK(got == std::vector<Indices>(expected.begin(), expected.begin() + static_cast<std::ptrdiff_t>(k)));
      wait_in_flight(p, 7);  // depth + workers batches made (or being made) ahead, none consumed
      CHECK(p.in_flight() == 7);
      st = sampler.state();  // counts what the consumer received, not what was made ahead
      CHECK(st.index == static_cast<std::int64_t>(k * batch));
      CHECK(st.epoch == 2);
    }
    // A new process: a fresh sampler loaded from the state, a new prefetcher.
    ResumableSampler fresh(n);
    fresh.load_state(st);
    Batches q{nitro::from_dataset(stacked(n), fresh, batch), {.depth = 4, .workers = 3}};
    CHECK(drain(q) == std::vector<Indices>(expected.begin() + static_cast<std::ptrdiff_t>(k), expected.end()));
    CHECK(fresh.state().index == static_cast<std::int64_t>(n));
  }
}

TEST_CASE("the same sampler behind a new prefetcher continues where the consumer stopped (rewind)") {
  const std::size_t n = 61, batch = 4;
  const std::vector<Indices> expected = batches_of(nitro::data::epoch_order(9, 0, n), batch);
  ResumableSampler sampler(n, {.seed = 9});
  std::vector<Indices> got;
  // Three prefetchers in turn, each stopped while batches were made ahead; no load_state.
  for (const std::size_t k : {3u, 4u}) {
    Batches p{nitro::from_dataset(stacked(n), sampler, batch), {.depth = 4, .workers = 3}};
    for (std::size_t i = 0; i < k; ++i) got.push_back(values(p.next()->data));
    wait_in_flight(p, 7);
    CHECK(p.in_flight() == 7);
  }
  CHECK(sampler.state().index == 7 * 4);
  {
    Batches p{nitro::from_dataset(stacked(n), sampler, batch), {.depth = 4, .workers = 3}};
    for (auto& b : p) got.push_back(values(b.data));
  }
  CHECK(got == expected);  // none skipped, none repeated
  CHECK(sampler.state().index == static_cast<std::int64_t>(n));

  // The epoch is read: a new prefetcher restarts it (torch's reset semantics), set_epoch moves on.
  {
    Batches p{nitro::from_dataset(stacked(n), sampler, batch), {.depth = 4, .workers = 3}};
    CHECK(drain(p) == expected);
  }
  sampler.set_epoch(1);
  {
    Batches p{nitro::from_dataset(stacked(n), sampler, batch), {.depth = 4, .workers = 3}};
    CHECK(drain(p) == batches_of(nitro::data::epoch_order(9, 1, n), batch));
  }
}

TEST_CASE("a batch whose production threw is not counted: the resumed run makes it again") {
  const std::size_t n = 40, batch = 4;
  const Indices order = nitro::data::epoch_order(3, 0, n);
  const std::vector<Indices> expected = batches_of(order, batch);
  const std::size_t bad_batch = 6;
  ResumableSampler sampler(n, {.seed = 3});
  {
    Batches p{nitro::from_dataset(stacked(n, static_cast<std::int64_t>(order[bad_batch * batch])), sampler, batch),
              {.depth = 4, .workers = 3}};
    for (std::size_t i = 0; i < bad_batch; ++i) CHECK(values(p.next()->data) == expected[i]);
    CHECK_THROWS_AS(p.next(), std::runtime_error);
    CHECK(sampler.state().index == static_cast<std::int64_t>(bad_batch * batch));
  }
  Batches q{nitro::from_dataset(stacked(n), sampler, batch), {.depth = 4, .workers = 3}};
  CHECK(drain(q) == std::vector<Indices>(expected.begin() + bad_batch, expected.end()));
}

TEST_CASE("copies share one state, and deferred delivery counts only delivered batches") {
  ResumableSampler a(10, {.seed = 1, .shuffle = false});
  ResumableSampler b = a;
  CHECK(b.next(3) == Indices{0, 1, 2});
  CHECK(a.state().index == 3);  // not deferred: counted at once
  CHECK(a.next(3) == Indices{3, 4, 5});
  CHECK(b.state().index == 6);

  a.defer_delivery(true);
  CHECK(b.delivery_deferred());
  CHECK(a.next(3) == Indices{6, 7, 8});
  CHECK(a.next(3) == Indices{9});
  CHECK_FALSE(a.next(3).has_value());
  CHECK(a.state().index == 6);
  a.delivered();
  CHECK(a.state().index == 9);
  a.rewind();  // {9} was claimed, not delivered: read again
  CHECK(a.state().index == 9);
  CHECK(a.next(3) == Indices{9});
  a.delivered();
  CHECK(a.state().index == 10);
  a.delivered();  // nothing claimed: nothing changes
  CHECK(a.state().index == 10);
}

TEST_CASE("an invalid state throws nitro::Error naming the field and changes nothing") {
  ResumableSampler s(20, {.seed = 4});
  s.set_epoch(1);
  REQUIRE(s.next(6).has_value());
  const SamplerState before = s.state();
  REQUIRE(before == SamplerState{.seed = 4, .epoch = 1, .index = 6, .size = 20, .shuffle = true});
  const SamplerState good{.seed = 99, .epoch = 3, .index = 10, .size = 20, .shuffle = true};

  SamplerState other_size = good;
  other_size.size = 21;
  CHECK_THROWS_WITH_AS(s.load_state(other_size), doctest::Contains("size is 21 in the saved state but 20 in this sampler"),
                       nitro::Error);
  SamplerState past_end = good;
  past_end.index = 21;
  CHECK_THROWS_WITH_AS(s.load_state(past_end), doctest::Contains("index is 21 in the saved state (this sampler's is 6)"),
                       nitro::Error);
  SamplerState negative_index = good;
  negative_index.index = -1;
  CHECK_THROWS_WITH_AS(s.load_state(negative_index), doctest::Contains("index is -1"), nitro::Error);
  SamplerState negative_epoch = good;
  negative_epoch.epoch = -2;
  CHECK_THROWS_WITH_AS(s.load_state(negative_epoch),
                       doctest::Contains("epoch is -2 in the saved state (this sampler's is 1)"), nitro::Error);

  CHECK(s.state() == before);
  const Indices order = nitro::data::epoch_order(4, 1, 20);
  CHECK(s.next(6) == Indices(order.begin() + 6, order.begin() + 12));

  // The edges are valid: index 0 and index == size (the epoch fully read).
  SamplerState at_end = good;
  at_end.index = 20;
  s.load_state(at_end);
  CHECK_FALSE(s.next(6).has_value());
  s.load_state(good);
  CHECK(s.state() == good);
  const Indices loaded = nitro::data::epoch_order(99, 3, 20);
  CHECK(s.next(4) == Indices(loaded.begin() + 10, loaded.begin() + 14));
}

TEST_CASE("reset keeps a loaded position once, checking the size, then restarts the epoch") {
  const Indices order = nitro::data::epoch_order(6, 2, 12);
  ResumableSampler s(12, {.seed = 6});
  s.load_state({.seed = 6, .epoch = 2, .index = 5, .size = 12, .shuffle = true});

  // The size does not match the loaded position: an error naming both, and the position stays.
  CHECK_THROWS_WITH_AS(s.reset(13), doctest::Contains("the data set has 13 samples, but the sampler's resumed position "
                                                      "is in an order of 12 samples"),
                       nitro::Error);
  CHECK(s.state().index == 5);

  s.reset(12);  // the first reset after load_state keeps the position
  CHECK(s.state().index == 5);
  CHECK(s.next(3) == Indices(order.begin() + 5, order.begin() + 8));
  s.reset(12);  // a later one restarts the same epoch's order at 0
  CHECK(s.state() == SamplerState{.seed = 6, .epoch = 2, .index = 0, .size = 12, .shuffle = true});
  CHECK(s.next(3) == Indices(order.begin(), order.begin() + 3));

  // load_state then next() before any reset: the reset after that restarts.
  s.load_state({.seed = 6, .epoch = 2, .index = 9, .size = 12, .shuffle = true});
  CHECK(s.next(2) == Indices(order.begin() + 9, order.begin() + 11));
  s.reset();
  CHECK(s.state().index == 0);

  // A plain reset may change the size (torch semantics): a new order of that size.
  s.reset(7);
  CHECK(s.size() == 7);
  CHECK(drain(s, 7) == std::vector<Indices>{nitro::data::epoch_order(6, 2, 7)});
  CHECK_THROWS_WITH_AS(s.reset(0), doctest::Contains("new size is 0"), nitro::Error);
}

TEST_CASE("save and load through torch archives keep the same fields, and load checks them") {
  ResumableSampler s(30, {.seed = 0xFEDCBA9876543210ULL});  // a seed above 2^63 survives the int64 archive
  s.set_epoch(5);
  REQUIRE(s.next(7).has_value());
  std::stringstream buffer;
  {
    torch::serialize::OutputArchive out;
    s.save(out);
    out.save_to(buffer);
  }
  ResumableSampler t(30, {.shuffle = false});
  {
    torch::serialize::InputArchive in;
    in.load_from(buffer);
    t.load(in);
  }
  CHECK(t.state() == SamplerState{.seed = 0xFEDCBA9876543210ULL, .epoch = 5, .index = 7, .size = 30, .shuffle = true});
  CHECK(t.next(30) == s.next(30));

  // An archive for another size is refused like load_state, and changes nothing.
  buffer.clear();
  buffer.seekg(0);
  ResumableSampler u(31);
  torch::serialize::InputArchive in;
  in.load_from(buffer);
  CHECK_THROWS_WITH_AS(u.load(in), doctest::Contains("size is 30 in the saved state but 31"), nitro::Error);
  CHECK(u.state() == SamplerState{.seed = 0, .epoch = 0, .index = 0, .size = 31, .shuffle = true});

  torch::serialize::InputArchive empty;
  std::stringstream nothing;
  {
    torch::serialize::OutputArchive out;
    out.write("epoch", c10::IValue(std::int64_t{1}));
    out.save_to(nothing);
  }
  empty.load_from(nothing);
  CHECK_THROWS_WITH_AS(u.load(empty), doctest::Contains("the archive has no 'seed'"), nitro::Error);
}

TEST_CASE("torch's own data loader reads a resumed sampler from its position") {
  const std::size_t n = 23, batch = 5;
  const std::vector<Indices> expected = batches_of(nitro::data::epoch_order(12, 0, n), batch);
  ResumableSampler sampler(n, {.seed = 12});
  sampler.load_state({.seed = 12, .epoch = 0, .index = 10, .size = static_cast<std::int64_t>(n), .shuffle = true});
  auto loader = torch::data::make_data_loader(stacked(n), sampler, torch::data::DataLoaderOptions(batch));
  std::vector<Indices> got;
  for (auto& b : *loader) got.push_back(values(b.data));
  CHECK(got == std::vector<Indices>(expected.begin() + 2, expected.end()));
  CHECK(sampler.state().index == static_cast<std::int64_t>(n));
}

TEST_CASE("one prefetcher over 3 epochs: one set of threads, and the batches of 3 separate prefetchers") {
  constexpr std::size_t n = 37, batch = 5, workers = 3;
  // Reference: a new prefetcher (new threads) per epoch over the sampler set to that epoch.
  std::vector<std::vector<Indices>> expected;
  const int before_separate = reader_threads.load();
  for (std::int64_t e = 0; e < 3; ++e) {
    ResumableSampler sampler(n, {.seed = 11});
    sampler.set_epoch(e);
    Batches p{nitro::from_dataset(stacked(n), sampler, batch), {.depth = 2, .workers = workers}};
    expected.push_back(drain(p));
    CHECK(p.threads_started() == workers);
  }
  // Threads that read: each prefetcher's are new (under load one may claim no batch, hence the range).
  const int separate_threads = reader_threads.load() - before_separate;
  CHECK(separate_threads >= 3);
  CHECK(separate_threads <= 3 * static_cast<int>(workers));
  // Each epoch is that epoch's order, cut into batches.
  for (std::int64_t e = 0; e < 3; ++e)
    CHECK(expected[static_cast<std::size_t>(e)] == batches_of(nitro::data::epoch_order(11, e, n), batch));

  const int before_one = reader_threads.load();
  ResumableSampler sampler(n, {.seed = 11});
  Batches p{nitro::from_dataset(stacked(n), sampler, batch), {.depth = 2, .workers = workers}};
  for (std::int64_t e = 0; e < 3; ++e) {
    p.set_epoch(e);
    CHECK(p.epoch() == e);
    CHECK(drain(p) == expected[static_cast<std::size_t>(e)]);
    CHECK_FALSE(p.next().has_value());  // an ended epoch stays ended until set_epoch
    CHECK(sampler.state().epoch == e);
    CHECK(sampler.state().index == static_cast<std::int64_t>(n));
  }
  CHECK(p.threads_started() == workers);
  // 24 batches over 3 epochs, read by no thread but the first epoch's workers.
  CHECK(reader_threads.load() - before_one >= 1);
  CHECK(reader_threads.load() - before_one <= static_cast<int>(workers));
}

TEST_CASE("set_epoch mid-epoch drops the batches made ahead, and a resumed epoch keeps its position") {
  constexpr std::size_t n = 40, batch = 4;
  ResumableSampler sampler(n, {.seed = 3});
  Batches p{nitro::from_dataset(stacked(n), sampler, batch), {.depth = 4, .workers = 2}};
  p.set_epoch(0);  // the epoch it reads already, nothing taken: kept
  auto first = p.next();
  REQUIRE(first.has_value());
  wait_in_flight(p, 4);
  p.set_epoch(1);  // three quarters of epoch 0 left unread
  CHECK(sampler.state().epoch == 1);
  CHECK(sampler.state().index == 0);
  const auto epoch1 = drain(p);
  CHECK(epoch1 == batches_of(nitro::data::epoch_order(3, 1, n), batch));

  // Stopped after 3 batches of epoch 2, resumed in a new sampler and prefetcher: the resumed loop's
  // set_epoch(2) keeps the loaded position, then epoch 3 is whole.
  p.set_epoch(2);
  for (int i = 0; i < 3; ++i) REQUIRE(p.next().has_value());
  const SamplerState saved = sampler.state();
  CHECK(saved.epoch == 2);
  CHECK(saved.index == 12);
  ResumableSampler again(n, {.seed = 3});
  again.load_state(saved);
  Batches q{nitro::from_dataset(stacked(n), again, batch), {.depth = 3, .workers = 3}};
  CHECK(q.epoch() == 2);
  q.set_epoch(2);
  const auto whole2 = batches_of(nitro::data::epoch_order(3, 2, n), batch);
  CHECK(drain(q) == std::vector<Indices>(whole2.begin() + 3, whole2.end()));
  q.set_epoch(3);
  CHECK(drain(q) == batches_of(nitro::data::epoch_order(3, 3, n), batch));
  CHECK_THROWS_WITH_AS(q.set_epoch(-1), doctest::Contains("give one >= 0"), nitro::Error);
}

TEST_CASE("an error ends one epoch only: the same workers read the next") {
  constexpr std::size_t n = 20, batch = 4;
  ResumableSampler sampler(n, {.seed = 5, .shuffle = false});
  Batches p{nitro::from_dataset(stacked(n, /*fail_at=*/9), sampler, batch), {.depth = 2, .workers = 2}};
  CHECK(p.next().has_value());
  CHECK(p.next().has_value());
  CHECK_THROWS_WITH_AS(p.next(), doctest::Contains("bad sample 9"), std::runtime_error);
  CHECK_FALSE(p.next().has_value());
  p.set_epoch(1);
  CHECK(p.next().has_value());  // samples 0..3 again
  CHECK(p.threads_started() == 2);
}

TEST_CASE("torch's RandomSampler through set_epoch: every epoch covers the data set, in a new order") {
  constexpr std::size_t n = 30;
  nitro::Prefetcher<nitro::Cpu, nitro::DatasetSource<Stacked, torch::data::samplers::RandomSampler>> p{
      nitro::from_dataset(stacked(n), torch::data::samplers::RandomSampler(n), 7), {.workers = 2}};
  std::vector<Indices> epochs;
  for (std::int64_t e = 0; e < 3; ++e) {
    p.set_epoch(e);
    Indices all;
    while (auto b = p.next()) {
      const auto v = values(b->data);
      all.insert(all.end(), v.begin(), v.end());
    }
    CHECK(all.size() == n);
    CHECK(is_permutation_of_iota(all));
    epochs.push_back(all);
  }
  CHECK((epochs[0] != epochs[1] || epochs[1] != epochs[2]));
}

}  // namespace nitro_test_data_sampler
