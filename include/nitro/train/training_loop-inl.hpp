#pragma once
// The definitions of nitro/train/training_loop.hpp's non-template functions: included by
// training_loop.hpp when Nitro is header-only, compiled once into the library with NITRO_COMPILED
// (core/config.hpp).
#include <nitro/train/training_loop.hpp>

namespace nitro::detail {

NITRO_INLINE void check_loop_counters(std::int64_t accumulation_steps, std::int64_t pending_micro_batches,
                                      std::int64_t optimizer_steps, std::int64_t skipped_steps, std::int64_t split,
                                      std::int64_t splits_made) {
  NITRO_CHECK(pending_micro_batches >= 0 && pending_micro_batches < accumulation_steps,
              "TrainingLoop::load_state: pending_micro_batches must be in [0, accumulation_steps), got ",
              pending_micro_batches, " of ", accumulation_steps);
  NITRO_CHECK(optimizer_steps >= 0 && skipped_steps >= 0 && skipped_steps <= optimizer_steps,
              "TrainingLoop::load_state: the step counters must satisfy 0 <= skipped_steps <= optimizer_steps, got ",
              skipped_steps, " and ", optimizer_steps);
  NITRO_CHECK(split >= 1 && splits_made >= 0, "TrainingLoop::load_state: split must be >= 1 and splits_made "
              "must be >= 0, got ", split, " and ", splits_made);
}

}  // namespace nitro::detail
