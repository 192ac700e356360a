// nitro::Prefetcher: order, exactly-once delivery, exceptions at their position, early destruction,
// bounded memory, the three kinds of source, bad options, and on a GPU the data arriving intact.
#include "testing.hpp"
#include "data/kept_batches.hpp"

#include <nitro/data/pipeline.hpp>
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/sampler.hpp>
#include <nitro/data/synthetic.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#if NITRO_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace nitro_test_data_prefetcher {  // one namespace per file: an area is compiled as one translation unit

namespace {

using namespace std::chrono_literals;

// Sample i is a tensor holding i; reading it takes a random 0-2 ms, so workers finish out of order.
// Counts the batches being made and not yet consumed.
struct SlowIndices : torch::data::datasets::BatchDataset<SlowIndices, at::Tensor, std::vector<std::size_t>> {
  std::size_t n = 0;
  std::shared_ptr<std::atomic<int>> started = std::make_shared<std::atomic<int>>(0);
  std::int64_t fail_at = -1;  // get_batch throws for the batch holding this index
  at::Tensor get_batch(std::vector<std::size_t> indices) override {
    ++*started;
    thread_local std::mt19937 rng(std::random_device{}());
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    for (auto i : indices)
      if (static_cast<std::int64_t>(i) == fail_at) throw std::runtime_error("bad sample " + std::to_string(i));
    std::vector<std::int64_t> v(indices.begin(), indices.end());
    return torch::tensor(v);
  }
  std::optional<std::size_t> size() const override { return n; }
};


std::vector<std::int64_t> values(const at::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

}  // namespace

TEST_CASE("many workers deliver every batch once in sampler order") {
  for (const std::size_t workers : {1u, 3u, 8u}) {
    CAPTURE(workers);
    SlowIndices data;
    data.n = 203;  // the last batch is short: the source ends mid-batch
    nitro::Prefetcher<nitro::Cpu, nitro::DatasetSource<SlowIndices, torch::data::samplers::SequentialSampler>> p{
        nitro::from_dataset(data, torch::data::samplers::SequentialSampler(data.n), 10), {.depth = 2, .workers = workers}};
    std::vector<std::int64_t> seen;
    std::size_t batches = 0;
    for (auto& batch : p) {
      auto v = values(batch);
      seen.insert(seen.end(), v.begin(), v.end());
      ++batches;
    }
    std::vector<std::int64_t> expected(203);
    std::iota(expected.begin(), expected.end(), 0);
    CHECK(seen == expected);
    CHECK(batches == 21);
    CHECK_FALSE(p.next().has_value());  // and stays ended
  }
}

TEST_CASE("a random sampler's order is kept too") {
  SlowIndices data;
  data.n = 100;
  torch::manual_seed(3);
  torch::data::samplers::RandomSampler reference(data.n);
  reference.reset(data.n);
  std::vector<std::int64_t> expected;
  while (auto idx = reference.next(7)) expected.insert(expected.end(), idx->begin(), idx->end());
  torch::manual_seed(3);
  auto p = nitro::prefetch<nitro::Cpu>(nitro::from_dataset(data, torch::data::samplers::RandomSampler(data.n), 7),
                                       {.depth = 3, .workers = 4});
  std::vector<std::int64_t> seen;
  for (auto& batch : p) {
    auto v = values(batch);
    seen.insert(seen.end(), v.begin(), v.end());
  }
  CHECK(seen == expected);
}

TEST_CASE("at most depth plus workers batches are made ahead of the consumer") {
  SlowIndices data;
  data.n = 400;
  const std::size_t depth = 2, workers = 3;
  auto p = nitro::prefetch<nitro::Cpu>(nitro::from_dataset(data, torch::data::samplers::SequentialSampler(data.n), 4),
                                       {.depth = depth, .workers = workers});
  int consumed = 0;
  int most = 0;
  for (auto& batch : p) {
    (void)batch;
    std::this_thread::sleep_for(1ms);  // a slow consumer lets the workers run ahead as far as allowed
    most = std::max(most, data.started->load() - consumed);
    CHECK(p.in_flight() <= depth + workers);
    ++consumed;
  }
  CHECK(consumed == 100);
  // Made or being made, not yet handed over: the window, plus the batch the consumer holds.
  CHECK(most <= static_cast<int>(depth + workers) + 1);
  CHECK(most >= static_cast<int>(depth));  // and it did run ahead
}

TEST_CASE("an exception from the source reaches the consumer at its batch") {
  SUBCASE("a callable source") {
    int calls = 0;
    auto p = nitro::prefetch<nitro::Cpu>(
        [&]() -> std::optional<at::Tensor> {
          if (++calls == 4) throw std::runtime_error("broken record");
          return torch::full({1}, calls);
        },
        {.depth = 2});
    for (int i = 1; i <= 3; ++i) CHECK(p.next()->item<float>() == i);
    CHECK_THROWS_WITH_AS(p.next(), "broken record", std::runtime_error);
    CHECK_FALSE(p.next().has_value());  // the epoch ended there
    CHECK(calls == 4);                  // and the source was not called again
  }
  SUBCASE("a worker of a data set source") {
    SlowIndices data;
    data.n = 100;
    data.fail_at = 55;  // in batch 5 (indices 50..59)
    auto p = nitro::prefetch<nitro::Cpu>(
        nitro::from_dataset(data, torch::data::samplers::SequentialSampler(data.n), 10), {.depth = 2, .workers = 4});
    for (int b = 0; b < 5; ++b) CHECK(values(*p.next()).front() == b * 10);
    CHECK_THROWS_WITH_AS(p.next(), "bad sample 55", std::runtime_error);
    CHECK_FALSE(p.next().has_value());
  }
}

TEST_CASE("batches made past an error are freed when it ends the epoch, not kept until set_epoch") {
  nitro::test::KeptBatches data;
  data.n = 100;
  data.fail_at = 10;  // batch 1 fails, after the workers made batches 2.. ahead
  auto p = nitro::prefetch<nitro::Cpu>(
      nitro::from_dataset(data, torch::data::samplers::SequentialSampler(data.n), 10), {.depth = 4, .workers = 4});
  CHECK(values(*p.next()).front() == 0);
  CHECK_THROWS_WITH_AS(p.next(), "bad sample 10", std::runtime_error);
  {
    std::lock_guard guard(data.made->mutex);
    CHECK(data.made->batches.size() >= 3);  // some were made ahead
  }
  CHECK(data.only_kept_held({}));
  CHECK_FALSE(p.next().has_value());
}

TEST_CASE("destroying the prefetcher mid-epoch stops its busy workers promptly") {
  std::atomic<int> made{0};
  struct Slow : torch::data::datasets::BatchDataset<Slow, at::Tensor, std::vector<std::size_t>> {
    std::atomic<int>* made;
    at::Tensor get_batch(std::vector<std::size_t>) override {
      std::this_thread::sleep_for(20ms);
      ++*made;
      return torch::zeros({1});
    }
    std::optional<std::size_t> size() const override { return 100000; }
  };
  Slow slow;
  slow.made = &made;
  const auto start = std::chrono::steady_clock::now();
  {
    auto p = nitro::prefetch<nitro::Cpu>(
        nitro::from_dataset(slow, torch::data::samplers::SequentialSampler(100000), 1), {.depth = 4, .workers = 4});
    CHECK(p.next().has_value());
  }  // workers are inside get_batch here
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < 1s);  // a hang or a drain of the 100000 batches would take far longer
  CHECK(made.load() <= 1 + 4 + 4);
}

