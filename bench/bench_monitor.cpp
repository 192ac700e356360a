// The cost of watching: a step with monitor::Phases and a ProgressBar (loss read every 50 steps)
// against the same step with monitor::Off, on one small CPU model. Both loops train the very same
// model and optimizer in alternating blocks (as bench_loop_overhead does); median step time.
// RESULT monitor_overhead = monitored / unmonitored, goal <= 1.02.
//
// Then, in blocks of 100 steps (so that what happens every 10 or 100 steps is inside each block),
// alternating with the same plain loop, median block time:
// RESULT tensorboard_overhead = with a TensorBoardSink row every 10 steps (the loss read with .item(),
//   as the demo does) / without, goal <= 1.02.
// RESULT guard_overhead = with stability::Guard (its defaults: a check every 10 steps, the good state
//   copied to the host every 100) / without, goal <= 1.02.
//
// Then the same three ratios as instruction counts (bench/instructions.hpp; by default where no GPU
// is present): 100 steps of each loop after 20 uncounted, each under callgrind in a process of its
// own, so that whatever happens every 10, 50 or 100 steps happens as often in each count. Goal <= 1.01:
// RESULT monitor_overhead_instructions, tensorboard_overhead_instructions, guard_overhead_instructions.
//
// On a GPU, also the levels demo's CNN (batch 64 of 3x32x32, SGD), a step of about a millisecond, in
// blocks of 50 steps (the device synchronised only at a block's ends, so the events are read lazily as
// in training), alternating with the same loop without the monitor:
// RESULT monitor_overhead_cnn = with monitor::Phases / without, goal <= 1.02 (GPU only);
// and, as an info line, what monitor::Trace costs once (the profiler started and stopped around three
// steps) in a 64-step epoch of that CNN: a short epoch such as the demo's shows it as a lower speed.
//
//   bench_monitor [rounds] [--instructions | --no-instructions] [--instructions-out=DIR]
#include "common.hpp"
#include "instructions.hpp"
#include "models.hpp"

#include <nitro/io/file.hpp>
#include <nitro/monitor/phases.hpp>
#include <nitro/monitor/progress.hpp>
#include <nitro/monitor/report.hpp>
#include <nitro/monitor/tensorboard.hpp>
#include <nitro/monitor/trace.hpp>
#include <nitro/train/stability.hpp>
#include <nitro/train/levels.hpp>

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <unistd.h>

/// The levels demo's CNN on the GPU: Phases against Off in blocks of 50 steps, and Trace's one-time cost.
void demo_cnn_on_gpu(int rounds, const std::filesystem::path& dir) {
  const c10::Device device = nitro::Cuda::device();
  torch::manual_seed(0);
  auto model = nitro::bench::demo_cnn();
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
  std::vector<std::pair<at::Tensor, at::Tensor>> inputs;
  for (int b = 0; b < 16; ++b)
    inputs.emplace_back(torch::randn({64, 3, 32, 32}, device),
                        torch::randint(0, 10, {64}, torch::TensorOptions(device).dtype(torch::kLong)));
  const auto loss_fn = [&](const auto& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); };
  nitro::level::Basic plain{model, optimizer};
  nitro::level::with<nitro::level::Basic, nitro::monitor::Phases> watched{model, optimizer};
  constexpr int block = 50;
  int next = 0;
  auto plain_block = [&] {
    for (int i = 0; i < block; ++i) plain.step(inputs[static_cast<std::size_t>(next++ % 16)], loss_fn);
  };
  auto watched_block = [&] {
    for (int i = 0; i < block; ++i) watched.step(inputs[static_cast<std::size_t>(next++ % 16)], loss_fn);
  };
  plain_block();
  watched_block();
  const int block_rounds = std::max(5, rounds / 3);
  const auto [off, on] = nitro::bench::interleaved(plain_block, watched_block, block_rounds, 1);
  const double a = nitro::bench::median(off) / block, b = nitro::bench::median(on) / block;
  // A 64-step epoch with the demo's trace (steps 20 to 22 recorded) and without: the profiler's start
  // and stop once.
  using Traced = nitro::level::with<nitro::level::Basic, nitro::monitor::Phases, nitro::monitor::Trace>;
  Traced::Options traced_options;
  traced_options.hooks = {nitro::monitor::Trace::Options{.path = dir / "cnn.trace.json", .start = 20, .steps = 3}};
  std::filesystem::create_directories(dir);
  const auto epoch = [&](auto& loop) {
    return nitro::bench::seconds([&] {
      for (int i = 0; i < 64; ++i) loop.step(inputs[static_cast<std::size_t>(i % 16)], loss_fn);
    });
  };
  // Both loops new, so that each epoch has a new loop's first steps and only the trace differs.
  Traced traced{model, optimizer, traced_options};
  nitro::level::with<nitro::level::Basic, nitro::monitor::Phases> fresh{model, optimizer};
  const double with_trace = epoch(traced), without_trace = epoch(fresh);
  std::printf("\nGPU: the levels demo's CNN, batch 64, SGD; blocks of %d steps, %zu of each, interleaved\n", block,
              off.size());
  std::printf("%-58s %10.4f ms a step\n", "level::Basic", a * 1e3);
  std::printf("%-58s %10.4f ms a step\n", "level::Basic + monitor::Phases", b * 1e3);
  std::printf("a 64-step epoch: %.1f ms with monitor::Trace recording steps 20-22, %.1f ms without (%.1f ms once)\n",
              with_trace * 1e3, without_trace * 1e3, (with_trace - without_trace) * 1e3);
  nitro::bench::result("monitor_overhead_cnn", b / a, "<=", 1.02);
}

