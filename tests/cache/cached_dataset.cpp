#include "testing.hpp"

#include <nitro/cache/cached_dataset.hpp>
#include <nitro/cache/evict/lru.hpp>
#include <nitro/cache/evict/no_evict.hpp>
#include <nitro/data/synthetic.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

using nitro::data::SyntheticImages;

namespace {

/// SyntheticImages counting the samples it is asked for; copies (one per loader worker) share the count.
class CountingImages : public torch::data::datasets::Dataset<CountingImages> {
 public:
  explicit CountingImages(SyntheticImages::Options o) : images_(o) {}
  torch::data::Example<> get(size_t index) override {
    ++*loads_;
    return images_.get(index);
  }
  std::optional<size_t> size() const override { return images_.size(); }
  [[nodiscard]] int loads() const { return loads_->load(); }

 private:
  SyntheticImages images_;
  std::shared_ptr<std::atomic<int>> loads_ = std::make_shared<std::atomic<int>>(0);
};

/// A callable source whose sample i is recognisable: data full of i, target i.
struct Numbered {
  std::shared_ptr<std::atomic<int>> loads = std::make_shared<std::atomic<int>>(0);
  torch::data::Example<> operator()(std::size_t i) const {
    ++*loads;
    const auto x = static_cast<std::int64_t>(i);
    return {torch::full({4}, static_cast<float>(x)), torch::tensor(x)};
  }
};

/// Reads every sample once in a shuffled order, as an epoch does; checks each against the source.
template <class Cached>
void epoch(Cached& cached, SyntheticImages& reference) {
  const auto n = static_cast<std::int64_t>(*cached.size());
  const auto order = torch::randperm(n, at::TensorOptions().dtype(at::kLong));
  for (std::int64_t j = 0; j < n; ++j) {
    const auto i = static_cast<size_t>(order[j].template item<std::int64_t>());
    const auto sample = cached.get(i);
    const auto expected = reference.get(i);
    REQUIRE(torch::equal(sample.data, expected.data));
    REQUIRE(torch::equal(sample.target, expected.target));
  }
}

std::size_t sample_bytes(SyntheticImages::Options o) {
  SyntheticImages images{o};
  return static_cast<std::size_t>(nitro::TensorBytes{}(images.get(0)));
}

}  // namespace

TEST_CASE("the second epoch reads from memory and every sample equals the source's") {
  const SyntheticImages::Options o{.size = 64, .height = 8, .width = 8, .seed = 5};
  SyntheticImages reference{o};
  auto cached = nitro::cached<nitro::evict::Lru>(CountingImages{o}, {.capacity_bytes = 64 * sample_bytes(o)});
  static_assert(std::is_same_v<decltype(cached)::Sample, torch::data::Example<>>);
  CHECK(cached.size() == 64);

  torch::manual_seed(1);
  epoch(cached, reference);
  CHECK(cached.source().loads() == 64);
  epoch(cached, reference);
  CHECK(cached.source().loads() == 64);  // nothing loaded again
  const auto s = cached.cache().stats();
  CHECK(s.hits == 64);
  CHECK(s.misses == 64);
  CHECK(s.entries == 64);
  CHECK(s.bytes == 64 * sample_bytes(o));
}

TEST_CASE("NoEvict with room for half the samples loads exactly half of them in the second epoch") {
  const SyntheticImages::Options o{.size = 100, .height = 8, .width = 8, .seed = 9};
  SyntheticImages reference{o};
  auto cached = nitro::cached<nitro::evict::NoEvict>(CountingImages{o}, {.capacity_bytes = 50 * sample_bytes(o)});
  torch::manual_seed(2);
  epoch(cached, reference);
  CHECK(cached.source().loads() == 100);
  CHECK(cached.cache().size() == 50);
  for (int e = 2; e <= 4; ++e) {
    CAPTURE(e);
    cached.cache().reset_stats();
    epoch(cached, reference);
    CHECK(cached.source().loads() == 100 + 50 * (e - 1));  // the other half, each epoch
    CHECK(cached.cache().stats().hits == 50);
    CHECK(cached.cache().size() == 50);  // NoEvict keeps the first half it saw
  }
}

