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
  std::uint64_t seed = 0;
  std::int64_t epoch = 0;
  /// Samples already delivered to the consumer in this epoch, in [0, size].
  std::int64_t index = 0;
  std::int64_t size = 0;
  bool shuffle = true;
  /// Readers sharing each epoch's order (dist::DistributedSampler: the world size); 1 when alone. A
  /// state resumes only into a sampler with as many shards.
  std::int64_t shards = 1;
  friend bool operator==(const SamplerState&, const SamplerState&) = default;
};

namespace detail {

/// splitmix64 (Steele, Lea, Flood 2014): one 64-bit state, a fixed sequence on every platform.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t state) noexcept : state_(state) {}
  std::uint64_t operator()() noexcept { return mix(state_ += 0x9E3779B97F4A7C15ULL); }
  static std::uint64_t mix(std::uint64_t z) noexcept {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, bound), bound >= 1, unbiased: draws below 2^64 mod bound are rejected, so the
  /// accepted range is a whole number of copies of [0, bound).
  std::uint64_t below(std::uint64_t bound) noexcept {
    const std::uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
    for (;;) {
      const std::uint64_t r = (*this)();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  std::uint64_t state_;
};

}  // namespace detail

/// Epoch `epoch`'s order of `size` samples drawn from `seed` (what a ResumableSampler reads): the same
/// on every platform. Without shuffle: 0, 1, ..., size - 1.
///   nitro::data::epoch_order(42, 0, 10)  // a permutation of 0..9
[[nodiscard]] inline std::vector<std::size_t> epoch_order(std::uint64_t seed, std::int64_t epoch, std::size_t size,
                                                          bool shuffle = true) {
  std::vector<std::size_t> order(size);
  for (std::size_t i = 0; i < size; ++i) order[i] = i;
  if (!shuffle || size < 2) return order;
  // Each (seed, epoch) starts its own stream: both go through the mixer, so nearby seeds and epochs
  // give unrelated orders.
  detail::SplitMix64 rng(detail::SplitMix64::mix(detail::SplitMix64::mix(seed) + static_cast<std::uint64_t>(epoch)));
  for (std::size_t i = size - 1; i > 0; --i) {
    const auto j = static_cast<std::size_t>(rng.below(static_cast<std::uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

/// A torch::data sampler with an exact, resumable position; see the top of this header.
///   nitro::data::ResumableSampler sampler(n, {.seed = 7});
///   auto p = nitro::prefetch<nitro::Cpu>(nitro::from_dataset(stacked, sampler, 64), {.workers = 3});
///   ... after some batches: SamplerState s = sampler.state();
///   nitro::data::ResumableSampler again(n); again.load_state(s);  // reads on from the next batch
class ResumableSampler : public torch::data::samplers::Sampler<> {
 public:
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
    std::int64_t shards = 1;
    bool drop_last = false;
  };

  explicit ResumableSampler(std::size_t size) : ResumableSampler(size, Options{}) {}
  ResumableSampler(std::size_t size, Options options) : impl_(std::make_shared<Impl>()) {
    NITRO_CHECK(size > 0, "nitro::data::ResumableSampler: size is 0; give the number of samples in the data set "
                "(dataset.size().value()), >= 1");
    NITRO_CHECK(options.shards >= 1 && options.shard >= 0 && options.shard < options.shards,
                "nitro::data::ResumableSampler: shard must be in [0, shards) and shards >= 1, got shard ", options.shard,
                " of ", options.shards);
    NITRO_CHECK(!options.drop_last || static_cast<std::int64_t>(size) >= options.shards,
                "nitro::data::ResumableSampler: drop_last with ", size, " samples over ", options.shards,
                " shards leaves each shard nothing; use fewer shards or drop_last = false");
    impl_->size = static_cast<std::int64_t>(size);
    impl_->seed = options.seed;
    impl_->shuffle = options.shuffle;
    impl_->shard = options.shard;
    impl_->shards = options.shards;
    impl_->drop_last = options.drop_last;
  }
  // Copies share the state; a move copies too, so that no handle is ever left without a state.
  ResumableSampler(const ResumableSampler&) = default;
  ResumableSampler& operator=(const ResumableSampler&) = default;
  ~ResumableSampler() override = default;

  /// Restarts the current epoch at index 0 (torch semantics; a new order comes from set_epoch), with
  /// `new_size` samples if given. Except the first reset after load_state(), or after a rewind() that
  /// left the epoch part-read (0 < index < size), with no next() in between: that one keeps the
  /// position (so from_dataset, whose constructor calls reset, continues where the last reader
  /// stopped) and only checks that `new_size` is the size. To restart anyway: set_epoch(epoch()).
  void reset(std::optional<std::size_t> new_size = std::nullopt) override {
    std::lock_guard guard(impl_->mutex);
    Impl& s = *impl_;
    if (new_size) {
      NITRO_CHECK(!s.keep_position || static_cast<std::int64_t>(*new_size) == s.size,
                  "nitro::data::ResumableSampler::reset: the data set has ", *new_size,
                  " samples, but the sampler's resumed position is in an order of ", s.size,
                  " samples; resume with the data set the state was saved with");
      NITRO_CHECK(*new_size > 0, "nitro::data::ResumableSampler::reset: new size is 0; give the number of "
                  "samples in the data set, >= 1");
    }
    if (s.keep_position) {
      s.keep_position = false;
      return;
    }
    if (new_size) s.size = static_cast<std::int64_t>(*new_size);  // a new size gets a new order (ensure_order)
    s.restart_at(0);
  }

  /// The next `batch_size` indices of this epoch (fewer at its end), or nothing once it is read.
  std::optional<std::vector<std::size_t>> next(std::size_t batch_size) override {
    NITRO_CHECK(batch_size > 0, "nitro::data::ResumableSampler::next: batch_size is 0; give the number of "
                "samples per batch, >= 1");
    std::lock_guard guard(impl_->mutex);
    Impl& s = *impl_;
    s.keep_position = false;
    const std::int64_t length = s.length();
    if (s.claimed >= length) return std::nullopt;
    const std::int64_t count = std::min(static_cast<std::int64_t>(batch_size), length - s.claimed);
    std::vector<std::size_t> batch(static_cast<std::size_t>(count));
    if (s.shuffle) s.ensure_order();
    for (std::int64_t i = 0; i < count; ++i) {
      // Position k of this shard is position k * shards + shard of the (padded) epoch order.
      const auto at = static_cast<std::size_t>(((s.claimed + i) * s.shards + s.shard) % s.size);
      batch[static_cast<std::size_t>(i)] = s.shuffle ? s.order[at] : at;
    }
    s.claimed += count;
    if (s.deferred)
      s.pending.push_back(count);
    else
      s.delivered = s.claimed;
    return batch;
  }

  /// Writes seed, epoch, index (delivered), size and shuffle (and shards when sharded).
  void save(torch::serialize::OutputArchive& archive) const override {
    const SamplerState st = state();
    archive.write("seed", c10::IValue(static_cast<std::int64_t>(st.seed)));  // bit pattern kept
    archive.write("epoch", c10::IValue(st.epoch));
    archive.write("index", c10::IValue(st.index));
    archive.write("size", c10::IValue(st.size));
    archive.write("shuffle", c10::IValue(st.shuffle));
    if (st.shards != 1) archive.write("shards", c10::IValue(st.shards));
  }

  /// Reads what save() wrote and load_state()s it (checked: nothing changes if it does not fit).
  void load(torch::serialize::InputArchive& archive) override {
    const auto read = [&](const char* key) {
      c10::IValue v;
      NITRO_CHECK(archive.try_read(key, v), "nitro::data::ResumableSampler::load: the archive has no '", key,
                  "'; load an archive written by ResumableSampler::save");
      return v;
    };
    const auto integer = [&](const char* key) {
      c10::IValue v = read(key);
      NITRO_CHECK(v.isInt(), "nitro::data::ResumableSampler::load: '", key, "' is a ", v.tagKind(),
                  ", not an integer; load an archive written by ResumableSampler::save");
      return v.toInt();
    };
    SamplerState st;
    st.seed = static_cast<std::uint64_t>(integer("seed"));
    st.epoch = integer("epoch");
    st.index = integer("index");
    st.size = integer("size");
    const c10::IValue shuffle = read("shuffle");
    NITRO_CHECK(shuffle.isBool(), "nitro::data::ResumableSampler::load: 'shuffle' is a ", shuffle.tagKind(),
                ", not a bool; load an archive written by ResumableSampler::save");
    st.shuffle = shuffle.toBool();
    c10::IValue shards;
    if (archive.try_read("shards", shards)) {
      NITRO_CHECK(shards.isInt(), "nitro::data::ResumableSampler::load: 'shards' is a ", shards.tagKind(),
                  ", not an integer; load an archive written by ResumableSampler::save");
      st.shards = shards.toInt();
    }
    load_state(st);
  }

  /// Selects epoch `epoch`'s order (from the seed) and restarts it at index 0.
  void set_epoch(std::int64_t epoch) {
    NITRO_CHECK(epoch >= 0, "nitro::data::ResumableSampler::set_epoch: epoch is ", epoch, "; give one >= 0");
    std::lock_guard guard(impl_->mutex);
    impl_->epoch = epoch;
    impl_->keep_position = false;
    impl_->restart_at(0);
  }
  [[nodiscard]] std::int64_t epoch() const {
    std::lock_guard guard(impl_->mutex);
    return impl_->epoch;
  }
  [[nodiscard]] std::size_t size() const {
    std::lock_guard guard(impl_->mutex);
    return static_cast<std::size_t>(impl_->size);
  }
  /// Samples this sampler reads per epoch: size(), or its shard's share (see Options::shards).
  [[nodiscard]] std::size_t length() const {
    std::lock_guard guard(impl_->mutex);
    return static_cast<std::size_t>(impl_->length());
  }

  /// The state to save: index counts the samples delivered to the consumer.
  [[nodiscard]] SamplerState state() const {
    std::lock_guard guard(impl_->mutex);
    const Impl& s = *impl_;
    return {.seed = s.seed, .epoch = s.epoch, .index = s.delivered, .size = s.size, .shuffle = s.shuffle, .shards = s.shards};
  }

  /// Continues from `saved`: the next batch starts at its index. Throws nitro::Error naming the field
  /// and changes nothing if it does not fit this sampler (another size, an index outside [0, size], a
  /// negative epoch). The next reset() keeps this position.
  void load_state(const SamplerState& saved) {
    std::lock_guard guard(impl_->mutex);
    Impl& s = *impl_;
    check(s, saved);
    s.seed = saved.seed;
    s.shuffle = saved.shuffle;
    s.epoch = saved.epoch;
    s.restart_at(saved.index);
    s.keep_position = true;
  }

  /// Throws what load_state(saved) would throw, changing nothing.
  void check_state(const SamplerState& saved) const {
    std::lock_guard guard(impl_->mutex);
    check(*impl_, saved);
  }

 private:
  struct Impl;
  static void check(const Impl& s, const SamplerState& saved) {
    NITRO_CHECK(saved.shards == s.shards, "nitro::data::ResumableSampler::load_state: the state was saved by a "
                "sampler read in ", saved.shards, " shards (processes), but this one is 1 of ", s.shards,
                "; resume with the same world size");
    NITRO_CHECK(saved.size == s.size, "nitro::data::ResumableSampler::load_state: size is ", saved.size,
                " in the saved state but ", s.size, " in this sampler; load it into a sampler over the data set "
                "it was saved with");
    NITRO_CHECK(saved.index >= 0 && saved.index <= s.length(), "nitro::data::ResumableSampler::load_state: index is ",
                saved.index, " in the saved state (this sampler's is ", s.delivered, "), outside [0, ", s.length(),
                "]; the saved state is corrupt");
    NITRO_CHECK(saved.epoch >= 0, "nitro::data::ResumableSampler::load_state: epoch is ", saved.epoch,
                " in the saved state (this sampler's is ", s.epoch, "), but must be >= 0; the saved state is corrupt");
  }

 public:

  /// Deferred delivery (from_dataset turns it on): next() only claims; delivered() and rewind() say
  /// what became of the claimed batches. Switching drops the claimed, undelivered batches.
  void defer_delivery(bool on) {
    std::lock_guard guard(impl_->mutex);
    impl_->restart_at(impl_->delivered);
    impl_->deferred = on;
  }
  [[nodiscard]] bool delivery_deferred() const {
    std::lock_guard guard(impl_->mutex);
    return impl_->deferred;
  }

  /// Deferred delivery: the oldest claimed batch reached the consumer; the delivered index moves past it.
  void delivered() {
    std::lock_guard guard(impl_->mutex);
    Impl& s = *impl_;
    if (s.pending.empty()) return;  // delivery is not deferred, or the epoch was restarted since the claim
    s.delivered += s.pending.front();
    s.pending.pop_front();
  }

  /// Deferred delivery: forgets the claimed batches not delivered; the next next() reads from the
  /// delivered index. If the epoch is unfinished, the next reset() keeps this position.
  void rewind() {
    std::lock_guard guard(impl_->mutex);
    impl_->rewind();
  }

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

    void restart_at(std::int64_t index) {
      delivered = claimed = index;
      pending.clear();
    }
    void rewind() {
      restart_at(delivered);
      // A reader stopped mid-epoch: the next source over this sampler continues from here.
      if (delivered > 0 && delivered < length()) keep_position = true;
    }
    // Samples per epoch for this shard.
    std::int64_t length() const {
      if (shards == 1) return size;
      return drop_last ? size / shards : (size + shards - 1) / shards;
    }
    void ensure_order() {
      if (order_seed == seed && order_epoch == epoch && static_cast<std::int64_t>(order.size()) == size) return;
      order = epoch_order(seed, epoch, static_cast<std::size_t>(size), true);
      order_seed = seed;
      order_epoch = epoch;
    }
  };

  std::shared_ptr<Impl> impl_;
};

}  // namespace nitro::data
