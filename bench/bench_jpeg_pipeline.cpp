// bench_jpeg_pipeline: training fed by JPEGs decoded on the GPU inside the pipeline
// (include/nitro/data/jpeg_batches.hpp) against the same training on batches already on the GPU.
//
//   RESULT gpu_jpeg_pipeline_vs_synthetic=<step time on pre-made GPU batches / step time fed from the
//       packed JPEG file> goal>=0.95   (GPU only)
//       ResNet-50 (bench/models/resnet.hpp, torchvision's), bf16 autocast (TrainingLoop<amp::Bf16>),
//       SGD with momentum, channels-last, batches of 256 at 224x224, 1000 classes. (a) the pipeline: a
//       packed file (data::PackedImages) of --images JPEGs of 500x375 (quality 90, 4:2:0), read as a
//       data set of `--images` files repeated (each repeat its own sample index, so its own crop),
//       JpegBatches over from_dataset with a ResumableSampler, Prefetcher<Cuda> with --workers (<= 4)
//       CPU threads and depth 3, its transform DecodeAugment (nvJPEG on the copy stream, torchvision's
//       RandomResizedCrop ranges, flip, ImageNet normalisation, float32 channels-last). (b) the same
//       number of steps on 4 batches made once on the GPU, cycled. The same model and optimizer for
//       both, alternating blocks of --steps steps (the one going first rotating) over --rounds rounds
//       after --warmup steps of each; the GPU synchronised before each clock read; a pipeline block
//       first takes depth + workers batches untimed, so those made ahead during (b) do not count;
//       medians of the per-step times.
//   info: the same training in Python (bench/jpeg_pipeline_torch.py): torch.utils.data.DataLoader with
//       --workers worker processes reading the same packed file, PIL decoding, torchvision transforms.v2
//       RandomResizedCrop + RandomHorizontalFlip + ToImage + ToDtype + Normalize, pinned memory,
//       torchvision.models.resnet50, bf16 autocast, channels-last; its images/s from the DataLoader and
//       on GPU batches (transforms.v2 resizes with antialiasing, which Nitro's DecodeAugment, as
//       augment::RandomResizedCrop, does not: a little more work on the Python side). Python: $NITRO_PYTHON, else /root/.cache/nitro/torch-2.11.0/bin/python where it
//       exists, else python3; without torchvision the line is skipped, saying so.
//
// Without a GPU (or with --device cpu) a small CPU variant runs so the program can be checked: 64x64
// crops, batches of 8, a small CNN, fewer files and steps, DecodeAugment with libjpeg-turbo on the
// workers; it prints its ratio as an info line and says that the GPU result was not measured.
//
//   build-release/bench/bench_jpeg_pipeline [--device cuda|cpu] [--images 1024] [--batch 256]
//       [--size 224] [--workers 4] [--steps 20] [--rounds 5] [--warmup 10] [--classes 1000]
//       [--model resnet50|small] [--no-python]
#include <nitro/core/config.hpp>
#include <nitro/core/device.hpp>
#include <nitro/data/image.hpp>
#include <nitro/data/jpeg_batches.hpp>
#include <nitro/data/nvjpeg.hpp>
#include <nitro/data/packed.hpp>
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/sampler.hpp>
#include <nitro/data/source.hpp>
#include <nitro/hw/settings.hpp>
#include <nitro/train/amp.hpp>
#include <nitro/train/channels_last.hpp>
#include <nitro/train/training_loop.hpp>

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/optim/sgd.h>

#include "common.hpp"
#include "python.hpp"

#if __has_include("models/resnet.hpp")
#include "models/resnet.hpp"
#define BENCH_JPEG_RESNET 1
#else
#define BENCH_JPEG_RESNET 0
#endif

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kHeight = 375, kWidth = 500;

struct Args {
  bool gpu = false;
  std::int64_t images = 1024;
  std::int64_t batch = 256;
  std::int64_t size = 224;
  std::size_t workers = 4;
  int steps = 20;
  int rounds = 5;
  int warmup = 10;
  std::int64_t classes = 1000;
  std::string model = "resnet50";
  bool python = true;
};

