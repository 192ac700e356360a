// Serving the demo's CNN: trained briefly, prepared for inference, then served through a
// DynamicBatcher to 16 client threads, each sending one image at a time and waiting for its answer.
// Prints a latency table for one request at a time against dynamic batching, fp32 and int8.
//
//   build-release/examples/serve [--seconds 2]
#include <nitro/data/synthetic.hpp>
#include <nitro/infer/batcher.hpp>
#include <nitro/infer/quantize.hpp>
#include <nitro/infer/runner.hpp>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/optim/adam.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace {

torch::nn::Sequential demo_cnn() {
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)), torch::nn::ReLU(),
                               torch::nn::MaxPool2d(2), torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)),
                               torch::nn::ReLU(), torch::nn::MaxPool2d(2), torch::nn::Flatten(),
                               torch::nn::Linear(32 * 8 * 8, 10));
}

struct Served {
  double requests_per_s = 0, accuracy = 0;
  nitro::infer::BatcherStats stats;
};

// 16 clients, each submitting test images one at a time for `seconds`; answers checked against labels.
template <class Model>
Served serve(Model model, nitro::infer::BatcherOptions options, const at::Tensor& images, const at::Tensor& labels,
             double seconds) {
  nitro::infer::DynamicBatcher batcher{std::move(model), options};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> answered{0}, correct{0};
  std::vector<std::thread> clients;
  const auto start = std::chrono::steady_clock::now();
  for (int c = 0; c < 16; ++c) {
    clients.emplace_back([&, c] {
      for (int64_t i = c; !stop.load(std::memory_order_relaxed); i += 16) {
        const int64_t k = i % images.size(0);
        const at::Tensor logits = batcher.submit(images[k]).get();
        correct += logits.argmax().item<int64_t>() == labels[k].item<int64_t>();
        ++answered;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : clients) t.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {static_cast<double>(answered) / elapsed, static_cast<double>(correct) / static_cast<double>(answered),
          batcher.stats()};
}

}  // namespace

int main(int argc, char** argv) try {
  double seconds = 2.0;
  for (int i = 1; i + 1 < argc; i += 2)
    if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);

  // Train the demo's CNN for one epoch (CPU), as examples/levels.cpp does with its loop.
  torch::manual_seed(0);
  nitro::data::SyntheticImages train({.size = 8192, .noise = 8.0});
  nitro::data::SyntheticImages test({.size = 1024, .offset = 1'000'000, .noise = 8.0});
  auto model = demo_cnn();
  torch::optim::Adam optimizer(model->parameters(), 1e-3);
  for (int64_t b = 0; b < 8192; b += 64) {
    auto [x, y] = train.stacked(b, b + 64);
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    optimizer.step();
  }
  auto [images, labels] = test.stacked(0, 1024);

  // Ready to serve: eval mode, no gradients (and folded batch norms, had it any).
  auto prepared = nitro::infer::prepare(model);
  auto int8 = nitro::infer::quantize_dynamic(prepared);
  nitro::infer::Runner<nitro::infer::level::Basic> fp32_runner{nitro::infer::module_model(prepared)};
  nitro::infer::Runner<nitro::infer::level::Basic> int8_runner{nitro::infer::module_model(int8)};

  const nitro::infer::BatcherOptions batched{.max_batch = 16, .max_delay = 2ms};
  nitro::infer::BatcherOptions single = batched;
  single.max_batch = 1;
  std::printf("serve: the demo's CNN, 16 client threads, one 3x32x32 image per request, %.1f s per row, cpu\n\n",
              seconds);
  std::printf("%-44s %11s %6s %8s %8s %8s %8s\n", "configuration", "requests/s", "batch", "wait p50", "p50 ms",
              "p99 ms", "accuracy");
  const auto row = [](const char* name, const Served& s) {
    std::printf("%-44s %11.0f %6.1f %8.2f %8.2f %8.2f %8.3f\n", name, s.requests_per_s, s.stats.mean_batch(),
                s.stats.queue_wait_p50_ms, s.stats.latency_p50_ms, s.stats.latency_p99_ms, s.accuracy);
  };
  row("fp32, one request at a time", serve(fp32_runner, single, images, labels, seconds));
  row("fp32, DynamicBatcher (16, 2 ms)", serve(fp32_runner, batched, images, labels, seconds));
  row("int8 Linear, DynamicBatcher (16, 2 ms)", serve(int8_runner, batched, images, labels, seconds));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "serve: %s\n", e.what());
  return 1;
}
