#pragma once
// Gradient accumulation: several micro-batches per optimizer step, with the gradient of one batch
// that many times larger (each micro-batch loss is divided by the count; mean-reduced losses).
//
//   accumulate::Off         one micro-batch per step. The baseline.
//   accumulate::Fixed<N>    N micro-batches per step, known at compile time.
//   accumulate::Dynamic     N chosen at run time: Options{.steps = N}, or for_batch(effective, micro);
//                           TrainingLoop::set_accumulation_steps changes it between steps.
//   accumulate::Adaptive    every step() is one optimizer step over the batch it is given; when the
//                           forward or backward runs out of memory (in any form memory/oom.hpp knows:
//                           the allocator's, cuBLAS's, cuDNN's), the loop drops the partial gradients,
//                           splits the batch in two parts (then four...) and accumulates over them:
//                           the same update (losses weighted by part size), less activation memory. The
//                           split is kept for later steps and reported (TrainingLoop::split(),
//                           Options::on_split). For batches whose size you do not know fits: after a
//                           model change, on a shared GPU, with variable-size inputs.
//                           Covered: the forward and the backward (activations). Not covered: the
//                           optimizer step (splitting the batch does not shrink the optimizer's
//                           memory): an out-of-memory there, typically Adam making its state on the
//                           first step, reaches the caller with the step's gradients dropped and the
//                           loop ready for the next batch, as for any failed optimizer step.
//
// Unscaling (fp16) and clipping happen once per optimizer step. TrainingLoop::flush() steps on a
// partial window at the end of an epoch, rescaled so it is the mean over the micro-batches it had.
#include <nitro/core/config.hpp>
#include <nitro/core/concepts.hpp>
#include <nitro/core/error.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace nitro::accumulate {

/// One micro-batch per optimizer step.
struct Off {
  /// The policy family this belongs to.
  using family = nitro::family::Accumulation;
  /// Name shown in reports and checked in snapshots.
  static constexpr std::string_view name = "off";
  /// Off: the loop takes one micro-batch per optimizer step.
  static constexpr bool enabled = false;
  /// No knobs.
  struct Options {};
  /// One micro-batch per step.
  static constexpr std::int64_t steps(const Options&) noexcept { return 1; }
};

/// N micro-batches per optimizer step.
/// @tparam N required: micro-batches per step, >= 1.
template <std::int64_t N>
struct Fixed {
  static_assert(N >= 1, "accumulate::Fixed<N>: N is the number of micro-batches per optimizer step and must be >= 1 "
                        "(use accumulate::Off for one)");
  /// The policy family this belongs to.
  using family = nitro::family::Accumulation;
  /// Name shown in reports and checked in snapshots.
  static constexpr std::string_view name = "fixed";
  /// On when N > 1.
  static constexpr bool enabled = N > 1;
  /// No knobs: N is in the type.
  struct Options {};
  /// N micro-batches per step.
  static constexpr std::int64_t steps(const Options&) noexcept { return N; }
};

/// A run-time number of micro-batches per optimizer step.
struct Dynamic {
  /// The policy family this belongs to.
  using family = nitro::family::Accumulation;
  /// Name shown in reports and checked in snapshots.
  static constexpr std::string_view name = "dynamic";
  /// On: the loop counts micro-batches.
  static constexpr bool enabled = true;
  /// The knobs.
  struct Options {
    /// Micro-batches per optimizer step, >= 1.
    std::int64_t steps = 1;
  };
  /// o.steps micro-batches per step. Throws nitro::Error when it is below 1.
  NITRO_INLINE static std::int64_t steps(const Options& o);
  /// The options that reach `effective_batch` samples per step with micro-batches of `micro_batch`.
  /// Throws nitro::Error unless micro_batch >= 1 and effective_batch is a positive multiple of it.
  NITRO_INLINE static Options for_batch(std::int64_t effective_batch, std::int64_t micro_batch);
};

/// One optimizer step per step() call; the batch is split into parts when memory runs out.
struct Adaptive {
  /// The policy family this belongs to.
  using family = nitro::family::Accumulation;
  /// Name shown in reports and checked in snapshots.
  static constexpr std::string_view name = "adaptive";
  /// On: the loop splits batches when memory runs out.
  static constexpr bool enabled = true;
  /// The loop splits its batch when memory runs out (the trait the loop checks).
  static constexpr bool splits_on_oom = true;

  /// What the loop reports when it splits (core/concepts.hpp).
  using SplitEvent = accumulate::SplitEvent;
  /// The knobs.
  struct Options {
    /// Parts to start with, >= 1 (e.g. a split remembered from an earlier run).
    std::int64_t initial_split = 1;
    /// The most parts a batch may be split into, >= initial_split; 0: one row per part at most.
    /// Past it the out-of-memory error reaches the caller.
    std::int64_t max_split = 0;
    /// Called on each split, e.g. to log it. Optional.
    std::function<void(const SplitEvent&)> on_split;
  };
  /// One optimizer step per step() call: returns 1. Throws nitro::Error when initial_split is below 1,
  /// or max_split is neither 0 nor >= initial_split.
  NITRO_INLINE static std::int64_t steps(const Options& o);
};

static_assert(AccumulationPolicy<Off> && AccumulationPolicy<Fixed<4>> && AccumulationPolicy<Dynamic> &&
              AccumulationPolicy<Adaptive>);

}  // namespace nitro::accumulate

namespace nitro::detail {
/// The accumulation policy splits the batch on running out of memory (accumulate::Adaptive).
template <class A>
concept SplitsOnOom = requires {
  requires static_cast<bool>(A::splits_on_oom);
};
}  // namespace nitro::detail

#if !NITRO_COMPILED
#include <nitro/train/accumulate-inl.hpp>
#endif
