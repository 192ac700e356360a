// The demo's CNN trained from a record file, with batched augmentation, through a data::Pipeline and
// one Prefetcher for every epoch:
//
//   record file (memory-mapped) -> read (RecordBatches: records copied straight into a batch)
//     -> augment (random resized crop, flip, colour jitter, normalise; per sample, keyed by
//        (seed, epoch, index): the same on the CPU and on a GPU, and after a resume)
//     -> Prefetcher (on a GPU: pinned staging, copy stream, and the augmentation runs there instead)
//     -> level::Basic's step
//
// The file is made once from nitro::data::SyntheticImages (as bench/nitro_pack does) and reused.
// Each epoch prints its time, loss and samples/s; the end prints the pipeline's stage table (which
// stage is busy, which waits) and the test accuracy.
//
//   build-release/examples/records [--epochs 3] [--samples 8192] [--batch 64] [--workers 2] [--records FILE]
#include <nitro/data/augment.hpp>
#include <nitro/data/pipeline.hpp>
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/record_file.hpp>
#include <nitro/data/sampler.hpp>
#include <nitro/data/synthetic.hpp>
#include <nitro/train/levels.hpp>

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

namespace {

namespace aug = nitro::data::augment;
namespace fs = std::filesystem;

struct Args {
  int epochs = 3;
  std::int64_t samples = 8192;
  std::int64_t batch = 64;
  std::size_t workers = 2;
  std::string records = (fs::temp_directory_path() / "nitro-records-demo.nrec").string();
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&] {
      NITRO_CHECK(i + 1 < argc, "records: ", arg, " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--epochs") a.epochs = std::stoi(value());
    else if (arg == "--samples") a.samples = std::stoll(value());
    else if (arg == "--batch") a.batch = std::stoll(value());
    else if (arg == "--workers") a.workers = static_cast<std::size_t>(std::stoul(value()));
    else if (arg == "--records") a.records = value();
    else nitro::detail::fail("records: unknown option ", arg, "; use --epochs, --samples, --batch, --workers, --records");
  }
  NITRO_CHECK(a.epochs >= 1 && a.samples >= 1 && a.batch >= 1 && a.workers >= 1,
              "records: epochs, samples, batch, workers must be >= 1");
  return a;
}

constexpr double noise = 8.0;
// Pixels as the record file keeps them: uint8, x * 40 + 128 (as nitro_pack --synthetic).
at::Tensor to_u8(const at::Tensor& x) { return (x * 40 + 128).clamp(0, 255).to(at::kByte); }

// The record file of `samples` SyntheticImages (made unless one with that many records is there).
std::shared_ptr<nitro::data::RecordFile> records(const Args& args) {
  if (fs::exists(args.records)) {
    try {
      auto f = nitro::data::RecordFile::open(args.records);
      if (f->size() == args.samples && f->fields().size() == 2) return f;
    } catch (const nitro::Error&) {  // not ours, or damaged: written again below
    }
  }
  const auto start = std::chrono::steady_clock::now();
  nitro::data::SyntheticImages set({.size = args.samples, .noise = noise});
  nitro::data::RecordWriter w(args.records, {{"image", at::kByte, {3, 32, 32}}, {"label", at::kLong, {}}});
  for (std::int64_t i = 0; i < args.samples; ++i) {
    auto e = set.get(static_cast<std::size_t>(i));
    w.write({to_u8(e.data), e.target});
  }
  w.close();
  std::printf("wrote %s: %lld records in %.2f s\n", args.records.c_str(), static_cast<long long>(args.samples),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return nitro::data::RecordFile::open(args.records);
}

torch::nn::Sequential cnn() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)), torch::nn::ReLU(),
                               torch::nn::MaxPool2d(2), torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)),
                               torch::nn::ReLU(), torch::nn::MaxPool2d(2), torch::nn::Flatten(),
                               torch::nn::Linear(32 * 8 * 8, 10));
}

constexpr std::uint64_t augment_seed = 7;
// Light augmentation: the synthetic classes are patterns at fixed places, so crops stay large.
using Augment = aug::Compose<aug::ToFloat, aug::RandomResizedCrop, aug::HFlip, aug::ColorJitter, aug::Normalize>;
Augment make_augment() {
  return Augment{{},
                 {.height = 32, .width = 32, .scale_min = 0.85, .scale_max = 1.0, .ratio_min = 0.9, .ratio_max = 1.1},
                 {.p = 0.5},
                 {.brightness = 0.2, .contrast = 0.2, .saturation = 0.2},
                 {.mean = {0.5, 0.5, 0.5}, .std = {0.25, 0.25, 0.25}}};
}
// What the test images get: the same pixels without the random stages.
at::Tensor evaluation_view(const at::Tensor& u8) {
  return (u8.to(at::kFloat) / 255.0 - 0.5) / 0.25;
}

