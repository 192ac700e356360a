// expect: each candidate must be a TrainingLoop type
#include <nitro/train/autotune.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

int main() {
  torch::nn::Linear model(2, 2);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  // A policy is not a loop: the candidates are loop types (level::Basic, TrainingLoop<amp::Bf16>).
  nitro::level::Auto<nitro::level::Basic, nitro::amp::Bf16> loop{model, optimizer};
}
