// nitro::image's nvJPEG path (data/nvjpeg.hpp): how the library is looked for and the reasons given when
// it is not there, the CPU fallback of decode_on (image::decode's pixels exactly), and, on a GPU, nvJPEG's
// batch decode against libjpeg-turbo's, errors naming the file, and the stream the work is queued on.
//
// The tolerance against libjpeg-turbo. nvJPEG's pixels are not libjpeg-turbo's accurate-IDCT, fancy-
// upsampled ones (Pillow's): it has its own IDCT and, unless it honours the interpolation flag, it
// upsamples chroma by repetition. libjpeg-turbo's own fast mode (TJFLAG_FASTDCT | TJFLAG_FASTUPSAMPLE:
// another IDCT, coarser than nvJPEG's, and repetition upsampling) is such a decoder; on the images below
// it stays within max_diff and mean_diff of the accurate decode (the "basis" case checks that on every
// machine), and nvJPEG is held to the same bounds. The mean bound is torchvision's for its nvJPEG decode
// of photographs (test_decode_jpeg_cuda: mean absolute difference < 2).
//
// Errors are provoked on threads of their own: after TurboJPEG (2.1.5) refuses a header, the next header
// read on the same thread's instance (image.hpp keeps one per thread) reports 0x0 pixels once.
#include "testing.hpp"
#include "image/image_testing.hpp"

#include <nitro/data/nvjpeg.hpp>

#include <link.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#if NITRO_WITH_CUDA
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace nitro_test_image_nvjpeg {  // one namespace per file: an area is compiled as one translation unit

namespace img = nitro::image;
using Bytes = std::vector<std::uint8_t>;
using Spans = std::vector<std::span<const std::uint8_t>>;

namespace {

constexpr double max_diff = 12.0;  // any one sample, 0..255 (libjpeg-turbo's fast decode: up to 9 here)
constexpr double mean_diff = 2.0;  // over all samples of an image (fast decode: 1.1 to 1.6; torchvision: < 2)

using nitro::test::error_of;
using nitro::test::has;

/// A [3, h, w] uint8 image: smooth colour waves (which chroma subsampling and its upsampling see) and a
/// fixed pseudo-random texture of +-12 (which the IDCTs see).
at::Tensor picture(std::int64_t h, std::int64_t w, int seed) {
  auto t = torch::empty({3, h, w}, torch::kByte);
  auto a = t.accessor<std::uint8_t, 3>();
  std::uint32_t r = 2463534242u + static_cast<std::uint32_t>(seed);
  for (std::int64_t y = 0; y < h; ++y)
    for (std::int64_t x = 0; x < w; ++x) {
      r ^= r << 13, r ^= r >> 17, r ^= r << 5;
      const double noise = static_cast<double>(r % 25) - 12.0;
      const double v[3] = {128 + 90 * std::sin(x / 23.0 + y / 31.0 + seed), 128 + 90 * std::cos(x / 17.0 - y / 29.0),
                           255.0 * (x + y) / static_cast<double>(w + h)};
      for (int c = 0; c < 3; ++c) a[c][y][x] = static_cast<std::uint8_t>(std::clamp(v[c] + noise, 0.0, 255.0));
    }
  return t;
}

/// A progressive 4:2:0 JPEG of a [3, h, w] image, from a TurboJPEG instance of its own: libjpeg-turbo
/// 2.1.5 (Debian 12's) writes a corrupt file when an instance that compressed a progressive image then
/// compresses a baseline one, which image::encode_jpeg's per-thread instance would do in the next call.
Bytes progressive_jpeg(const at::Tensor& chw) {
  const auto hwc = chw.permute({1, 2, 0}).contiguous();
  tjhandle h = tjInitCompress();
  REQUIRE(h != nullptr);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(h, hwc.data_ptr<std::uint8_t>(), static_cast<int>(hwc.size(1)), 0,
                             static_cast<int>(hwc.size(0)), TJPF_RGB, &buf, &size, TJSAMP_420, 90,
                             TJFLAG_ACCURATEDCT | TJFLAG_PROGRESSIVE);
  Bytes out;
  if (rc == 0) out.assign(buf, buf + size);
  tjFree(buf);
  tjDestroy(h);
  REQUIRE(rc == 0);
  return out;
}

/// The test files: 4:2:0 at the benchmark's size and at odd sizes, 4:4:4, 4:2:2, grey, progressive.
std::vector<Bytes> test_files() {
  using S = img::Subsampling;
  std::vector<Bytes> f;
  f.push_back(img::encode_jpeg(picture(375, 500, 0), {.quality = 90, .subsampling = S::s420}));
  f.push_back(img::encode_jpeg(picture(61, 97, 1), {.quality = 85, .subsampling = S::s420}));
  f.push_back(img::encode_jpeg(picture(48, 64, 2), {.quality = 95, .subsampling = S::s444}));
  f.push_back(img::encode_jpeg(picture(150, 201, 3), {.quality = 90, .subsampling = S::s422}));
  f.push_back(img::encode_jpeg(picture(17, 33, 4).narrow(0, 1, 1), {.quality = 90}));  // grey
  f.push_back(progressive_jpeg(picture(80, 120, 5)));
  f.push_back(img::encode_jpeg(picture(333, 250, 6), {.quality = 75, .subsampling = S::s420}));
  return f;
}

Spans spans_of(const std::vector<Bytes>& files) { return Spans(files.begin(), files.end()); }

struct Diff {
  double max = 0, mean = 0;
};
Diff diff(const at::Tensor& a, const at::Tensor& b) {
  const auto d = (a.cpu().to(torch::kInt) - b.cpu().to(torch::kInt)).abs().to(torch::kDouble);
  return {d.max().item<double>(), d.mean().item<double>()};
}

/// The path of a shared library loaded in this process whose file name starts with `prefix`.
std::string loaded(const std::string& prefix) {
  struct Find {
    std::string prefix, path;
  } find{prefix, {}};
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* p) {
        auto* f = static_cast<Find*>(p);
        const std::string name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        if (std::filesystem::path(name).filename().string().starts_with(f->prefix)) {
          f->path = name;
          return 1;
        }
        return 0;
      },
      &find);
  return find.path;
}

}  // namespace

