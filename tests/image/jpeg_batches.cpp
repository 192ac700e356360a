// data/jpeg_batches.hpp: JpegBatches (encoded bytes, labels and keys from a packed file or a folder) and
// DecodeAugment (decode, random resized crop, flip, normalise), on the CPU against an independent
// reference, through a Prefetcher with an exact resume, its errors; on a GPU, nvJPEG's batches against
// the CPU's.
//
// The reference: each file decoded by image::decode, made float in [0, 1] (augment::ToFloat), then
// augment::Compose<RandomResizedCrop, HFlip, Normalize> on that one image with the sample's keys
// (seed, epoch, index). Its crop is a grid_sample over the whole image; DecodeAugment's is
// at::upsample_bilinear2d of the cut-out crop: the same bilinear weights, computed from other float
// expressions of the same coordinates. The tolerance is a float rounding of the coordinates (a few 1e-5
// of a pixel, times the pixel gradient) divided by std: max_float_diff below, on normalised values.
//
// The GPU tolerance: nvJPEG's pixels are not libjpeg-turbo's (its IDCT and chroma upsampling; see
// tests/image/nvjpeg.cpp, which bounds the mean absolute difference of a decode by 2 levels of 255).
// Crop, resize and flip are the same draws on both; the batches are compared in [0, 1] (mean 0, std 1):
// each image's mean absolute difference must stay under 2/255.
#include "testing.hpp"
#include "image/image_testing.hpp"

#include <nitro/data/augment.hpp>
#include <nitro/data/image.hpp>
#include <nitro/data/image_folder.hpp>
#include <nitro/data/jpeg_batches.hpp>
#include <nitro/data/nvjpeg.hpp>
#include <nitro/data/packed.hpp>
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/sampler.hpp>
#include <nitro/data/source.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace nitro_test_image_jpeg_batches {  // one namespace per file: an area is compiled as one translation unit

namespace {

namespace fs = std::filesystem;
namespace img = nitro::image;
namespace data = nitro::data;
namespace aug = nitro::data::augment;
using Bytes = std::vector<std::uint8_t>;
using nitro::test::error_of;
using nitro::test::has;

/// Normalised values: DecodeAugment's CPU batch against the reference (see the top of this file).
constexpr double max_float_diff = 5e-5;  // measured: 1.1e-5
/// [0, 1] values: nvJPEG's batch against libjpeg-turbo's, each image's mean absolute difference.
constexpr double gpu_mean_diff = 2.0 / 255.0;

/// A [3, h, w] uint8 image: smooth colour waves and a fixed pseudo-random texture, so that crops,
/// flips and decoders show.
at::Tensor picture(std::int64_t h, std::int64_t w, int seed) {
  auto t = torch::empty({3, h, w}, torch::kByte);
  auto a = t.accessor<std::uint8_t, 3>();
  std::uint32_t r = 2463534242u + static_cast<std::uint32_t>(seed);
  for (std::int64_t y = 0; y < h; ++y)
    for (std::int64_t x = 0; x < w; ++x) {
      r ^= r << 13, r ^= r >> 17, r ^= r << 5;
      const double noise = static_cast<double>(r % 17) - 8.0;
      const double v[3] = {128 + 90 * std::sin(static_cast<double>(x) / 19.0 + static_cast<double>(y) / 27.0 + seed),
                           128 + 90 * std::cos(static_cast<double>(x) / 13.0 - static_cast<double>(y) / 23.0),
                           255.0 * static_cast<double>(x + 2 * y) / static_cast<double>(w + 2 * h)};
      for (int c = 0; c < 3; ++c) a[c][y][x] = static_cast<std::uint8_t>(std::clamp(v[c] + noise, 0.0, 255.0));
    }
  return t;
}

/// The test files: sizes from 500x375 down to 33x21, 4:2:0, 4:4:4, 4:2:2 and grey; labels k % 3.
std::vector<Bytes> test_files() {
  using S = img::Subsampling;
  std::vector<Bytes> f;
  f.push_back(img::encode_jpeg(picture(375, 500, 0), {.quality = 90, .subsampling = S::s420}));
  f.push_back(img::encode_jpeg(picture(61, 97, 1), {.quality = 85, .subsampling = S::s420}));
  f.push_back(img::encode_jpeg(picture(48, 64, 2), {.quality = 95, .subsampling = S::s444}));
  f.push_back(img::encode_jpeg(picture(150, 201, 3), {.quality = 90, .subsampling = S::s422}));
  f.push_back(img::encode_jpeg(picture(40, 33, 4).narrow(0, 1, 1), {.quality = 90}));  // grey
  f.push_back(img::encode_jpeg(picture(333, 250, 6), {.quality = 75, .subsampling = S::s420}));
  f.push_back(img::encode_jpeg(picture(21, 33, 7), {.quality = 90, .subsampling = S::s420}));
  f.push_back(img::encode_jpeg(picture(120, 90, 8), {.quality = 90, .subsampling = S::s420}));
  f.push_back(img::encode_jpeg(picture(64, 64, 9), {.quality = 90, .subsampling = S::s420}));
  f.push_back(img::encode_jpeg(picture(200, 300, 10), {.quality = 90, .subsampling = S::s420}));
  f.push_back(img::encode_jpeg(picture(77, 51, 11), {.quality = 90, .subsampling = S::s444}));
  return f;
}
std::int64_t label_of(std::size_t k) { return static_cast<std::int64_t>(k % 3); }

/// The same files as a packed file (record k named f<100 + k>.jpg) and as an ImageFolder (file k as
/// c<label>/f<100 + k>.jpg, so the folder lists them class by class): folder_order says which file is
/// the folder's sample j.
struct Data {
  nitro::test::TempDir dir{"nitro-jpeg-batches", /*create=*/true};
  std::vector<Bytes> files = test_files();
  fs::path packed = dir / "images.npak";
  fs::path folder = dir / "folder";
  /// folder_order[j]: the test file that is the folder's sample j.
  std::vector<std::size_t> folder_order;

