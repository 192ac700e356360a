// bench_infer: the serving path (include/nitro/infer/).
//
//   RESULT fold_speedup=<folded / unfolded throughput> goal>=1.1
//       a CNN of 4 (convolution, batch norm, ReLU) blocks, batch 32 of 3x64x64 (GPU: 128), eval mode
//       under c10::InferenceMode, the folded and the unfolded model alternately, median batch time
//   RESULT int8_linear_speedup=<fp32 / int8 time> goal>=1.5                       (CPU only)
//       an MLP of 4 Linear(1024, 1024) layers with ReLU, batch 32: infer::quantize_dynamic against fp32
//   RESULT batcher_throughput_vs_single=<requests/s batched / one at a time> goal>=4.0
//       16 client threads, each submitting one 3x32x32 image and waiting for its answer, again and
//       again, to the demo's CNN through a DynamicBatcher (max_batch 16, max_delay 2 ms) and through
//       the same batcher with max_batch 1 (each request run alone), each with 1 and with all intra-op
//       threads; rotating rounds, medians; the ratio of each side's best
//   RESULT batcher_p99_ms=<latency p99 of the batched runs> goal<=<max_delay + 2 x one batch's time>
//
//   build-release/bench/bench_infer [--rounds 5] [--seconds 1.5]
#include <nitro/hw/settings.hpp>
#include <nitro/infer/batcher.hpp>
#include <nitro/infer/fold.hpp>
#include <nitro/infer/quantize.hpp>
#include <nitro/infer/runner.hpp>

#include <ATen/ops/randn.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/utils.h>

#include "common.hpp"
#include "models.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

torch::nn::Sequential bn_cnn() {
  torch::nn::Sequential m;
  int64_t in = 3;
  for (int64_t out : {32, 64, 64, 128}) {
    m->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1).bias(false)));
    torch::nn::BatchNorm2d bn(out);
    {
      torch::NoGradGuard g;  // statistics away from the identity, as after training
      bn->running_mean.uniform_(-0.5, 0.5);
      bn->running_var.uniform_(0.5, 2.0);
    }
    m->push_back(bn);
    m->push_back(torch::nn::ReLU(torch::nn::ReLUOptions().inplace(true)));
    if (out == 64 && in == 32) m->push_back(torch::nn::MaxPool2d(2));
    in = out;
  }
  m->push_back(torch::nn::AdaptiveAvgPool2d(1));
  m->push_back(torch::nn::Flatten());
  m->push_back(torch::nn::Linear(128, 10));
  m->eval();
  return m;
}

