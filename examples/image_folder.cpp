// The demo's CNN trained from a folder of JPEG files, as a real data set arrives:
//
//   root/<class>/<image>.jpg (any size)
//     -> data::ImageFolder (torchvision's classes and order)
//     -> read: ImageBatches decodes each file and takes its random resized crop (per sample, keyed by
//        (seed, epoch, index): the same after a resume), the JPEG decoded at a reduced scale when
//        the crop is at least twice the output's size
//     -> augment: flip and normalise the batch at once (data/augment.hpp)
//     -> Prefetcher (on a GPU: pinned staging and the copy stream) -> level::Basic's step
//
// Without --folder it first writes one: SyntheticImages (10 classes) as JPEG files of varying sizes
// under <tmp>/nitro-image-folder-demo/{train,val}, once, and reuses it. Each epoch prints its time,
// loss and samples/s; the end prints the stage table and the accuracy on the val folder (each image
// resized to the training size).
//
//   build-release/examples/image_folder [--folder DIR] [--epochs 3] [--batch 64] [--workers 2]
//       [--samples 4096] [--size 32]
// With --folder DIR, DIR holds train/ and val/ (ImageNet's layout) or is itself the training tree
// (then no accuracy is printed).
#include <nitro/data/augment.hpp>
#include <nitro/data/image.hpp>
#include <nitro/data/image_folder.hpp>
#include <nitro/data/pipeline.hpp>
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/sampler.hpp>
#include <nitro/data/synthetic.hpp>
#include <nitro/io/file.hpp>
#include <nitro/train/levels.hpp>

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <string_view>

namespace {

namespace aug = nitro::data::augment;
namespace sample = nitro::data::sample;
namespace fs = std::filesystem;

struct Args {
  std::string folder;
  int epochs = 3;
  std::int64_t batch = 64;
  std::size_t workers = 2;
  std::int64_t samples = 4096;
  std::int64_t size = 32;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&] {
      NITRO_CHECK(i + 1 < argc, "image_folder: ", arg, " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--folder") a.folder = value();
    else if (arg == "--epochs") a.epochs = std::stoi(value());
    else if (arg == "--batch") a.batch = std::stoll(value());
    else if (arg == "--workers") a.workers = static_cast<std::size_t>(std::stoul(value()));
    else if (arg == "--samples") a.samples = std::stoll(value());
    else if (arg == "--size") a.size = std::stoll(value());
    else nitro::detail::fail("image_folder: unknown option ", arg, "; use --folder, --epochs, --batch, --workers, --samples, --size");
  }
  NITRO_CHECK(a.epochs >= 1 && a.batch >= 1 && a.workers >= 1 && a.samples >= 10 && a.size >= 8,
              "image_folder: epochs, batch, workers must be >= 1, samples >= 10, size >= 8");
  return a;
}

constexpr double noise = 8.0;

// `count` SyntheticImages from `offset` as root/class<k>/<i>.jpg, each resized to a size between 1x and
// 2x the synthetic 32 x 32 (a folder of photos has every size), JPEG quality 95.
void write_tree(const fs::path& root, std::int64_t offset, std::int64_t count) {
  nitro::data::SyntheticImages set({.size = count, .offset = offset, .noise = noise});
  for (std::int64_t i = 0; i < count; ++i) {
    auto e = set.get(static_cast<std::size_t>(i));
    const auto u8 = (e.data * 40 + 128).clamp(0, 255).to(at::kByte);
    const std::int64_t h = 32 + (i * 7) % 33, w = 32 + (i * 13) % 33;  // 32..64 each way
    const auto resized = at::_upsample_bilinear2d_aa(u8.unsqueeze(0), {h, w}, false).squeeze(0);
    const auto dir = root / ("class" + std::to_string(e.target.item<std::int64_t>()));
    fs::create_directories(dir);
    const auto bytes = nitro::image::encode_jpeg(resized, {.quality = 95, .subsampling = nitro::image::Subsampling::s444});
    std::ofstream(dir / (std::to_string(offset + i) + ".jpg"), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
}

// The demo folder: written once (a marker file says it is complete), reused afterwards.
fs::path demo_folder(const Args& args) {
  const auto root = fs::temp_directory_path() / ("nitro-image-folder-demo-" + std::to_string(args.samples));
  if (fs::exists(root / "complete")) return root;
  const auto start = std::chrono::steady_clock::now();
  if (fs::exists(root)) nitro::io::remove_tree(root);
  write_tree(root / "train", 0, args.samples);
  write_tree(root / "val", args.samples, std::max<std::int64_t>(args.samples / 8, 10));
  std::ofstream(root / "complete") << "ok\n";
  std::printf("wrote %s: %lld training and %lld val JPEG files in %.2f s\n", root.c_str(),
              static_cast<long long>(args.samples), static_cast<long long>(std::max<std::int64_t>(args.samples / 8, 10)),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return root;
}

torch::nn::Sequential cnn(std::int64_t size) {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)), torch::nn::ReLU(),
                               torch::nn::MaxPool2d(2), torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)),
                               torch::nn::ReLU(), torch::nn::MaxPool2d(2), torch::nn::Flatten(),
                               torch::nn::Linear(32 * (size / 4) * (size / 4), 10));
}