Args parse(int argc, char** argv) {
  Args a;
  std::optional<std::string> device;
  std::vector<std::pair<std::string, std::string>> given;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--no-python") {
      a.python = false;
      continue;
    }
    NITRO_CHECK(i + 1 < argc, "bench_jpeg_pipeline: ", arg, " needs a value");
    given.emplace_back(arg, argv[++i]);
    if (arg == "--device") device = given.back().second;
  }
  NITRO_CHECK(!device || *device == "cpu" || *device == "cuda", "bench_jpeg_pipeline: --device is cpu or cuda");
  a.gpu = device ? *device == "cuda" : nitro::Cuda::available();
  NITRO_CHECK(!a.gpu || nitro::Cuda::available(), "bench_jpeg_pipeline: --device cuda, but no GPU is available");
  if (!a.gpu) {  // the small CPU variant, so that the program can be checked without a GPU
    a.images = 48, a.batch = 8, a.size = 64, a.workers = 2, a.steps = 5, a.rounds = 3, a.warmup = 2, a.classes = 10;
    a.model = "small";
  }
  for (const auto& [arg, value] : given) {
    if (arg == "--device") continue;
    if (arg == "--images") a.images = std::stoll(value);
    else if (arg == "--batch") a.batch = std::stoll(value);
    else if (arg == "--size") a.size = std::stoll(value);
    else if (arg == "--workers") a.workers = static_cast<std::size_t>(std::stoul(value));
    else if (arg == "--steps") a.steps = std::stoi(value);
    else if (arg == "--rounds") a.rounds = std::stoi(value);
    else if (arg == "--warmup") a.warmup = std::stoi(value);
    else if (arg == "--classes") a.classes = std::stoll(value);
    else if (arg == "--model") a.model = value;
    else nitro::detail::fail("bench_jpeg_pipeline: unknown option ", arg,
                             "; use --device cpu|cuda, --images N, --batch B, --size S, --workers W, --steps K, "
                             "--rounds R, --warmup W, --classes C, --model resnet50|small, --no-python");
  }
  NITRO_CHECK(a.images >= 1 && a.batch >= 1 && a.size >= 8 && a.workers >= 1 && a.workers <= 4 && a.steps >= 1 &&
                  a.rounds >= 1 && a.warmup >= 0 && a.classes >= 2 && (a.model == "resnet50" || a.model == "small"),
              "bench_jpeg_pipeline: needs --images, --batch, --steps, --rounds >= 1, --size >= 8, 1 <= --workers <= 4 "
              "(the goal allows at most 4 CPU worker threads), --classes >= 2, --model resnet50 or small");
  NITRO_CHECK(a.model != "resnet50" || BENCH_JPEG_RESNET, "bench_jpeg_pipeline: bench/models/resnet.hpp is not there; "
              "use --model small");
  return a;
}

// ---- the files ---------------------------------------------------------------------------------

/// A deterministic 500x375 scene: smooth colour (low-resolution noise, upsampled), stripes of a random
/// frequency and Gaussian noise, so a file is about as large as an ImageNet photograph's at quality 90.
at::Tensor scene(at::Generator& gen) {
  auto base = at::rand({1, 3, 6, 8}, gen) * 255.0;
  auto x = at::upsample_bicubic2d(base, {kHeight, kWidth}, false);
  const auto yy = at::arange(kHeight, at::kFloat).view({kHeight, 1}), xx = at::arange(kWidth, at::kFloat).view({1, kWidth});
  const auto f = at::rand({3}, gen);
  const double fx = 0.05 + 0.3 * f[0].item<double>(), fy = 0.05 + 0.3 * f[1].item<double>();
  x = x + at::sin(xx * fx + yy * fy) * (10.0 + 20.0 * f[2].item<double>()) + at::randn(x.sizes(), gen) * 6.0;
  return x.round().clamp(0, 255).to(at::kByte).squeeze(0).contiguous();
}

/// `n` such JPEGs (quality 90, 4:2:0) in a packed file, labels k % classes; the mean file size.
double write_packed(const fs::path& path, std::int64_t n, std::int64_t classes) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(20261128);
  nitro::data::PackedWriter w(path, {.fsync = false});
  double bytes = 0;
  for (std::int64_t k = 0; k < n; ++k) {
    const auto jpeg = nitro::image::encode_jpeg(scene(gen), {.quality = 90, .subsampling = nitro::image::Subsampling::s420});
    bytes += static_cast<double>(jpeg.size());
    w.write(jpeg, k % classes, "img_" + std::to_string(k) + ".jpg");
  }
  w.close();
  return bytes / static_cast<double>(n);
}

