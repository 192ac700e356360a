#pragma once
// Channels-last models: nitro::to_channels_last(module) stores every 4-d parameter and buffer (the
// convolution weights) as NHWC, as Python's `model.to(memory_format=torch.channels_last)` does. With
// channels-last inputs (data::Prefetcher's `channels_last` option delivers them), cuDNN's convolutions
// on tensor cores and oneDNN's on the CPU skip their layout transposes.
//
//   auto model = make_cnn();
//   nitro::to_channels_last(*model);                     // before the optimizer is built
//   nitro::optim::FusedAdamW optimizer(model->parameters(), ...);
//
// The tensors stay the same objects (their data is replaced, as Python's param.data = ...), so an
// optimizer built before still holds them; but its state made before (Adam's moments) keeps the old
// layout: LibTorch's optimizers read it through strides, Nitro's fused ones (optim/fused.hpp) copy it
// into the new layout at their next step. Convert first, then build the optimizer.
// A gradient already there is converted too. Other tensors (1-d biases, 2-d linear weights) are left
// as they are: channels-last has no meaning for them.
#include <nitro/core/config.hpp>
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <c10/core/MemoryFormat.h>
#include <torch/nn/module.h>

#include <cstdint>

namespace nitro {

/// Converts the module's 4-d parameters and buffers (recursively) to channels-last; returns how many
/// tensors it changed.
NITRO_INLINE std::int64_t to_channels_last(torch::nn::Module& module);

/// Whether every 4-d parameter and buffer of the module is channels-last.
NITRO_INLINE bool is_channels_last(torch::nn::Module& module);

}  // namespace nitro

#if !NITRO_COMPILED
#include <nitro/train/channels_last-inl.hpp>
#endif
