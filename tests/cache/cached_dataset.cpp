#include "testing.hpp"

#include <nitro/cache/cached_dataset.hpp>
#include <nitro/cache/evict/lru.hpp>
#include <nitro/cache/evict/no_evict.hpp>
#include <nitro/data/record_file.hpp>
#include <nitro/data/synthetic.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

namespace nitro_test_cache_cached_dataset {  // one namespace per file: an area is compiled as one translation unit

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

// ---- memory, then disk: cached_tiered --------------------------------------------------------------

namespace {
std::vector<char> file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::filesystem::path& p, const std::vector<char>& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
}  // namespace

TEST_CASE_TEMPLATE("cached_tiered with memory for a quarter of the samples reads the rest from disk after epoch 1", P,
                   nitro::evict::NoEvict, nitro::evict::Lru) {
  const SyntheticImages::Options o{.size = 40, .height = 8, .width = 8, .seed = 11};
  SyntheticImages reference{o};
  nitro::test::TempDir dir("nitro-cached-tiered", false);
  auto cached = nitro::cached_tiered<P>(
      CountingImages{o},
      {.capacity_bytes = 10 * sample_bytes(o), .disk = {.directory = dir.path, .capacity_bytes = 1 << 20}});
  static_assert(std::is_same_v<typename decltype(cached)::cache_type,
                               nitro::TieredCache<P, torch::data::Example<>, std::mutex>>);
  torch::manual_seed(4);
  epoch(cached, reference);
  CHECK(cached.source().loads() == 40);
  auto s = cached.cache().stats();
  CHECK(s.memory.entries == 10);
  CHECK(s.memory.bytes <= 10 * sample_bytes(o));
  CHECK(s.disk.entries == 30);  // what memory had no room for, spilled instead of dropped

  for (int e = 2; e <= 3; ++e) {
    CAPTURE(e);
    cached.cache().reset_stats();
    epoch(cached, reference);
    CHECK(cached.source().loads() == 40);  // nothing decoded again: every sample from memory or disk
    s = cached.cache().stats();
    CHECK(s.memory.hits + s.disk.hits == 40);
    CHECK(s.disk.misses == 0);
    CHECK(s.disk.corrupt == 0);
    if constexpr (std::is_same_v<P, nitro::evict::NoEvict>) {
      CHECK(s.memory.hits == 10);  // NoEvict keeps the first 10 it saw ...
      CHECK(s.disk.hits == 30);    // ... and serves the others from their files, which stay
      CHECK(s.disk.stores == 0);
    } else {
      CHECK(s.disk.hits >= 30);  // a shuffled epoch through LRU: at least the 30 spilled samples, moving
    }
  }
}

TEST_CASE("cached_tiered through make_data_loader with 2 workers shares one cache of memory and disk") {
  Numbered source;
  const std::size_t n = 120;
  const std::size_t sample = 4 * 4 + 8;  // 4 floats and a 0-dim int64
  nitro::test::TempDir dir("nitro-cached-tiered", false);
  auto cached = nitro::cached_tiered<nitro::evict::NoEvict>(
      source, {.capacity_bytes = 30 * sample, .size = n, .disk = {.directory = dir.path, .capacity_bytes = 1 << 20}});
  auto loader = torch::data::make_data_loader(cached.map(torch::data::transforms::Stack<>()),
                                              torch::data::DataLoaderOptions(16).workers(2));
  for (int e = 1; e <= 2; ++e) {
    CAPTURE(e);
    cached.cache().reset_stats();
    std::vector<std::int64_t> seen;
    for (auto& batch : *loader) {
      CHECK(torch::equal(batch.data, batch.target.to(at::kFloat).unsqueeze(1).expand({-1, 4})));
      for (std::int64_t j = 0; j < batch.target.size(0); ++j) seen.push_back(batch.target[j].item<std::int64_t>());
    }
    std::sort(seen.begin(), seen.end());
    std::vector<std::int64_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    CHECK(seen == all);
    CHECK(*source.loads == static_cast<int>(n));
  }
  const auto s = cached.cache().stats();
  CHECK(s.memory.hits == 30);
  CHECK(s.disk.hits == n - 30);
  CHECK(cached.cache().size() == n);
}

TEST_CASE("a damaged spill file of a sample is a miss: the sample is loaded from the source again and spilled anew") {
  const SyntheticImages::Options o{.size = 12, .height = 8, .width = 8, .seed = 13};
  SyntheticImages reference{o};
  nitro::test::TempDir dir("nitro-cached-tiered", false);
  auto cached = nitro::cached_tiered<nitro::evict::NoEvict>(
      CountingImages{o},
      {.capacity_bytes = 4 * sample_bytes(o), .disk = {.directory = dir.path, .capacity_bytes = 1 << 20}});
  for (std::size_t i = 0; i < 12; ++i) (void)cached.get(i);  // 0 to 3 in memory, the others on disk
  const auto& disk = cached.cache().disk();
  REQUIRE(disk.contains(7));
  // The last byte of the file is the target's (the second tensor's) payload.
  auto bytes = file_bytes(disk.path_of(7));
  bytes.back() = static_cast<char>(bytes.back() ^ 0x01);
  write_bytes(disk.path_of(7), bytes);

  const auto check = [&](std::size_t i) {
    const auto e = cached.get(i);
    const auto expected = reference.get(i);
    CHECK(torch::equal(e.data, expected.data));
    CHECK(torch::equal(e.target, expected.target));
  };
  check(7);
  CHECK(cached.source().loads() == 13);  // 7 once more
  CHECK(disk.stats().corrupt == 1);
  CHECK(disk.contains(7));  // loaded, put again, and spilled again (memory is full)
  check(7);
  CHECK(cached.source().loads() == 13);  // now from its new file
  for (std::size_t i = 0; i < 12; ++i) check(i);
  CHECK(cached.source().loads() == 13);
}

TEST_CASE("disk options: missing for a tiered cache or given to another throw nitro::Error saying what to do") {
  const SyntheticImages::Options o{.size = 4, .height = 8, .width = 8};
  nitro::test::TempDir dir("nitro-cached-tiered", false);
  CHECK_THROWS_WITH_AS(nitro::cached_tiered<nitro::evict::Lru>(SyntheticImages{o}, {.capacity_bytes = 1 << 20}),
                       doctest::Contains("no disk options were given; give {.capacity_bytes = <memory budget>, .disk"),
                       nitro::Error);
  const nitro::DiskTierOptions disk{.directory = dir.path, .capacity_bytes = 1 << 20};
  CHECK_THROWS_WITH_AS(nitro::cached<nitro::evict::Lru>(SyntheticImages{o}, {.capacity_bytes = 1 << 20, .disk = disk}),
                       doctest::Contains("the cache has no disk tier; use nitro::cached_tiered"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::cached_tiered<nitro::evict::Lru>(SyntheticImages{o}, {.capacity_bytes = 0, .disk = disk}),
                       doctest::Contains("capacity_bytes is 0; give the cache's byte budget"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::cached_tiered<nitro::evict::Lru>(
                           SyntheticImages{o}, {.capacity_bytes = 1 << 20, .disk = {.directory = dir.path}}),
                       doctest::Contains("nitro::DiskTier: capacity_bytes is 0"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::cached_tiered<nitro::evict::Lru>(
                           SyntheticImages{o}, {.capacity_bytes = 1 << 20, .disk = {.capacity_bytes = 1}}),
                       doctest::Contains("directory is empty"), nitro::Error);
  // The same checks through the class itself, with TieredCache_mt as its cache.
  using Tiered = nitro::CachedDataset<nitro::evict::Lru, SyntheticImages, nitro::TieredCache_mt>;
  CHECK_THROWS_WITH_AS(Tiered(SyntheticImages{o}, {.capacity_bytes = 1 << 20}), doctest::Contains("no disk options"),
                       nitro::Error);
  Tiered ok(SyntheticImages{o}, {.capacity_bytes = 1 << 20, .disk = disk});
  CHECK(ok.get(3).data.sizes() == SyntheticImages{o}.get(3).data.sizes());
}

// ---- a record file through the cache ----------------------------------------------------------------

namespace {
/// n records of a uint8 3x8x8 image and an int64 label; returns them stacked.
std::pair<at::Tensor, at::Tensor> write_records(const std::filesystem::path& path, std::int64_t n) {
  const auto images = torch::randint(0, 256, {n, 3, 8, 8}, torch::kUInt8);
  const auto labels = torch::randint(0, 10, {n}, torch::kInt64);
  nitro::data::RecordWriter w(path, {{"image", at::kByte, {3, 8, 8}}, {"label", at::kLong, {}}}, {.fsync = false});
  for (std::int64_t i = 0; i < n; ++i) w.write({images[i], labels[i]});
  w.close();
  return {images, labels};
}
constexpr std::size_t record_sample_bytes = 3 * 8 * 8 + 8;

/// An epoch in a shuffled order; checks each sample against the records written.
template <class Cached>
void record_epoch(Cached& cached, const at::Tensor& images, const at::Tensor& labels) {
  const auto n = images.size(0);
  const auto order = torch::randperm(n, torch::kInt64);
  for (std::int64_t j = 0; j < n; ++j) {
    const auto i = order[j].item<std::int64_t>();
    const auto e = cached.get(static_cast<std::size_t>(i));
    REQUIRE(torch::equal(e.data, images[i]));
    REQUIRE(torch::equal(e.target, labels[i]));
  }
}

bool inside(const at::Tensor& t, std::span<const std::byte> mapping) {
  const auto* p = static_cast<const std::byte*>(t.data_ptr());
  return p >= mapping.data() && p + t.nbytes() <= mapping.data() + mapping.size();
}
}  // namespace

TEST_CASE("a cached RecordDataset keeps half its samples under the byte budget: as views of the mapping, or cloned") {
  nitro::test::TempDir dir("nitro-cached-rec", true);
  const auto path = dir / "train.nrec";
  torch::manual_seed(21);
  const auto [images, labels] = write_records(path, 60);
  auto file = nitro::data::RecordFile::open(path);
  const auto handles = file.use_count();
  // A view weighs its record's bytes, not the whole mapping: the budget counts what a sample holds.
  CHECK(static_cast<std::size_t>(nitro::TensorBytes{}(nitro::data::RecordDataset(file).get(0))) == record_sample_bytes);

  {
    // As it is: the cache holds the data set's views (no copy).
    auto views = nitro::cached<nitro::evict::NoEvict>(nitro::data::RecordDataset(file),
                                                      {.capacity_bytes = 30 * record_sample_bytes});
    record_epoch(views, images, labels);
    auto s = views.cache().stats();
    CHECK(s.misses == 60);
    CHECK(s.entries == 30);
    CHECK(s.bytes == 30 * record_sample_bytes);
    views.cache().reset_stats();
    record_epoch(views, images, labels);
    s = views.cache().stats();
    CHECK(s.hits == 30);  // the half kept since epoch 1
    CHECK(s.misses == 30);
    // Each cached view keeps the mapping (its two tensors each hold the file), so it stays valid
    // whatever becomes of the other handles; the data set holds one more.
    CHECK(file.use_count() == handles + 1 + 2 * 30);
    std::size_t i = 0;
    while (!views.cache().contains(static_cast<std::int64_t>(i))) ++i;
    CHECK(inside(views.get(i).data, file->mapping()));
    // A write into the (private) mapping reaches the cached view: what {.clone = true} is for.
    file->record(static_cast<std::int64_t>(i))[0].fill_(0);
    CHECK(views.get(i).data.sum().item<std::int64_t>() == 0);
    file->record(static_cast<std::int64_t>(i))[0].copy_(images[static_cast<std::int64_t>(i)]);
  }
  CHECK(file.use_count() == handles);  // the cache is gone, and the mapping's handles with it

  {
    // Cloned: the cache holds its own bytes, in memory under the budget.
    auto clones = nitro::cached<nitro::evict::NoEvict>(
        nitro::data::RecordDataset(file), {.capacity_bytes = 30 * record_sample_bytes, .clone = true});
    record_epoch(clones, images, labels);
    clones.cache().reset_stats();
    record_epoch(clones, images, labels);
    const auto s = clones.cache().stats();
    CHECK(s.hits == 30);
    CHECK(s.entries == 30);
    CHECK(s.bytes == 30 * record_sample_bytes);
    CHECK(file.use_count() == handles + 1);  // only the data set's own handle: no cached view holds the file
    std::size_t i = 0;
    while (!clones.cache().contains(static_cast<std::int64_t>(i))) ++i;
    const auto cached = clones.get(i);
    CHECK_FALSE(inside(cached.data, file->mapping()));
    CHECK_FALSE(inside(cached.target, file->mapping()));
    file->record(static_cast<std::int64_t>(i))[0].fill_(0);  // nothing done to the mapping reaches it
    CHECK(torch::equal(clones.get(i).data, images[static_cast<std::int64_t>(i)]));
    file->record(static_cast<std::int64_t>(i))[0].copy_(images[static_cast<std::int64_t>(i)]);
  }
}

TEST_CASE("augmentation after the cache: cached samples are augmented afresh every epoch and stay as they were") {
  nitro::test::TempDir dir("nitro-cached-rec", true);
  const auto path = dir / "train.nrec";
  torch::manual_seed(22);
  const auto [images, labels] = write_records(path, 40);
  auto cached = nitro::cached<nitro::evict::NoEvict>(nitro::data::RecordDataset(nitro::data::RecordFile::open(path)),
                                                     {.capacity_bytes = 40 * record_sample_bytes});
  // A per-epoch augmentation (here: the epoch's number added), applied to what the cache returns.
  auto epoch_number = std::make_shared<int>(0);
  auto augmented = cached.map(torch::data::transforms::Lambda<torch::data::Example<>>(
      [epoch_number](torch::data::Example<> e) {
        return torch::data::Example<>{e.data.to(torch::kInt32) + *epoch_number, e.target};
      }));
  std::vector<std::size_t> all(40);
  std::iota(all.begin(), all.end(), 0);
  for (int e = 1; e <= 3; ++e) {
    CAPTURE(e);
    *epoch_number = e;
    cached.cache().reset_stats();
    const auto batch = augmented.get_batch(all);
    REQUIRE(batch.size() == 40);
    for (std::int64_t i = 0; i < 40; ++i) {
      CHECK(torch::equal(batch[static_cast<std::size_t>(i)].data, images[i].to(torch::kInt32) + e));
      CHECK(torch::equal(batch[static_cast<std::size_t>(i)].target, labels[i]));
    }
    CHECK(cached.cache().stats().hits == (e == 1 ? 0 : 40));  // from the cache after epoch 1, augmented anew
  }
  for (std::size_t i = 0; i < 40; ++i)  // the cached samples are the records, unchanged
    CHECK(torch::equal(cached.get(i).data, images[static_cast<std::int64_t>(i)]));
}

}  // namespace nitro_test_cache_cached_dataset