/// A packed file's records repeated to `size` samples: sample i is record i % records, with its own
/// index (so its own crop and flip), as an epoch of a larger data set of such files would be.
struct Repeated {
  nitro::data::PackedImages images;
  std::int64_t samples = 0;
  [[nodiscard]] std::int64_t size() const noexcept { return samples; }
  [[nodiscard]] std::span<const std::uint8_t> encoded(std::size_t i) const {
    return images.encoded(static_cast<std::int64_t>(i) % images.size());
  }
  [[nodiscard]] std::int64_t label(std::size_t i) const { return images.label(static_cast<std::int64_t>(i) % images.size()); }
  [[nodiscard]] std::string name(std::size_t i) const { return images.name(static_cast<std::int64_t>(i) % images.size()); }
};

// ---- the model -----------------------------------------------------------------------------------

/// The CPU variant's model: two strided convolutions, global pooling, a classifier.
torch::nn::Sequential small_cnn(std::int64_t classes) {
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 32, 3).stride(2).padding(1)), torch::nn::ReLU(),
                               torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).stride(2).padding(1)), torch::nn::ReLU(),
                               torch::nn::AdaptiveAvgPool2d(1), torch::nn::Flatten(), torch::nn::Linear(64, classes));
}

// ---- Python ------------------------------------------------------------------------------------

using nitro::bench::find_python;
using nitro::bench::run_lines;
using nitro::bench::shell_quote;

using nitro::bench::value_of;

