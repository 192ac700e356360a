#pragma once
// Gradient accumulation: several micro-batches per optimizer step, with the gradient of one batch
// that many times larger (each micro-batch loss is divided by the count; mean-reduced losses).
//
//   accumulate::Off         one micro-batch per step. The baseline.
//   accumulate::Fixed<N>    N micro-batches per step, known at compile time.
//   accumulate::Dynamic     N chosen at run time: Options{.steps = N}, or for_batch(effective, micro);
//                           TrainingLoop::set_accumulation_steps changes it between steps.
//
// Unscaling (fp16) and clipping happen once per optimizer step. TrainingLoop::flush() steps on a
// partial window at the end of an epoch, rescaled so it is the mean over the micro-batches it had.
#include <nitro/core/concepts.hpp>
#include <nitro/core/error.hpp>

#include <cstdint>
#include <string_view>

namespace nitro::accumulate {

/// One micro-batch per optimizer step.
struct Off {
  using family = nitro::family::Accumulation;
  static constexpr std::string_view name = "off";
  static constexpr bool enabled = false;
  struct Options {};
  static constexpr std::int64_t steps(const Options&) noexcept { return 1; }
};

/// N micro-batches per optimizer step.
/// @tparam N required: micro-batches per step, >= 1.
template <std::int64_t N>
struct Fixed {
  static_assert(N >= 1, "accumulate::Fixed<N>: N is the number of micro-batches per optimizer step and must be >= 1 "
                        "(use accumulate::Off for one)");
  using family = nitro::family::Accumulation;
  static constexpr std::string_view name = "fixed";
  static constexpr bool enabled = N > 1;
  struct Options {};
  static constexpr std::int64_t steps(const Options&) noexcept { return N; }
};

/// A run-time number of micro-batches per optimizer step.
struct Dynamic {
  using family = nitro::family::Accumulation;
  static constexpr std::string_view name = "dynamic";
  static constexpr bool enabled = true;
  struct Options {
    /// Micro-batches per optimizer step, >= 1.
    std::int64_t steps = 1;
  };
  static std::int64_t steps(const Options& o) {
    NITRO_CHECK(o.steps >= 1, "accumulate::Dynamic: steps must be >= 1, got ", o.steps);
    return o.steps;
  }
  /// The options that reach `effective_batch` samples per step with micro-batches of `micro_batch`.
  static Options for_batch(std::int64_t effective_batch, std::int64_t micro_batch) {
    NITRO_CHECK(micro_batch >= 1 && effective_batch >= micro_batch && effective_batch % micro_batch == 0,
                "accumulate::Dynamic::for_batch: the effective batch (", effective_batch,
                ") must be a positive multiple of the micro-batch (", micro_batch, ")");
    return {effective_batch / micro_batch};
  }
};

static_assert(AccumulationPolicy<Off> && AccumulationPolicy<Fixed<4>> && AccumulationPolicy<Dynamic>);

}  // namespace nitro::accumulate
