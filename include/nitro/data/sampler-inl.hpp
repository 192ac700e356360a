#pragma once
// The definitions of nitro/data/sampler.hpp's non-template functions: included by sampler.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/data/sampler.hpp>

namespace nitro::data::detail {

NITRO_INLINE SplitMix64::SplitMix64(std::uint64_t state) noexcept : state_(state) {}

NITRO_INLINE std::uint64_t SplitMix64::mix(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

NITRO_INLINE std::uint64_t SplitMix64::below(std::uint64_t bound) noexcept {
  const std::uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  for (;;) {
    const std::uint64_t r = (*this)();
    if (r >= threshold) return r % bound;
  }
}

}  // namespace nitro::data::detail

namespace nitro::data {

NITRO_INLINE std::vector<std::size_t> epoch_order(std::uint64_t seed, std::int64_t epoch, std::size_t size, bool shuffle) {
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

NITRO_INLINE ResumableSampler::ResumableSampler(std::size_t size) : ResumableSampler(size, Options{}) {}

NITRO_INLINE ResumableSampler::ResumableSampler(std::size_t size, Options options) : impl_(std::make_shared<Impl>()) {
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

NITRO_INLINE void ResumableSampler::reset(std::optional<std::size_t> new_size) {
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

NITRO_INLINE std::optional<std::vector<std::size_t>> ResumableSampler::next(std::size_t batch_size) {
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

NITRO_INLINE void ResumableSampler::save(torch::serialize::OutputArchive& archive) const {
  const SamplerState st = state();
  archive.write("seed", c10::IValue(static_cast<std::int64_t>(st.seed)));  // bit pattern kept
  archive.write("epoch", c10::IValue(st.epoch));
  archive.write("index", c10::IValue(st.index));
  archive.write("size", c10::IValue(st.size));
  archive.write("shuffle", c10::IValue(st.shuffle));
  if (st.shards != 1) archive.write("shards", c10::IValue(st.shards));
}

NITRO_INLINE void ResumableSampler::load(torch::serialize::InputArchive& archive) {
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

NITRO_INLINE void ResumableSampler::set_epoch(std::int64_t epoch) {
  NITRO_CHECK(epoch >= 0, "nitro::data::ResumableSampler::set_epoch: epoch is ", epoch, "; give one >= 0");
  std::lock_guard guard(impl_->mutex);
  impl_->epoch = epoch;
  impl_->keep_position = false;
  impl_->restart_at(0);
}

NITRO_INLINE std::int64_t ResumableSampler::epoch() const {
  std::lock_guard guard(impl_->mutex);
  return impl_->epoch;
}

NITRO_INLINE std::size_t ResumableSampler::size() const {
  std::lock_guard guard(impl_->mutex);
  return static_cast<std::size_t>(impl_->size);
}

NITRO_INLINE std::size_t ResumableSampler::length() const {
  std::lock_guard guard(impl_->mutex);
  return static_cast<std::size_t>(impl_->length());
}

NITRO_INLINE SamplerState ResumableSampler::state() const {
  std::lock_guard guard(impl_->mutex);
  const Impl& s = *impl_;
  return {.seed = s.seed, .epoch = s.epoch, .index = s.delivered, .size = s.size, .shuffle = s.shuffle, .shards = s.shards};
}

NITRO_INLINE void ResumableSampler::load_state(const SamplerState& saved) {
  std::lock_guard guard(impl_->mutex);
  Impl& s = *impl_;
  check(s, saved);
  s.seed = saved.seed;
  s.shuffle = saved.shuffle;
  s.epoch = saved.epoch;
  s.restart_at(saved.index);
  s.keep_position = true;
}

NITRO_INLINE void ResumableSampler::check_state(const SamplerState& saved) const {
  std::lock_guard guard(impl_->mutex);
  check(*impl_, saved);
}

NITRO_INLINE void ResumableSampler::check(const Impl& s, const SamplerState& saved) {
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

NITRO_INLINE void ResumableSampler::defer_delivery(bool on) {
  std::lock_guard guard(impl_->mutex);
  impl_->restart_at(impl_->delivered);
  impl_->deferred = on;
}

NITRO_INLINE bool ResumableSampler::delivery_deferred() const {
  std::lock_guard guard(impl_->mutex);
  return impl_->deferred;
}

NITRO_INLINE void ResumableSampler::delivered() {
  std::lock_guard guard(impl_->mutex);
  Impl& s = *impl_;
  if (s.pending.empty()) return;  // delivery is not deferred, or the epoch was restarted since the claim
  s.delivered += s.pending.front();
  s.pending.pop_front();
}

NITRO_INLINE void ResumableSampler::rewind() {
  std::lock_guard guard(impl_->mutex);
  impl_->rewind();
}

NITRO_INLINE void ResumableSampler::Impl::restart_at(std::int64_t index) {
  delivered = claimed = index;
  pending.clear();
}

NITRO_INLINE void ResumableSampler::Impl::rewind() {
  restart_at(delivered);
  // A reader stopped mid-epoch: the next source over this sampler continues from here.
  if (delivered > 0 && delivered < length()) keep_position = true;
}

NITRO_INLINE std::int64_t ResumableSampler::Impl::length() const {
  if (shards == 1) return size;
  return drop_last ? size / shards : (size + shards - 1) / shards;
}

NITRO_INLINE void ResumableSampler::Impl::ensure_order() {
  if (order_seed == seed && order_epoch == epoch && static_cast<std::int64_t>(order.size()) == size) return;
  order = epoch_order(seed, epoch, static_cast<std::size_t>(size), true);
  order_seed = seed;
  order_epoch = epoch;
}

}  // namespace nitro::data
