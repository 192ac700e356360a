// expect: this loop has accumulate::Adaptive, which splits a batch that runs out of memory
#include <nitro/memory/batch_size.hpp>
#include <nitro/train/training_loop.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

int main() {
  torch::nn::Linear model(2, 2);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::TrainingLoop<nitro::accumulate::Adaptive> loop{model, optimizer};
  (void)nitro::memory::find_max_batch_size(loop, [](std::int64_t) {}, {});
}