TEST_CASE("nvjpeg: NITRO_NVJPEG naming a missing file is the reason given, and nothing else is tried") {
  // The candidates (one of which may load, e.g. torchvision's copy) are not tried.
  const auto f = img::detail::locate_nvjpeg("/nonexistent/dir/libnvjpeg.so.13", img::detail::nvjpeg_candidates());
  REQUIRE(f.library != nullptr);
  CHECK_FALSE(f.library->ok());
  CHECK(has(f.reason, "NITRO_NVJPEG=/nonexistent/dir/libnvjpeg.so.13"));
  CHECK(has(f.reason, "No such file"));
  CHECK(has(f.reason, "or unset it"));
  // An empty value is as unset: the search runs.
  const auto g = img::detail::locate_nvjpeg("", {"/nonexistent/a/libnvjpeg.so.13"});
  CHECK(has(g.reason, "nvJPEG not found"));
  CHECK_FALSE(has(g.reason, "NITRO_NVJPEG="));
}

TEST_CASE("nvjpeg: a library without nvJPEG's entry points is refused, naming what it lacks") {
  const auto turbo = loaded("libturbojpeg.so");
  REQUIRE_FALSE(turbo.empty());  // test_image links TurboJPEG
  const auto f = img::detail::locate_nvjpeg(turbo.c_str(), {});
  CHECK_FALSE(f.library->ok());
  CHECK(has(f.reason, "is not a usable nvJPEG: it lacks nvjpegGetProperty, nvjpegCreateEx"));
  CHECK(has(f.reason, "nvjpegDecodeBatched"));
  // In a search, a file that is there but unusable is named with why; files not there are not.
  const auto g = img::detail::locate_nvjpeg(nullptr, {"/nonexistent/a/libnvjpeg.so.13", turbo});
  CHECK((g.library == nullptr || !g.library->ok()));
  CHECK(has(g.reason, "nvJPEG not found"));
  CHECK(has(g.reason, turbo + " is not a usable nvJPEG"));
  CHECK_FALSE(has(g.reason, "/nonexistent/a"));
  CHECK(has(g.reason, "set NITRO_NVJPEG to its path"));
}

TEST_CASE("nvjpeg: the search takes the first candidate with every entry point") {
  // Where an nvJPEG is installed (a CUDA toolkit's, a wheel's, torchvision's copy), every symbol
  // NvJpegLibrary needs resolves in it: dlopen and dlsym need no GPU.
  const auto candidates = img::detail::nvjpeg_candidates();
  const auto f = img::detail::locate_nvjpeg(nullptr, candidates);
  if (f.library == nullptr || !f.library->ok()) {
    MESSAGE("no nvJPEG on this machine (" << f.reason << "); the search's success is not checked here");
    CHECK(has(f.reason, "nvJPEG not found"));
    CHECK_FALSE(has(f.reason, "is not a usable nvJPEG"));  // one is there, but lacks what NvJpegLibrary asks for
    return;
  }
  CHECK(f.reason.empty());
  CHECK(f.library->status().empty());
  CHECK((f.library->version().starts_with("12.") || f.library->version().starts_with("13.")));
  MESSAGE("nvJPEG found: " << f.library->path() << " version " << f.library->version());
  // A failing candidate before it does not stop the search.
  const auto g = img::detail::locate_nvjpeg(nullptr, {"/nonexistent/libnvjpeg.so.13", loaded("libturbojpeg.so"),
                                                      f.library->path()});
  REQUIRE(g.library != nullptr);
  CHECK(g.library->ok());
  CHECK(g.library->path() == f.library->path());
  // NITRO_NVJPEG naming it works too.
  CHECK(img::detail::locate_nvjpeg(f.library->path().c_str(), {}).library->ok());
}

