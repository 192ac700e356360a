// expect: nitro::autotune<Candidates...>: the candidate list is empty
#include <nitro/train/autotune.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

int main() {
  torch::nn::Linear model(2, 2);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  const auto x = torch::ones({4, 2});
  (void)nitro::autotune<>(model, optimizer, [&] { return x; }, [&](const at::Tensor& b) { return model->forward(b).sum(); });
}
