// Nitro's compiled library: the non-template code of data/ (the image decoders aside: src/image.cpp)
// and cache/.
#include <nitro/cache/cache-inl.hpp>
#include <nitro/cache/disk_tier-inl.hpp>
#include <nitro/cache/evict/wtinylfu-inl.hpp>
#include <nitro/data/augment-inl.hpp>
#include <nitro/data/packed-inl.hpp>
#include <nitro/data/pinned_pool-inl.hpp>
#include <nitro/data/record_file-inl.hpp>
#include <nitro/data/sampler-inl.hpp>
#include <nitro/data/stage_stats-inl.hpp>
#include <nitro/data/synthetic-inl.hpp>