TEST_CASE("a callable source with its size in the options") {
  Numbered source;
  auto cached = nitro::cached<nitro::evict::Lru>(source, {.capacity_bytes = 1 << 20, .size = 10});
  CHECK(cached.size() == 10);
  for (int pass = 0; pass < 3; ++pass) {
    for (std::size_t i = 0; i < 10; ++i) {
      const auto e = cached.get(i);
      CHECK(torch::equal(e.data, torch::full({4}, static_cast<float>(i))));
      CHECK(e.target.item<std::int64_t>() == static_cast<std::int64_t>(i));
    }
  }
  CHECK(*source.loads == 10);

  // A std::function, returning a bare tensor.
  int calls = 0;
  nitro::CachedDataset<nitro::evict::Lru, std::function<at::Tensor(std::size_t)>> tensors{
      [&calls](std::size_t i) {
        ++calls;
        return torch::full({2}, static_cast<double>(i));
      },
      {.capacity_bytes = 1 << 10, .size = 3}};
  CHECK(torch::equal(tensors.get(2), torch::full({2}, 2.0)));
  CHECK(torch::equal(tensors.get(2), torch::full({2}, 2.0)));
  CHECK(calls == 1);
}

TEST_CASE("a sample larger than the budget is served and not kept") {
  Numbered source;
  auto cached = nitro::cached<nitro::evict::Lru>(source, {.capacity_bytes = 8, .size = 2});
  CHECK(torch::equal(cached.get(1).data, torch::full({4}, 1.0f)));
  CHECK(torch::equal(cached.get(1).data, torch::full({4}, 1.0f)));
  CHECK(*source.loads == 2);
  CHECK(cached.cache().stats().rejections == 2);
}

TEST_CASE("make_data_loader with 2 workers delivers every sample and shares one cache") {
  Numbered source;
  const std::size_t n = 200;
  auto cached = nitro::cached<nitro::evict::NoEvict>(source, {.capacity_bytes = 1 << 20, .size = n});
  auto loader = torch::data::make_data_loader(cached.map(torch::data::transforms::Stack<>()),
                                              torch::data::DataLoaderOptions(16).workers(2));
  for (int e = 1; e <= 2; ++e) {
    CAPTURE(e);
    std::vector<std::int64_t> seen;
    for (auto& batch : *loader) {
      REQUIRE(batch.data.size(0) == batch.target.size(0));
      // Each row is the sample its target names.
      CHECK(torch::equal(batch.data, batch.target.to(at::kFloat).unsqueeze(1).expand({-1, 4})));
      for (std::int64_t j = 0; j < batch.target.size(0); ++j) seen.push_back(batch.target[j].item<std::int64_t>());
    }
    std::sort(seen.begin(), seen.end());
    std::vector<std::int64_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    CHECK(seen == all);
    CHECK(*source.loads == static_cast<int>(n));  // the second epoch came from the cache the workers share
  }
  CHECK(cached.cache().size() == n);
  CHECK(cached.cache().stats().hits == n);
}

TEST_CASE("a torch::data data set through make_data_loader with 2 workers and a sharded cache") {
  const SyntheticImages::Options o{.size = 96, .height = 8, .width = 8, .seed = 3};
  CountingImages source{o};
  SyntheticImages reference{o};
  nitro::CachedDataset<nitro::evict::NoEvict, CountingImages, nitro::ShardedCache_mt> cached{
      source, {.capacity_bytes = 96 * sample_bytes(o) * 4}};  // room in every shard
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      cached.map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(8).workers(2));
  for (int e = 1; e <= 2; ++e) {
    std::int64_t rows = 0;
    for (auto& batch : *loader) rows += batch.data.size(0);
    CHECK(rows == 96);
  }
  CHECK(source.loads() == 96);
  const auto [x, y] = reference.stacked(0, 96);
  for (std::size_t i = 0; i < 96; i += 7) {
    const auto e = cached.get(i);
    CHECK(torch::equal(e.data, x[static_cast<std::int64_t>(i)]));
    CHECK(torch::equal(e.target, y[static_cast<std::int64_t>(i)]));
  }
  CHECK(source.loads() == 96);
}

TEST_CASE("option errors throw nitro::Error saying what to do") {
  const SyntheticImages::Options o{.size = 4, .height = 8, .width = 8};
  CHECK_THROWS_WITH_AS(nitro::cached<nitro::evict::Lru>(SyntheticImages{o}, {.capacity_bytes = 0}),
                       doctest::Contains("capacity_bytes is 0"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::cached<nitro::evict::Lru>(Numbered{}, {.capacity_bytes = 100}),
                       doctest::Contains("give {.size = N}"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::cached<nitro::evict::Lru>(SyntheticImages{o}, {.capacity_bytes = 100, .size = 4}),
                       doctest::Contains("leave size empty"), nitro::Error);
  // The source's own errors pass through, and nothing is cached.
  auto cached = nitro::cached<nitro::evict::Lru>(SyntheticImages{o}, {.capacity_bytes = 1 << 20});
  CHECK_THROWS_WITH_AS(cached.get(4), doctest::Contains("out of range"), nitro::Error);
  CHECK(cached.cache().size() == 0);
}