  explicit Data(const std::vector<Bytes>* replace = nullptr) {
    if (replace != nullptr) files = *replace;
    data::PackedWriter w(packed, {.fsync = false});
    for (std::size_t k = 0; k < files.size(); ++k) w.write(files[k], label_of(k), "f" + std::to_string(100 + k) + ".jpg");
    w.close();
    for (std::int64_t c = 0; c < 3; ++c)
      for (std::size_t k = 0; k < files.size(); ++k) {
        if (label_of(k) != c) continue;
        const auto path = folder / ("c" + std::to_string(c)) / ("f" + std::to_string(100 + k) + ".jpg");
        fs::create_directories(path.parent_path());
        std::ofstream out(path, std::ios::binary);
        out.write(reinterpret_cast<const char*>(files[k].data()), static_cast<std::streamsize>(files[k].size()));
        REQUIRE(out.good());
        folder_order.push_back(k);
      }
  }
};

/// The reference batch of samples `indices` of `files` (see the top of this file).
at::Tensor reference(const std::vector<Bytes>& files, const std::vector<std::size_t>& indices, std::uint64_t seed,
                     std::int64_t epoch, const data::DecodeAugmentOptions& o) {
  const aug::Compose<aug::RandomResizedCrop, aug::HFlip, aug::Normalize> stages(
      aug::RandomResizedCrop{.height = o.height, .width = o.width, .scale_min = o.scale_min, .scale_max = o.scale_max,
                             .ratio_min = o.ratio_min, .ratio_max = o.ratio_max},
      aug::HFlip{.p = o.flip}, aug::Normalize{.mean = o.mean, .std = o.std});
  std::vector<at::Tensor> out;
  for (const auto i : indices) {
    const auto x = img::decode(files[i]).to(at::kFloat).div_(255.0).unsqueeze(0);
    const auto key = at::tensor({static_cast<std::int64_t>(i)}, at::kLong);
    out.push_back(stages(x, {.seed = seed, .epoch = epoch, .index = key}));
  }
  return at::cat(out);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.cpu().to(at::kDouble) - b.cpu().to(at::kDouble)).abs().max().item<double>();
}

std::vector<std::size_t> iota(std::size_t n) {
  std::vector<std::size_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

bool same(const data::JpegBatch& a, const data::JpegBatch& b) {
  return torch::equal(a.data.cpu(), b.data.cpu()) && torch::equal(a.target.cpu(), b.target.cpu()) &&
         torch::equal(a.index.cpu(), b.index.cpu());
}

const data::DecodeAugmentOptions small{.height = 24, .width = 32, .scale_min = 0.2, .scale_max = 1.0};

}  // namespace

