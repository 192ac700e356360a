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
// Measured (CPU, 2 cores, no GPU; make demo, CNN on SyntheticImages, batch 64, 2 epochs):
//   without bf16 arithmetic: plain loop 3166 samples/s, 17.0 MB peak;  Basic 3523 samples/s, 17.3 MB,
//   same loss and accuracy;  Advanced 509 samples/s, 15.0 MB;  Ultra 289 samples/s, 5.9 MB.
//   with AVX-512 BF16 (AMD EPYC): plain 5798, Basic 5130 (with monitor::Phases), Advanced 5675
//   samples/s, 12.2 MB;  Ultra 3736 samples/s, 5.9 MB. samples/s vary by 10% or more between runs.
//   after the gradients were released at the optimizer step (AMD EPYC without AVX-512, 2026-11-23):
//   plain 2981 samples/s, 17.0 MB;  Basic 2941, 17.2 MB (was 0.9 MB above plain);  Advanced 518,
//   14.9 MB;  Ultra 290, 5.8 MB.
//   bench_loop_overhead: Basic / hand-written loop = 0.998 (goal <= 1.02). Not yet measured on a GPU.
//
//   level::Max       (in graph/capture.hpp, which this header does not include) Advanced plus
//                    graph::Capture: each step replayed from a CUDA graph; needs a fused optimizer
//                    (optim/fused.hpp) and batches on the GPU; convert a CNN with to_channels_last.
//                    Not yet measured: no GPU has been lent (bench_graphs).
//
// Add a policy to a level with `level::with`: `level::with<level::Advanced, monitor::Phases>`.
#include <nitro/hw/settings.hpp>
#include <nitro/train/stability.hpp>
#include <nitro/train/training_loop.hpp>

#include <type_traits>

namespace nitro::level {

using Basic = TrainingLoop<amp::Off, accumulate::Off, checkpoint::Off>;
using Advanced = TrainingLoop<amp::Bf16, accumulate::Off, checkpoint::Off>;
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

/// The hardware settings a level is meant to run with: none for Basic, Settings::fast() for the
/// others (a loop with any AMP policy counts as Advanced or above).
template <class Loop>
hw::Settings hardware() {
  if constexpr (std::is_same_v<typename Loop::amp_policy, amp::Off>) {
    return {};
  } else {
    return hw::Settings::fast();
  }
}

}  // namespace nitro::level
