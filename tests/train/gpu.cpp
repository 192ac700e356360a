// On the GPU machine: step() synchronises the host with the device only where a policy must decide
// on the host (amp::Fp16, skip_nonfinite). Proven with CUDA's sync debug mode set to error, which
// makes any synchronising call throw. Skipped, and reported so, without a GPU.
#include <nitro/train/levels.hpp>

#include "testing.hpp"

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace nitro_test_train_gpu {  // one namespace per file: an area is compiled as one translation unit

namespace {

#if NITRO_WITH_CUDA
struct SyncIsAnError {
  SyncIsAnError() { c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR); }
  ~SyncIsAnError() { c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED); }
};
#endif

template <class Loop>
void run_steps(int steps, typename Loop::Options options = {}) {
#if NITRO_WITH_CUDA
  torch::nn::Sequential model(torch::nn::Linear(64, 64), torch::nn::Functional(torch::relu), torch::nn::Linear(64, 64),
                              torch::nn::Functional(torch::relu), torch::nn::Linear(64, 1));
  model->to(torch::kCUDA);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  Loop loop{model, optimizer, options};
  const auto x = torch::randn({32, 64}, torch::kCUDA), y = torch::randn({32, 1}, torch::kCUDA);
  loop.step(std::make_pair(x, y), [](auto& f, const auto& b) { return (f(b.first) - b.second).pow(2).mean(); });
  c10::cuda::device_synchronize();  // warm-up done: lazy initialisation may synchronise
  SyncIsAnError strict;
  for (int i = 0; i < steps; ++i)
    loop.step(std::make_pair(x, y), [](auto& f, const auto& b) { return (f(b.first) - b.second).pow(2).mean(); });
#else
  (void)steps;
  (void)options;
#endif
}

using namespace nitro;
using Accumulating = TrainingLoop<amp::Bf16, accumulate::Fixed<2>, checkpoint::Off>;
using Checkpointed = TrainingLoop<amp::Off, accumulate::Off, checkpoint::Sqrt>;
using ClippedNorm = TrainingLoop<amp::Bf16, accumulate::Off, checkpoint::Off, clip::Norm>;
using ClippedValue = TrainingLoop<amp::Off, accumulate::Dynamic, checkpoint::Segments<2>, clip::Value>;

}  // namespace

TEST_CASE_TEMPLATE("gpu: no host-device synchronisation in step() without fp16 or skip_nonfinite" * nitro::test::needs_gpu(),
                   Loop, level::Basic, level::Advanced, level::Ultra, Accumulating, Checkpointed, ClippedNorm,
                   ClippedValue) {
  // 6 steps: level::Ultra's stability::Guard reads the device once every 10 optimizer steps (its
  // check), on purpose; those steps are not among these.
  CHECK_NOTHROW(run_steps<Loop>(6));
}

TEST_CASE("gpu: fp16's one synchronisation per optimizer step is what the sync detector catches" * nitro::test::needs_gpu()) {
  // The detector works: the fp16 skip decision reads one flag from the device, and is refused with
  // CUDA's sync-debug error, not any other.
  CHECK_THROWS_WITH(run_steps<TrainingLoop<amp::Fp16<>>>(1), doctest::Contains("called a synchronizing CUDA operation"));
  CHECK_THROWS_WITH(run_steps<level::Basic>(1, {.skip_nonfinite = true}),
                    doctest::Contains("called a synchronizing CUDA operation"));
}

}  // namespace nitro_test_train_gpu