TEST_CASE("JpegBatches: the encoded bytes, labels and indices of a packed file (views) and of a folder (read), nothing decoded") {
  const Data d;
  data::JpegBatches packed(data::PackedImages(d.packed), {.seed = 5});
  CHECK(packed.size() == d.files.size());
  packed.set_epoch(3);
  const auto copy = packed;  // copies share the epoch
  packed.set_epoch(4);
  CHECK(copy.epoch() == 4);
  auto b = packed.get_batch({4, 0, 9});
  CHECK_FALSE(b.data.defined());
  CHECK(b.target.scalar_type() == at::kLong);
  CHECK(b.target.device().is_cpu());
  CHECK(std::vector<std::int64_t>(b.target.data_ptr<std::int64_t>(), b.target.data_ptr<std::int64_t>() + 3) ==
        std::vector<std::int64_t>{label_of(4), label_of(0), label_of(9)});
  CHECK(std::vector<std::int64_t>(b.index.data_ptr<std::int64_t>(), b.index.data_ptr<std::int64_t>() + 3) ==
        std::vector<std::int64_t>{4, 0, 9});
  REQUIRE(b.encoded != nullptr);
  CHECK(b.encoded->seed == 5);
  CHECK(b.encoded->epoch == 4);
  CHECK(b.encoded->index == std::vector<std::int64_t>{4, 0, 9});
  CHECK(b.encoded->owned.empty());  // the packed file's bytes are viewed, not copied
  for (std::size_t k = 0; k < 3; ++k) {
    const auto i = static_cast<std::size_t>(b.encoded->index[k]);
    CHECK(Bytes(b.encoded->files[k].begin(), b.encoded->files[k].end()) == d.files[i]);
  }
  CHECK(b.encoded->name(9) == "f109.jpg");

  data::JpegBatches folder{data::ImageFolder(d.folder)};
  auto f = folder.get_batch({0, 1});
  CHECK(f.encoded->owned.size() == 2);  // files read for the batch
  CHECK(Bytes(f.encoded->files[1].begin(), f.encoded->files[1].end()) == d.files[d.folder_order[1]]);
  CHECK(has(f.encoded->name(1), "f" + std::to_string(100 + d.folder_order[1]) + ".jpg"));
  CHECK(f.target[1].item<std::int64_t>() == label_of(d.folder_order[1]));

  // The views outlive the data set (the batch holds the file).
  data::JpegBatch kept;
  {
    data::JpegBatches gone(data::PackedImages(d.packed));
    kept = gone.get_batch({2});
  }
  CHECK(Bytes(kept.encoded->files[0].begin(), kept.encoded->files[0].end()) == d.files[2]);
}

TEST_CASE("DecodeAugment's crop box and flip are augment::RandomResizedCrop's and augment::HFlip's draws (stages 0 and 1)") {
  const data::DecodeAugment stage({.height = 20, .width = 30, .scale_min = 0.1, .scale_max = 0.9, .ratio_min = 0.5,
                                   .ratio_max = 2.0, .flip = 0.3});
  const aug::RandomResizedCrop rrc{.height = 20, .width = 30, .scale_min = 0.1, .scale_max = 0.9, .ratio_min = 0.5,
                                   .ratio_max = 2.0};
  const aug::HFlip flip{.p = 0.3};
  std::vector<std::int64_t> idx;
  for (std::int64_t i = 0; i < 200; ++i) idx.push_back(i * 7919 % 100003);
  const aug::Keys keys{.seed = 11, .epoch = 2, .index = at::tensor(idx, at::kLong)};
  int flips = 0;
  for (const auto& [h, w] : std::vector<std::pair<std::int64_t, std::int64_t>>{{375, 500}, {21, 33}, {300, 40}, {1, 1}}) {
    const auto boxes = rrc.crops(keys, static_cast<std::int64_t>(idx.size()), h, w, data::DecodeAugment::crop_stage);
    for (std::size_t i = 0; i < idx.size(); ++i) CHECK(stage.crop(11, 2, idx[i], h, w) == boxes[i]);
  }
  const auto f = flip.flips(keys, static_cast<std::int64_t>(idx.size()), data::DecodeAugment::flip_stage);
  for (std::size_t i = 0; i < idx.size(); ++i) {
    CHECK(stage.flipped(11, 2, idx[i]) == (f[i] == 1));
    flips += f[i];
  }
  CHECK(flips > 30);  // about 60 of 200
  CHECK(flips < 100);
  // Another epoch or seed draws anew.
  CHECK(stage.crop(11, 3, idx[0], 375, 500) != stage.crop(11, 2, idx[0], 375, 500));
  CHECK(stage.crop(12, 2, idx[0], 375, 500) != stage.crop(11, 2, idx[0], 375, 500));
}

