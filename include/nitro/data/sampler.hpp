#pragma once
// nitro::data::ResumableSampler: a torch::data sampler whose whole state is (seed, epoch, index), so
// that a run stopped mid-epoch resumes with exactly the batches its consumer had not yet received, in
// the same order, whatever the number of workers and the prefetch depth.
//
// Epoch e's order is a permutation computed from (seed, e) alone: splitmix64 and Fisher-Yates with an
// unbiased bounded draw, written out here (std::shuffle and the std:: distributions are not specified
// across standard libraries), so it is the same on every platform and compiler. shuffle = false reads
// 0, 1, ..., size - 1. Set the epoch, or the order repeats:
//
//   nitro::data::ResumableSampler sampler(images.size().value(), {.seed = 42});
//   for (std::int64_t epoch = sampler.epoch(); epoch < epochs; ++epoch) {
//     if (epoch != sampler.epoch()) sampler.set_epoch(epoch);
//     nitro::Prefetcher<nitro::Cuda, ...> batches{nitro::from_dataset(stacked, sampler, 64), {.workers = 3}};
//     for (auto& batch : batches) { step(batch); if (time_to_save) save(sampler.state(), ...); }
//   }
//   // resume: nitro::data::ResumableSampler sampler(n, {.seed = 42}); sampler.load_state(saved);
//
// Copies share one state: keep a handle while from_dataset holds a copy, and read `state()` from it.
//
// Delivered, not claimed. A Prefetcher claims batches ahead of its consumer; the state must count only
// those the consumer received. With deferred delivery on (from_dataset turns it on), next() claims,
// `delivered()` (the Prefetcher calls it for each batch it hands out) moves the delivered index past
// the oldest claimed batch, and `rewind()` (the Prefetcher's destructor calls it) drops the claimed,
// undelivered batches, so the next reader makes them again. With it off (the default), next() counts
// as delivered at once: exact when used alone or by torch's DataLoader without workers; torch's
// DataLoader with workers claims ahead of its consumer and does not report deliveries, so its state
// may be ahead of what the training loop received.
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>

#include <torch/data/samplers/base.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nitro::data {

/// The whole state of a ResumableSampler: epoch `epoch` of the order drawn from `seed`, of which the
/// first `index` samples were delivered to the consumer.
struct SamplerState {
  std::uint64_t seed = 0;  ///< The seed every epoch's order is drawn from.
  std::int64_t epoch = 0;  ///< The current epoch (>= 0).
  /// Samples already delivered to the consumer in this epoch, in [0, size] (with shards, in [0, the
  /// shard's length()]).
  std::int64_t index = 0;
  std::int64_t size = 0;   ///< Samples in the data set; a state loads only into a sampler of this size.
  bool shuffle = true;     ///< false: each epoch reads 0, 1, ..., size - 1.
  /// Readers sharing each epoch's order (dist::DistributedSampler: the world size); 1 when alone. A
  /// state resumes only into a sampler with as many shards.
  std::int64_t shards = 1;
  /// Field-wise equality.
  friend bool operator==(const SamplerState&, const SamplerState&) = default;
};

namespace detail {

/// splitmix64 (Steele, Lea, Flood 2014): one 64-bit state, a fixed sequence on every platform.
class SplitMix64 {
 public:
  NITRO_INLINE explicit SplitMix64(std::uint64_t state) noexcept;
  std::uint64_t operator()() noexcept { return mix(state_ += 0x9E3779B97F4A7C15ULL); }
  NITRO_INLINE static std::uint64_t mix(std::uint64_t z) noexcept;
  /// Uniform in [0, bound), bound >= 1, unbiased: draws below 2^64 mod bound are rejected, so the
  /// accepted range is a whole number of copies of [0, bound).
  NITRO_INLINE std::uint64_t below(std::uint64_t bound) noexcept;

 private:
  std::uint64_t state_;
};

}  // namespace detail

/// Epoch `epoch`'s order of `size` samples drawn from `seed` (what a ResumableSampler reads): the same
/// on every platform. Without shuffle: 0, 1, ..., size - 1.
///   nitro::data::epoch_order(42, 0, 10)  // a permutation of 0..9
[[nodiscard]] NITRO_INLINE std::vector<std::size_t> epoch_order(std::uint64_t seed, std::int64_t epoch, std::size_t size,
                                                          bool shuffle = true);

/// A torch::data sampler with an exact, resumable position; see the top of this header.
///   nitro::data::ResumableSampler sampler(n, {.seed = 7});
///   auto p = nitro::prefetch<nitro::Cpu>(nitro::from_dataset(stacked, sampler, 64), {.workers = 3});
///   ... after some batches: SamplerState s = sampler.state();
///   nitro::data::ResumableSampler again(n); again.load_state(s);  // reads on from the next batch
class ResumableSampler : public torch::data::samplers::Sampler<> {
 public:
  /// How a ResumableSampler orders and shards each epoch.
  struct Options {
    /// Seed of every epoch's order.
    std::uint64_t seed = 0;
    /// false: each epoch reads 0, 1, ..., size - 1.
    bool shuffle = true;
    /// Sharding (dist::DistributedSampler sets these from the process group): this sampler reads
    /// positions shard, shard + shards, shard + 2 * shards, ... of each epoch's order, so that the
    /// shards are disjoint and together cover the epoch. The order is padded by repeating its start up
    /// to a multiple of `shards` (every shard reads ceil(size / shards) samples, as PyTorch's
    /// DistributedSampler), or cut to one (drop_last: floor(size / shards)).
    std::int64_t shard = 0;
    std::int64_t shards = 1;   ///< The number of shards (>= 1); 1 reads the whole epoch.
    bool drop_last = false;    ///< Cut each epoch's order to a multiple of shards instead of padding it.
  };

