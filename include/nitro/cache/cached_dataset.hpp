#pragma once
// nitro::CachedDataset: a torch::data data set that keeps the samples it has loaded in a byte-budgeted
// nitro::Cache, so later epochs read memory instead of decoding again. In front of a torch::data
// data set (anything with get(size_t) and size()) or of any callable index -> sample.
//
//   nitro::data::SyntheticImages images{{.size = 50'000}};
//   auto samples = nitro::cached<nitro::evict::NoEvict>(images, {.capacity_bytes = 8ull << 30});
//   auto loader = torch::data::make_data_loader(samples.map(torch::data::transforms::Stack<>()),
//                                               torch::data::DataLoaderOptions(64).workers(4));
//
// The policy: shuffled epochs read every sample once in a fresh order, and NoEvict is optimal for
// that (see cache.hpp); a budget for a fraction f of the data set gives f hits after the first epoch.
//
// Memory, then disk: nitro::cached_tiered keeps what memory has no room for in spill files
// (TieredCache, disk_tier.hpp), so a second epoch reads the rest from disk instead of decoding it:
//
//   auto samples = nitro::cached_tiered<nitro::evict::NoEvict>(
//       images, {.capacity_bytes = 8ull << 30,
//                .disk = {.directory = "/scratch/spill", .capacity_bytes = 64ull << 30}});
//
// torch::data copies the data set into each worker. The copies share one cache (so every worker
// fills and reads it) and each has its own copy of the source (as torch::data does without a cache,
// so the source need not be thread safe). A returned sample shares its tensors with the cached one:
// clone before changing it in place. Augment after the cache (`cached(...).map(augment)`): a cached
// sample is then augmented afresh every epoch, and a transform that makes new tensors (as most do)
// leaves the cached one as it was.
//
// A source whose samples view memory it does not own, such as data::RecordDataset (views of a file
// mapping, each keeping the mapping alive), can be cached as it is: the cache then holds views, which
// cost no copy and stay valid when the file object is gone, but whose bytes are the mapping's pages,
// which the kernel may drop and read again, and which a write into the mapping changes. Set
// {.clone = true} to cache a copy of each sample instead: its bytes are then the cache's own, in
// memory under the budget, and nothing done to the mapping reaches them.
#include <nitro/cache/cache.hpp>
#include <nitro/cache/disk_tier.hpp>
#include <nitro/core/concepts.hpp>
#include <nitro/core/device.hpp>
#include <nitro/core/error.hpp>

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