// Requests per second of 16 closed-loop clients against `batcher` for `seconds`.
template <class B>
double clients_throughput(B& batcher, const std::vector<at::Tensor>& images, double seconds) {
  std::atomic<bool> stop{false};
  std::atomic<int64_t> answered{0};
  std::vector<std::thread> clients;
  const auto start = std::chrono::steady_clock::now();
  for (int c = 0; c < 16; ++c) {
    clients.emplace_back([&, c] {
      size_t i = static_cast<size_t>(c);
      while (!stop.load(std::memory_order_relaxed)) {
        batcher.submit(images[i % images.size()]).get();
        answered.fetch_add(1, std::memory_order_relaxed);
        i += 16;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : clients) t.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(answered.load()) / elapsed;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  double seconds = 1.5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);
  }
  const bool gpu = nitro::Cuda::available();
  const c10::Device device = gpu ? c10::Device(c10::kCUDA) : c10::Device(c10::kCPU);
  nitro::hw::ScopedSettings hw{nitro::infer::hardware<nitro::infer::level::Basic>()};
  std::printf("bench_infer: %s (%s), %d rounds\n", gpu ? "cuda" : "cpu", nitro::bench::machine().c_str(), rounds);

  // --- conv-BN folding -------------------------------------------------------------------------
  torch::manual_seed(0);
  auto unfolded = bn_cnn();
  unfolded->to(device);
  auto folded = nitro::infer::fold_conv_bn(unfolded);
  const int64_t batch = gpu ? 128 : 32;
  const auto x = torch::randn({batch, 3, 64, 64}, torch::TensorOptions().device(device));
  double fold_speedup = 0;
  {
    c10::InferenceMode inference;
    const double diff = (folded->forward(x) - unfolded->forward(x)).abs().max().item<double>();
    for (int i = 0; i < 3; ++i) folded->forward(x), unfolded->forward(x);  // warm-up
    auto [tf, tu] = nitro::bench::interleaved([&] { folded->forward(x); }, [&] { unfolded->forward(x); }, rounds, 10);
    const double mf = nitro::bench::median(tf) * 1e3, mu = nitro::bench::median(tu) * 1e3;
    fold_speedup = mu / mf;
    std::printf("\nCNN 4 x (conv, BN, ReLU), batch %lld of 3x64x64       median ms   images/s\n",
                static_cast<long long>(batch));
    std::printf("unfolded (eval, inference mode)                    %9.3f %10.0f\n", mu, batch / mu * 1e3);
    std::printf("infer::fold_conv_bn                                %9.3f %10.0f\n", mf, batch / mf * 1e3);
    std::printf("largest output difference: %.3g\n", diff);
  }

  // --- dynamic int8 ------------------------------------------------------------------------------
  double int8_speedup = 0;
  if (!gpu) {
    torch::manual_seed(0);
    torch::nn::Sequential mlp;
    for (int i = 0; i < 4; ++i) {
      mlp->push_back(torch::nn::Linear(1024, 1024));
      mlp->push_back(torch::nn::ReLU());
    }
    mlp->eval();
    auto q = nitro::infer::quantize_dynamic(mlp);
    const auto in = torch::randn({32, 1024});
    c10::InferenceMode inference;
    const auto ref = mlp->forward(in);
    const double rel = ((q->forward(in) - ref).norm() / ref.norm()).item<double>();
    for (int i = 0; i < 5; ++i) q->forward(in), mlp->forward(in);
    auto [tq, tf] = nitro::bench::interleaved([&] { q->forward(in); }, [&] { mlp->forward(in); }, rounds, 20);
    const double mq = nitro::bench::median(tq) * 1e3, mf = nitro::bench::median(tf) * 1e3;
    int8_speedup = mf / mq;
    std::printf("\nMLP 4 x Linear(1024, 1024) + ReLU, batch 32          median ms\n");
    std::printf("fp32                                               %9.3f\n", mf);
    std::printf("infer::quantize_dynamic (int8 weights)             %9.3f\n", mq);
    std::printf("relative output error of int8: %.3g\n", rel);
  }

  // --- the dynamic batcher -----------------------------------------------------------------------
  torch::manual_seed(0);
  auto cnn = nitro::infer::prepare(nitro::bench::demo_cnn(), {.device = device});
  auto model = nitro::infer::module_model(cnn);
  std::vector<at::Tensor> images;
  for (int i = 0; i < 256; ++i) images.push_back(torch::randn({3, 32, 32}));
  const nitro::infer::BatcherOptions batched{.max_batch = 16, .max_delay = 2ms};
  nitro::infer::BatcherOptions single = batched;
  single.max_batch = 1;
  // One batch of 16's time, for the latency goal.
  nitro::infer::Runner<> runner{model};
  const auto sixteen = torch::stack(std::vector<at::Tensor>(images.begin(), images.begin() + 16));
  for (int i = 0; i < 5; ++i) runner(sixteen);
  std::vector<double> batch_times;
  for (int i = 0; i < 50; ++i) batch_times.push_back(nitro::bench::seconds([&] { runner(sixteen); }) * 1e3);
  const double batch_ms = nitro::bench::median(batch_times);

  // Each side at its best intra-op thread count: at batch 1 LibTorch's intra-op threads cost more
  // than they give on small tensors, and the 16 clients need cores too.
  const int all_threads = at::get_num_threads();
  struct Config {
    const char* name;
    bool batched;
    int threads;
    std::vector<double> rates, p50s, p99s, means;
  };
  std::vector<Config> configs = {{"one at a time (max_batch 1), 1 intra-op thread", false, 1, {}, {}, {}, {}},
                                 {"one at a time (max_batch 1), all intra-op threads", false, all_threads, {}, {}, {}, {}},
                                 {"DynamicBatcher (max_batch 16), 1 intra-op thread", true, 1, {}, {}, {}, {}},
                                 {"DynamicBatcher (max_batch 16), all intra-op threads", true, all_threads, {}, {}, {}, {}}};
  if (all_threads == 1) configs = {configs[0], configs[2]};
  for (int r = 0; r < rounds; ++r) {
    for (size_t k = 0; k < configs.size(); ++k) {
      auto& c = configs[(k + static_cast<size_t>(r)) % configs.size()];  // rotating order
      nitro::hw::ScopedSettings threads{{.intra_op_threads = c.threads}};
      nitro::infer::DynamicBatcher b{nitro::infer::Runner<>{model}, c.batched ? batched : single};
      clients_throughput(b, images, 0.2);  // warm-up, not counted
      const auto before = b.stats();
      c.rates.push_back(clients_throughput(b, images, seconds));
      const auto s = b.stats();  // the window holds the last 65536 requests: the timed ones, mostly
      c.p99s.push_back(s.latency_p99_ms);
      c.p50s.push_back(s.latency_p50_ms);
      c.means.push_back(static_cast<double>(s.requests - before.requests) /
                        static_cast<double>(std::max<uint64_t>(1, s.batches - before.batches)));
    }
  }
  std::printf("\ndemo CNN, 16 client threads, max_delay 2 ms                 requests/s  mean batch   p50 ms   p99 ms\n");
  const Config* best_single = nullptr;
  const Config* best_batched = nullptr;
  for (const auto& c : configs) {
    const double rate = nitro::bench::median(c.rates);
    std::printf("%-58s %10.0f  %10.1f %8.2f %8.2f\n", c.name, rate, nitro::bench::median(c.means),
                nitro::bench::median(c.p50s), nitro::bench::median(c.p99s));
    const Config*& best = c.batched ? best_batched : best_single;
    if (!best || rate > nitro::bench::median(best->rates)) best = &c;
  }
  const double rb = nitro::bench::median(best_batched->rates), rs = nitro::bench::median(best_single->rates);
  const double p99 = nitro::bench::median(best_batched->p99s);
  std::printf("one batch of 16: %.3f ms (median of 50, all intra-op threads); ratio and p99: each side's best row\n\n",
              batch_ms);

  nitro::bench::result("fold_speedup", fold_speedup, ">=", 1.1);
  if (!gpu) nitro::bench::result("int8_linear_speedup", int8_speedup, ">=", 1.5);
  nitro::bench::result("batcher_throughput_vs_single", rb / rs, ">=", 4.0);
  nitro::bench::result("batcher_p99_ms", p99, "<=", 2.0 + 2.0 * batch_ms);
  return 0;
}
