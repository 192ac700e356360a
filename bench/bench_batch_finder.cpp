// find_max_batch_size on a CNN under a CPU byte budget (nitro::memory::ScopedCpuTracking; on a GPU,
// the device's own memory): trials used and seconds spent by each mode, and whether binsearch's answer
// is exact (its size fits, one more does not, each checked by a separate trial).
// RESULT batch_finder_trials = sizes binsearch tried, goal <= ceil(log2(max / min)) + 2;
// RESULT batch_finder_exact = 1 when the answer is the largest fitting size, goal >= 1.
//
//   bench_batch_finder [budget MiB, default 256]
#include "common.hpp"

#include <nitro/memory/batch_size.hpp>
#include <nitro/memory/tracking_allocator.hpp>

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

namespace {

torch::nn::Sequential cnn() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 32, 3).padding(1)),
                               torch::nn::Functional(torch::relu), torch::nn::MaxPool2d(2),
                               torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)),
                               torch::nn::Functional(torch::relu), torch::nn::MaxPool2d(2), torch::nn::Flatten(),
                               torch::nn::Linear(64 * 8 * 8, 10));
}

}  // namespace

int main(int argc, char** argv) try {
  const bool gpu = nitro::Cuda::available();
  const c10::Device device = gpu ? nitro::Cuda::device() : nitro::Cpu::device();
  const std::int64_t budget_mib = argc > 1 ? std::atoll(argv[1]) : 256;
  const std::int64_t min = 1, max = gpu ? (1 << 17) : 8192;
  auto model = cnn();
  model->to(device);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  const auto trial = [&](std::int64_t batch) {
    const auto x = torch::randn({batch, 3, 32, 32}, device);
    const auto y = torch::randint(0, 10, {batch}, torch::TensorOptions(device).dtype(torch::kLong));
    optimizer.zero_grad();
    torch::cross_entropy_loss(model->forward(x), y).backward();
    optimizer.step();
  };
  std::optional<nitro::memory::ScopedCpuTracking> budget;
  if (!gpu) budget.emplace(nitro::memory::TrackingOptions{.budget_bytes = budget_mib << 20});
  std::printf("bench_batch_finder: CNN 3x32x32 (2 conv, 1 linear), Adam, %s, %s, sizes %lld..%lld\n",
              gpu ? "cuda (the device's memory)" : "cpu", gpu ? nitro::bench::machine().c_str()
                                                         : (std::to_string(budget_mib) + " MiB budget").c_str(),
              static_cast<long long>(min), static_cast<long long>(max));
  std::printf("%-10s %10s %8s %8s %10s\n", "mode", "batch", "trials", "calls", "seconds");
  nitro::memory::BatchSizeResult bin;
  for (const auto mode : {nitro::memory::SearchMode::power, nitro::memory::SearchMode::binsearch}) {
    const auto r = nitro::memory::find_max_batch_size(
        trial, {.mode = mode, .min = min, .max = max, .model = model.ptr().get(), .optimizer = &optimizer});
    std::printf("%-10s %10lld %8d %8d %10.2f\n", mode == nitro::memory::SearchMode::power ? "power" : "binsearch",
                static_cast<long long>(r.batch_size), r.trials, r.calls, r.seconds);
    if (mode == nitro::memory::SearchMode::binsearch) bin = r;
  }
  // Exact: the answer fits and one more does not, each alone.
  const auto fits = [&](std::int64_t size) {
    const auto r = nitro::memory::find_max_batch_size(
        trial, {.mode = nitro::memory::SearchMode::power, .min = size, .max = size, .model = model.ptr().get(),
                .optimizer = &optimizer});
    return r.largest_fit == size;
  };
  bool exact = fits(bin.batch_size);
  try {
    exact = exact && (bin.batch_size == max || !fits(bin.batch_size + 1));
  } catch (const nitro::Error&) {  // min = answer + 1 does not fit: what we want
  }
  std::printf("binsearch history:");
  for (const auto& t : bin.history) std::printf(" %lld%s", static_cast<long long>(t.batch_size), t.fit ? "+" : "-");
  std::printf("\n");
  const double bound = std::ceil(std::log2(static_cast<double>(max) / static_cast<double>(min))) + 2;
  nitro::bench::result("batch_finder_trials", bin.trials, "<=", bound);
  nitro::bench::result("batch_finder_exact", exact ? 1 : 0, ">=", 1);
  std::printf("batch_finder_seconds=%.2f (binsearch, %d calls)\n", bin.seconds, bin.calls);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_batch_finder: %s\n", e.what());
  return 1;
}