TEST_CASE("depth 1 and an empty source work") {
  int n = 0;
  auto p = nitro::prefetch<nitro::Cpu>(
      [&]() -> std::optional<at::Tensor> {
        if (n == 5) return std::nullopt;
        return torch::full({1}, n++);
      },
      {.depth = 1});
  int i = 0;
  for (auto& t : p) CHECK(t.item<float>() == i++);
  CHECK(i == 5);

  int body = 0;
  auto empty = nitro::prefetch<nitro::Cpu>([]() -> std::optional<at::Tensor> { return std::nullopt; });
  for (auto& t : empty) {
    (void)t;
    ++body;
  }
  CHECK(body == 0);
}

TEST_CASE("a torch::data loader feeds the prefetcher the same batches it gives directly") {
  nitro::data::SyntheticImages images{{.size = 96, .seed = 5}};
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      images.map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(16).workers(2));
  std::vector<torch::data::Example<>> direct;
  for (auto& b : *loader) direct.push_back(b);
  auto p = nitro::prefetch<nitro::Cpu>(nitro::from_loader(*loader), {.depth = 2});
  std::size_t i = 0;
  for (auto& b : p) {
    REQUIRE(i < direct.size());
    CHECK(torch::equal(b.data, direct[i].data));
    CHECK(torch::equal(b.target, direct[i].target));
    ++i;
  }
  CHECK(i == direct.size());
}

TEST_CASE("set_epoch on a loader with workers drops the rest of the pass and begins the next") {
  // torch's DataLoader refuses a new begin() while the old pass has jobs in flight: set_epoch mid-epoch
  // must read the old pass out first.
  nitro::data::SyntheticImages images{{.size = 40, .seed = 5}};
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      images.map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(4).workers(2));
  nitro::Prefetcher<nitro::Cpu, nitro::LoaderSource<std::remove_reference_t<decltype(*loader)>>> p{
      nitro::from_loader(*loader), {.depth = 2}};
  REQUIRE(p.next().has_value());  // one batch of epoch 0 taken, the rest in flight
  for (int e = 1; e <= 3; ++e) {
    p.set_epoch(e);
    int got = 0;
    std::int64_t first = -1;
    while (auto b = p.next()) {
      if (got == 0) first = b->target[0].item<std::int64_t>();
      ++got;
    }
    CHECK(got == 10);
    CHECK(first == images.get(0).target.item<std::int64_t>());
    p.set_epoch(e + 10);  // and mid-epoch again
    REQUIRE(p.next().has_value());
  }
}

