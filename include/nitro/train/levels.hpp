#pragma once
// Optimization levels: the TrainingLoop configurations to pick from, as type aliases (the analogue
// of Apex's O0-O3), each with the hardware settings it is meant to run with.
//
//   using Loop = nitro::level::Advanced;                            // pick a level
//   nitro::hw::ScopedSettings hw{nitro::level::hardware<Loop>()};   // its hardware settings
//   Loop loop{model, optimizer};                                    // and train with loop.step(...)
//
//   level::Basic     fp32, no accumulation, no checkpointing, LibTorch's defaults. The baseline:
//                    what a hand-written loop does, at the same speed (bench_loop_overhead).
//   level::Advanced  bf16 autocast, cuDNN autotuning and TF32: faster on GPUs with bf16 (Ampere
//                    and newer), same memory for parameters, less for activations.
//   level::Ultra     Advanced plus gradient accumulation (accumulate::Dynamic, e.g. for_batch()),
//                    sqrt(n) activation checkpointing (of a Sequential model by the loop, of any
//                    other model by its own forward through checkpoint::sequential / block), clipping
//                    by norm, and stability::Guard (train/stability.hpp: every 10 optimizer steps one
//                    read of the losses and a finite-parameters flag; a NaN or inf restores the last
//                    good state, kept on the host every 100 steps): the least activation memory, for
//                    models that do not fit otherwise, and long runs that must not die of one NaN.
//
// What each level measured, on which machine and when: bench/README.md and the README (make demo,
// bench_loop_overhead). Which level is fastest depends on the machine: bf16 autocast (Advanced, Ultra)
// is several times slower than fp32 on a CPU without bf16 arithmetic.
//
//   level::Max       (in graph/capture.hpp, which this header does not include) Advanced plus
//                    graph::Capture: each step replayed from a CUDA graph; needs a fused optimizer
//                    (optim/fused.hpp) and batches on the GPU; convert a CNN with to_channels_last.
//                    bench_graphs measures it on a GPU.
//
// Add a policy to a level with `level::with`: `level::with<level::Advanced, monitor::Phases>`.
#include <nitro/core/config.hpp>
#include <nitro/hw/settings.hpp>
#include <nitro/train/stability.hpp>
#include <nitro/train/training_loop.hpp>

#include <type_traits>

namespace nitro::level {

/// fp32, no accumulation, no checkpointing: the baseline (see the top of this file).
using Basic = TrainingLoop<amp::Off, accumulate::Off, checkpoint::Off>;
/// bf16 autocast; with hardware<Advanced>(), cuDNN autotuning and TF32.
using Advanced = TrainingLoop<amp::Bf16, accumulate::Off, checkpoint::Off>;
/// Advanced plus accumulate::Dynamic, checkpoint::Sqrt, clip::Norm and stability::Guard: the least
/// activation memory.
using Ultra = TrainingLoop<amp::Bf16, accumulate::Dynamic, checkpoint::Sqrt, clip::Norm, stability::Guard>;


namespace detail {
template <class Loop, class... More>
struct with_policies;
template <class... Policies, class... More>
struct with_policies<TrainingLoop<Policies...>, More...> {
  using type = TrainingLoop<Policies..., More...>;
};
}  // namespace detail

/// A level with more extra policies, e.g. a monitor: `level::with<level::Ultra, monitor::Phases>`.
template <class Loop, class... More>
using with = typename detail::with_policies<Loop, More...>::type;

/// The hardware settings a level is meant to run with: the CPU heap kept for Basic
/// (Settings::heap(): glibc's malloc thresholds fixed, so a step's freed memory is reused without
/// page faults), Settings::fast() for the others (a loop with any AMP policy counts as Advanced or
/// above): cuDNN autotuning, TF32, and the heap kept.
template <class Loop>
hw::Settings hardware() {
  if constexpr (std::is_same_v<typename Loop::amp_policy, amp::Off>) {
    return hw::Settings::heap();
  } else {
    return hw::Settings::fast();
  }
}

}  // namespace nitro::level

#if NITRO_COMPILED
// The levels' members defined out of the class are compiled in Nitro's library (src/train.cpp).
NITRO_DETAIL_LOOP_MEMBERS(extern template, nitro::level::Basic);
NITRO_DETAIL_LOOP_MEMBERS(extern template, nitro::level::Advanced);
NITRO_DETAIL_LOOP_MEMBERS(extern template, nitro::level::Ultra);
#endif


// Their mark for NITRO_EXPLICIT_INSTANTIATE_ONLY (detail::is_predefined_level) is in training_loop.hpp.
static_assert(nitro::detail::is_predefined_level<nitro::level::Basic> &&
              nitro::detail::is_predefined_level<nitro::level::Advanced> &&
              nitro::detail::is_predefined_level<nitro::level::Ultra>);
