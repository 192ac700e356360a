// level::Basic against a hand-written LibTorch loop doing the same work: same model, data and seed,
// runs interleaved, median step time. RESULT loop_overhead = Basic / hand-written, goal <= 1.02.
//
// Both loops train the very same model and optimizer, in alternating blocks: two model copies sit
// at different addresses, and that alone moved the ratio by +-4% on the CPU machine. That they do
// the same work is checked first, on two copies from the same seed: equal parameters after a few steps.
//
// Then the same ratio as instruction counts (bench/instructions.hpp; by default where no GPU is
// present): 5 steps of each after 5 uncounted, each under callgrind in a process of its own.
// RESULT loop_overhead_instructions, goal <= 1.01.
//
// The Auto row: level::Auto<Basic, Advanced, Ultra> holding level::Basic (adopted, no trials) against
// level::Basic used directly, on the same model and optimizer, interleaved: what the variant's dispatch
// (one std::visit and one branch a step) costs. RESULT auto_dispatch_overhead, goal <= 1.02, and
// auto_dispatch_instructions, goal <= 1.01.
//
//   bench_loop_overhead [rounds] [--instructions | --no-instructions] [--instructions-out=DIR]
#include "common.hpp"
#include "instructions.hpp"
#include "models.hpp"

#include <nitro/data/synthetic.hpp>
#include <nitro/train/autotune.hpp>
#include <nitro/train/levels.hpp>

#include <torch/torch.h>

#include <cstdio>

namespace {

torch::nn::Sequential cnn() { return nitro::bench::demo_cnn(); }

void copy_parameters(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto src = from.parameters(), dst = to.parameters();
  for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
}

}  // namespace

int main(int argc, char** argv) {
  nitro::bench::Instructions counts{argc, argv};
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 15, per_round = 8, warmup = 5, batches = 16;
  const bool gpu = nitro::Cuda::available();
  const c10::Device device = gpu ? nitro::Cuda::device() : nitro::Cpu::device();
  torch::manual_seed(0);

  nitro::data::SyntheticImages data{{.size = 32 * batches, .noise = 4.0}};
  std::vector<std::pair<at::Tensor, at::Tensor>> inputs;
  for (int b = 0; b < batches; ++b) {
    auto [x, y] = data.stacked(b * 32, (b + 1) * 32);
    inputs.emplace_back(x.to(device), y.to(device));
  }
  auto hand_step_on = [](torch::nn::Sequential& model, torch::optim::Optimizer& opt, const auto& batch) {
    opt.zero_grad();
    auto loss = torch::cross_entropy_loss(model->forward(batch.first), batch.second);
    loss.backward();
    opt.step();
  };
  auto loss_of = [](torch::nn::Sequential& model) {
    return [&model](const auto& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); };
  };

  auto model = cnn();
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  nitro::level::Basic loop{model, optimizer};
  int next = 0;
  auto hand_step = [&] { hand_step_on(model, optimizer, inputs[static_cast<size_t>(next++ % batches)]); };
  auto loop_step = [&] { loop.step(inputs[static_cast<size_t>(next++ % batches)], loss_of(model)); };
  using Auto = nitro::level::Auto<nitro::level::Basic, nitro::level::Advanced, nitro::level::Ultra>;
  Auto auto_loop{model, optimizer};
  auto_loop.adopt({});  // level::Basic, the user's choices as they are: no trials
  auto auto_step = [&] { auto_loop.step(inputs[static_cast<size_t>(next++ % batches)], loss_of(model)); };

  // Instruction counts: the same 5 steps of each after 5 uncounted, from the same model and batches.
  counts.add("hand-written", hand_step, {.warmup = warmup, .steps = 5});
  counts.add("basic", loop_step, {.warmup = warmup, .steps = 5});
  counts.add("auto", auto_step, {.warmup = warmup, .steps = 5});
  if (counts.child()) return counts.run_child();  // a valgrind child: the variants' steps, nothing else

  // Same work: two copies, one per loop, stay equal step for step.
  double max_diff = 0;
  {
    auto a = cnn(), b = cnn();
    a->to(device);
    b->to(device);
    copy_parameters(*a, *b);
    torch::optim::SGD opt_a(a->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    torch::optim::SGD opt_b(b->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    nitro::level::Basic check{b, opt_b};
    for (int i = 0; i < 4; ++i) {
      hand_step_on(a, opt_a, inputs[static_cast<size_t>(i)]);
      check.step(inputs[static_cast<size_t>(i)], loss_of(b));
    }
    auto pa = a->parameters(), pb = b->parameters();
    for (size_t i = 0; i < pa.size(); ++i) max_diff = std::max(max_diff, (pa[i] - pb[i]).abs().max().item<double>());
  }

  for (int i = 0; i < warmup; ++i) {
    hand_step();
    loop_step();
  }
  const auto [hand, ours] = nitro::bench::interleaved(hand_step, loop_step, rounds, per_round);
  const double h = nitro::bench::median(hand), o = nitro::bench::median(ours);
  for (int i = 0; i < warmup; ++i) auto_step();
  const auto [direct, dispatched] = nitro::bench::interleaved(loop_step, auto_step, rounds, per_round);
  const double d = nitro::bench::median(direct), a = nitro::bench::median(dispatched);
  std::printf("bench_loop_overhead: CNN 3x32x32, batch 32, SGD, %s (%s), %zu steps each, interleaved\n",
              gpu ? "cuda" : "cpu", nitro::bench::machine().c_str(), hand.size());
  std::printf("%-22s %12s\n", "loop", "median ms");
  std::printf("%-22s %12.3f\n", "hand-written LibTorch", h * 1e3);
  std::printf("%-22s %12.3f\n", "nitro level::Basic", o * 1e3);
  std::printf("%-22s %12.3f   (against level::Basic %.3f in its own interleaved run)\n", "nitro level::Auto", a * 1e3,
              d * 1e3);
  std::printf("same work: largest parameter difference between the two loops after 4 steps: %.3g\n", max_diff);
  nitro::bench::result("loop_overhead", o / h, "<=", 1.02);
  counts.result("loop_overhead_instructions", "basic", "hand-written");
  nitro::bench::result("auto_dispatch_overhead", a / d, "<=", 1.02);
  counts.result("auto_dispatch_instructions", "auto", "basic");
  return 0;
}