namespace {

// Sample i holds i; every sample of the batch holding `fail_at` throws; `gets` counts samples read.
struct Counted : torch::data::datasets::Dataset<Counted> {
  std::size_t n = 40;
  std::int64_t fail_at = -1;
  std::shared_ptr<std::atomic<int>> gets = std::make_shared<std::atomic<int>>(0);
  torch::data::Example<> get(std::size_t i) override {
    ++*gets;
    if (fail_at >= 0 && i / 4 == static_cast<std::size_t>(fail_at) / 4) throw std::runtime_error("bad sample");
    const auto v = static_cast<std::int64_t>(i);
    return {torch::tensor(v), torch::tensor(v)};
  }
  [[nodiscard]] std::optional<std::size_t> size() const override { return n; }
};

// A stateful reader of 6 batches (batch k holds k), begun again by reset(); torch's workers share it.
struct Records : torch::data::datasets::StatefulDataset<Records, at::Tensor, std::size_t> {
  std::shared_ptr<std::atomic<std::int64_t>> pos = std::make_shared<std::atomic<std::int64_t>>(0);
  std::optional<at::Tensor> get_batch(std::size_t n) override {
    const auto k = (*pos)++;
    if (k >= 6) return std::nullopt;
    return torch::full({static_cast<std::int64_t>(n)}, k);
  }
  [[nodiscard]] std::optional<std::size_t> size() const override { return std::nullopt; }
  void reset() override { *pos = 0; }
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}
};

template <class Source>
std::int64_t first_of(Source& source) {
  auto b = source.claim();
  if (!b) return -1;
  if constexpr (requires { b->data; }) {
    REQUIRE(b->data.defined());
    return b->data[0].template item<std::int64_t>();
  } else {
    return (*b)[0].template item<std::int64_t>();
  }
}

}  // namespace

TEST_CASE("a loader's failed batch is the error of its own claim: the batches before it arrive, the next goes on") {
  for (const std::size_t workers : {0, 2}) {
    CAPTURE(workers);
    Counted data;
    data.n = 24;
    data.fail_at = 12;  // batch 3 of 6
    auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
        data.map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(4).workers(workers));
    auto source = nitro::from_loader(*loader);
    CHECK(first_of(source) == 0);
    CHECK(first_of(source) == 4);
    CHECK(first_of(source) == 8);
    CHECK_THROWS_AS(first_of(source), std::exception);
    CHECK(first_of(source) == 16);  // the batch after the failed one, not the one before again
    CHECK(first_of(source) == 20);
    CHECK(first_of(source) == -1);

    // Through a prefetcher: batches 0-2, then the error, which ends the epoch; the next epoch is whole.
    nitro::Prefetcher<nitro::Cpu, nitro::LoaderSource<std::remove_reference_t<decltype(*loader)>>> p{
        nitro::from_loader(*loader), {.depth = 2}};
    for (int e = 0; e < 2; ++e) {
      p.set_epoch(e);
      for (const std::int64_t want : {0, 4, 8}) {
        auto b = p.next();
        REQUIRE(b.has_value());
        CHECK(b->data[0].item<std::int64_t>() == want);
      }
      CHECK_THROWS_AS(p.next(), std::exception);
      CHECK_FALSE(p.next().has_value());
    }
  }
}

namespace {
// Batch 0 fails after the batches behind it were made (torch holds them back, in order) while `fail`
// is set; batch i holds i.
struct LateFailure : torch::data::datasets::BatchDataset<LateFailure, at::Tensor, std::vector<std::size_t>> {
  std::shared_ptr<std::atomic<bool>> fail = std::make_shared<std::atomic<bool>>(true);
  at::Tensor get_batch(std::vector<std::size_t> indices) override {
    if (indices[0] == 0 && *fail) {
      std::this_thread::sleep_for(200ms);
      throw std::runtime_error("bad batch 0");
    }
    return torch::tensor({static_cast<std::int64_t>(indices[0])});
  }
  [[nodiscard]] std::optional<std::size_t> size() const override { return 20; }
};
}  // namespace

TEST_CASE("a loader's pass read on after an error is still ended by set_epoch") {
  // The failed batch comes last: no job is left in the loader when it throws, and the claim after it
  // (batch 1, held back by torch) queues new ones, which set_epoch must drain.
  LateFailure data;
  auto fail = data.fail;
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      data, torch::data::DataLoaderOptions(1).workers(2));
  auto source = nitro::from_loader(*loader);
  CHECK_THROWS_WITH_AS(first_of(source), doctest::Contains("bad batch 0"), torch::data::WorkerException);
  CHECK(first_of(source) == 1);
  *fail = false;
  source.set_epoch(1);
  CHECK(first_of(source) == 0);
}