int main(int argc, char** argv) {
  nitro::bench::Instructions counts{argc, argv};
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
  // In the valgrind child the bar writes to a log file, a plain line every 10 s of valgrind's slow
  // clock: inside the count, and not as often in every run. There it writes none (natively, such a
  // line comes once in thousands of steps); the check whether one is due still runs every step.
  nitro::monitor::ProgressBar bar{{.total = total,
                                   .desc = "bench_monitor (monitored steps)",
                                   .plain_every_s = counts.child() ? 1e9 : 10.0}};

  int next = 0;
  auto plain_step = [&] { plain.step(inputs[static_cast<size_t>(next++ % batches)], loss_fn); };
  auto watched_step = [&] { bar.update(1, watched.step(inputs[static_cast<size_t>(next++ % batches)], loss_fn).loss); };
  // The TensorBoard sink and the guard (measured in blocks further down).
  const auto logdir = std::filesystem::temp_directory_path() / ("nitro-bench-monitor-" + std::to_string(::getpid()));
  const nitro::bench::ScopedTree cleanup{logdir};
  nitro::monitor::TensorBoardSink tb{logdir};
  using Guarded = nitro::level::with<nitro::level::Basic, nitro::stability::Guard>;
  Guarded guarded{model, optimizer};
  std::int64_t logged = 0;
  auto logged_step = [&] {
    auto r = plain.step(inputs[static_cast<size_t>(next++ % batches)], loss_fn);
    if (++logged % 10 == 0)
      tb.write({.step = logged, .loss = r.loss.item<double>(), .lr = 0.01, .samples_per_s = 1000.0});
  };
  auto guarded_step = [&] { guarded.step(inputs[static_cast<size_t>(next++ % batches)], loss_fn); };

  const nitro::bench::CountOptions counted{.warmup = warmup, .steps = 100};
  counts.add("plain", plain_step, counted);
  counts.add("monitored", watched_step, counted);
  counts.add("tensorboard", logged_step, counted);
  counts.add("guarded", guarded_step, counted);
  if (counts.child()) return counts.run_child();  // the valgrind child: the variants' steps, nothing else

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
  counts.result("monitor_overhead_instructions", "monitored", "plain");

  // Blocks of 100 steps: the plain loop, with a TensorBoard row every 10 steps, with the guard.
  constexpr int block = 100;
  auto plain_block = [&] {
    for (int i = 0; i < block; ++i) plain_step();
  };
  auto logged_block = [&] {
    for (int i = 0; i < block; ++i) logged_step();
  };
  auto guarded_block = [&] {
    for (int i = 0; i < block; ++i) guarded_step();
  };
  const int block_rounds = std::max(5, rounds / 3);
  plain_block();
  logged_block();
  guarded_block();
  const auto [tb_off, tb_on] = nitro::bench::interleaved(plain_block, logged_block, block_rounds, 1);
  const auto [g_off, g_on] = nitro::bench::interleaved(plain_block, guarded_block, block_rounds, 1);
  tb.close();
  const double t0 = nitro::bench::median(tb_off), t1 = nitro::bench::median(tb_on);
  const double g0 = nitro::bench::median(g_off), g1 = nitro::bench::median(g_on);
  std::printf("\nblocks of %d steps, %zu of each, interleaved                median ms per block\n", block, tb_off.size());
  std::printf("%-58s %10.3f\n", "level::Basic", t0 * 1e3);
  std::printf("%-58s %10.3f\n", "level::Basic + TensorBoardSink row every 10 steps", t1 * 1e3);
  std::printf("%-58s %10.3f\n", "level::Basic (again, beside the guard)", g0 * 1e3);
  std::printf("%-58s %10.3f\n", "level::Basic + stability::Guard (check every 10)", g1 * 1e3);
  std::printf("guard: %s; TensorBoard events written: %lld\n", guarded.hook<nitro::stability::Guard>().report().c_str(),
              static_cast<long long>(tb.events()));
  nitro::bench::result("tensorboard_overhead", t1 / t0, "<=", 1.02);
  nitro::bench::result("guard_overhead", g1 / g0, "<=", 1.02);
  counts.result("tensorboard_overhead_instructions", "tensorboard", "plain");
  counts.result("guard_overhead_instructions", "guarded", "plain");
  if (gpu) demo_cnn_on_gpu(rounds, logdir);
  return 0;
}
