// expect: graph::Capture needs a LibTorch built with CUDA
// On a LibTorch without CUDA (NITRO_WITH_CUDA 0, forced here) graph::Capture is a compile-time error
// that says why, not a link error or a policy that silently does nothing.
#undef NITRO_WITH_CUDA
#define NITRO_WITH_CUDA 0
#include <nitro/graph/capture.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

int main() {
  torch::nn::Linear model(2, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::TrainingLoop<nitro::graph::Capture> loop{model, optimizer};
}
