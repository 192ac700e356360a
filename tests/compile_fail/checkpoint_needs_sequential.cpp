// expect: checkpoint::Segments and checkpoint::Sqrt apply to a torch::nn::Sequential model
#include <nitro/train/training_loop.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

int main() {
  torch::nn::Linear model(2, 2);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Off, nitro::checkpoint::Sqrt> loop{model, optimizer};
}
