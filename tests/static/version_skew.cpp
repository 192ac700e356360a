// Built with NITRO_COMPILED against a copy of Nitro's headers whose version.hpp says 0.99.0
// (tests/CMakeLists.txt writes it) and linked with the library built from this tree: the first
// TrainingLoop made throws nitro::Error naming both versions (the test matches the message).
#include <nitro/train/levels.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstdio>

int main() {
  torch::nn::Linear model(2, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  try {
    nitro::level::Basic loop{model, optimizer};
    std::puts("no error: the versions were not compared");
    return 1;
  } catch (const nitro::Error& e) {
    std::printf("nitro::Error: %s\n", e.what());
    return 0;
  }
}
