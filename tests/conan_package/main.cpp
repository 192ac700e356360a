#include <nitro/core/error.hpp>
#include <nitro/version.hpp>

#include <cstdio>
#if NITRO_COMPILED
#include <nitro/train/levels.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#endif

int main() {
  try {
    NITRO_CHECK(NITRO_VERSION_MAJOR < 0, "checked");
    return 1;
  } catch (const nitro::Error&) {
  }
#if NITRO_COMPILED
  // The compiled library: a level::Basic loop (whose members the library holds) takes two steps.
  torch::nn::Linear model(4, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::level::Basic loop{model, optimizer};
  const auto x = at::ones({8, 4});
  for (int i = 0; i < 2; ++i) loop.step(x, [&](const at::Tensor& b) { return model->forward(b).square().mean(); });
  if (loop.optimizer_steps() != 2) return 1;
  std::printf("nitro test_package: compiled library, 2 steps\n");
#endif
  std::printf("nitro test_package: version %d.%d.%d\n", NITRO_VERSION_MAJOR, NITRO_VERSION_MINOR, NITRO_VERSION_PATCH);
  return 0;
}