TEST_CASE("set_epoch on a loader without workers begins again at once, with workers after the jobs in flight") {
  for (const std::size_t workers : {0, 2}) {
    CAPTURE(workers);
    Counted data;  // 10 batches of 4
    auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
        data.map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(4).workers(workers));
    auto source = nitro::from_loader(*loader);
    CHECK(first_of(source) == 0);
    CHECK(first_of(source) == 4);
    source.set_epoch(1);
    // Without workers nothing more of the old pass is read; with them at most the jobs torch had
    // queued (4 ahead, one more per batch taken: 6 batches of 4), not the rest of the pass (40).
    if (workers == 0) {
      CHECK(*data.gets == 8);
    } else {
      CHECK(*data.gets >= 8);
      CHECK(*data.gets <= 24);
    }
    CHECK(first_of(source) == 0);
    CHECK(first_of(source) == 4);
  }
  // A stateful loader: begin() resets the data set; with workers, after the jobs in flight.
  for (const std::size_t workers : {0, 2}) {
    CAPTURE(workers);
    auto loader = torch::data::make_data_loader(Records{}, torch::data::DataLoaderOptions(3).workers(workers));
    auto source = nitro::from_loader(*loader);
    CHECK(first_of(source) >= 0);
    CHECK(first_of(source) >= 0);
    source.set_epoch(1);
    std::vector<std::int64_t> got;  // workers may finish the batches in any order
    for (auto k = first_of(source); k >= 0; k = first_of(source)) got.push_back(k);
    std::sort(got.begin(), got.end());
    CHECK(got == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5});
  }
}

TEST_CASE("a prefetcher or pipeline over a loader, destroyed mid-epoch, leaves the loader ready for a new pass") {
  // torch refuses begin() while a pass has jobs in flight: the source ends its pass when destroyed.
  static_assert(nitro::detail::LoaderInternals<torch::data::StatelessDataLoader<
                    torch::data::datasets::MapDataset<Counted, torch::data::transforms::Stack<>>,
                    torch::data::samplers::SequentialSampler>>::reachable());
  Counted data;  // 10 batches of 4
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      data.map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(4).workers(2));
  auto whole_pass = [&] {
    std::vector<std::int64_t> firsts;
    for (auto& b : *loader) firsts.push_back(b.data[0].item<std::int64_t>());
    return firsts;
  };
  const std::vector<std::int64_t> all{0, 4, 8, 12, 16, 20, 24, 28, 32, 36};
  {
    auto p = nitro::prefetch<nitro::Cpu>(nitro::from_loader(*loader), {.depth = 2});
    REQUIRE(p.next().has_value());
  }
  CHECK(*data.gets < 40);  // the rest of the pass was not read
  CHECK(whole_pass() == all);
  {
    auto pipe = nitro::data::pipeline(nitro::from_loader(*loader), {.name = "read"},
                                      nitro::data::stage({.name = "same"}, [](torch::data::Example<> b) { return b; }));
    REQUIRE(pipe.next().has_value());
  }
  CHECK(whole_pass() == all);
  {  // a source moved from does not end the pass of the one it moved to
    std::optional<decltype(nitro::from_loader(*loader))> a{nitro::from_loader(*loader)};
    CHECK(first_of(*a) == 0);
    auto b = std::move(*a);
    CHECK(first_of(b) == 4);
    while (first_of(b) >= 0) {
    }
    CHECK(first_of(*a) == 0);  // a source moved from begins a pass of its own, from its start
    auto c = std::move(b);     // a pass that ended
    c = std::move(*a);         // takes over a's pass
    CHECK(first_of(c) == 4);
    a.reset();
    CHECK(first_of(c) == 8);
  }
  CHECK(whole_pass() == all);
  {  // a source whose pass ended leaves alone the pass another reader began since
    auto ended = std::make_optional(nitro::from_loader(*loader));
    while (first_of(*ended) >= 0) {
    }
    std::vector<std::int64_t> firsts;
    for (auto& batch : *loader) {
      firsts.push_back(batch.data[0].item<std::int64_t>());
      if (firsts.size() == 2) ended.reset();
    }
    CHECK(firsts == all);
  }
}

namespace {

// Five items holding 0-4 per epoch; set_epoch throws while `refuse` is set.
struct Refusing {
  using batch_type = at::Tensor;
  using ticket_type = at::Tensor;
  static constexpr bool parallel = false;
  std::shared_ptr<std::atomic<bool>> refuse = std::make_shared<std::atomic<bool>>(false);
  std::int64_t next = 0;
  std::optional<at::Tensor> claim() {
    if (next == 5) return std::nullopt;
    return torch::full({1}, next++);
  }
  at::Tensor produce(at::Tensor&& t) { return std::move(t); }
  void set_epoch(std::int64_t /*epoch*/) {
    if (*refuse) throw std::runtime_error("cannot start the epoch");
    next = 0;
  }
};

}  // namespace

