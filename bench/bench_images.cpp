// bench_images: real image data sets (include/nitro/data/image.hpp, image_folder.hpp, packed.hpp): JPEG
// decoding against Pillow, reduced-size (draft) decoding, an ImageFolder pipeline against PyTorch's
// DataLoader + torchvision, a packed file against the folder; on a GPU, nvJPEG (bench/images_nvjpeg.inc).
//
// The data: --images JPEG files (default 640, 10 classes of 64) of 500x375, ImageNet's average size,
// quality 90 with 4:2:0 chroma subsampling (as most ImageNet files), written once into a temporary
// folder, deterministic: variants (a 4:3 window, resized, mirrored or not, a gain per channel, a grey
// texture added, noise) of scikit-image's colour sample photographs, found in the Python's
// site-packages (skimage/data; skimage is not imported), else smooth synthetic scenes with texture and
// noise. Every timed pass comes after an untimed one over the same files (the page cache is warm).
//
//   RESULT decode_vs_pillow=<images/s of image::read (file -> uint8 [3, H, W]) / Pillow's
//       Image.open(f).convert("RGB")> goal>=1.0
//       one thread each, the first 256 files; the Python side is bench/images_dataloader.py --mode
//       decode, run once per round, alternating with Nitro's rounds, medians
//   RESULT draft_decode_speedup=<images/s of a reduced-size decode nearest 224, then a resize to 224x224 /
//       a full decode, then the same resize (at::_upsample_bilinear2d_aa)> goal>=2.0
//       Nitro only, one thread, the first 256 files' bytes, decoded as [H, W, 3] and resized as a
//       channels-last view (ATen's fast uint8 path), alternating, medians. For a 500x375 file the
//       reduction nearest 224 is libjpeg's 1/2 (250x188; the largest min_height = min_width that gets
//       it is asked of image::reduction_for, so the library's rule decides); min 224 keeps
//       the full size there (375 / 2 < 224), as PIL's draft("RGB", (224, 224)) does: an info line, as
//       is the same comparison on 16 files of 2000x1500 (1/8 scale), where reduced decoding pays most
//   RESULT image_folder_vs_dataloader=<samples/s of Nitro / of PyTorch> goal>=2.0
//       Nitro: ImageBatches(ImageFolder, sample::RandomResizedCrop 224) over from_dataset with a
//       ResumableSampler, batches of 64, Prefetcher<Cpu> with --workers W threads (depth 2W), each
//       batch flipped and normalised on its worker (the prefetcher's transform:
//       augment::Compose<HFlip, Normalize>, torchvision's order, the flip on uint8, Normalize of uint8 one pass).
//       PyTorch: DataLoader(torchvision ImageFolder, the PIL loader, transforms.v2
//       RandomResizedCrop(224) + RandomHorizontalFlip + ToImage + ToDtype(float32, scale=True) +
//       Normalize, batch_size 64, shuffle, num_workers W, persistent workers). One torch thread per
//       worker on both sides (here at::set_num_threads(1), which worker threads inherit; DataLoader
//       sets 1 in its worker processes). One epoch per round after an untimed epoch (Python: a fresh
//       process per round, its start-up and first epoch untimed), alternating, medians
//   RESULT images_vs_dali_cpu=<samples/s of Nitro's ImageFolder pipeline / NVIDIA DALI's CPU pipeline>
//       goal>=1.3
//       Nitro: the pipeline of image_folder_vs_dataloader (the same object, --workers threads, batches
//       of 64, float [64, 3, 224, 224]): each sample's crop drawn as torchvision's RandomResizedCrop,
//       then only the crop's region decoded (image::DecodeOptions::partial: the rows above it
//       entropy-decoded only, the rows below it not at all, the columns beside it neither transformed
//       nor upsampled), resized to 224x224 (antialiased bilinear), flipped and normalised on the
//       workers. A crop at least twice 224 each way would be decoded at 1/2 (PIL's draft rule); in
//       these 500x375 files none is (375 < 448): both sides decode at full scale.
//       DALI: bench/images_dali.py, CPU only (device_id=None): fn.readers.file (random shuffle) ->
//       fn.decoders.image_random_crop (RGB, random_area [0.08, 1], random_aspect_ratio [3/4, 4/3]; it
//       decodes only the crop's region) -> fn.resize 224x224 (linear, antialiased) ->
//       fn.crop_mirror_normalize (coin_flip mirror, ImageNet mean and std x 255, float CHW), batch 64,
//       num_threads --workers (besides its reader's and executor's threads; Nitro: --workers workers
//       and the consuming thread); its batches stay DALI's (no copy into torch). Each side one epoch a
//       round after an untimed one (DALI: a fresh process per round, its start-up and first epoch
//       untimed), alternating, medians. An info line gives one thread's decode of the crops' regions
//       against whole decodes. DALI (the PyPI wheel nvidia-dali-cuda130, which runs without a GPU) is
//       installed into the Python on first use (images_dali.py --mode install; NITRO_BENCH_NO_INSTALL=1
//       skips it); where it cannot be, the line is skipped, saying so
//   RESULT packed_vs_folder=<samples/s of that pipeline reading a packed file (data::PackedImages) /
//       reading the folder> goal>=1.0
//       the same files' bytes written once by data::PackedWriter; the same crops (the same seed and
//       epochs); both from the page cache; alternating epochs, medians
//
//   build-release/bench/bench_images [--images 640] [--classes 10] [--workers 2] [--rounds 5]
//       [--decode-files 256] [--parts decode,draft,loader,dali,packed]
// The Python: $NITRO_PYTHON, else /root/.cache/nitro/torch-2.11.0/bin/python where it exists, else
// python3. Without Pillow (or torchvision, or DALI) the RESULT lines that need them are skipped, saying so.
#include <nitro/core/config.hpp>
#include <nitro/data/augment.hpp>
#include <nitro/data/image.hpp>
#include <nitro/hw/settings.hpp>
#include <nitro/data/image_folder.hpp>
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/sampler.hpp>
#include <nitro/data/source.hpp>
#include <nitro/io/file.hpp>
#if __has_include(<nitro/data/packed.hpp>)
#include <nitro/data/packed.hpp>
#define BENCH_IMAGES_PACKED 1
#else
#define BENCH_IMAGES_PACKED 0
#endif

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "common.hpp"
#include "python.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#if NITRO_WITH_CUDA && __has_include("images_nvjpeg.inc")
#include "images_nvjpeg.inc"
#define BENCH_IMAGES_NVJPEG 1
#else
#define BENCH_IMAGES_NVJPEG 0
#endif

namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kHeight = 375, kWidth = 500;

struct Args {
  std::int64_t images = 640;
  std::int64_t classes = 10;
  std::size_t workers = 2;
  int rounds = 5;
  std::int64_t decode_files = 256;
  std::string parts = "decode,draft,loader,dali,packed";
  [[nodiscard]] bool want(const std::string& part) const {
    return ("," + parts + ",").find("," + part + ",") != std::string::npos;
  }
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&] {
      NITRO_CHECK(i + 1 < argc, "bench_images: ", arg, " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--images") a.images = std::stoll(value());
    else if (arg == "--classes") a.classes = std::stoll(value());
    else if (arg == "--workers") a.workers = static_cast<std::size_t>(std::stoul(value()));
    else if (arg == "--rounds") a.rounds = std::stoi(value());
    else if (arg == "--decode-files") a.decode_files = std::stoll(value());
    else if (arg == "--parts") a.parts = value();
    else nitro::detail::fail("bench_images: unknown option ", arg,
                             "; use --images N, --classes C, --workers W, --rounds R, --decode-files F, "
                             "--parts decode,draft,loader,dali,packed");
  }
  NITRO_CHECK(a.images >= 64 && a.classes >= 1 && a.classes <= a.images && a.workers >= 1 && a.rounds >= 1 &&
                  a.decode_files >= 1,
              "bench_images: needs --images >= 64, 1 <= --classes <= --images, --workers >= 1, --rounds >= 1");
  a.decode_files = std::min(a.decode_files, a.images);
  return a;
}

// ---- the machine ------------------------------------------------------------------------------

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  return "unknown CPU";
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  double one = 0, five = 0, fifteen = 0;
  in >> one >> five >> fifteen;
  char s[64];
  std::snprintf(s, sizeof s, "%.2f %.2f %.2f", one, five, fifteen);
  return s;
}

// ---- Python ------------------------------------------------------------------------------------

using nitro::bench::find_python;
using nitro::bench::run_lines;
using nitro::bench::shell_quote;

using nitro::bench::value_of;

struct Python {
  std::string exe;
  std::string script;
  bool pil = false;
  bool torchvision = false;

  /// images/s from one run of the script; nullopt (and the output printed) when it failed.
  std::optional<double> run(const std::string& arguments, bool print_info) {
    auto [lines, ok] = run_lines(shell_quote(exe) + " " + shell_quote(script) + " " + arguments);
    const auto v = value_of(lines, "images_per_s");
    if (!ok || !v) {
      std::printf("python failed (%s %s):\n", script.c_str(), arguments.c_str());
      for (const auto& l : lines) std::printf("  | %s\n", l.c_str());
      return std::nullopt;
    }
    if (print_info)
      for (const auto& l : lines)
        if (l.rfind("info:", 0) == 0) std::printf("python %s\n", l.c_str());
    return v;
  }
};

Python find_peer() {
  Python py{find_python(), std::string(NITRO_SOURCE_DIR) + "/bench/images_dataloader.py"};
  std::error_code ec;
  if (!fs::exists(py.script, ec)) {
    std::printf("python: %s is missing: the comparisons with Pillow and the DataLoader are skipped\n", py.script.c_str());
    return py;
  }
  auto [lines, ok] = run_lines(shell_quote(py.exe) + " " + shell_quote(py.script) + " --root . --mode check");
  py.pil = ok && value_of(lines, "has_pil").value_or(0) == 1;
  py.torchvision = ok && value_of(lines, "has_torchvision").value_or(0) == 1;
  if (!py.pil) {
    std::printf("python: %s cannot import PIL: the comparisons with Pillow and the DataLoader are skipped\n", py.exe.c_str());
    for (const auto& l : lines) std::printf("  | %s\n", l.c_str());
  } else if (!py.torchvision) {
    std::printf("python: %s has no working torchvision: the DataLoader comparison is skipped\n", py.exe.c_str());
  }
  return py;
}

/// bench/images_dali.py, with DALI installed into the Python on first use (--mode install: pip, the
/// Python's torch pinned); has_dali false (and why printed) where it is not there and cannot be.
struct Dali {
  Python py;
  bool has_dali = false;
};

