// bench_optimizer: the step time of Nitro's fused optimizers against LibTorch's, on the same
// parameters and gradients: (a) 100 parameters of 256x256, (b) 300 parameters of a ResNet-like mix
// (100 convolution weights of 16 to 128 channels, 3x3, and the 200 vectors of their batch norms).
// LibTorch's and Nitro's steps alternate in rounds (bench/common.hpp: interleaved), each on its own
// copy of the parameters; the first steps (which make the state) are warm-up, not timed; medians.
//
//   RESULT fused_adamw_vs_libtorch_cpu=<the smaller speedup of (a) and (b)> goal>=2.0
//   RESULT fused_adamw_vs_libtorch_gpu=<the same on the GPU>                goal>=5.0   (GPU only)
// with a line per case; FusedSGD (momentum) and FusedAdam rows are printed for information, and a
// "fold" row: the amp::Fp16 step of FusedAdamW with a separate unscale pass against the folded one.
//
//   build-release/bench/bench_optimizer [--rounds 10] [--per-round 5]
#include <nitro/optim/fused.hpp>
#include <nitro/train/amp.hpp>

#include <ATen/ops/randn.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "common.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Case {
  std::string name;
  std::vector<std::vector<std::int64_t>> shapes;
};

Case large() {
  Case c{"100x256x256", {}};
  for (int i = 0; i < 100; ++i) c.shapes.push_back({256, 256});
  return c;
}

Case resnet_mix() {
  Case c{"resnet_mix_300", {}};
  const std::int64_t channels[] = {16, 32, 64, 128};
  for (int i = 0; i < 100; ++i) {
    const auto ch = channels[i * 4 / 100];
    c.shapes.push_back({ch, ch, 3, 3});
    c.shapes.push_back({ch});
    c.shapes.push_back({ch});
  }
  return c;
}

// Parameters with gradients, the same values for each call.
std::vector<at::Tensor> make_params(const Case& c, c10::Device device) {
  at::manual_seed(0);
  std::vector<at::Tensor> params;
  for (const auto& s : c.shapes) {
    auto p = at::randn(s).to(device).requires_grad_(true);
    p.mutable_grad() = at::randn(s).to(device) * 1e-2;
    params.push_back(p);
  }
  return params;
}

std::int64_t elements(const Case& c) {
  std::int64_t n = 0;
  for (const auto& s : c.shapes) {
    std::int64_t e = 1;
    for (auto d : s) e *= d;
    n += e;
  }
  return n;
}

struct Timing {
  double libtorch_ms, fused_ms;
  double speedup() const { return libtorch_ms / fused_ms; }
};

template <class Ref, class Fused, class Options>
Timing time_pair(const Case& c, c10::Device device, const Options& options, int rounds, int per_round) {
  auto pa = make_params(c, device), pb = make_params(c, device);
  Ref ref(pa, options);
  Fused fused(pb, options);
  for (int i = 0; i < 3; ++i) ref.step(), fused.step();  // warm-up: the state is made here
  const auto [ta, tb] = nitro::bench::interleaved([&] { ref.step(); }, [&] { fused.step(); }, rounds, per_round);
  return {nitro::bench::median(ta) * 1e3, nitro::bench::median(tb) * 1e3};
}

// The loss scaler's part of an amp::Fp16 step with FusedAdamW, as TrainingLoop does it: (a) unscale
// pass, then step(); (b) folded: the inf check, then step_scaled() (the kernel unscales). Scale 1, so
// that repeating the step leaves the gradients as they are. Returns (a) and (b) medians in ms.
Timing time_fold(const Case& c, c10::Device device, int rounds, int per_round) {
  auto pa = make_params(c, device), pb = make_params(c, device);
  nitro::optim::FusedAdamW a(pa, torch::optim::AdamWOptions(1e-3)), b(pb, torch::optim::AdamWOptions(1e-3));
  const auto scale = at::ones({}, at::TensorOptions().dtype(at::kFloat).device(device));
  nitro::detail::GradGroups ga, gb;
  const auto unscaled = [&] {
    ga.assign(pa);
    (void)nitro::detail::unscale_by(scale, ga);
    ga.release();
    a.step();
  };
  const auto folded = [&] {
    gb.assign(pb);
    (void)nitro::detail::nonfinite_flag(gb, device);
    gb.release();
    b.step_scaled(scale);
  };
  for (int i = 0; i < 3; ++i) unscaled(), folded();
  const auto [ta, tb] = nitro::bench::interleaved(unscaled, folded, rounds, per_round);
  return {nitro::bench::median(ta) * 1e3, nitro::bench::median(tb) * 1e3};
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 10, per_round = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--per-round")) per_round = std::max(1, std::atoi(argv[i + 1]));
  }
  std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
  if (nitro::Cuda::available()) devices.push_back(nitro::Cuda::device());
  std::printf("bench_optimizer: %s; %d rounds of %d steps each, medians\n", nitro::bench::machine().c_str(), rounds,
              per_round);
  std::printf("%-6s %-22s %-10s %12s %12s %9s\n", "device", "case", "optimizer", "LibTorch ms", "Nitro ms", "speedup");
  std::vector<std::pair<std::string, double>> lines;
  for (const auto device : devices) {
    const std::string dev = device.is_cpu() ? "cpu" : "gpu";
    double worst = 1e30;
    for (const auto& c : {large(), resnet_mix()}) {
      const auto adamw = time_pair<torch::optim::AdamW, nitro::optim::FusedAdamW>(
          c, device, torch::optim::AdamWOptions(1e-3), rounds, per_round);
      const auto adam = time_pair<torch::optim::Adam, nitro::optim::FusedAdam>(c, device, torch::optim::AdamOptions(1e-3),
                                                                               rounds, per_round);
      const auto sgd = time_pair<torch::optim::SGD, nitro::optim::FusedSGD>(
          c, device, torch::optim::SGDOptions(1e-2).momentum(0.9), rounds, per_round);
      for (const auto& [name, t] : {std::pair<const char*, Timing>{"AdamW", adamw}, {"Adam", adam}, {"SGD mom.", sgd}})
        std::printf("%-6s %-22s %-10s %12.3f %12.3f %8.2fx\n", dev.c_str(), (c.name + " " + std::to_string(elements(c) / 1000) + "k").c_str(), name,
                    t.libtorch_ms, t.fused_ms, t.speedup());
      const auto fold = time_fold(c, device, rounds, per_round);
      std::printf("%-6s %-22s %-10s %12.3f %12.3f %8.2fx   (amp::Fp16: unscale + step, folded check + step_scaled)\n",
                  dev.c_str(), (c.name + " " + std::to_string(elements(c) / 1000) + "k").c_str(), "fold", fold.libtorch_ms,
                  fold.fused_ms, fold.speedup());
      lines.emplace_back("fused_adamw_vs_libtorch_" + dev + "_" + c.name, adamw.speedup());
      worst = std::min(worst, adamw.speedup());
    }
    lines.emplace_back("fused_adamw_vs_libtorch_" + dev, worst);
  }
  for (const auto& [name, value] : lines)
    nitro::bench::result(name, value, ">=", name.find("_gpu") != std::string::npos ? 5.0 : 2.0);
  return 0;
}