TEST_CASE("a source that fails to start an epoch leaves the prefetcher (or pipeline) between epochs until a set_epoch succeeds") {
  Refusing source;
  auto refuse = source.refuse;
  nitro::Prefetcher<nitro::Cpu, Refusing> p{source, {.depth = 2}};
  *refuse = true;
  CHECK_THROWS_WITH_AS(p.set_epoch(1), "cannot start the epoch", std::runtime_error);
  CHECK_FALSE(p.next().has_value());
  *refuse = false;
  p.set_epoch(0);  // the epoch it was reading, nothing of it taken: still started again, not kept ended
  std::int64_t n = 0;
  while (auto b = p.next()) CHECK(b->item<std::int64_t>() == n++);
  CHECK(n == 5);

  Refusing read;
  auto refuse_read = read.refuse;
  auto pipe = nitro::data::pipeline(read, {.name = "read"},
                                    nitro::data::stage({.name = "twice"}, [](at::Tensor t) { return t * 2; }));
  *refuse_read = true;
  CHECK_THROWS_WITH_AS(pipe.set_epoch(1), "cannot start the epoch", std::runtime_error);
  CHECK_FALSE(pipe.next().has_value());
  pipe.rewind();  // does not reopen the epoch before the failed set_epoch
  CHECK_FALSE(pipe.next().has_value());
  *refuse_read = false;
  pipe.set_epoch(0);
  n = 0;
  while (auto b = pipe.next()) CHECK(b->item<std::int64_t>() == 2 * n++);
  CHECK(n == 5);
}

TEST_CASE("the transform runs on each batch") {
  int n = 0;
  auto p = nitro::prefetch<nitro::Cpu>(
      [&]() -> std::optional<at::Tensor> {
        if (n == 3) return std::nullopt;
        return torch::full({2}, n++, torch::kUInt8);
      },
      {.transform = [](at::Tensor t) { return t.to(torch::kFloat).div(2); }});
  int i = 0;
  for (auto& t : p) {
    CHECK(t.scalar_type() == torch::kFloat);
    CHECK(t[0].item<float>() == doctest::Approx(i++ / 2.0));
  }
}

TEST_CASE("bad options throw nitro::Error naming the option") {
  auto source = []() -> std::optional<at::Tensor> { return std::nullopt; };
  CHECK_THROWS_WITH_AS(nitro::prefetch<nitro::Cpu>(source, {.depth = 0}), doctest::Contains("depth is 0"),
                       nitro::Error);
  SlowIndices data;
  data.n = 10;
  CHECK_THROWS_WITH_AS(nitro::prefetch<nitro::Cpu>(
                           nitro::from_dataset(data, torch::data::samplers::SequentialSampler(10), 2), {.workers = 0}),
                       doctest::Contains("workers is 0"), nitro::Error);
  if (!nitro::Cuda::available()) {
    CHECK_THROWS_AS(nitro::prefetch<nitro::Cuda>(source), nitro::Error);
    // The CPU prefetcher stays usable.
    CHECK_FALSE(nitro::prefetch<nitro::Cpu>(source).next().has_value());
  }
}

TEST_CASE("gpu: batches arrive intact and the pinned pool is reused" * nitro::test::needs_gpu()) {
  SlowIndices data;
  data.n = 640;
  auto p = nitro::prefetch<nitro::Cuda>(
      nitro::from_dataset(data, torch::data::samplers::SequentialSampler(data.n), 64), {.depth = 2, .workers = 2});
  std::int64_t next = 0;
  for (auto& batch : p) {
    CHECK(batch.is_cuda());
    auto v = values(batch.cpu());
    for (auto x : v) CHECK(x == next++);
  }
  CHECK(next == 640);
#if NITRO_WITH_CUDA
  // Ten batches through a window of four: buffers came back and were used again.
  CHECK(p.pinned_pool().reused() > 0);
  CHECK(p.pinned_pool().allocated() <= 4);
#endif
}

TEST_CASE("gpu: the copies run while the consumer's stream is busy" * nitro::test::needs_gpu()) {
#if NITRO_WITH_CUDA
  // Timeline by events: the consumer's stream gets a long kernel; the prefetcher's copy of the next
  // batch completes on its copy stream before that kernel ends.
  auto host = torch::rand({16 << 20});  // 64 MB
  std::atomic<bool> go{false};
  auto p = nitro::prefetch<nitro::Cuda>(
      [&, n = 0]() mutable -> std::optional<at::Tensor> {
        if (n++ == 2) return std::nullopt;
        if (n == 2)
          while (!go) std::this_thread::sleep_for(100us);  // the second copy starts after the kernel
        return host;
      },
      {.depth = 2});
  auto first = p.next();
  REQUIRE(first.has_value());
  auto a = torch::randn({4096, 4096}, torch::TensorOptions().device(torch::kCUDA));
  at::cuda::CUDAEvent kernel_done;
  auto x = a;
  for (int i = 0; i < 40; ++i) x = torch::mm(x, a).mul_(1e-4);  // hundreds of ms on the consumer's stream
  kernel_done.record(c10::cuda::getCurrentCUDAStream());
  go = true;
  auto second = p.next();
  REQUIRE(second.has_value());
  p.copy_stream().synchronize();     // the second batch's copy is done ...
  CHECK_FALSE(kernel_done.query());  // ... while the consumer's kernel is still running
  CHECK(torch::equal(second->cpu(), host));
  c10::cuda::device_synchronize();
#endif
}

