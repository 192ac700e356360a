#pragma once
// Models the benchmark programs share.
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <ATen/ops/relu.h>

#include <cstdint>

namespace nitro::bench {

/// The elements of a module's parameters (a tied one once, as nanoGPT's get_num_params counts).
inline std::int64_t parameter_count(const torch::nn::Module& m) {
  std::int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

/// The levels demo's CNN (examples/levels.cpp) for 3x32x32 images and 10 classes; weights from the
/// current seed.
inline torch::nn::Sequential demo_cnn() {
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)),
                               torch::nn::Functional(torch::relu), torch::nn::MaxPool2d(2),
                               torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)),
                               torch::nn::Functional(torch::relu), torch::nn::MaxPool2d(2), torch::nn::Flatten(),
                               torch::nn::Linear(32 * 8 * 8, 10));
}

}  // namespace nitro::bench