TEST_CASE("DecodeAugment on the CPU equals augment's Compose<RandomResizedCrop, HFlip, Normalize> of each decoded file") {
  const Data d;
  for (const std::int64_t epoch : {0, 1}) {
    CAPTURE(epoch);
    data::JpegBatches packed(data::PackedImages(d.packed), {.seed = 9});
    packed.set_epoch(epoch);
    const std::vector<std::size_t> order = {3, 0, 7, 10, 4, 1, 2, 9, 5, 6, 8};
    const data::DecodeAugment stage(small);
    const auto b = stage(packed.get_batch(order));
    REQUIRE(b.data.defined());
    CHECK(b.encoded == nullptr);  // dropped once decoded
    CHECK(b.data.sizes() == c10::IntArrayRef({11, 3, 24, 32}));
    CHECK(b.data.scalar_type() == at::kFloat);
    CHECK(b.data.is_contiguous());
    const auto ref = reference(d.files, order, 9, epoch, small);
    const double diff = max_diff(b.data, ref);
    MESSAGE("epoch " << epoch << ": max |DecodeAugment - reference| = " << diff << " (normalised values)");
    CHECK(diff <= max_float_diff);
    // The flips are there: some samples flipped, some not (else the comparison would not show them).
    int flipped = 0;
    for (const auto i : order) flipped += stage.flipped(9, epoch, static_cast<std::int64_t>(i)) ? 1 : 0;
    CHECK(flipped > 0);
    CHECK(flipped < 11);
    // A mirrored sample differs from its unmirrored self: the flip is applied, not just drawn.
    const auto unflipped = data::DecodeAugment({.height = 24, .width = 32, .scale_min = 0.2, .flip = 0.0})(
        packed.get_batch(order));
    for (std::size_t k = 0; k < order.size(); ++k) {
      const bool f = stage.flipped(9, epoch, static_cast<std::int64_t>(order[k]));
      const auto kk = static_cast<std::int64_t>(k);
      CHECK(torch::equal(b.data[kk], f ? unflipped.data[kk].flip({2}) : unflipped.data[kk]));
    }
    // The folder's samples are the same files: the same images for the same keys (indices mapped).
    data::JpegBatches folder(data::ImageFolder(d.folder), {.seed = 9});
    folder.set_epoch(epoch);
    const auto fb = stage(folder.get_batch(iota(d.files.size())));
    const auto fref = reference(
        [&] {
          std::vector<Bytes> in_folder_order;
          for (const auto k : d.folder_order) in_folder_order.push_back(d.files[k]);
          return in_folder_order;
        }(),
        iota(d.files.size()), 9, epoch, small);
    CHECK(max_diff(fb.data, fref) <= max_float_diff);
    for (std::size_t j = 0; j < d.folder_order.size(); ++j)
      CHECK(fb.target[static_cast<std::int64_t>(j)].item<std::int64_t>() == label_of(d.folder_order[j]));
  }
}

