// expect: dist::DataParallel cannot be combined with accumulate::Adaptive
// A rank that splits its batch on running out of memory would run more backward passes than the
// others, and their all-reduces would no longer pair up: refused at compile time.
#include <nitro/dist/data_parallel.hpp>
#include <nitro/train/training_loop.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

int main() {
  torch::nn::Linear model(2, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::TrainingLoop<nitro::accumulate::Adaptive, nitro::dist::DataParallel> loop{model, optimizer};
  const auto x = at::Tensor();
  loop.step(x, [&](const at::Tensor& b) { return model->forward(b).sum(); });
}
