// expect: level::Auto<Candidates...>: the candidate list is empty
#include <nitro/train/autotune.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

int main() {
  torch::nn::Linear model(2, 2);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::level::Auto<> loop{model, optimizer};
}
