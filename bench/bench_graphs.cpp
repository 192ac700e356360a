// bench_graphs (GPU): samples/s of a training step replayed from a CUDA graph (graph::Capture, i.e.
// level::Max) against the same level without it (level::Advanced: bf16 autocast), both with
// FusedAdamW, on (a) a launch-bound MLP (batch 64, 8 layers of 512) and (b) the demo's CNN on
// SyntheticImages (batch 64, 3x32x32). Each configuration trains its own copy of the same weights on
// the same batches (already on the GPU); the first 10 steps of each (warm-up and capture) are not
// timed; blocks of steps alternate between the two (bench/common.hpp: interleaved), the GPU
// synchronised before each clock read; medians.
//
//   RESULT graph_speedup_mlp=<samples/s with / without graph::Capture> goal>=3.0
//   RESULT graph_speedup_cnn=<the same for the CNN>                    goal>=1.3
//
// Without a GPU it says so and measures nothing (CUDA graphs capture GPU work).
//
//   build-release/bench/bench_graphs [rounds (default 10)] [steps per block (default 20)]
#include <nitro/data/synthetic.hpp>
#include <nitro/graph/capture.hpp>
#include <nitro/optim/fused.hpp>
#include <nitro/train/levels.hpp>

#include <torch/torch.h>

#include "common.hpp"
#include "models.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#if NITRO_WITH_CUDA
namespace {

torch::nn::Sequential mlp() {
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int i = 0; i < 8; ++i) {
    net->push_back(torch::nn::Linear(512, 512));
    net->push_back(torch::nn::Functional(torch::relu));
  }
  net->push_back(torch::nn::Linear(512, 10));
  return net;
}

torch::nn::Sequential cnn() {
  torch::manual_seed(0);
  return nitro::bench::demo_cnn();
}

using Batches = std::vector<std::pair<at::Tensor, at::Tensor>>;

// samples/s of each way (median over blocks), and the last loss of each.
struct Outcome {
  double eager_sps, graph_sps, eager_loss, graph_loss;
  std::int64_t replays;
};

template <class Make>
Outcome measure(Make make, const Batches& batches, const c10::Device& device, int rounds, int per_block) {
  auto a = make(), b = make();
  a->to(device);
  b->to(device);
  nitro::optim::FusedAdamW oa(a->parameters(), torch::optim::AdamWOptions(1e-3));
  nitro::optim::FusedAdamW ob(b->parameters(), torch::optim::AdamWOptions(1e-3));
  nitro::level::Advanced eager{a, oa};
  nitro::level::Max graphed{b, ob};
  const auto loss_a = [&](const auto& x) { return torch::cross_entropy_loss(a->forward(x.first), x.second); };
  const auto loss_b = [&](const auto& x) { return torch::cross_entropy_loss(b->forward(x.first), x.second); };
  std::size_t ia = 0, ib = 0;
  at::Tensor last_a, last_b;
  const auto block_a = [&](int n) {
    for (int i = 0; i < n; ++i) last_a = eager.step(batches[ia++ % batches.size()], loss_a).loss;
  };
  const auto block_b = [&](int n) {
    for (int i = 0; i < n; ++i) last_b = graphed.step(batches[ib++ % batches.size()], loss_b).loss;
  };
  block_a(10);  // warm-up: allocator, cuDNN autotuning, optimizer state; capture for b
  block_b(10);
  nitro::bench::synchronize();
  const auto [ta, tb] = nitro::bench::interleaved([&] { block_a(per_block); }, [&] { block_b(per_block); }, rounds, 1);
  const double rows = static_cast<double>(batches.front().first.size(0)) * per_block;
  return {rows / nitro::bench::median(ta), rows / nitro::bench::median(tb), last_a.item<double>(), last_b.item<double>(),
          graphed.hook<nitro::graph::Capture>().replays()};
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 10, per_block = argc > 2 ? std::atoi(argv[2]) : 20;
  std::printf("bench_graphs: %s\n", nitro::bench::machine().c_str());
  if (!nitro::Cuda::available()) {
    std::printf("bench_graphs: no GPU here; CUDA graphs capture GPU work, so nothing is measured and no RESULT line "
                "is printed (run it on the GPU machine: bash bench/run_gpu.sh bench bench_graphs)\n");
    return 0;
  }
  const c10::Device device = nitro::Cuda::device();
  nitro::hw::ScopedSettings hw{nitro::level::hardware<nitro::level::Max>()};

  Batches mlp_batches;
  for (int i = 0; i < 16; ++i) {
    torch::manual_seed(1000 + i);
    mlp_batches.emplace_back(torch::randn({64, 512}).to(device), torch::randint(10, {64}).to(device));
  }
  nitro::data::SyntheticImages images{{.size = 64 * 16, .noise = 4.0}};
  Batches cnn_batches;
  for (int i = 0; i < 16; ++i) {
    auto [x, y] = images.stacked(i * 64, (i + 1) * 64);
    cnn_batches.emplace_back(x.to(device), y.to(device));
  }

  std::printf("%-6s %16s %16s %8s %12s %12s %8s\n", "model", "Advanced (s/s)", "Max (s/s)", "ratio", "loss Adv.",
              "loss Max", "replays");
  const auto row = [&](const char* name, const Outcome& o) {
    std::printf("%-6s %16.0f %16.0f %8.3f %12.4f %12.4f %8lld\n", name, o.eager_sps, o.graph_sps,
                o.graph_sps / o.eager_sps, o.eager_loss, o.graph_loss, static_cast<long long>(o.replays));
    return o.graph_sps / o.eager_sps;
  };
  const double mlp_ratio = row("mlp", measure(mlp, mlp_batches, device, rounds, per_block));
  const double cnn_ratio = row("cnn", measure(cnn, cnn_batches, device, rounds, per_block));
  nitro::bench::result("graph_speedup_mlp", mlp_ratio, ">=", 3.0);
  nitro::bench::result("graph_speedup_cnn", cnn_ratio, ">=", 1.3);
  return 0;
}
#else
int main() {
  std::printf("bench_graphs: this LibTorch has no CUDA (NITRO_WITH_CUDA 0): nothing to measure, no RESULT line\n");
  return 0;
}
#endif
