// expect: this hook policy has none of the hooks
// A type of the Hook family whose member has the wrong signature: the loop says so instead of
// silently never calling it.
#include <nitro/train/training_loop.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

struct Misspelled {
  using family = nitro::family::Hook;
  static constexpr std::string_view name = "misspelled";
  static constexpr bool enabled = true;
  struct Options {};
  void after_optimizer_step(int) {}  // takes (Loop&, StepResult&)
};

int main() {
  torch::nn::Linear model(2, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::TrainingLoop<Misspelled> loop{model, optimizer};
}