TEST_CASE("DecodeAugment: bfloat16 and channels-last are the float32 batch converted, and {0, 0, 0} / {1, 1, 1} gives [0, 1]") {
  const Data d;
  data::JpegBatches packed(data::PackedImages(d.packed), {.seed = 1});
  const auto order = iota(d.files.size());
  const auto f32 = data::DecodeAugment(small)(packed.get_batch(order)).data;
  auto o = small;
  o.dtype = at::kBFloat16;
  o.channels_last = true;
  const auto bf = data::DecodeAugment(o)(packed.get_batch(order)).data;
  CHECK(bf.scalar_type() == at::kBFloat16);
  CHECK(bf.is_contiguous(at::MemoryFormat::ChannelsLast));
  CHECK(torch::equal(bf, f32.to(at::kBFloat16)));
  o.dtype = at::kFloat;
  const auto cl = data::DecodeAugment(o)(packed.get_batch(order)).data;
  CHECK(cl.is_contiguous(at::MemoryFormat::ChannelsLast));
  CHECK(torch::equal(cl, f32));
  auto unit = small;
  unit.mean = {0, 0, 0};
  unit.std = {1, 1, 1};
  const auto u = data::DecodeAugment(unit)(packed.get_batch(order)).data;
  CHECK(u.min().item<float>() >= 0.0f);
  CHECK(u.max().item<float>() <= 1.0f);
  // The normalisation is (x - mean) / std of those: per channel.
  for (std::int64_t c = 0; c < 3; ++c)
    CHECK(max_diff(f32.select(1, c), (u.select(1, c) - small.mean[static_cast<std::size_t>(c)]) /
                                        small.std[static_cast<std::size_t>(c)]) <= 1e-5);
  // An empty batch is an empty tensor of the output's shape.
  CHECK(data::DecodeAugment(small)(packed.get_batch({})).data.sizes() == c10::IntArrayRef({0, 3, 24, 32}));
}

TEST_CASE("JpegBatches through from_dataset and a Prefetcher<Cpu> with 2 workers: two epochs as made directly, and an exact resume") {
  const Data d;
  const std::size_t n = d.files.size(), batch = 3;  // 4 batches an epoch, the last of 2
  const std::uint64_t order_seed = 8;
  using Batches = data::JpegBatches<data::PackedImages>;
  using Source = nitro::DatasetSource<Batches, data::ResumableSampler>;
  using Prefetcher = nitro::Prefetcher<nitro::Cpu, Source>;
  const data::DecodeAugment stage(small);
  const auto options = [&] {
    nitro::PrefetchOptions<data::JpegBatch> o{.depth = 2, .workers = 2};
    o.transform = stage;
    return o;
  };

  // Made directly: epoch e's order in batches, decoded with the epoch set.
  std::vector<std::vector<data::JpegBatch>> expected(2);
  {
    Batches direct(data::PackedImages(d.packed), {.seed = 21});
    for (const std::int64_t e : {0, 1}) {
      direct.set_epoch(e);
      const auto order = data::epoch_order(order_seed, e, n);
      for (std::size_t at = 0; at < n; at += batch)
        expected[static_cast<std::size_t>(e)].push_back(stage(direct.get_batch(
            std::vector<std::size_t>(order.begin() + static_cast<std::ptrdiff_t>(at),
                                     order.begin() + static_cast<std::ptrdiff_t>(std::min(n, at + batch))))));
    }
  }
  REQUIRE(expected[0].size() == 4);
  CHECK_FALSE(torch::equal(expected[0][0].data, expected[1][0].data));
  const auto check_rest = [&](Prefetcher& p, std::int64_t epoch, std::size_t from) {
    std::size_t k = from;
    for (auto& b : p) {
      CAPTURE(epoch);
      CAPTURE(k);
      REQUIRE(k < expected[static_cast<std::size_t>(epoch)].size());
      CHECK(b.encoded == nullptr);
      CHECK(same(b, expected[static_cast<std::size_t>(epoch)][k]));
      ++k;
    }
    CHECK(k == expected[static_cast<std::size_t>(epoch)].size());
  };

  SUBCASE("two epochs, one prefetcher") {
    data::ResumableSampler sampler(n, {.seed = order_seed});
    Prefetcher p{nitro::from_dataset(Batches(data::PackedImages(d.packed), {.seed = 21}), sampler, batch), options()};
    for (const std::int64_t e : {0, 1}) {
      p.set_epoch(e);
      check_rest(p, e, 0);
    }
  }
  SUBCASE("stopped after k batches and resumed in a fresh prefetcher over a fresh data set and file") {
    for (const std::int64_t stop_epoch : {0, 1}) {
      for (const std::size_t k : {std::size_t{1}, std::size_t{3}}) {
        CAPTURE(stop_epoch);
        CAPTURE(k);
        data::ResumableSampler sampler(n, {.seed = order_seed});
        data::SamplerState st;
        {
          Prefetcher p{nitro::from_dataset(Batches(data::PackedImages(d.packed), {.seed = 21}), sampler, batch), options()};
          for (std::int64_t e = 0; e < stop_epoch; ++e) {
            p.set_epoch(e);
            check_rest(p, e, 0);
          }
          p.set_epoch(stop_epoch);
          for (std::size_t j = 0; j < k; ++j) {
            auto b = p.next();
            REQUIRE(b.has_value());
            CHECK(same(*b, expected[static_cast<std::size_t>(stop_epoch)][j]));
          }
          st = sampler.state();
        }  // the batches made ahead are dropped
        CHECK(st.epoch == stop_epoch);
        CHECK(st.index == static_cast<std::int64_t>(k * batch));
        data::ResumableSampler fresh(n);
        fresh.load_state(st);
        Prefetcher q{nitro::from_dataset(Batches(data::PackedImages(d.packed), {.seed = 21}), fresh, batch), options()};
        q.set_epoch(st.epoch);
        check_rest(q, stop_epoch, k);  // bit for bit
        if (stop_epoch == 0) {
          q.set_epoch(1);
          check_rest(q, 1, 0);
        }
      }
    }
  }
}

