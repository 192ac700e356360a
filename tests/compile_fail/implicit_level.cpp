// expect: NITRO_EXPLICIT_INSTANTIATE_ONLY: a member of a predefined level
// With NITRO_EXPLICIT_INSTANTIATE_ONLY, a predefined level compiled in the program's own translation
// unit (here: header-only, so nothing is declared extern) is refused, naming what to do.
#define NITRO_EXPLICIT_INSTANTIATE_ONLY
#include <nitro/train/levels.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

int main() {
  torch::nn::Linear model(2, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::level::Basic loop{model, optimizer};
  return static_cast<int>(loop.optimizer_steps());
}
