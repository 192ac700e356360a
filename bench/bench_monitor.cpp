// The cost of watching: a step with monitor::Phases and a ProgressBar (loss read every 50 steps)
// against the same step with monitor::Off, on one small CPU model. Both loops train the very same
// model and optimizer in alternating blocks (as bench_loop_overhead does); median step time.
// RESULT monitor_overhead = monitored / unmonitored, goal <= 1.02.
//
//   bench_monitor [rounds]
#include "common.hpp"

#include <nitro/monitor/phases.hpp>
#include <nitro/monitor/progress.hpp>
#include <nitro/monitor/report.hpp>
#include <nitro/train/levels.hpp>

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 30, per_round = 20, warmup = 20, batches = 16;
  const bool gpu = nitro::Cuda::available();
  const c10::Device device = gpu ? nitro::Cuda::device() : nitro::Cpu::device();
  torch::manual_seed(0);
  // Small: a short step is where a fixed per-step cost shows most.
  auto model = torch::nn::Sequential(torch::nn::Linear(128, 256), torch::nn::Functional(torch::relu),
                                     torch::nn::Linear(256, 256), torch::nn::Functional(torch::relu),
                                     torch::nn::Linear(256, 10));
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  std::vector<std::pair<at::Tensor, at::Tensor>> inputs;
  for (int b = 0; b < batches; ++b)
    inputs.emplace_back(torch::randn({64, 128}, device), torch::randint(0, 10, {64}, torch::TensorOptions(device).dtype(torch::kLong)));
  const auto loss_fn = [&](const auto& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); };

  using Watched = nitro::level::with<nitro::level::Basic, nitro::monitor::Phases>;
  nitro::level::Basic plain{model, optimizer};
  Watched watched{model, optimizer, {.monitor = {.warmup_steps = warmup}}};
  const std::int64_t total = static_cast<std::int64_t>(warmup + rounds * per_round);
  nitro::monitor::ProgressBar bar{{.total = total, .desc = "bench_monitor (monitored steps)"}};

  int next = 0;
  auto plain_step = [&] { plain.step(inputs[static_cast<size_t>(next++ % batches)], loss_fn); };
  auto watched_step = [&] { bar.update(1, watched.step(inputs[static_cast<size_t>(next++ % batches)], loss_fn).loss); };
  for (int i = 0; i < warmup; ++i) {
    plain_step();
    watched_step();
  }
  const auto [off, on] = nitro::bench::interleaved(plain_step, watched_step, rounds, per_round);
  bar.close();
  const double a = nitro::bench::median(off), b = nitro::bench::median(on);
  const auto summary = nitro::monitor::summarize(watched.monitor());
  std::printf("bench_monitor: MLP 128-256-256-10, batch 64, SGD, %s (%s), %zu steps each, interleaved\n",
              gpu ? "cuda" : "cpu", nitro::bench::machine().c_str(), off.size());
  std::printf("%-40s %12s\n", "loop", "median ms");
  std::printf("%-40s %12.4f\n", "level::Basic (monitor::Off)", a * 1e3);
  std::printf("%-40s %12.4f\n", "with monitor::Phases + ProgressBar", b * 1e3);
  std::printf("what the monitor saw of its own steps:\n%s", nitro::monitor::format(summary).c_str());
  nitro::bench::result("monitor_overhead", b / a, "<=", 1.02);
  return 0;
}