TEST_CASE("a device option of the wrong kind is refused") {
  auto source = []() -> std::optional<at::Tensor> { return std::nullopt; };
  CHECK_THROWS_WITH_AS(nitro::prefetch<nitro::Cpu>(source, {.device = c10::Device(c10::kCUDA, 0)}),
                       doctest::Contains("not a cpu device"), nitro::Error);
  CHECK(nitro::prefetch<nitro::Cpu>(source, {.device = c10::Device(c10::kCPU)}).device() == c10::Device(c10::kCPU));
}

namespace {
// Every batch of `p`, as the values it holds (on the host).
template <class P>
std::vector<std::vector<std::int64_t>> drain_values(P& p) {
  std::vector<std::vector<std::int64_t>> out;
  while (auto b = p.next()) out.push_back(values(b->cpu()));
  return out;
}

// Waits (bounded) until `p` has made `count` batches ahead.
template <class P>
void wait_in_flight(const P& p, std::size_t count) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (p.in_flight() < count && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
}
}  // namespace

TEST_CASE("Prefetcher<Auto> on the CPU delivers what Prefetcher<Cpu> does: order, values, the batches themselves, exact resume") {
  const std::size_t n = 61, batch = 4;  // 16 batches, the last of 1
  using Sampler = nitro::data::ResumableSampler;
  using Source = nitro::DatasetSource<SlowIndices, Sampler>;
  SlowIndices data;
  data.n = n;
  const c10::Device cpu(c10::kCPU);
  std::vector<std::vector<std::int64_t>> expected;
  {
    Sampler sampler(n, {.seed = 5});
    nitro::Prefetcher<nitro::Cpu, Source> p{nitro::from_dataset(data, sampler, batch), {.depth = 4, .workers = 3}};
    expected = drain_values(p);
  }
  REQUIRE(expected.size() == 16);
  {
    Sampler sampler(n, {.seed = 5});
    nitro::Prefetcher<nitro::Auto, Source> p{nitro::from_dataset(data, sampler, batch),
                                             {.depth = 4, .workers = 3, .device = cpu}};
    CHECK(p.device() == cpu);
    CHECK(drain_values(p) == expected);
    CHECK(sampler.state().index == static_cast<std::int64_t>(n));
  }
  // Stopped after k batches with depth + workers made ahead; a fresh sampler loaded from the state
  // reads exactly the rest.
  for (const std::size_t k : {1u, 9u}) {
    CAPTURE(k);
    Sampler sampler(n, {.seed = 5});
    nitro::data::SamplerState st;
    {
      nitro::Prefetcher<nitro::Auto, Source> p{nitro::from_dataset(data, sampler, batch),
                                               {.depth = 4, .workers = 3, .device = cpu}};
      std::vector<std::vector<std::int64_t>> got;
      for (std::size_t i = 0; i < k; ++i) got.push_back(values(*p.next()));
      CHECK(got == std::vector<std::vector<std::int64_t>>(expected.begin(), expected.begin() + static_cast<std::ptrdiff_t>(k)));
      wait_in_flight(p, 7);
      CHECK(p.in_flight() == 7);
      st = sampler.state();
      CHECK(st.index == static_cast<std::int64_t>(k * batch));
    }
    Sampler fresh(n);
    fresh.load_state(st);
    nitro::Prefetcher<nitro::Auto, Source> q{nitro::from_dataset(data, fresh, batch),
                                             {.depth = 4, .workers = 3, .device = cpu}};
    CHECK(drain_values(q) == std::vector<std::vector<std::int64_t>>(expected.begin() + static_cast<std::ptrdiff_t>(k), expected.end()));
  }
  // No copy, as Prefetcher<Cpu>: the consumer gets the tensor the source returned, transformed on the host.
  const auto kept = torch::arange(8, torch::kLong);
  auto source = [kept, n = 0]() mutable -> std::optional<at::Tensor> {
    if (n++ == 2) return std::nullopt;
    return kept;
  };
  auto p = nitro::prefetch<nitro::Auto>(source, {.device = cpu});
  for (auto& b : p) CHECK(b.is_same(kept));
  int transformed = 0;
  auto t = nitro::prefetch<nitro::Auto>(source, {.transform = [&](at::Tensor b) { ++transformed; return b + 1; },
                                                 .device = cpu});
  for (auto& b : t) CHECK(torch::equal(b, kept + 1));
  CHECK(transformed == 2);
}