std::string load_average() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  double one = 0, five = 0, fifteen = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%lf %lf %lf", &one, &five, &fifteen) != 3) one = five = fifteen = 0;
    std::fclose(f);
  }
  char s[64];
  std::snprintf(s, sizeof s, "%.2f %.2f %.2f", one, five, fifteen);
  return s;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  const c10::Device device = a.gpu ? nitro::Cuda::device() : c10::Device(c10::kCPU);
  const nitro::hw::ScopedSettings settings{{.cudnn_benchmark = a.gpu ? std::optional<bool>(true) : std::nullopt}};
  const auto t_start = std::chrono::steady_clock::now();
  const fs::path dir = fs::temp_directory_path() / ("nitro-bench-jpeg-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const nitro::bench::ScopedTree cleanup{dir};
  const fs::path packed = dir / "images.npak";

  std::printf("bench_jpeg_pipeline: %s; %s; load average %s\n", nitro::bench::machine().c_str(),
              a.gpu ? "GPU run" : "CPU variant (no GPU, or --device cpu)", load_average().c_str());
  const double mean_bytes = write_packed(packed, a.images, a.classes);
  std::printf("data: %lld JPEG files of %lldx%lld, quality 90, 4:2:0, mean %.1f KB, in one packed file\n",
              static_cast<long long>(a.images), static_cast<long long>(kWidth), static_cast<long long>(kHeight),
              mean_bytes / 1024.0);
  const char* decoder = !a.gpu                           ? "libjpeg-turbo on the workers (CPU variant)"
                        : nitro::image::NvJpeg::available() ? "nvJPEG on the copy stream"
                                                            : "libjpeg-turbo on the workers (nvJPEG not available)";
  std::printf("model: %s, bf16 autocast, SGD momentum 0.9, batch %lld, %lldx%lld, %lld classes; pipeline: %zu "
              "workers, decode by %s\n",
              a.model.c_str(), static_cast<long long>(a.batch), static_cast<long long>(a.size),
              static_cast<long long>(a.size), static_cast<long long>(a.classes), a.workers, decoder);
  if (a.gpu && !nitro::image::NvJpeg::available())
    std::printf("nvJPEG: %s\n", nitro::image::NvJpeg::unavailable_reason().c_str());
  std::fflush(stdout);

  // The model, its optimizer and loop: one for both feeds.
  torch::manual_seed(0);
  std::shared_ptr<torch::nn::Module> model;
  std::function<at::Tensor(const at::Tensor&)> forward;
#if BENCH_JPEG_RESNET
  if (a.model == "resnet50") {
    auto net = nitro::bench::resnet50(a.classes);
    model = net.ptr();
    forward = [net](const at::Tensor& x) mutable { return net->forward(x); };
  }
#endif
  if (!model) {
    auto net = small_cnn(a.classes);
    model = net.ptr();
    forward = [net](const at::Tensor& x) mutable { return net->forward(x); };
  }
  model->to(device);
  if (a.gpu) nitro::to_channels_last(*model);  // as the batches
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  nitro::TrainingLoop<nitro::amp::Bf16> loop{model, optimizer};
  const auto loss_fn = [&](const auto& b) { return torch::nn::functional::cross_entropy(forward(b.data), b.target); };

  // (b) batches already on the device: 4, made once, cycled.
  const auto format = a.gpu ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  std::vector<nitro::data::JpegBatch> premade;
  for (int k = 0; k < 4; ++k)
    premade.push_back({at::randn({a.batch, 3, a.size, a.size}, at::TensorOptions().device(device)).contiguous(format),
                       at::randint(a.classes, {a.batch}, at::TensorOptions().dtype(at::kLong).device(device)),
                       at::arange(a.batch, at::TensorOptions().dtype(at::kLong).device(device)), nullptr});

  // (a) the pipeline: enough samples for every pipeline step of the run in one epoch.
  const std::size_t depth = 3;
  const std::int64_t pipeline_steps = a.warmup + a.rounds * (static_cast<std::int64_t>(depth + a.workers) + a.steps);
  const std::int64_t samples = a.batch * (pipeline_steps + static_cast<std::int64_t>(depth + a.workers) + 2);
  nitro::data::ResumableSampler sampler(static_cast<std::size_t>(samples), {.seed = 7});
  auto source = nitro::from_dataset(
      nitro::data::JpegBatches(Repeated{nitro::data::PackedImages(packed), samples}, {.seed = 7}), sampler,
      static_cast<std::size_t>(a.batch));
  nitro::PrefetchOptions<nitro::data::JpegBatch> po{.depth = depth, .workers = a.workers};
  po.transform = nitro::data::DecodeAugment({.height = a.size, .width = a.size, .channels_last = a.gpu});
  po.device = device;
  nitro::Prefetcher<nitro::Auto, decltype(source)> batches{std::move(source), std::move(po)};

  std::int64_t delivered = 0;
  const auto from_pipeline = [&](int n) {
    for (int i = 0; i < n; ++i) {
      auto b = batches.next();
      NITRO_CHECK(b.has_value(), "bench_jpeg_pipeline: the pipeline ended early");
      NITRO_CHECK(b->data.defined() && b->data.size(0) == a.batch && b->data.size(2) == a.size &&
                      b->data.device() == device && b->data.scalar_type() == at::kFloat,
                  "bench_jpeg_pipeline: a batch is not float [", a.batch, ", 3, ", a.size, ", ", a.size, "] on ", device);
      (void)loop.step(*b, loss_fn);
      delivered += b->data.size(0);
    }
  };
  std::size_t next_premade = 0;
  const auto from_premade = [&](int n) {
    for (int i = 0; i < n; ++i) (void)loop.step(premade[next_premade++ % premade.size()], loss_fn);
  };

  // Warm-up: cuDNN's autotuning, nvJPEG's buffers, the caching allocator, the page cache.
  (void)nitro::bench::seconds([&] { from_premade(a.warmup); });
  (void)nitro::bench::seconds([&] { from_pipeline(a.warmup); });
  std::vector<double> t_pipe, t_pre;
  const int ahead = static_cast<int>(depth + a.workers);
  for (int r = 0; r < a.rounds; ++r) {
    for (int order = 0; order < 2; ++order) {
      if ((r + order) % 2 == 0) {
        from_pipeline(ahead);  // the batches made ahead during the other block: untimed
        t_pipe.push_back(nitro::bench::seconds([&] { from_pipeline(a.steps); }) / a.steps);
      } else {
        t_pre.push_back(nitro::bench::seconds([&] { from_premade(a.steps); }) / a.steps);
      }
    }
  }
  const double pipe = nitro::bench::median(t_pipe), pre = nitro::bench::median(t_pre);
  const double ratio = pre / pipe;
  const auto images_per_s = [&](double step) { return static_cast<double>(a.batch) / step; };

  std::printf("\n%-66s %10s %10s\n", "training step, medians", "ms/step", "images/s");
  std::printf("%-66s %10.2f %10.1f\n", "batches already on the device (pre-made)", pre * 1e3, images_per_s(pre));
  std::printf("%-66s %10.2f %10.1f\n", "packed JPEG file -> JpegBatches -> Prefetcher -> DecodeAugment", pipe * 1e3,
              images_per_s(pipe));
  std::printf("info: %lld samples delivered by the pipeline, each a float [3, %lld, %lld]\n",
              static_cast<long long>(delivered), static_cast<long long>(a.size), static_cast<long long>(a.size));
  std::fflush(stdout);

  // The Python peer, after Nitro's measurement (the GPU to itself): our cached blocks handed back first.
  std::optional<double> py_pipe, py_pre;
  std::string py_status;
  if (a.python) {
#if NITRO_WITH_CUDA
    if (a.gpu) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
    const std::string python = find_python(), script = std::string(NITRO_SOURCE_DIR) + "/bench/jpeg_pipeline_torch.py";
    auto [check, ok] = run_lines(shell_quote(python) + " " + shell_quote(script) + " --mode check");
    if (!ok || value_of(check, "has_torchvision").value_or(0) != 1) {
      py_status = "skipped: " + python + " has no working torchvision (or PIL)";
      for (const auto& l : check) std::printf("  | %s\n", l.c_str());
    } else {
      const std::string args =
          " --packed " + shell_quote(packed.string()) + " --device " + (a.gpu ? "cuda" : "cpu") + " --batch " +
          std::to_string(a.batch) + " --size " + std::to_string(a.size) + " --workers " + std::to_string(a.workers) +
          " --steps " + std::to_string(a.steps) + " --rounds " + std::to_string(a.rounds) + " --warmup " +
          std::to_string(a.warmup) + " --classes " + std::to_string(a.classes) + " --model " + a.model;
      auto [lines, ran] = run_lines(shell_quote(python) + " " + shell_quote(script) + args);
      py_pipe = value_of(lines, "pipeline_images_per_s");
      py_pre = value_of(lines, "premade_images_per_s");
      for (const auto& l : lines)
        if (l.rfind("info:", 0) == 0) std::printf("python %s\n", l.c_str());
      if (!ran || !py_pipe || !py_pre) {
        py_status = "failed";
        for (const auto& l : lines) std::printf("  | %s\n", l.c_str());
        py_pipe.reset();
      }
    }
  } else {
    py_status = "skipped (--no-python)";
  }

  std::printf("\n%-58s %12s %12s %8s\n", "summary (images/s, medians)", "pipeline", "pre-made", "ratio");
  std::printf("%-58s %12.1f %12.1f %8.3f\n",
              a.gpu ? "nitro: packed JPEGs, nvJPEG on the copy stream" : "nitro: packed JPEGs, CPU variant",
              images_per_s(pipe), images_per_s(pre), ratio);
  if (py_pipe)
    std::printf("%-58s %12.1f %12.1f %8.3f\n", "PyTorch: DataLoader + PIL + torchvision transforms", *py_pipe, *py_pre,
                *py_pipe / *py_pre);
  else
    std::printf("PyTorch DataLoader + torchvision: %s\n", py_status.c_str());
  if (py_pipe)
    std::printf("info: PyTorch DataLoader + torchvision, %zu workers: %.1f images/s (%.3f of its pre-made batches); "
                "nitro's pipeline %.2f times its images/s\n",
                a.workers, *py_pipe, *py_pipe / *py_pre, images_per_s(pipe) / *py_pipe);
  std::printf("info: %.1f s, load average %s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(), load_average().c_str());
  std::fflush(stdout);
  if (a.gpu) {
    nitro::bench::result("gpu_jpeg_pipeline_vs_synthetic", ratio, ">=", 0.95);
  } else {
    std::printf("gpu_jpeg_pipeline_vs_synthetic: not measured (no GPU; the CPU variant's ratio, %.3f, is an info "
                "value, not the goal's)\n",
                ratio);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_jpeg_pipeline: %s\n", e.what());
  return 1;
}
