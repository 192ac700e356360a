// expect: graph::Capture replays one whole optimizer step per batch
// graph::Capture records one optimizer step per batch: an accumulation policy is refused at compile
// time with what to do instead.
#include <nitro/graph/capture.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

int main() {
  torch::nn::Linear model(2, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::TrainingLoop<nitro::accumulate::Fixed<2>, nitro::graph::Capture> loop{model, optimizer};
  const auto x = at::Tensor();
  loop.step(x, [&](const at::Tensor& b) { return model->forward(b).sum(); });
}
