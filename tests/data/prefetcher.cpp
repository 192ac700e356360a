// nitro::Prefetcher: order, exactly-once delivery, exceptions at their position, early destruction,
// bounded memory, the three kinds of source, bad options, and on a GPU the data arriving intact.
#include "testing.hpp"

#include <nitro/data/prefetcher.hpp>
#include <nitro/data/synthetic.hpp>

#include <atomic>
#include <chrono>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

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

TEST_CASE("on the GPU batches arrive intact and the pinned pool is reused" * nitro::test::needs_gpu()) {
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

TEST_CASE("on the GPU the copies run while the consumer's stream is busy" * nitro::test::needs_gpu()) {
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
