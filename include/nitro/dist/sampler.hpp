#pragma once
// nitro::dist::DistributedSampler: each rank reads its own shard of every epoch, as PyTorch's
// DistributedSampler does, with the exact, resumable position of data::ResumableSampler.
//
//   auto world = nitro::dist::ProcessGroup::from_environment();
//   nitro::dist::DistributedSampler sampler(dataset.size().value(), world, {.seed = 42});
//   for (epoch ...) { sampler.set_epoch(epoch); for (auto& batch : prefetcher over sampler) loop.step(...); }
//
// Every rank draws epoch e's order from the same (seed, e) (data::epoch_order), pads it by repeating
// its start to a multiple of the world size (or cuts it to one: drop_last), and reads positions rank,
// rank + W, rank + 2W, ...: the shards are disjoint (but for the padding) and cover the epoch, and every
// rank gets the same number of samples, hence of batches, so no rank waits in an all-reduce the others
// never start. Give every rank the same seed.
//
// Its state (data::SamplerState, with `shards` = the world size) goes into snapshots like any
// ResumableSampler's: every rank has delivered as many samples, so rank 0's snapshot resumes every rank.
// Resuming with another world size is a nitro::Error (the shards would change mid-epoch); start a new
// epoch instead.
#include <nitro/core/config.hpp>
#include <nitro/data/sampler.hpp>
#include <nitro/dist/process_group.hpp>

#include <cstddef>
#include <cstdint>

namespace nitro::dist {

/// A data::ResumableSampler that gives this rank its shard of each epoch (see the top of this file).
class DistributedSampler : public data::ResumableSampler {
 public:
  /// The knobs.
  struct Options {
    /// The same on every rank.
    std::uint64_t seed = 0;
    /// Draw each epoch's order from (seed, epoch); false: the data set's order.
    bool shuffle = true;
    /// Cut each epoch to a multiple of the world size instead of padding it.
    bool drop_last = false;
  };
  /// `size` samples sharded over `group`'s ranks, with default options.
  NITRO_INLINE DistributedSampler(std::size_t size, const ProcessGroup& group);
  /// `size` samples sharded over `group`'s ranks. Throws nitro::Error when size is 0, or with drop_last
  /// when there are fewer samples than ranks.
  NITRO_INLINE DistributedSampler(std::size_t size, const ProcessGroup& group, const Options& o);
};

}  // namespace nitro::dist

#if !NITRO_COMPILED
#include <nitro/dist/sampler-inl.hpp>
#endif