TEST_CASE("DecodeAugment refuses bad options with a nitro::Error that says what is wrong") {
  const auto error = [](data::DecodeAugmentOptions o) { return error_of([&] { data::DecodeAugment s(o); }); };
  auto o = small;
  CHECK(error(o) == "(no error)");
  o.height = 0;
  CHECK(has(error(o), "height and width must be >= 1"));
  o = small, o.width = -3;
  CHECK(has(error(o), "got 24 x -3"));
  o = small, o.scale_min = 0;
  CHECK(has(error(o), "0 < scale_min <= scale_max <= 1"));
  o = small, o.scale_min = 0.5, o.scale_max = 0.4;
  CHECK(has(error(o), "got [0.5, 0.4]"));
  o = small, o.scale_max = 1.5;
  CHECK(has(error(o), "scale_max <= 1"));
  o = small, o.scale_min = std::nan("");
  CHECK(has(error(o), "scale_min"));
  o = small, o.ratio_min = -1;
  CHECK(has(error(o), "0 < ratio_min <= ratio_max"));
  o = small, o.ratio_min = 2, o.ratio_max = 1;
  CHECK(has(error(o), "ratio_min <= ratio_max"));
  o = small, o.flip = 1.5;
  CHECK(has(error(o), "flip is a probability, in [0, 1]"));
  o = small, o.mean = {0.5};
  CHECK(has(error(o), "one value per channel (3, RGB); got 1 and 3"));
  o = small, o.std = {1, 0, 1};
  CHECK(has(error(o), "std[1] must be finite and > 0"));
  o = small, o.mean = {0, INFINITY, 0};
  CHECK(has(error(o), "mean[1] is not finite"));
  o = small, o.dtype = at::kByte;
  CHECK(has(error(o), "dtype must be float32, bfloat16 or float16"));
  // Batches it cannot take.
  const data::DecodeAugment stage(small);
  CHECK(has(error_of([&] { (void)stage(data::JpegBatch{}); }), "the batch holds no encoded files"));
  const Data d;
  data::JpegBatches packed(data::PackedImages(d.packed));
  auto b = stage(packed.get_batch({0}));
  CHECK(has(error_of([&] { (void)stage(b); }), "give each batch to DecodeAugment once"));
  CHECK(has(error_of([&] { (void)packed.get_batch({0, 11}); }), "index 11 of a data set of 11"));
  CHECK(has(error_of([&] { (void)stage.images(*packed.get_batch({0}).encoded, c10::Device(c10::kMeta)); }),
            "give a CPU or CUDA device"));
  data::EncodedFiles mismatched;
  mismatched.files.resize(2);
  mismatched.index = {0};
  CHECK(has(error_of([&] { (void)stage.images(mismatched, c10::Device(c10::kCPU)); }), "2 files and 1 indices"));
}