  /// A sampler over `size` samples (>= 1) with the default Options, at epoch 0, index 0. Throws
  /// nitro::Error when size is 0.
  NITRO_INLINE explicit ResumableSampler(std::size_t size);
  /// A sampler over `size` samples (>= 1) at epoch 0, index 0. Throws nitro::Error when size is 0, when
  /// shard is not in [0, shards), or when drop_last leaves each shard no sample (size < shards).
  NITRO_INLINE ResumableSampler(std::size_t size, Options options);
  /// Copies share the state; a move copies too, so that no handle is ever left without a state.
  ResumableSampler(const ResumableSampler&) = default;
  /// Makes this a handle on `other`'s state (shared, as a copy's).
  ResumableSampler& operator=(const ResumableSampler&) = default;
  ~ResumableSampler() override = default;

  /// Restarts the current epoch at index 0 (torch semantics; a new order comes from set_epoch), with
  /// `new_size` samples if given. Except the first reset after load_state(), or after a rewind() that
  /// left the epoch part-read (0 < index < size), with no next() in between: that one keeps the
  /// position (so from_dataset, whose constructor calls reset, continues where the last reader
  /// stopped) and only checks that `new_size` is the size. To restart anyway: set_epoch(epoch()).
  NITRO_INLINE void reset(std::optional<std::size_t> new_size = std::nullopt) override;

  /// The next `batch_size` indices of this epoch (fewer at its end), or nothing once it is read.
  NITRO_INLINE std::optional<std::vector<std::size_t>> next(std::size_t batch_size) override;

  /// Writes seed, epoch, index (delivered), size and shuffle (and shards when sharded).
  NITRO_INLINE void save(torch::serialize::OutputArchive& archive) const override;

  /// Reads what save() wrote and load_state()s it (checked: nothing changes if it does not fit).
  NITRO_INLINE void load(torch::serialize::InputArchive& archive) override;

  /// Selects epoch `epoch`'s order (from the seed) and restarts it at index 0.
  NITRO_INLINE void set_epoch(std::int64_t epoch);
  /// The current epoch.
  [[nodiscard]] NITRO_INLINE std::int64_t epoch() const;
  /// Samples in the data set (the size given, or the last reset()'s).
  [[nodiscard]] NITRO_INLINE std::size_t size() const;
  /// Samples this sampler reads per epoch: size(), or its shard's share (see Options::shards).
  [[nodiscard]] NITRO_INLINE std::size_t length() const;

  /// The state to save: index counts the samples delivered to the consumer.
  [[nodiscard]] NITRO_INLINE SamplerState state() const;

  /// Continues from `saved`: the next batch starts at its index. Throws nitro::Error naming the field
  /// and changes nothing if it does not fit this sampler (another size or number of shards, an index
  /// outside [0, length()], a negative epoch). The next reset() keeps this position.
  NITRO_INLINE void load_state(const SamplerState& saved);

  /// Throws what load_state(saved) would throw, changing nothing.
  NITRO_INLINE void check_state(const SamplerState& saved) const;

 private:
  struct Impl;
  NITRO_INLINE static void check(const Impl& s, const SamplerState& saved);

 public:

  /// Deferred delivery (from_dataset turns it on): next() only claims; delivered() and rewind() say
  /// what became of the claimed batches. Switching drops the claimed, undelivered batches.
  NITRO_INLINE void defer_delivery(bool on);
  /// Whether deferred delivery is on (see defer_delivery).
  [[nodiscard]] NITRO_INLINE bool delivery_deferred() const;

  /// Deferred delivery: the oldest claimed batch reached the consumer; the delivered index moves past it.
  NITRO_INLINE void delivered();

  /// Deferred delivery: forgets the claimed batches not delivered; the next next() reads from the
  /// delivered index. If the epoch is unfinished, the next reset() keeps this position.
  NITRO_INLINE void rewind();

 private:
  struct Impl {
    mutable std::mutex mutex;
    std::uint64_t seed = 0;
    bool shuffle = true;
    std::int64_t size = 0;
    std::int64_t epoch = 0;
    std::int64_t delivered = 0;  // state().index
    std::int64_t claimed = 0;    // where next() reads; >= delivered
    std::deque<std::int64_t> pending;  // sizes of the claimed, undelivered batches, oldest first
    bool deferred = false;
    bool keep_position = false;  // the next reset() keeps the position (after load_state or a rewind)
    std::int64_t shard = 0, shards = 1;
    bool drop_last = false;
    std::vector<std::size_t> order;  // (order_seed, order_epoch)'s, computed on first use
    std::uint64_t order_seed = 0;
    std::int64_t order_epoch = -1;

    NITRO_INLINE void restart_at(std::int64_t index);
    NITRO_INLINE void rewind();
    // Samples per epoch for this shard.
    NITRO_INLINE std::int64_t length() const;
    NITRO_INLINE void ensure_order();
  };

  std::shared_ptr<Impl> impl_;
};

}  // namespace nitro::data

#if !NITRO_COMPILED
#include <nitro/data/sampler-inl.hpp>
#endif