TEST_CASE("nvjpeg: a file not ending with an EOI marker (truncated) is left to libjpeg-turbo") {
  auto jpeg = img::encode_jpeg(picture(40, 60, 7));
  CHECK(img::detail::ends_with_eoi(jpeg));
  Bytes cut(jpeg.begin(), jpeg.begin() + static_cast<std::ptrdiff_t>(jpeg.size() / 2));
  CHECK_FALSE(img::detail::ends_with_eoi(cut));
  Bytes padded = jpeg;
  padded.insert(padded.end(), 64, 0);
  CHECK(img::detail::ends_with_eoi(padded));
  padded.insert(padded.end(), 1, 0);  // 65 bytes after it: no longer taken for padding
  CHECK_FALSE(img::detail::ends_with_eoi(padded));
  CHECK_FALSE(img::detail::ends_with_eoi(Bytes{}));
  CHECK_FALSE(img::detail::ends_with_eoi(Bytes{0xD9}));
  CHECK(img::detail::ends_with_eoi(Bytes{0xFF, 0xD9}));
}

TEST_CASE("nvjpeg: decode_on the CPU is image::decode exactly, and names a bad file") {
  const auto files = test_files();
  const auto out = img::decode_on(torch::kCPU, spans_of(files));
  REQUIRE(out.size() == files.size());
  for (std::size_t k = 0; k < files.size(); ++k) {
    CHECK(out[k].device() == torch::Device(torch::kCPU));
    CHECK(torch::equal(out[k], img::decode(files[k])));
  }
  auto bad = files;
  bad[2] = Bytes(bad[2].begin(), bad[2].begin() + 200);
  std::string e;
  std::thread([&] { e = error_of([&] { (void)img::decode_on(torch::kCPU, spans_of(bad)); }); }).join();
  CHECK(has(e, "jpegs[2]"));
  CHECK(has(e, "JPEG"));
  CHECK(img::decode_on(torch::kCPU, {}).empty());
}

TEST_CASE("nvjpeg: without a GPU NvJpeg is unavailable, says why, and decode_on refuses a CUDA device") {
  if (nitro::test::gpu_count() > 0) {
    MESSAGE("a GPU is present: the no-GPU behaviour is not checked here");
    return;
  }
  CHECK_FALSE(img::NvJpeg::available());
  const auto reason = img::NvJpeg::unavailable_reason();
  CHECK((has(reason, "no CUDA device") || has(reason, "nvJPEG not found") || has(reason, "NITRO_NVJPEG=") ||
         has(reason, "without CUDA")));
#if NITRO_WITH_CUDA
  CHECK(has(error_of([] { img::NvJpeg gpu; }), reason));
  const auto files = test_files();
  CHECK(has(error_of([&] { (void)img::decode_on(torch::kCUDA, spans_of(files)); }), "sees no CUDA device"));
#endif
  CHECK(has(error_of([] { (void)img::decode_on(torch::Device(torch::kMeta), {}); }), "give a CPU or CUDA device"));
}

TEST_CASE("nvjpeg: the tolerance's basis: libjpeg-turbo's fast decode is within it of the accurate one") {
  // See the top of this file. The 4:2:0 and 4:2:2 files are where repetition and fancy upsampling differ.
  const auto files = test_files();
  for (const auto& f : files) {
    const auto accurate = img::decode(f);
    const auto fast = img::decode(f, {.fast = true});
    const auto d = diff(fast, accurate);
    INFO("max ", d.max, " mean ", d.mean, " shape ", accurate.sizes());
    CHECK(d.max <= max_diff);
    CHECK(d.mean <= mean_diff);
  }
}

#if NITRO_WITH_CUDA

