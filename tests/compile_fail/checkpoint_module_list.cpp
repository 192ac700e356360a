// expect: a torch::nn::ModuleList holds plain torch::nn::Module pointers
#include <nitro/train/checkpoint.hpp>

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

int main() {
  torch::nn::ModuleList blocks(torch::nn::Linear(4, 4), torch::nn::Linear(4, 4));
  (void)nitro::checkpoint::sequential(blocks, 2, at::Tensor{});
}