Dali find_dali(const std::string& exe) {
  Dali d{{exe, std::string(NITRO_SOURCE_DIR) + "/bench/images_dali.py"}};
  std::error_code ec;
  if (!fs::exists(d.py.script, ec)) {
    std::printf("dali: %s is missing: images_vs_dali_cpu is skipped\n", d.py.script.c_str());
    return d;
  }
  auto [lines, ok] = run_lines(shell_quote(exe) + " " + shell_quote(d.py.script) + " --root . --mode install");
  d.has_dali = ok && value_of(lines, "has_dali").value_or(0) == 1;
  for (const auto& l : lines)
    if (d.has_dali ? l.rfind("info:", 0) == 0 || l.rfind("images_dali:", 0) == 0 : true) std::printf("dali | %s\n", l.c_str());
  if (!d.has_dali) std::printf("dali: %s has no working nvidia.dali: images_vs_dali_cpu is skipped\n", exe.c_str());
  return d;
}

// ---- the images ----------------------------------------------------------------------------------

/// scikit-image's colour sample photographs and grey textures (site-packages/skimage/data of the
/// Python, found by sysconfig, not imported).
std::pair<std::vector<fs::path>, std::vector<fs::path>> sample_photographs(const std::string& python) {
  auto [lines, ok] = run_lines(shell_quote(python) + " -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'");
  std::vector<fs::path> photos, textures;
  if (!ok || lines.empty()) return {photos, textures};
  const fs::path dir = fs::path(lines.back()) / "skimage" / "data";
  std::error_code ec;
  for (const char* name : {"astronaut.png", "chelsea.png", "coffee.png", "motorcycle_left.png", "motorcycle_right.png",
                           "rocket.jpg", "ihc.png"})
    if (fs::exists(dir / name, ec)) photos.push_back(dir / name);
  for (const char* name : {"grass.png", "gravel.png", "brick.png"})
    if (fs::exists(dir / name, ec)) textures.push_back(dir / name);
  return {photos, textures};
}

/// Uniform in [0, 1) from a 64-bit draw (the same on every standard library, unlike its distributions).
double uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

/// A photograph made into a 500x375 variant: a 4:3 window of 60% to 100% of the largest one, resized
/// (antialiased), mirrored or not, a gain per channel in [0.9, 1.1], half the contrast of a grey texture
/// (grass, gravel, brick; a random 500x375 window) added to every channel, Gaussian noise of 3 levels.
/// (The sample photographs are smoother than most of ImageNet's: the texture brings the files closer
/// to its bytes a pixel.)
at::Tensor variant(const at::Tensor& photo, const at::Tensor& texture, std::mt19937_64& rng, at::Generator& gen,
                   std::int64_t height = kHeight, std::int64_t width = kWidth) {
  const auto H = photo.size(1), W = photo.size(2);
  const double max_w = std::min<double>(static_cast<double>(W), static_cast<double>(H) * 4.0 / 3.0);
  const double f = std::sqrt(0.6 + 0.4 * uniform(rng));
  const auto cw = std::max<std::int64_t>(8, static_cast<std::int64_t>(max_w * f));
  const auto ch = std::min<std::int64_t>(H, std::max<std::int64_t>(6, cw * 3 / 4));
  const auto left = static_cast<std::int64_t>(uniform(rng) * static_cast<double>(W - cw + 1));
  const auto top = static_cast<std::int64_t>(uniform(rng) * static_cast<double>(H - ch + 1));
  auto x = photo.slice(1, top, top + ch).slice(2, left, left + cw).unsqueeze(0).to(at::kFloat);
  x = at::_upsample_bilinear2d_aa(x, {height, width}, false);
  if (uniform(rng) < 0.5) x = x.flip(3);
  const double g0 = 0.9 + 0.2 * uniform(rng), g1 = 0.9 + 0.2 * uniform(rng), g2 = 0.9 + 0.2 * uniform(rng);
  const auto gain = at::tensor({g0, g1, g2}).view({1, 3, 1, 1});
  x = x * gain + at::randn(x.sizes(), gen) * 3.0;
  if (texture.defined() && texture.size(1) >= height && texture.size(2) >= width) {
    const auto ty = static_cast<std::int64_t>(uniform(rng) * static_cast<double>(texture.size(1) - height + 1));
    const auto tx = static_cast<std::int64_t>(uniform(rng) * static_cast<double>(texture.size(2) - width + 1));
    const auto t = texture.select(0, 0).slice(0, ty, ty + height).slice(1, tx, tx + width).to(at::kFloat);
    x = x + 0.5 * (t - t.mean());
  }
  return x.round().clamp(0, 255).to(at::kByte).squeeze(0).contiguous();
}

/// No photographs: a smooth scene (low-resolution colour noise, upsampled), a texture of stripes and
/// Gaussian noise.
at::Tensor synthetic(std::mt19937_64& rng, at::Generator& gen, std::int64_t height = kHeight, std::int64_t width = kWidth) {
  auto base = at::rand({1, 3, 6, 8}, gen) * 255.0;
  auto x = at::upsample_bicubic2d(base, {height, width}, false);
  const auto yy = at::arange(height, at::kFloat).view({height, 1}), xx = at::arange(width, at::kFloat).view({1, width});
  const double fx = 0.05 + 0.3 * uniform(rng), fy = 0.05 + 0.3 * uniform(rng);
  x = x + at::sin(xx * fx + yy * fy) * (10.0 + 20.0 * uniform(rng)) + at::randn(x.sizes(), gen) * 6.0;
  return x.round().clamp(0, 255).to(at::kByte).squeeze(0).contiguous();
}

struct Folder {
  std::vector<std::string> paths;          // in ImageFolder's order (class folders, sorted names)
  std::vector<std::int64_t> labels;
  std::vector<std::vector<std::uint8_t>> bytes;
  std::vector<std::vector<std::uint8_t>> large;  // a few 2000x1500 files (info: where draft decoding pays)
  std::string made_from;
};