TEST_CASE("DecodeAugment: a truncated or corrupt file is a nitro::Error naming its sample, direct or at its batch of a Prefetcher") {
  auto files = test_files();
  files[5] = Bytes(files[5].begin(), files[5].begin() + static_cast<std::ptrdiff_t>(files[5].size() / 2));  // truncated
  files[8] = Bytes(files[8].size(), 0x5A);                                                                    // not a JPEG
  const Data d(&files);
  const data::DecodeAugment stage(small);
  // Errors on threads of their own (TurboJPEG 2.1.5 reports 0x0 once on the thread after a refused header).
  const auto error_in_thread = [](const std::function<void()>& f) {
    std::string e;
    std::thread([&] { e = error_of(f); }).join();
    return e;
  };
  data::JpegBatches packed(data::PackedImages(d.packed));
  auto e = error_in_thread([&] { (void)stage(packed.get_batch({0, 5, 1})); });
  CHECK(has(e, "data::DecodeAugment: "));
  CHECK(has(e, "sample 5 (f105.jpg)"));
  CHECK(has(e, "truncated"));
  e = error_in_thread([&] { (void)stage(packed.get_batch({8})); });
  CHECK(has(e, "sample 8 (f108.jpg)"));
  CHECK(has(e, "not a JPEG or PNG"));
  // A folder's sample is named by its path.
  data::JpegBatches folder{data::ImageFolder(d.folder)};
  const auto j = static_cast<std::size_t>(std::find(d.folder_order.begin(), d.folder_order.end(), 5) - d.folder_order.begin());
  e = error_in_thread([&] { (void)stage(folder.get_batch({j})); });
  CHECK(has(e, "sample " + std::to_string(j) + " (" + (d.folder / "c2" / "f105.jpg").string() + ")"));
  // Through a prefetcher: the batch holding it fails, those before it arrive.
  e = error_in_thread([&] {
    data::ResumableSampler sampler(d.files.size(), {.shuffle = false});
    nitro::PrefetchOptions<data::JpegBatch> o{.depth = 2, .workers = 2};
    o.transform = stage;
    nitro::Prefetcher<nitro::Cpu, nitro::DatasetSource<data::JpegBatches<data::PackedImages>, data::ResumableSampler>> p{
        nitro::from_dataset(data::JpegBatches(data::PackedImages(d.packed)), sampler, 2), o};
    for (int k = 0; k < 2; ++k) REQUIRE(p.next().has_value());  // samples 0..3
    (void)p.next();                                               // samples 4, 5
  });
  CHECK(has(e, "sample 5 (f105.jpg)"));
  CHECK(has(error_of([] { data::JpegBatches<data::PackedImages> none(data::PackedImages([] {
                          nitro::test::TempDir t("nitro-jpeg-empty", true);
                          data::PackedWriter w(t / "e.npak", {.fsync = false});
                          w.close();
                          return data::PackedFile::open(t / "e.npak");
                        }())); }),
            "the source has no sample"));
}

#if NITRO_WITH_CUDA

