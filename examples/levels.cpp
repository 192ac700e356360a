// The levels demo (make demo): the quickstart's CNN on nitro::data::SyntheticImages, trained with a
// plain LibTorch loop and with each optimization level, in one table: samples/s, peak memory,
// final training loss, test accuracy.
//
//   build/examples/levels [--epochs 2] [--samples 8192] [--batch 64]
#include <nitro/nitro.hpp>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace {

struct Args {
  int epochs = 2;
  std::int64_t samples = 8192;
  std::int64_t batch = 64;
};

struct Row {
  std::string name;
  double samples_per_s = 0, peak_mb = 0, final_loss = 0, accuracy = 0;
};

torch::nn::Sequential cnn() {
  torch::manual_seed(0);  // every configuration starts from the same weights
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)),
                               torch::nn::Functional(torch::relu), torch::nn::MaxPool2d(2),
                               torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)),
                               torch::nn::Functional(torch::relu), torch::nn::MaxPool2d(2), torch::nn::Flatten(),
                               torch::nn::Linear(32 * 8 * 8, 10));
}

// Peak tensor memory of a scope: the CUDA caching allocator's on a GPU, the tracking allocator's on the CPU.
class PeakMemory {
 public:
  explicit PeakMemory(bool gpu) : gpu_(gpu) {
#if NITRO_WITH_CUDA
    if (gpu_) c10::cuda::CUDACachingAllocator::resetPeakStats(c10::cuda::current_device());
#endif
    if (!gpu_) cpu_.emplace();
  }
  double megabytes() const {
#if NITRO_WITH_CUDA
    if (gpu_) {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
      return static_cast<double>(stats.allocated_bytes[0].peak) / 1048576.0;
    }
#endif
    return static_cast<double>(cpu_->stats().peak_bytes) / 1048576.0;
  }

 private:
  bool gpu_;
  std::optional<nitro::memory::ScopedCpuTracking> cpu_;
};

// Trains `model` for the epochs with `step(x, y) -> loss tensor` per micro-batch of `batch` samples.
template <class Step, class Flush>
Row train(const std::string& name, torch::nn::Sequential& model, const Args& args, std::int64_t batch, Step&& step,
          Flush&& flush) {
  const bool gpu = nitro::Cuda::available();
  const c10::Device device = gpu ? nitro::Cuda::device() : nitro::Cpu::device();
  nitro::data::SyntheticImages train_set{{.size = args.samples, .noise = 8.0}};
  nitro::data::SyntheticImages test_set{{.size = 1024, .offset = args.samples, .noise = 8.0}};
  torch::manual_seed(1);  // the same sample order for every configuration
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      train_set.map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(batch).workers(2));
  Row row{name};
  PeakMemory peak(gpu);
  double seconds = 0;
  for (int epoch = 0; epoch < args.epochs; ++epoch) {
    model->train();
    auto loss_sum = torch::zeros({}, device);
    std::int64_t seen = 0;
    const auto start = std::chrono::steady_clock::now();
    for (auto& b : *loader) {
      const auto x = b.data.to(device), y = b.target.to(device);
      loss_sum += step(x, y).detach() * x.size(0);
      seen += x.size(0);
    }
    flush();
    row.final_loss = loss_sum.item<double>() / static_cast<double>(seen);  // synchronises
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    row.samples_per_s = static_cast<double>(seen) * (epoch + 1) / seconds;
  }
  row.peak_mb = peak.megabytes();
  model->eval();
  torch::NoGradGuard no_grad;
  const auto [tx, ty] = test_set.stacked(0, 1024);
  row.accuracy = model->forward(tx.to(device)).argmax(1).eq(ty.to(device)).to(torch::kDouble).mean().item<double>();
  return row;
}

template <class Loop>
Row train_level(const std::string& name, const Args& args, std::int64_t micro_batch, typename Loop::Options options) {
  const bool gpu = nitro::Cuda::available();
  auto model = cnn();
  model->to(gpu ? nitro::Cuda::device() : nitro::Cpu::device());
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
  nitro::hw::ScopedSettings hw{nitro::level::hardware<Loop>()};
  Loop loop{model, optimizer, options};
  return train(
      name, model, args, micro_batch,
      [&](const at::Tensor& x, const at::Tensor& y) {
        return loop
            .step(std::make_pair(x, y),
                  [](auto& forward, const auto& b) { return torch::cross_entropy_loss(forward(b.first), b.second); })
            .loss;
      },
      [&] { loop.flush(); });
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view arg = argv[i];
    if (arg == "--epochs") a.epochs = std::stoi(argv[i + 1]);
    else if (arg == "--samples") a.samples = std::stoll(argv[i + 1]);
    else if (arg == "--batch") a.batch = std::stoll(argv[i + 1]);
    else nitro::detail::fail("levels: unknown option ", arg, "; use --epochs, --samples, --batch");
  }
  NITRO_CHECK(a.epochs >= 1 && a.samples >= 1 && a.batch >= 2 && a.batch % 2 == 0,
              "levels: epochs and samples must be >= 1, batch an even number >= 2");
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  const bool gpu = nitro::Cuda::available();
  std::printf("Nitro %s levels demo: CNN on SyntheticImages (%lld samples of 3x32x32, noise 8), batch %lld, "
              "%d epochs, SGD, on %s\n",
              nitro::version_string, static_cast<long long>(args.samples), static_cast<long long>(args.batch),
              args.epochs, gpu ? "cuda" : "cpu");
  auto plain = [&](const Args& a) {
    auto model = cnn();
    model->to(gpu ? nitro::Cuda::device() : nitro::Cpu::device());
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
    return train(
        "plain LibTorch loop", model, a, a.batch,
        [&](const at::Tensor& x, const at::Tensor& y) {
          optimizer.zero_grad();
          auto loss = torch::cross_entropy_loss(model->forward(x), y);
          loss.backward();
          optimizer.step();
          return loss;
        },
        [] {});
  };
  plain({.epochs = 1, .samples = 1024, .batch = args.batch});  // warm-up: thread pools, kernels, allocator
  std::vector<Row> rows;
  rows.push_back(plain(args));
  rows.push_back(train_level<nitro::level::Basic>("level::Basic", args, args.batch, {}));
  rows.push_back(train_level<nitro::level::Advanced>("level::Advanced (bf16)", args, args.batch, {}));
  rows.push_back(train_level<nitro::level::Ultra>(
      "level::Ultra (bf16, 2x" + std::to_string(args.batch / 2) + " accum, sqrt ckpt, clip)", args, args.batch / 2,
      {.accumulate = nitro::accumulate::Dynamic::for_batch(args.batch, args.batch / 2), .clip = {.max_norm = 5.0}}));

  std::printf("%-52s %10s %9s %11s %14s\n", "configuration", "samples/s", "peak MB", "final loss", "test accuracy");
  for (const auto& r : rows)
    std::printf("%-52s %10.0f %9.1f %11.4f %14.4f\n", r.name.c_str(), r.samples_per_s, r.peak_mb, r.final_loss,
                r.accuracy);
  std::printf("peak MB: the most tensor memory live at once during training (%s)\n",
              gpu ? "CUDA caching allocator" : "CPU tensors, nitro::memory::ScopedCpuTracking");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "levels: %s\n", e.what());
  return 1;
}