Folder write_folder(const fs::path& root, const Args& a, const std::string& python) {
  Folder out;
  std::vector<at::Tensor> photos, textures;
  const auto [photo_paths, texture_paths] = sample_photographs(python);
  for (const auto& p : photo_paths) photos.push_back(nitro::image::read(p));
  for (const auto& p : texture_paths) textures.push_back(nitro::image::read(p));
  out.made_from = photos.empty() ? std::string("synthetic scenes (scikit-image's sample photographs not found)")
                                 : std::to_string(photos.size()) + " of scikit-image's colour sample photographs with " +
                                       std::to_string(textures.size()) + " of its grey textures";
  std::mt19937_64 rng(20261126);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto per_class = (a.images + a.classes - 1) / a.classes;
  std::int64_t k = 0;
  for (std::int64_t c = 0; c < a.classes && k < a.images; ++c) {
    char cls[32];
    std::snprintf(cls, sizeof cls, "class_%02lld", static_cast<long long>(c));
    fs::create_directories(root / cls);
    for (std::int64_t j = 0; j < per_class && k < a.images; ++j, ++k) {
      const auto at_k = static_cast<std::size_t>(k);
      const auto image = photos.empty() ? synthetic(rng, gen)
                                        : variant(photos[at_k % photos.size()],
                                                  textures.empty() ? at::Tensor() : textures[at_k % textures.size()], rng, gen);
      auto jpeg = nitro::image::encode_jpeg(image, {.quality = 90, .subsampling = nitro::image::Subsampling::s420});
      char name[32];
      std::snprintf(name, sizeof name, "img_%05lld.jpg", static_cast<long long>(k));
      const auto path = (root / cls / name).string();
      std::ofstream f(path, std::ios::binary);
      f.write(reinterpret_cast<const char*>(jpeg.data()), static_cast<std::streamsize>(jpeg.size()));
      NITRO_CHECK(f.good(), "bench_images: cannot write ", path);
      out.paths.push_back(path);
      out.labels.push_back(c);
      out.bytes.push_back(std::move(jpeg));
    }
  }
  for (std::int64_t i = 0; i < 16; ++i) {
    const auto image = photos.empty()
                           ? synthetic(rng, gen, 1500, 2000)
                           : variant(photos[static_cast<std::size_t>(i) % photos.size()], at::Tensor(), rng, gen, 1500, 2000);
    out.large.push_back(nitro::image::encode_jpeg(image, {.quality = 90, .subsampling = nitro::image::Subsampling::s420}));
  }
  return out;
}

// ---- Nitro's pipeline ----------------------------------------------------------------------------

namespace aug = nitro::data::augment;
namespace sample = nitro::data::sample;
using Batch = nitro::data::RecordBatch;
// Flipped while uint8, then made float and normalised in one pass (Normalize of uint8 images):
// torchvision's order (RandomHorizontalFlip on the PIL image, then ToImage, ToDtype, Normalize).
using FlipNormalise = aug::Compose<aug::HFlip, aug::Normalize>;

/// at::get_num_threads() on a prefetcher's worker (the transform records it).
std::atomic<int> worker_threads{0};

/// ImageBatches over `source` (random resized crops 224), W workers, each batch flipped and normalised
/// on its worker. The epoch of the flips is `epoch` (set before each set_epoch).
template <class Source>
auto make_pipeline(Source source, std::size_t size, std::size_t workers, std::shared_ptr<std::atomic<std::int64_t>> epoch) {
  auto batches =
      nitro::data::ImageBatches(std::move(source), sample::RandomResizedCrop{.height = 224, .width = 224}, {.seed = 7});
  auto stages = std::make_shared<FlipNormalise>();
  nitro::PrefetchOptions<Batch> o{.depth = 2 * workers, .workers = workers};
  o.transform = [stages, epoch](Batch b) {
    worker_threads.store(at::get_num_threads());
    b.data = (*stages)(b.data, {.seed = 7, .epoch = epoch->load(), .index = b.index});
    return b;
  };
  return nitro::prefetch<nitro::Cpu>(
      nitro::from_dataset(std::move(batches), nitro::data::ResumableSampler(size, {.seed = 7}), 64), std::move(o));
}