template <nitro::DeviceTag Device>
void train(const Args& args) {
  constexpr bool gpu = Device::type == c10::DeviceType::CUDA;
  const c10::Device device = gpu ? nitro::Cuda::device() : nitro::Cpu::device();
  auto file = records(args);
  nitro::data::ResumableSampler sampler(static_cast<std::size_t>(file->size()), {.seed = 1});
  const Augment augment = make_augment();
  auto model = cnn();
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
  nitro::level::Basic loop{model, optimizer};

  // On the CPU the augmentation is a pipeline stage with its own workers; on a GPU it is the
  // prefetcher's transform, on the copy stream (its epoch from `current`, set between epochs).
  auto on_cpu = [&augment](nitro::data::RecordBatch b, const nitro::data::StageContext& c) {
    b.data = augment(b.data, {.seed = augment_seed, .epoch = c.epoch, .index = b.index});
    return b;
  };
  auto read = nitro::from_dataset(nitro::data::RecordBatches(file), sampler, static_cast<std::size_t>(args.batch));
  auto batches = [&] {
    if constexpr (gpu) {
      return nitro::data::pipeline(std::move(read), {.name = "read", .workers = args.workers, .queue = 4});
    } else {
      return nitro::data::pipeline(std::move(read), {.name = "read", .workers = 1, .queue = 4},
                                   nitro::data::stage({.name = "augment", .workers = args.workers, .queue = 4}, on_cpu));
    }
  }();
  std::atomic<std::int64_t> current{0};
  nitro::PrefetchOptions<nitro::data::RecordBatch> prefetch{.depth = 4};
  if constexpr (gpu) {
    prefetch.transform = [&augment, &current](nitro::data::RecordBatch b) {
      b.data = augment(b.data, {.seed = augment_seed, .epoch = current.load(), .index = b.index});
      return b;
    };
  }
  nitro::Prefetcher<Device, decltype(batches)> on_device{std::move(batches), std::move(prefetch)};

  for (int epoch = 0; epoch < args.epochs; ++epoch) {
    current = epoch;  // the previous epoch was read to its end: nothing is being made meanwhile
    on_device.set_epoch(epoch);
    const auto start = std::chrono::steady_clock::now();
    at::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
    std::int64_t steps = 0, seen = 0;
    for (auto& b : on_device) {
      auto r = loop.step(b, [](auto& forward, const auto& batch) {
        return torch::cross_entropy_loss(forward(batch.data), batch.target);
      });
      loss_sum += r.loss.detach();
      ++steps;
      seen += b.data.size(0);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("epoch %d  %6.2f s  loss %.4f  %8.1f samples/s  (%lld batches)\n", epoch, seconds,
                loss_sum.item<double>() / static_cast<double>(steps), static_cast<double>(seen) / seconds,
                static_cast<long long>(steps));
  }
  std::printf("\nthe pipeline, all epochs (the prefetcher is its consumer):\n%s",
              on_device.source().stats().format().c_str());

  nitro::data::SyntheticImages test{{.size = 1024, .offset = args.samples, .noise = noise}};
  const auto [x, y] = test.stacked(0, 1024);
  torch::NoGradGuard no_grad;
  model->eval();
  const auto predicted = model->forward(evaluation_view(to_u8(x)).to(device)).argmax(1).cpu();
  std::printf("test accuracy %.4f (1024 held-out images)\n", predicted.eq(y).to(at::kFloat).mean().item<double>());
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  const bool gpu = nitro::Cuda::available();
  std::printf("records: the demo's CNN from a record file of %lld images, batch %lld, %d epochs, augmentation on "
              "the %s, one Prefetcher<%s> for every epoch\n",
              static_cast<long long>(args.samples), static_cast<long long>(args.batch), args.epochs,
              gpu ? "GPU (copy stream)" : "CPU (pipeline stage)", gpu ? "Cuda" : "Cpu");
  if (gpu) train<nitro::Cuda>(args);
  else train<nitro::Cpu>(args);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "records: %s\n", e.what());
  return 1;
}
