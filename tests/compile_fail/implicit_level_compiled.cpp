// expect: NITRO_EXPLICIT_INSTANTIATE_ONLY: a member of a predefined level
// With NITRO_COMPILED and NITRO_EXPLICIT_INSTANTIATE_ONLY, level::Basic's type named without
// train/levels.hpp (so without the extern template declarations of its members) is refused too:
// its members would be compiled in this translation unit.
#define NITRO_COMPILED 1
#define NITRO_EXPLICIT_INSTANTIATE_ONLY
#include <nitro/train/training_loop.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

int main() {
  torch::nn::Linear model(2, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Off, nitro::checkpoint::Off> loop{model, optimizer};
  return static_cast<int>(loop.optimizer_steps());
}