TEST_CASE("gpu: DecodeAugment with nvJPEG equals the CPU's batch within 2/255, also through Prefetcher<Cuda>, and resumes exactly" * nitro::test::needs_gpu()) {
  REQUIRE_MESSAGE(img::NvJpeg::available(), img::NvJpeg::unavailable_reason());
  const Data d;
  auto unit = small;  // compared in [0, 1]
  unit.mean = {0, 0, 0};
  unit.std = {1, 1, 1};
  unit.height = 96, unit.width = 128;
  const data::DecodeAugment stage(unit);
  data::JpegBatches packed(data::PackedImages(d.packed), {.seed = 3});
  const auto order = iota(d.files.size());
  const auto cpu = stage(packed.get_batch(order)).data;
  const auto gpu = stage(packed.get_batch(order), c10::Device(c10::kCUDA, 0));
  c10::cuda::device_synchronize();
  REQUIRE(gpu.data.is_cuda());
  CHECK(gpu.target.is_cuda());
  CHECK(gpu.data.sizes() == cpu.sizes());
  for (std::size_t k = 0; k < order.size(); ++k) {
    const auto kk = static_cast<std::int64_t>(k);
    const double mean = (gpu.data[kk].cpu() - cpu[kk]).abs().mean().item<double>();
    const double most = (gpu.data[kk].cpu() - cpu[kk]).abs().max().item<double>();
    MESSAGE("sample " << k << ": mean |nvJPEG - CPU| " << mean * 255 << "/255, max " << most * 255 << "/255");
    CHECK(mean < gpu_mean_diff);
  }
  // bf16 and channels-last on the GPU: the float batch converted (the same kernels up to the conversion).
  auto o = unit;
  o.dtype = at::kBFloat16;
  o.channels_last = true;
  const auto bf = data::DecodeAugment(o)(packed.get_batch(order), c10::Device(c10::kCUDA, 0)).data;
  CHECK(bf.scalar_type() == at::kBFloat16);
  CHECK(bf.is_contiguous(at::MemoryFormat::ChannelsLast));
  CHECK(torch::equal(bf, gpu.data.to(at::kBFloat16)));

  // Through Prefetcher<Cuda> (the transform on its copy stream, 4 workers): the same batches as made
  // directly on the GPU, and a resumed run the same later batches, bit for bit.
  const std::size_t n = d.files.size(), batch = 3;
  using Source = nitro::DatasetSource<data::JpegBatches<data::PackedImages>, data::ResumableSampler>;
  nitro::PrefetchOptions<data::JpegBatch> po{.depth = 2, .workers = 4};
  po.transform = stage;
  std::vector<data::JpegBatch> all;
  {
    data::ResumableSampler sampler(n, {.seed = 4});
    nitro::Prefetcher<nitro::Cuda, Source> p{nitro::from_dataset(data::JpegBatches(data::PackedImages(d.packed), {.seed = 3}), sampler, batch), po};
    for (auto& b : p) {
      CHECK(b.data.is_cuda());
      CHECK(b.target.is_cuda());
      all.push_back(b);
    }
  }
  REQUIRE(all.size() == 4);
  const auto order0 = data::epoch_order(4, 0, n);
  for (std::size_t k = 0; k < all.size(); ++k) {
    const std::vector<std::size_t> idx(order0.begin() + static_cast<std::ptrdiff_t>(k * batch),
                                       order0.begin() + static_cast<std::ptrdiff_t>(std::min(n, (k + 1) * batch)));
    CHECK(torch::equal(all[k].data.cpu(), stage(packed.get_batch(idx), c10::Device(c10::kCUDA, 0)).data.cpu()));
  }
  data::ResumableSampler sampler(n, {.seed = 4});
  data::SamplerState st;
  {
    nitro::Prefetcher<nitro::Cuda, Source> p{nitro::from_dataset(data::JpegBatches(data::PackedImages(d.packed), {.seed = 3}), sampler, batch), po};
    REQUIRE(p.next().has_value());
    REQUIRE(p.next().has_value());
    st = sampler.state();
  }
  data::ResumableSampler fresh(n);
  fresh.load_state(st);
  nitro::Prefetcher<nitro::Cuda, Source> q{nitro::from_dataset(data::JpegBatches(data::PackedImages(d.packed), {.seed = 3}), fresh, batch), po};
  std::size_t k = 2;
  for (auto& b : q) {
    REQUIRE(k < all.size());
    CHECK(same(b, all[k]));
    ++k;
  }
  CHECK(k == all.size());
}

TEST_CASE("gpu: DecodeAugment with nvJPEG names the sample of a corrupt file" * nitro::test::needs_gpu()) {
  REQUIRE_MESSAGE(img::NvJpeg::available(), img::NvJpeg::unavailable_reason());
  auto files = test_files();
  files[5] = Bytes(files[5].begin(), files[5].begin() + static_cast<std::ptrdiff_t>(files[5].size() / 2));
  const Data d(&files);
  const data::DecodeAugment stage(small);
  data::JpegBatches packed(data::PackedImages(d.packed));
  std::string e;
  std::thread([&] { e = error_of([&] { (void)stage(packed.get_batch({0, 5, 1}), c10::Device(c10::kCUDA, 0)); }); }).join();
  CHECK(has(e, "data::DecodeAugment: "));
  CHECK(has(e, "sample 5 (f105.jpg)"));
  CHECK_FALSE(has(e, "jpegs["));
}

#endif

}  // namespace nitro_test_image_jpeg_batches
