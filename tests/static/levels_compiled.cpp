// Built with NITRO_COMPILED and NITRO_EXPLICIT_INSTANTIATE_ONLY: a program that uses every member of
// the predefined levels compiles (so none of their members defined out of the class is instantiated
// here: the macro would make that an error), and tests/check_extern.cmake reads the object file to
// check that those members are only referenced, the library's copies being the ones that run.
#include <nitro/graph/capture.hpp>
#include <nitro/train/levels.hpp>

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

namespace {
template <class Loop>
[[maybe_unused]] void use(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, const at::Tensor& x) {
  Loop loop{model, optimizer};
  Loop moved_model{std::shared_ptr<torch::nn::Module>(model.ptr()), optimizer};
  (void)loop.step(x, [&](const at::Tensor& b) { return model->forward(b).sum(); });
  (void)loop.flush();
  (void)loop.forward(x);
  loop.load_state(loop.state());
  (void)moved_model.optimizer_steps();
}
}  // namespace

void use_levels(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, const at::Tensor& x) {
  use<nitro::level::Basic>(model, optimizer, x);
  use<nitro::level::Advanced>(model, optimizer, x);
  use<nitro::level::Ultra>(model, optimizer, x);
#if NITRO_WITH_CUDA
  use<nitro::level::Max>(model, optimizer, x);
#endif
}