/// One epoch through a pipeline: the samples delivered and the seconds from set_epoch to the last batch.
template <class P>
std::pair<std::int64_t, double> epoch_of(P& pipeline, std::atomic<std::int64_t>& epoch_flag, std::int64_t epoch,
                                         double& checksum) {
  std::int64_t n = 0;
  const double s = nitro::bench::seconds([&] {
    epoch_flag.store(epoch);
    pipeline.set_epoch(epoch);
    while (auto next = pipeline.next()) {
      const Batch& b = *next;
      NITRO_CHECK(b.data.dim() == 4 && b.data.size(1) == 3 && b.data.size(2) == 224 && b.data.scalar_type() == at::kFloat,
                  "bench_images: a batch is not float [N, 3, 224, 224]");
      n += b.data.size(0);
      checksum += b.target.sum().item<double>();
    }
  });
  return {n, s};
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  at::set_num_threads(1);  // one thread per worker (as DataLoader's workers), and the one-thread decodes
  // The heap kept, as level::hardware<Basic>() keeps it in a training program (hw/settings.hpp): a
  // batch of 64 float images (38 MB) is otherwise mapped and unmapped by glibc each time.
  const nitro::hw::ScopedSettings heap{nitro::hw::Settings::heap()};
  const auto t_start = std::chrono::steady_clock::now();
  const fs::path dir = fs::temp_directory_path() / ("nitro-bench-images-" + std::to_string(::getpid()));
  const fs::path root = dir / "folder";
  fs::create_directories(root);
  const nitro::bench::ScopedTree cleanup{dir};

  std::printf("bench_images: %s; %s; torch threads %d (at::set_num_threads(1): ops run on the calling thread, as in "
              "DataLoader's workers); load average %s\n",
              cpu_model().c_str(), nitro::bench::machine().c_str(), at::get_num_threads(), load_average().c_str());
  Python py = find_peer();
  Dali dali = a.want("dali") ? find_dali(py.exe) : Dali{};
  const Folder folder = write_folder(root, a, py.exe);
  double total_bytes = 0;
  for (const auto& b : folder.bytes) total_bytes += static_cast<double>(b.size());
  std::printf("data: %lld JPEG files, %lld classes, %lldx%lld, quality 90, 4:2:0, mean %.1f KB a file, made from %s, in %s\n",
              static_cast<long long>(a.images), static_cast<long long>(a.classes), static_cast<long long>(kWidth),
              static_cast<long long>(kHeight), total_bytes / static_cast<double>(folder.bytes.size()) / 1024.0,
              folder.made_from.c_str(), root.c_str());
  std::printf("python: %s (Pillow %s, torchvision %s, DALI %s)\n\n", py.exe.c_str(), py.pil ? "yes" : "no",
              py.torchvision ? "yes" : "no", dali.has_dali ? "yes" : a.want("dali") ? "no" : "not asked");
  std::fflush(stdout);

  const std::int64_t M = a.decode_files;
  const int R = a.rounds;

  // ---- 1. decoding, one thread: Nitro's image::read against Pillow ----------------------------------
  std::vector<double> nitro_decode, nitro_decode_hwc, pillow_decode;
  double pixels = 0, nd = 0, nh = 0, pd = 0;
  bool pillow_ok = py.pil && a.want("decode");
  if (a.want("decode")) {
    const auto decode_pass = [&](nitro::image::Layout layout) {
      const double s = nitro::bench::seconds([&] {
        for (std::int64_t i = 0; i < M; ++i) {
          const auto bytes = nitro::image::read_file(folder.paths[static_cast<std::size_t>(i)]);
          const auto x = nitro::image::decode(bytes, {.layout = layout}, folder.paths[static_cast<std::size_t>(i)]);
          pixels += static_cast<double>(x.numel());
        }
      });
      return static_cast<double>(M) / s;
    };
      decode_pass(nitro::image::Layout::chw);  // warm-up (and the page cache)
    decode_pass(nitro::image::Layout::hwc);
    const std::string decode_args = "--root " + shell_quote(root.string()) + " --mode decode --images " + std::to_string(M) +
                                    " --warmup 32 --epochs 1";
    for (int r = 0; r < R; ++r) {
      for (int order = 0; order < 2; ++order) {
        if ((r + order) % 2 == 0) {
          nitro_decode.push_back(decode_pass(nitro::image::Layout::chw));
          nitro_decode_hwc.push_back(decode_pass(nitro::image::Layout::hwc));
        } else if (pillow_ok) {
          const auto v = py.run(decode_args, r == 0);
          if (v) pillow_decode.push_back(*v);
          else pillow_ok = false;
        }
      }
    }
    nd = nitro::bench::median(nitro_decode), nh = nitro::bench::median(nitro_decode_hwc);
    pd = pillow_ok ? nitro::bench::median(pillow_decode) : 0.0;
    std::printf("decode %lldx%lld JPEG files (file read + decode to RGB), one thread, %lld files, %d rounds   images/s   ms/image\n",
                static_cast<long long>(kWidth), static_cast<long long>(kHeight), static_cast<long long>(M), R);
    if (pillow_ok) std::printf("Pillow Image.open(f).convert(\"RGB\")                                           %9.1f %9.3f\n", pd, 1e3 / pd);
    std::printf("nitro image::read, uint8 [3, H, W]                                             %9.1f %9.3f\n", nd, 1e3 / nd);
    std::printf("nitro image::read, uint8 [H, W, 3] (info)                                      %9.1f %9.3f\n\n", nh, 1e3 / nh);
    std::fflush(stdout);
  }

  // ---- 2. reduced-size decoding, Nitro only -------------------------------------------------------
  // The reduction whose output's shorter side is nearest 224 (on a log scale), and the largest
  // min_height = min_width for which decode() picks it (asked of the library: its rule decides).
  const auto draft_min_for = [](const nitro::image::Info& info) {
    const auto shorter = std::min(info.height, info.width);
    int nearest = 1;
    const auto off = [&](int scale) { return std::abs(std::log(static_cast<double>(shorter) / scale / 224.0)); };
    for (int s : {2, 4, 8})
      if (off(s) < off(nearest)) nearest = s;
    for (std::int64_t m = shorter; m >= 1; --m)
      if (nitro::image::reduction_for(info, {.min_height = m, .min_width = m}) >= nearest) return m;
    return std::int64_t{1};
  };
  const auto info = nitro::image::probe(folder.bytes[0]);
  const std::int64_t draft_min = draft_min_for(info);
  // Decoded as [H, W, 3] and resized as a channels-last [1, 3, H, W] view (ATen's fast uint8 path).
  const auto resized_of = [&](const std::vector<std::vector<std::uint8_t>>& files, std::int64_t count, std::int64_t min_size) {
    const double s = nitro::bench::seconds([&] {
      for (std::int64_t i = 0; i < count; ++i) {
        const auto x = nitro::image::decode(files[static_cast<std::size_t>(i)],
                                            {.layout = nitro::image::Layout::hwc, .min_height = min_size, .min_width = min_size});
        const auto y = at::_upsample_bilinear2d_aa(x.permute({2, 0, 1}).unsqueeze(0), {224, 224}, false);
        pixels += static_cast<double>(y.numel());
      }
    });
    return static_cast<double>(count) / s;
  };
  const auto resized = [&](std::int64_t min_size) { return resized_of(folder.bytes, M, min_size); };
  const int literal_scale = nitro::image::reduction_for(info, {.min_height = 224, .min_width = 224});
  const int draft_scale = nitro::image::reduction_for(info, {.min_height = draft_min, .min_width = draft_min});
  std::vector<double> full_rs, draft_rs, literal_rs;
  double fr = 0, dr = 0, lr = 0, big_full_rate = 0, big_draft_rate = 0;
  int big_scale = 1;
  if (a.want("draft")) {
    resized(0), resized(draft_min), resized(224);  // warm-up
    for (int r = 0; r < R; ++r) {
      for (int k = 0; k < 3; ++k) {
        switch ((r + k) % 3) {
          case 0: full_rs.push_back(resized(0)); break;
          case 1: draft_rs.push_back(resized(draft_min)); break;
          default: literal_rs.push_back(resized(224)); break;
        }
      }
    }
    fr = nitro::bench::median(full_rs), dr = nitro::bench::median(draft_rs), lr = nitro::bench::median(literal_rs);
    std::printf("decode [H, W, 3], resize to 224x224 (at::_upsample_bilinear2d_aa, uint8, channels-last), Nitro, "
                "one thread   images/s   ms/image\n");
    std::printf("full size (%lldx%lld)                                                            %9.1f %9.3f\n",
                static_cast<long long>(kWidth), static_cast<long long>(kHeight), fr, 1e3 / fr);
    std::printf("min_height = min_width = %3lld: 1/%d scale (%lldx%lld)                                %9.1f %9.3f\n",
                static_cast<long long>(draft_min), draft_scale, static_cast<long long>((kWidth + draft_scale - 1) / draft_scale),
                static_cast<long long>((kHeight + draft_scale - 1) / draft_scale), dr, 1e3 / dr);
    std::printf("min_height = min_width = 224: 1/%d scale (info)                                  %9.1f %9.3f\n",
                literal_scale, lr, 1e3 / lr);
    // Info: the same on 16 files of 2000x1500 (a phone's photograph), where 1/8 gives 250x188.
    const auto big = static_cast<std::int64_t>(folder.large.size());
    std::vector<double> big_full, big_draft;
    const auto big_info = nitro::image::probe(folder.large[0]);
    const std::int64_t big_min = draft_min_for(big_info);
    resized_of(folder.large, big, 0), resized_of(folder.large, big, big_min);
    for (int r = 0; r < 3; ++r) {
      for (int order = 0; order < 2; ++order) {
        if ((r + order) % 2 == 0) big_full.push_back(resized_of(folder.large, big, 0));
        else big_draft.push_back(resized_of(folder.large, big, big_min));
      }
    }
    big_full_rate = nitro::bench::median(big_full), big_draft_rate = nitro::bench::median(big_draft);
    big_scale = nitro::image::reduction_for(big_info, {.min_height = big_min, .min_width = big_min});
    std::printf("info, %lld files of 2000x1500: full size %.1f images/s, min %lld (1/%d scale) %.1f images/s: %.2f times\n\n",
                static_cast<long long>(big), big_full_rate, static_cast<long long>(big_min), big_scale, big_draft_rate,
                big_draft_rate / big_full_rate);
    std::fflush(stdout);
  }

  // ---- 3. ImageFolder pipeline against DataLoader + torchvision ------------------------------------
  const auto n = static_cast<std::size_t>(a.images);
  if (a.want("loader")) {
    // Where a sample's time goes, on this thread alone (info): the random resized crop (read, decode,
    // crop, resize) and the batched flip + normalise, over the first batches of epoch 1.
    auto batches = nitro::data::ImageBatches(nitro::data::ImageFolder(root), sample::RandomResizedCrop{.height = 224, .width = 224},
                                             {.seed = 7});
    batches.set_epoch(1);
    const FlipNormalise stages;
    const std::int64_t count = std::min<std::int64_t>(M, 128);
    std::vector<double> crop_ms, stage_ms;
    for (int r = 0; r < 3; ++r) {
      double c = 0, t = 0;
      for (std::int64_t first = 0; first < count; first += 64) {
        std::vector<size_t> idx;
        for (std::int64_t i = first; i < std::min(count, first + 64); ++i) idx.push_back(static_cast<size_t>(i));
        Batch b;
        c += nitro::bench::seconds([&] { b = batches.get_batch(idx); });
        t += nitro::bench::seconds([&] { b.data = stages(b.data, {.seed = 7, .epoch = 1, .index = b.index}); });
      }
      if (r > 0) {
        crop_ms.push_back(c * 1e3 / static_cast<double>(count));
        stage_ms.push_back(t * 1e3 / static_cast<double>(count));
      }
    }
    std::printf("one thread, ms a sample (info): read + decode + sample::RandomResizedCrop 224 %.3f; flip + normalise, "
                "batched %.3f\n",
                nitro::bench::median(crop_ms), nitro::bench::median(stage_ms));
  }
  auto folder_epoch = std::make_shared<std::atomic<std::int64_t>>(0);
  auto from_folder = make_pipeline(nitro::data::ImageFolder(root), n, a.workers, folder_epoch);
  double checksum_folder = 0;
  std::int64_t epoch = 0;
  (void)epoch_of(from_folder, *folder_epoch, epoch++, checksum_folder);  // warm-up epoch
  std::vector<double> nitro_loader, torch_loader;
  // R rounds of one Nitro epoch and one epoch of `peer` (a Python side, `--mode loader`), the one going
  // first alternating; a peer that fails once is not asked again (ok becomes false).
  const auto against = [&](Python& peer, bool& ok, std::vector<double>& mine, std::vector<double>& theirs) {
    const std::string args = "--root " + shell_quote(root.string()) + " --mode loader --workers " +
                             std::to_string(a.workers) + " --batch 64 --warmup 1 --epochs 1";
    for (int r = 0; r < R; ++r) {
      for (int order = 0; order < 2; ++order) {
        if ((r + order) % 2 == 0) {
          const auto [samples, s] = epoch_of(from_folder, *folder_epoch, epoch++, checksum_folder);
          NITRO_CHECK(samples == a.images, "bench_images: an epoch delivered ", samples, " samples of ", a.images);
          mine.push_back(static_cast<double>(samples) / s);
        } else if (ok) {
          const auto v = peer.run(args, r == 0);
          if (v) theirs.push_back(*v);
          else ok = false;
        }
      }
    }
  };
  bool loader_ok = py.torchvision && a.want("loader");
  double nl = 0, tl = 0;
  if (a.want("loader")) {
    against(py, loader_ok, nitro_loader, torch_loader);
    nl = nitro::bench::median(nitro_loader), tl = loader_ok ? nitro::bench::median(torch_loader) : 0.0;
    std::printf("epoch of %lld files: random resized crop 224, flip, normalise, batches of 64, %zu workers   samples/s\n",
                static_cast<long long>(a.images), a.workers);
    if (loader_ok) std::printf("PyTorch DataLoader + torchvision ImageFolder (PIL), transforms.v2                      %9.1f\n", tl);
    std::printf("nitro ImageFolder -> ImageBatches -> Prefetcher<Cpu> (flip, normalise on the workers)    %9.1f\n", nl);
    std::printf("torch threads on a Nitro worker: %d\n\n", worker_threads.load());
    std::fflush(stdout);
  }

  // ---- 4. the same pipeline against DALI's CPU pipeline -------------------------------------------
  std::vector<double> nitro_dali_rounds, dali_rounds;
  bool dali_ok = dali.has_dali && a.want("dali");
  double nd2 = 0, dl = 0;
  if (a.want("dali")) {
    // Info: what decoding only the crop's region saves, on this thread alone: the crops the pipeline
    // draws (epoch 1) of the first files, decoded as its geometry decodes them ([h, w, 3], the draft
    // rule for 224), with DecodeOptions::partial (the default) and without (the whole image at that
    // scale, then cut).
    {
      const sample::RandomResizedCrop g{.height = 224, .width = 224};
      const auto count = static_cast<std::size_t>(std::min<std::int64_t>(M, 128));
      std::vector<nitro::image::DecodeOptions> options;
      for (std::size_t i = 0; i < count; ++i) {
        const auto info = nitro::image::probe(folder.bytes[i]);
        const auto c = g.crop({7, 1, static_cast<std::int64_t>(i)}, info.height, info.width);
        options.push_back({.layout = nitro::image::Layout::hwc, .crop = nitro::image::Window{c[0], c[1], c[2], c[3]},
                           .min_height = 224, .min_width = 224});
      }
      const auto pass = [&](bool partial) {
        return nitro::bench::seconds([&] {
                 for (std::size_t i = 0; i < count; ++i) {
                   auto o = options[i];
                   o.partial = partial;
                   pixels += static_cast<double>(nitro::image::decode(folder.bytes[i], o).numel());
                 }
               }) * 1e3 / static_cast<double>(count);
      };
      (void)pass(true), (void)pass(false);
      std::vector<double> region_ms, whole_ms;
      for (int r = 0; r < 3; ++r) {
        if (r % 2 == 0) region_ms.push_back(pass(true)), whole_ms.push_back(pass(false));
        else whole_ms.push_back(pass(false)), region_ms.push_back(pass(true));
      }
      std::printf("one thread, ms a sample (info): decode of the crop's region %.3f; of the whole image, then the crop "
                  "cut %.3f (%zu files' random resized crops)\n",
                  nitro::bench::median(region_ms), nitro::bench::median(whole_ms), count);
    }
    against(dali.py, dali_ok, nitro_dali_rounds, dali_rounds);
    nd2 = nitro::bench::median(nitro_dali_rounds), dl = dali_ok ? nitro::bench::median(dali_rounds) : 0.0;
    std::printf("epoch of %lld files: random resized crop 224, flip, normalise, batches of 64, %zu threads    samples/s\n",
                static_cast<long long>(a.images), a.workers);
    if (dali_ok) std::printf("DALI CPU: readers.file -> decoders.image_random_crop -> resize -> crop_mirror_normalize  %9.1f\n", dl);
    std::printf("nitro ImageFolder -> ImageBatches -> Prefetcher<Cpu> (flip, normalise on the workers)    %9.1f\n\n", nd2);
    std::fflush(stdout);
  }

  // ---- 5. a packed file against the folder ---------------------------------------------------------
#if BENCH_IMAGES_PACKED
  double pr = 0, fo = 0;
  if (a.want("packed")) {
    const fs::path packed_path = dir / "images.npak";
    {
      nitro::data::PackedWriter w(packed_path, {.fsync = false});
      for (std::size_t i = 0; i < folder.bytes.size(); ++i)
        w.write(folder.bytes[i], folder.labels[i], fs::relative(folder.paths[i], root).string());
      w.close();
    }
    const auto packed_bytes = static_cast<double>(fs::file_size(packed_path));
    auto packed_epoch = std::make_shared<std::atomic<std::int64_t>>(0);
    auto from_packed = make_pipeline(nitro::data::PackedImages(packed_path), n, a.workers, packed_epoch);
    double checksum_packed = 0;
    std::int64_t pe = 0;
    (void)epoch_of(from_packed, *packed_epoch, pe++, checksum_packed);  // warm-up: the page cache, the chunk checksums
    std::vector<double> packed_rate, folder_rate;
    // The same epochs (so the same crops) on both sides, alternating which goes first.
    const std::int64_t first = std::max(epoch, pe);
    for (int r = 0; r < R; ++r) {
      const std::int64_t e = first + r;
      for (int order = 0; order < 2; ++order) {
        if ((r + order) % 2 == 0) {
          const auto [samples, s] = epoch_of(from_packed, *packed_epoch, e, checksum_packed);
          packed_rate.push_back(static_cast<double>(samples) / s);
        } else {
          const auto [samples, s] = epoch_of(from_folder, *folder_epoch, e, checksum_folder);
          folder_rate.push_back(static_cast<double>(samples) / s);
        }
      }
    }
    pr = nitro::bench::median(packed_rate), fo = nitro::bench::median(folder_rate);
    std::printf("the same pipeline, %zu workers, both from the page cache                                 samples/s\n", a.workers);
    std::printf("from the folder (%lld files)                                                        %9.1f\n",
                static_cast<long long>(a.images), fo);
    std::printf("from a packed file (data::PackedImages, %.1f MB)                                     %9.1f\n\n", packed_bytes / 1e6, pr);
  }
#else
  std::printf("packed file: nitro/data/packed.hpp is not there; packed_vs_folder is skipped\n\n");
#endif

  // ---- the summary ---------------------------------------------------------------------------------
  std::printf("%-58s %12s %12s %8s\n", "summary (medians)", "nitro", "baseline", "ratio");
  if (pillow_ok) std::printf("%-58s %12.1f %12.1f %8.3f\n", "decode, images/s (baseline: Pillow)", nd, pd, nd / pd);
  if (a.want("draft"))
    std::printf("%-58s %12.1f %12.1f %8.3f\n", "draft decode + resize, images/s (baseline: full decode)", dr, fr, dr / fr);
  if (loader_ok)
    std::printf("%-58s %12.1f %12.1f %8.3f\n", "pipeline, samples/s (baseline: DataLoader + torchvision)", nl, tl, nl / tl);
  if (dali_ok) std::printf("%-58s %12.1f %12.1f %8.3f\n", "pipeline, samples/s (baseline: DALI, CPU)", nd2, dl, nd2 / dl);
#if BENCH_IMAGES_PACKED
  if (a.want("packed"))
    std::printf("%-58s %12.1f %12.1f %8.3f\n", "pipeline, samples/s: packed file (baseline: the folder)", pr, fo, pr / fo);
#endif
  if (a.want("draft"))
    std::printf("info: draft decoding on 2000x1500 files (1/%d) + resize against full decode + resize: %.3f\n", big_scale,
                big_draft_rate / big_full_rate);
  if (a.want("draft"))
    std::printf("info: min_height = min_width = 224 (1/%d scale at %lldx%lld) + resize against full decode + resize: %.3f\n",
              literal_scale, static_cast<long long>(kWidth), static_cast<long long>(kHeight), lr / fr);
  std::printf("info: the Nitro pipeline delivered every sample of every epoch (labels summed: %.0f)\n", checksum_folder);
  std::printf("info: %.1f s, load average %s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(), load_average().c_str());
  std::fflush(stdout);

  if (pillow_ok) nitro::bench::result("decode_vs_pillow", nd / pd, ">=", 1.0);
  else if (a.want("decode")) std::printf("decode_vs_pillow: skipped (no Pillow in %s)\n", py.exe.c_str());
  if (a.want("draft")) nitro::bench::result("draft_decode_speedup", dr / fr, ">=", 2.0);
  if (loader_ok) nitro::bench::result("image_folder_vs_dataloader", nl / tl, ">=", 2.0);
  else if (a.want("loader")) std::printf("image_folder_vs_dataloader: skipped (no torchvision or Pillow in %s)\n", py.exe.c_str());
  if (dali_ok) nitro::bench::result("images_vs_dali_cpu", nd2 / dl, ">=", 1.3);
  else if (a.want("dali"))
    std::printf("images_vs_dali_cpu: skipped (no working nvidia.dali in %s, or its run failed: above)\n", dali.py.exe.c_str());
#if BENCH_IMAGES_PACKED
  if (a.want("packed")) nitro::bench::result("packed_vs_folder", pr / fo, ">=", 1.0);
#endif
#if BENCH_IMAGES_NVJPEG
  {
    // nvJPEG on the GPU (bench/images_nvjpeg.inc prints its own table and RESULT line): the first 64 files.
    std::printf("\n");
    std::vector<std::vector<std::uint8_t>> jpegs(folder.bytes.begin(), folder.bytes.begin() + 64);
    bench_nvjpeg(jpegs);
  }
#endif
  (void)pixels;
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_images: %s\n", e.what());
  return 1;
}
