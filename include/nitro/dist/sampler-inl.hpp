#pragma once
// The definitions of nitro/dist/sampler.hpp's non-template functions: included by sampler.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/dist/sampler.hpp>

namespace nitro::dist {

NITRO_INLINE DistributedSampler::DistributedSampler(std::size_t size, const ProcessGroup& group) : DistributedSampler(size, group, Options{}) {}

NITRO_INLINE DistributedSampler::DistributedSampler(std::size_t size, const ProcessGroup& group, const Options& o) : data::ResumableSampler(size, {.seed = o.seed, .shuffle = o.shuffle, .shard = group.rank(),
                                    .shards = group.size(), .drop_last = o.drop_last}) {}

}  // namespace nitro::dist