constexpr std::uint64_t seed = 7;
using Augment = aug::Compose<aug::ToFloat, aug::HFlip, aug::Normalize>;
const Augment augment{{}, {.p = 0.5}, {.mean = {0.5, 0.5, 0.5}, .std = {0.25, 0.25, 0.25}}};

template <nitro::DeviceTag Device>
void train(const Args& args, const fs::path& train_root, const std::optional<fs::path>& val_root) {
  constexpr bool gpu = Device::type == c10::DeviceType::CUDA;
  const c10::Device device = gpu ? nitro::Cuda::device() : nitro::Cpu::device();
  nitro::data::ImageFolder folder(train_root);
  std::printf("%s: %zu images, %zu classes\n", train_root.c_str(), *folder.size(), folder.classes().size());
  NITRO_CHECK(folder.classes().size() <= 10, "image_folder: the demo's CNN has 10 outputs; ", train_root.string(), " has ",
              folder.classes().size(), " classes");
  // The synthetic classes are patterns at fixed places, so the crops stay large.
  const sample::RandomResizedCrop crop{.height = args.size, .width = args.size, .scale_min = 0.8, .ratio_min = 0.9, .ratio_max = 1.1};
  nitro::data::ImageBatches images(folder, crop, {.seed = seed, .skip_bad = true});
  nitro::data::ResumableSampler sampler(*folder.size(), {.seed = 1});

  auto model = cnn(args.size);
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
  nitro::level::Basic loop{model, optimizer};

  // Decoding (the most work) on `workers` read workers; flip and normalise on one more stage.
  auto flip_normalise = [](nitro::data::RecordBatch b, const nitro::data::StageContext& c) {
    b.data = augment(b.data, {.seed = seed, .epoch = c.epoch, .index = b.index});
    return b;
  };
  auto batches = nitro::data::pipeline(
      nitro::from_dataset(images, sampler, static_cast<std::size_t>(args.batch)),
      {.name = "decode+crop", .workers = args.workers, .queue = 4},
      nitro::data::stage({.name = "flip+normalise", .workers = 1, .queue = 4}, flip_normalise));
  nitro::Prefetcher<Device, decltype(batches)> on_device{std::move(batches), {.depth = 4}};

  for (int epoch = 0; epoch < args.epochs; ++epoch) {
    on_device.set_epoch(epoch);  // the sampler's order and the crops' keys
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
  // The pipeline's workers hold copies of `images`; they share its counts.
  std::printf("files that could not be decoded (skipped): %lld\n", static_cast<long long>(images.skipped()));
  std::printf("\nthe pipeline, all epochs (the prefetcher is its consumer):\n%s",
              on_device.source().stats().format().c_str());

  if (!val_root) return;
  nitro::data::ImageFolder val(*val_root);
  nitro::data::ImageBatches val_images(val, sample::Resize{.height = args.size, .width = args.size});
  std::vector<size_t> all(*val.size());
  std::iota(all.begin(), all.end(), size_t{0});
  const nitro::data::RecordBatch b = val_images.get_batch(all);
  torch::NoGradGuard no_grad;
  model->eval();
  const at::Tensor x = ((b.data.to(at::kFloat) / 255.0 - 0.5) / 0.25).to(device);
  const at::Tensor predicted = model->forward(x).argmax(1).cpu();
  std::printf("val accuracy %.4f (%zu images of %s)\n", predicted.eq(b.target).to(at::kFloat).mean().item<double>(), all.size(),
              val_root->c_str());
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  fs::path train_root;
  std::optional<fs::path> val_root;
  if (args.folder.empty()) {
    const auto root = demo_folder(args);
    train_root = root / "train";
    val_root = root / "val";
  } else if (fs::is_directory(fs::path(args.folder) / "train")) {
    train_root = fs::path(args.folder) / "train";
    if (fs::is_directory(fs::path(args.folder) / "val")) val_root = fs::path(args.folder) / "val";
  } else {
    train_root = args.folder;
  }
  const bool gpu = nitro::Cuda::available();
  std::printf("image_folder: the demo's CNN from JPEG files, crops of %lldx%lld, batch %lld, %d epochs, %zu decode workers, "
              "Prefetcher<%s>\n",
              static_cast<long long>(args.size), static_cast<long long>(args.size), static_cast<long long>(args.batch),
              args.epochs, args.workers, gpu ? "Cuda" : "Cpu");
  if (gpu) train<nitro::Cuda>(args, train_root, val_root);
  else train<nitro::Cpu>(args, train_root, val_root);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "image_folder: %s\n", e.what());
  return 1;
}
