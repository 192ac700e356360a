#pragma once
// The definitions of nitro/train/accumulate.hpp's non-template functions: included by accumulate.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/train/accumulate.hpp>

namespace nitro::accumulate {

NITRO_INLINE std::int64_t Dynamic::steps(const Options& o) {
  NITRO_CHECK(o.steps >= 1, "accumulate::Dynamic: steps must be >= 1, got ", o.steps);
  return o.steps;
}

NITRO_INLINE auto Dynamic::for_batch(std::int64_t effective_batch, std::int64_t micro_batch) -> Options {
  NITRO_CHECK(micro_batch >= 1 && effective_batch >= micro_batch && effective_batch % micro_batch == 0,
              "accumulate::Dynamic::for_batch: the effective batch (", effective_batch,
              ") must be a positive multiple of the micro-batch (", micro_batch, ")");
  return {effective_batch / micro_batch};
}

NITRO_INLINE std::int64_t Adaptive::steps(const Options& o) {
  NITRO_CHECK(o.initial_split >= 1, "accumulate::Adaptive: initial_split must be >= 1, got ", o.initial_split);
  NITRO_CHECK(o.max_split == 0 || o.max_split >= o.initial_split, "accumulate::Adaptive: max_split (", o.max_split,
              ") must be 0 (no limit) or >= initial_split (", o.initial_split, ")");
  return 1;
}

}  // namespace nitro::accumulate