TEST_CASE("Prefetcher<Auto>: unset, the device is Auto::device(), and a CUDA device without a GPU, or another kind, throws") {
  auto source = []() -> std::optional<at::Tensor> { return std::nullopt; };
  CHECK(nitro::prefetch<nitro::Auto>(source).device().type() == nitro::Auto::device().type());
  CHECK_THROWS_WITH_AS(nitro::prefetch<nitro::Auto>(source, {.device = c10::Device(c10::kMeta)}),
                       doctest::Contains("nitro::Prefetcher<Auto>: device is meta; give the CPU or a CUDA device"),
                       nitro::Error);
  if (nitro::Cuda::available()) {
    MESSAGE("a GPU is present: the no-GPU error is not reachable here");
    return;
  }
  CHECK(nitro::prefetch<nitro::Auto>(source).device() == c10::Device(c10::kCPU));
  for (const auto cuda : {c10::Device(c10::kCUDA), c10::Device(c10::kCUDA, 1)}) {
    CAPTURE(cuda);
    CHECK_THROWS_WITH_AS(nitro::prefetch<nitro::Auto>(source, {.device = cuda}),
                         doctest::Contains(NITRO_WITH_CUDA ? "but no CUDA device is available in this process"
                                                           : "but Nitro was built without CUDA"),
                         nitro::Error);
  }
}

#if NITRO_WITH_CUDA
namespace {
// A source of `count` batches made by `make(n)`.
template <class Make>
auto counted(int count, Make make) {
  return [count, make, n = 0]() mutable -> std::optional<at::Tensor> {
    if (n == count) return std::nullopt;
    return make(n++);
  };
}
}  // namespace
#endif

TEST_CASE("gpu: batches go to the device given, not to the current one" * nitro::test::needs_gpu()) {
#if NITRO_WITH_CUDA
  const bool two = nitro::test::gpu_count() >= 2;
  const c10::Device target = two ? c10::Device(c10::kCUDA, 1) : c10::Device(c10::kCUDA, 0);
  c10::cuda::CUDAGuard current(0);
  auto p = nitro::prefetch<nitro::Cuda>(counted(6, [](int n) { return torch::full({1024}, n, torch::kFloat); }),
                                        {.depth = 2, .workers = 1, .device = target});
  CHECK(p.device() == target);
  CHECK(p.copy_stream().device() == target);
  std::vector<at::Tensor> sums;
  for (auto& b : p) {
    CHECK(b.device() == target);
    sums.push_back(b.sum());  // on the consumer's stream of the target device: no synchronisation
  }
  const auto got = torch::stack(sums).cpu();
  for (int n = 0; n < 6; ++n) CHECK(got[n].item<float>() == 1024.0f * static_cast<float>(n));
  // `cuda` without an index is the device current when the prefetcher is made.
  CHECK(nitro::prefetch<nitro::Cuda>(counted(0, [](int) { return at::Tensor(); })).device() == c10::Device(c10::kCUDA, 0));
  CHECK_THROWS_WITH_AS(nitro::prefetch<nitro::Cuda>(counted(0, [](int) { return at::Tensor(); }),
                                                    {.device = c10::Device(c10::kCUDA, 64)}),
                       doctest::Contains("does not exist"), nitro::Error);
  if (!two) MESSAGE("one GPU: the non-default device index is not exercised");
#endif
}

TEST_CASE("gpu: a transform and channels_last run on the copy stream, after the constants they captured" * nitro::test::needs_gpu()) {
#if NITRO_WITH_CUDA
  // The constant is made by a kernel on the constructing thread's stream just before the prefetcher:
  // the copy stream must wait for it.
  auto mean = torch::zeros({1, 3, 1, 1}, torch::kCUDA);
  for (int i = 0; i < 50; ++i) mean.add_(0.01);
  std::atomic<std::int64_t> transform_stream{-1};
  std::atomic<int> channels_last_inputs{0};
  using Options = nitro::PrefetchOptions<at::Tensor>;
  Options options;
  options.channels_last = true;
  options.transform = [mean, &transform_stream, &channels_last_inputs](at::Tensor b) {
    transform_stream = c10::cuda::getCurrentCUDAStream(b.device().index()).id();
    channels_last_inputs += b.is_contiguous(c10::MemoryFormat::ChannelsLast) ? 1 : 0;
    return (b.to(torch::kFloat) / 255.0 - mean);
  };
  const auto image = [](int n) {
    return (torch::arange(2 * 3 * 16 * 16, torch::kLong).reshape({2, 3, 16, 16}) + n).remainder(256).to(torch::kUInt8);
  };
  nitro::Prefetcher<nitro::Cuda, decltype(counted(4, image))> p{counted(4, image), std::move(options)};
  int n = 0;
  for (auto& b : p) {
    CHECK(b.scalar_type() == torch::kFloat);
    const auto expected = image(n++).to(torch::kFloat) / 255.0 - 0.5;
    CHECK(torch::allclose(b.cpu(), expected, 1e-4, 1e-4));  // 0.5 as fifty float additions of 0.01
  }
  CHECK(n == 4);
  CHECK(channels_last_inputs.load() == 4);
  CHECK(transform_stream.load() == p.copy_stream().id());
#endif
}