namespace nitro {

/// A random-access data set in torch::data's shape: `get(size_t)` gives a sample, `size()` the count.
template <class S>
concept IndexedDataset = requires(S& s, const S& cs, std::size_t i) {
  s.get(i);
  { cs.size() } -> std::convertible_to<std::optional<std::size_t>>;
};

/// What a CachedDataset can sit in front of: an IndexedDataset, or a callable index -> sample.
template <class S>
concept SampleSource = std::copy_constructible<S> && (IndexedDataset<S> || std::invocable<S&, std::size_t>);

namespace detail {
template <class S>
struct source_sample;
template <IndexedDataset S>
struct source_sample<S> {
  using type = std::remove_cvref_t<decltype(std::declval<S&>().get(std::size_t{}))>;
};
template <class S>
  requires(!IndexedDataset<S> && std::invocable<S&, std::size_t>)
struct source_sample<S> {
  using type = std::remove_cvref_t<std::invoke_result_t<S&, std::size_t>>;
};
}  // namespace detail

/// The sample type a source gives: what its get(i), or the callable, returns.
template <SampleSource S>
using source_sample_t = typename detail::source_sample<S>::type;

namespace detail {
/// A cache with a disk tier (TieredCache): made from memory and disk options.
template <class C>
concept TieredCacheType = requires(typename C::Options o) {
  typename C::disk_type;
  o.memory_capacity_bytes;
  o.disk;
};
}  // namespace detail

/// A CachedDataset's knobs.
template <EvictionPolicy Policy>
struct CachedDatasetOptions {
  /// The cache's byte budget (TensorBytes of the samples), > 0: with a disk tier, the memory tier's.
  std::size_t capacity_bytes = 0;
  /// The policy's knobs.
  typename Policy::Options policy{};
  /// The number of samples: required for a callable source, left empty for a data set (it has one).
  std::optional<std::size_t> size{};
  /// Cache a copy of each sample (every tensor cloned) rather than the source's own, and
  /// return that copy: for a source whose samples view memory it does not own (data::RecordDataset).
  bool clone = false;
  /// The disk tier (directory and byte budget): required with a tiered cache (nitro::cached_tiered,
  /// TieredCache_mt), left empty otherwise.
  DiskTierOptions disk{};
};

/// A torch::data data set serving samples of `Source` through a cache: get(i) returns the cached
/// sample on a hit, and loads it from the source and caches it on a miss.
/// @tparam Policy        the eviction policy (cache/evict/), required
/// @tparam Source        a torch::data data set or a callable index -> sample (SampleSource); inferred by nitro::cached
/// @tparam CacheTemplate the cache, as Cache_mt / ShardedCache_mt are named; optional, default Cache_mt
///                       (ShardedCache_mt for many workers reading at once; TieredCache_mt for memory
///                       then disk, with Options::disk). Must be thread safe.
///
///   nitro::CachedDataset<nitro::evict::NoEvict, MyDataset> samples{MyDataset{root}, {.capacity_bytes = 4ull << 30}};
///   samples.get(i);                      // loads, caches
///   samples.get(i);                      // from memory
///   samples.cache().stats().hit_ratio();
template <EvictionPolicy Policy, SampleSource Source,
          template <class, class, class, class> class CacheTemplate = Cache_mt>
class CachedDataset
    : public torch::data::datasets::Dataset<CachedDataset<Policy, Source, CacheTemplate>, source_sample_t<Source>> {
 public:
  /// What get() returns: the source's sample type (source_sample_t).
  using Sample = source_sample_t<Source>;
  static_assert(Batch<Sample>,
                "nitro::CachedDataset: the source's sample must be a batch the cache can weigh (a tensor, a "
                "torch::data::Example, a tuple or vector of them, or a type with nitro_map_tensors; see "
                "core/device.hpp)");
  /// The cache the samples are held in, keyed by sample index.
  using cache_type = CacheTemplate<Policy, std::int64_t, Sample, TensorBytes>;
  /// The source type.
  using source_type = Source;
  /// The knobs: CachedDatasetOptions.
  using Options = CachedDatasetOptions<Policy>;

  /// Throws nitro::Error when capacity_bytes is 0, `size` is missing for a callable source (or
  /// given for a data set), or the disk options are missing for a tiered cache (or given for another).
  CachedDataset(Source source, Options options)
      : source_(std::move(source)),
        cache_(make_cache(options)),
        size_(checked_size(options.size)),
        clone_(options.clone) {}

  /// Sample `index`: the cached one, or the source's (then cached).
  Sample get(std::size_t index) override {
    const auto key = static_cast<std::int64_t>(index);
    if (auto hit = cache_->get(key)) return std::move(*hit);
    Sample sample = load(index);
    if (clone_) sample = map_tensors(sample, [](const at::Tensor& t) { return t.defined() ? t.clone() : t; });
    cache_->put(key, sample);
    return sample;
  }

  /// The source's size (a data set's), or Options::size (a callable's).
  [[nodiscard]] std::optional<std::size_t> size() const override {
    if constexpr (IndexedDataset<Source>) return source_.size();
    else return size_;
  }

  /// The cache, shared by every copy of this data set (torch::data's workers): for stats() and clear().
  [[nodiscard]] cache_type& cache() const noexcept { return *cache_; }
  /// The source, this copy's own (each torch::data worker copy has its own).
  [[nodiscard]] const Source& source() const noexcept { return source_; }

 private:
  static std::size_t checked_capacity(std::size_t capacity) {
    NITRO_CHECK(capacity > 0, "nitro::CachedDataset: capacity_bytes is 0; give the cache's byte budget, e.g. "
                              "{.capacity_bytes = 8ull << 30} for 8 GiB");
    return capacity;
  }
  static std::shared_ptr<cache_type> make_cache(Options& options) {
    const std::size_t capacity = checked_capacity(options.capacity_bytes);
    const bool disk_given = !options.disk.directory.empty() || options.disk.capacity_bytes > 0;
    if constexpr (detail::TieredCacheType<cache_type>) {
      NITRO_CHECK(disk_given, "nitro::CachedDataset: the cache has a disk tier but no disk options were given; give "
                              "{.capacity_bytes = <memory budget>, .disk = {.directory = \"/scratch/spill\", "
                              ".capacity_bytes = <disk budget>}}");
      return std::make_shared<cache_type>(typename cache_type::Options{
          .memory_capacity_bytes = capacity, .policy = std::move(options.policy), .disk = std::move(options.disk)});
    } else {
      NITRO_CHECK(!disk_given, "nitro::CachedDataset: disk options are given (directory ", options.disk.directory,
                  ") but the cache has no disk tier; use nitro::cached_tiered<Policy>(source, options) (or "
                  "CacheTemplate = nitro::TieredCache_mt) to spill to disk, or leave .disk empty");
      return std::make_shared<cache_type>(
          typename cache_type::Options{.capacity_bytes = capacity, .policy = std::move(options.policy)});
    }
  }
  static std::optional<std::size_t> checked_size(std::optional<std::size_t> size) {
    if constexpr (IndexedDataset<Source>) {
      NITRO_CHECK(!size, "nitro::CachedDataset: size is given (", size.value_or(0),
                  ") but the source is a data set, which has its own size(); leave size empty");
    } else {
      NITRO_CHECK(size.has_value(), "nitro::CachedDataset: the source is a callable, which cannot say how many "
                                    "samples it has; give {.size = N}");
    }
    return size;
  }

  Sample load(std::size_t index) {
    if constexpr (IndexedDataset<Source>) return source_.get(index);
    else return std::invoke(source_, index);
  }

  Source source_;
  std::shared_ptr<cache_type> cache_;
  std::optional<std::size_t> size_;
  bool clone_ = false;
};

/// A CachedDataset over `source` (a torch::data data set or a callable index -> sample, copied in).
///   auto samples = nitro::cached<nitro::evict::NoEvict>(dataset, {.capacity_bytes = 8ull << 30});
///   auto from_fn = nitro::cached<nitro::evict::NoEvict>(decode, {.capacity_bytes = 1ull << 30, .size = n});
template <EvictionPolicy Policy, template <class, class, class, class> class CacheTemplate = Cache_mt,
          class Source>
  requires SampleSource<std::decay_t<Source>>
[[nodiscard]] CachedDataset<Policy, std::decay_t<Source>, CacheTemplate> cached(Source&& source,
                                                                                CachedDatasetOptions<Policy> options) {
  return {std::forward<Source>(source), std::move(options)};
}

/// A CachedDataset over `source` with memory and disk (TieredCache_mt): what the memory budget
/// (`capacity_bytes`) has no room for is spilled to `disk`, and read back from there instead of
/// being loaded again. Throws nitro::Error when `disk` is not given.
///   auto samples = nitro::cached_tiered<nitro::evict::NoEvict>(
///       dataset, {.capacity_bytes = 8ull << 30,
///                 .disk = {.directory = "/scratch/spill", .capacity_bytes = 64ull << 30}});
///   samples.cache().stats().disk.hits;
template <EvictionPolicy Policy, class Source>
  requires SampleSource<std::decay_t<Source>>
[[nodiscard]] CachedDataset<Policy, std::decay_t<Source>, TieredCache_mt> cached_tiered(
    Source&& source, CachedDatasetOptions<Policy> options) {
  return {std::forward<Source>(source), std::move(options)};
}

}  // namespace nitro