TEST_CASE("gpu: nvjpeg decodes a mixed batch as libjpeg-turbo does, within the tolerance" * nitro::test::needs_gpu()) {
  REQUIRE_MESSAGE(img::NvJpeg::available(), img::NvJpeg::unavailable_reason());
  img::NvJpeg gpu;
  MESSAGE("nvJPEG " << img::NvJpeg::library() << (gpu.hardware() ? ", hardware decoder" : ", CUDA kernels")
                    << ", flags " << gpu.flags());
  const auto files = test_files();
  for (int round = 0; round < 2; ++round) {  // the second reuses the batch state
    const auto out = gpu.decode(spans_of(files));
    c10::cuda::getCurrentCUDAStream().synchronize();
    REQUIRE(out.size() == files.size());
    for (std::size_t k = 0; k < files.size(); ++k) {
      const auto cpu = img::decode(files[k]);
      CHECK(out[k].is_cuda());
      CHECK(out[k].scalar_type() == torch::kByte);
      REQUIRE(out[k].sizes() == cpu.sizes());
      const auto d = diff(out[k], cpu);
      INFO("file ", k, " ", cpu.sizes(), ": max ", d.max, " mean ", d.mean);
      if (round == 0) MESSAGE("file " << k << " " << cpu.sizes() << ": max diff " << d.max << ", mean " << d.mean);
      CHECK(d.max <= max_diff);
      CHECK(d.mean <= mean_diff);
    }
  }
  // A batch of one, and an empty one.
  CHECK(gpu.decode(Spans{files[0]})[0].sizes() == img::decode(files[0]).sizes());
  CHECK(gpu.decode({}).empty());
  // decode_on takes the same path.
  const auto on = img::decode_on(torch::kCUDA, spans_of(files));
  for (std::size_t k = 0; k < files.size(); ++k) CHECK(diff(on[k], img::decode(files[k])).mean <= mean_diff);
}

TEST_CASE("gpu: nvjpeg: a corrupt file in a batch is a nitro::Error naming it, and the decoder goes on" * nitro::test::needs_gpu()) {
  REQUIRE_MESSAGE(img::NvJpeg::available(), img::NvJpeg::unavailable_reason());
  img::NvJpeg gpu;
  auto files = test_files();
  const auto good = files;
  const auto error_in_thread = [&](const std::vector<Bytes>& batch) {
    std::string e;
    std::thread([&] { e = error_of([&] { (void)gpu.decode(spans_of(batch)); }); }).join();
    return e;
  };
  files[3] = Bytes(files[3].begin(), files[3].begin() + static_cast<std::ptrdiff_t>(files[3].size() / 2));  // truncated
  auto e = error_in_thread(files);
  CHECK(has(e, "jpegs[3]"));
  CHECK(has(e, "truncated or corrupt JPEG data"));
  files = good;
  files[1] = Bytes(files[1].size(), 0x5A);  // not a JPEG at all
  e = error_in_thread(files);
  CHECK(has(e, "jpegs[1]"));
  CHECK(has(e, "not a JPEG or PNG"));
  files = good;
  files[5].resize(200);  // the header cut short
  CHECK(has(error_in_thread(files), "jpegs[5]"));
  // The same decoder decodes the good batch afterwards.
  const auto out = gpu.decode(spans_of(good));
  c10::cuda::getCurrentCUDAStream().synchronize();
  for (std::size_t k = 0; k < good.size(); ++k) CHECK(diff(out[k], img::decode(good[k])).mean <= mean_diff);
}

TEST_CASE("gpu: nvjpeg decode is queued on the stream given, the outputs ready when it is" * nitro::test::needs_gpu()) {
  REQUIRE_MESSAGE(img::NvJpeg::available(), img::NvJpeg::unavailable_reason());
  img::NvJpeg gpu;
  const auto files = test_files();
  (void)gpu.decode(spans_of(files));  // warm-up: buffers allocated
  c10::cuda::device_synchronize();
  const auto side = c10::cuda::getStreamFromPool();
  // The current stream is kept busy (~0.5 s): work queued there would not be done when `side` is.
  at::cuda::sleep(1'000'000'000);
  const auto out = gpu.decode(spans_of(files), side);
  side.synchronize();
  MESSAGE("the current stream was " << (c10::cuda::getCurrentCUDAStream().query() ? "idle" : "still busy")
                                    << " when the side stream's decode was done");
  // Read the outputs on `side` (not behind the sleeping current stream).
  const c10::cuda::CUDAStreamGuard on_side(side);
  for (std::size_t k = 0; k < files.size(); ++k) {
    const auto d = diff(out[k], img::decode(files[k]));
    INFO("file ", k, ": max ", d.max, " mean ", d.mean);
    CHECK(d.mean <= mean_diff);
  }
  c10::cuda::device_synchronize();
  // A stream of another device is refused.
  if (c10::cuda::device_count() > 1) {
    CHECK(has(error_of([&] { (void)gpu.decode(spans_of(files), c10::cuda::getStreamFromPool(false, 1)); }),
              "the stream is on cuda:1"));
  }
}

#endif

}  // namespace nitro_test_image_nvjpeg
