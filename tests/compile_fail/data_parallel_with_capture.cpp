// expect: dist::DataParallel cannot be combined with graph::Capture
// The Reducer's gradient hooks are host work during backward, which a replayed graph would skip.
#include <nitro/dist/data_parallel.hpp>
#include <nitro/graph/capture.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

int main() {
  torch::nn::Linear model(2, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::TrainingLoop<nitro::graph::Capture, nitro::dist::DataParallel> loop{model, optimizer};
  const auto x = at::Tensor();
  loop.step(x, [&](const at::Tensor& b) { return model->forward(b).sum(); });
}