TEST_CASE("gpu: a source that refills one pinned tensor in place still delivers every batch intact" * nitro::test::needs_gpu()) {
#if NITRO_WITH_CUDA
  // No .cpu() between batches: the consumer keeps device-side sums and reads them at the end, so
  // nothing slows the worker down while a copy from the refilled memory may be in flight.
  for (const bool pin : {true, false}) {
    CAPTURE(pin);
    auto buffer = torch::empty({16 << 20}, torch::kFloat).pin_memory();  // 64 MB, refilled per batch
    const int batches = 12;
    auto p = nitro::prefetch<nitro::Cuda>(counted(batches, [buffer](int n) {
                                            buffer.fill_(static_cast<float>(n));
                                            return buffer;
                                          }),
                                          {.depth = 4, .pin_memory = pin});
    std::vector<at::Tensor> sums;
    for (auto& b : p) sums.push_back(b.sum(torch::kDouble));
    const auto got = torch::stack(sums).cpu();
    REQUIRE(got.numel() == batches);
    for (int n = 0; n < batches; ++n) CHECK(got[n].item<double>() == static_cast<double>(16 << 20) * n);
  }
#endif
}

TEST_CASE("gpu: CUDA tensors a source computes are read after the kernels that make them" * nitro::test::needs_gpu()) {
#if NITRO_WITH_CUDA
  // The source's kernels run on the worker's current (default) stream; the transform on the copy
  // stream must see their result, not a half-updated tensor.
  using Options = nitro::PrefetchOptions<at::Tensor>;
  Options options;
  options.transform = [](at::Tensor b) { return b * 2; };
  auto source = counted(6, [](int n) {
    auto t = torch::zeros({8 << 20}, torch::kCUDA);
    for (int i = 0; i < 100; ++i) t.add_(1.0);  // a long chain on the source's stream
    return t.add_(n);
  });
  nitro::Prefetcher<nitro::Cuda, decltype(source)> p{source, std::move(options)};
  std::vector<at::Tensor> sums;
  for (auto& b : p) sums.push_back(b.sum(torch::kDouble));
  const auto got = torch::stack(sums).cpu();
  for (int n = 0; n < 6; ++n) CHECK(got[n].item<double>() == 2.0 * (100 + n) * (8 << 20));
#endif
}

TEST_CASE("gpu: Prefetcher<Auto> given a GPU delivers, staged in pinned memory and copied, what Prefetcher<Cuda> does" * nitro::test::needs_gpu()) {
#if NITRO_WITH_CUDA
  SlowIndices data;
  data.n = 640;
  const auto sequential = [&] { return nitro::from_dataset(data, torch::data::samplers::SequentialSampler(data.n), 64); };
  auto reference = nitro::prefetch<nitro::Cuda>(sequential(), {.depth = 2, .workers = 2});
  std::vector<at::Tensor> expected;
  for (auto& b : reference) expected.push_back(b.cpu());
  REQUIRE(expected.size() == 10);

  std::atomic<std::int64_t> transform_stream{-1};
  using Options = nitro::PrefetchOptions<at::Tensor>;
  Options options;
  options.depth = 2;
  options.workers = 2;
  options.device = c10::Device(c10::kCUDA);  // as a ported program passes it: the current GPU
  options.transform = [&transform_stream](at::Tensor b) {
    transform_stream = c10::cuda::getCurrentCUDAStream(b.device().index()).id();
    return b;
  };
  nitro::Prefetcher<nitro::Auto, decltype(sequential())> p{sequential(), std::move(options)};
  CHECK(p.device() == reference.device());  // concrete: cuda:<current>
  CHECK(p.copy_stream().device() == p.device());
  std::size_t i = 0;
  for (auto& b : p) {
    CHECK(b.device() == p.device());
    REQUIRE(i < expected.size());
    CHECK(torch::equal(b.cpu(), expected[i++]));
  }
  CHECK(i == expected.size());
  CHECK(transform_stream.load() == p.copy_stream().id());  // the transform ran on the copy stream
  // Staged in the pinned pool, whose buffers came back: ten batches through a window of four. The
  // allocation count is the process's: the reference prefetcher above left blocks of the same size in
  // LibTorch's host cache, so this one may allocate none at all (it did on an H100), never more than
  // its window.
  CHECK(p.pinned_pool().staged() == expected.size());
  CHECK(p.pinned_pool().allocated() <= 4);
  CHECK(p.pinned_pool().reused() > 0);
  // Unset, the device is the current GPU; the CPU given on the same machine copies nothing.
  CHECK(nitro::prefetch<nitro::Auto>(counted(0, [](int) { return at::Tensor(); })).device() == reference.device());
  auto on_cpu = nitro::prefetch<nitro::Auto>(counted(2, [](int n) { return torch::full({4}, n, torch::kLong); }),
                                             {.device = c10::Device(c10::kCPU)});
  for (auto& b : on_cpu) CHECK(b.is_cpu());
  CHECK(on_cpu.pinned_pool().allocated() == 0);
  CHECK_THROWS_WITH_AS((void)on_cpu.copy_stream(), doctest::Contains("has no copy stream"), nitro::Error);
#endif
}

}  // namespace nitro_test_data_prefetcher
