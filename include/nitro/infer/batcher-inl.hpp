#pragma once
// The definitions of nitro/infer/batcher.hpp's non-template functions: included by batcher.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/infer/batcher.hpp>

namespace nitro::infer {

NITRO_INLINE double BatcherStats::mean_batch() const {
  uint64_t n = 0, sum = 0;
  for (size_t i = 0; i < batch_sizes.size(); ++i) n += batch_sizes[i], sum += batch_sizes[i] * i;
  return n ? static_cast<double>(sum) / static_cast<double>(n) : 0.0;
}

}  // namespace nitro::infer
