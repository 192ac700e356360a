#pragma once
// nitro::data::SyntheticImages: an image-classification data set computed from a seed, so that
// examples, tests and benches need no download.
//
// Each class has a fixed random prototype image (blocky, so convolutions can learn it); a sample is
// its class prototype shifted by a few pixels, scaled by a random contrast, buried in Gaussian noise,
// then scaled to unit variance (so `noise` sets the difficulty, not the input scale). Sample i
// depends only on (seed, offset + i): the data set is deterministic, random access, and the same
// whatever the order or thread that reads it. Two data sets with the same seed and
// disjoint [offset, offset + size) ranges share the classes and no samples: a train and a test split.
//
// With a range {low, high}, each pixel x of that image becomes low + (high - low) * Phi(x), Phi the
// standard normal distribution function: bounded by [low, high] and spread nearly uniformly over it,
// like images read from files and scaled ([0, 1] for MNIST, [-1, 1] for a GAN's tanh output), while
// the map, monotone, keeps what makes the classes learnable. Unset, samples are as they always were.
//
//   nitro::data::SyntheticImages train{{.size = 8192}};
//   nitro::data::SyntheticImages test{{.size = 1024, .offset = 8192}};
//   nitro::data::SyntheticImages mnist_like{{.size = 60'000, .channels = 1, .height = 28, .width = 28,
//                                            .range = nitro::data::SyntheticImages::Range{0, 1}}};
//   auto loader = torch::data::make_data_loader(train.map(torch::data::transforms::Stack<>()), 64);
#include <nitro/core/error.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/stack.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <utility>
#include <vector>

namespace nitro::data {

class SyntheticImages : public torch::data::datasets::Dataset<SyntheticImages> {
 public:
  /// Bounds of the pixel values: low < high, both finite.
  struct Range {
    double low = 0;
    double high = 1;
  };

  struct Options {
    /// Number of samples.
    std::int64_t size = 10'000;
    /// Index of the first sample: splits with the same seed and disjoint ranges share no sample.
    std::int64_t offset = 0;
    std::int64_t classes = 10;
    std::int64_t channels = 3;
    std::int64_t height = 32;
    std::int64_t width = 32;
    /// Side of the prototype's square blocks in pixels; must divide height and width.
    std::int64_t block = 4;
    /// Largest shift of the prototype in pixels, each axis, either way.
    std::int64_t max_shift = 2;
    /// Standard deviation of the added noise relative to the prototypes' (1): 0 is trivial, 10 is hard.
    double noise = 1.0;
    std::uint64_t seed = 0;
    /// Pixels in [low, high], spread nearly uniformly (see the top of this header); unset: unbounded,
    /// mean 0 and variance about 1.
    std::optional<Range> range{};
  };

  explicit SyntheticImages(Options options) : o_(options) {
    NITRO_CHECK(o_.size >= 0, "SyntheticImages: size must be >= 0, got ", o_.size);
    NITRO_CHECK(o_.offset >= 0, "SyntheticImages: offset must be >= 0, got ", o_.offset);
    NITRO_CHECK(o_.classes >= 2, "SyntheticImages: classes must be >= 2, got ", o_.classes);
    NITRO_CHECK(o_.channels >= 1 && o_.height >= 1 && o_.width >= 1,
                "SyntheticImages: channels, height and width must be >= 1, got ", o_.channels, "x", o_.height, "x",
                o_.width);
    NITRO_CHECK(o_.block >= 1 && o_.height % o_.block == 0 && o_.width % o_.block == 0,
                "SyntheticImages: block (", o_.block, ") must be >= 1 and divide height (", o_.height,
                ") and width (", o_.width, ")");
    NITRO_CHECK(o_.max_shift >= 0 && o_.max_shift < o_.height && o_.max_shift < o_.width,
                "SyntheticImages: max_shift must be in [0, min(height, width)), got ", o_.max_shift);
    NITRO_CHECK(o_.noise >= 0.0, "SyntheticImages: noise must be >= 0, got ", o_.noise);
    NITRO_CHECK(!o_.range || (std::isfinite(o_.range->low) && std::isfinite(o_.range->high) &&
                              o_.range->low < o_.range->high),
                "SyntheticImages: range must have finite bounds with low < high (e.g. {0, 1} or {-1, 1}), got [",
                o_.range ? o_.range->low : 0.0, ", ", o_.range ? o_.range->high : 0.0, "]");
    auto gen = at::make_generator<at::CPUGeneratorImpl>(mix(o_.seed, ~std::uint64_t{0}));
    prototypes_ = at::randn({o_.classes, o_.channels, o_.height / o_.block, o_.width / o_.block}, gen)
                      .repeat_interleave(o_.block, 2)
                      .repeat_interleave(o_.block, 3)
                      .contiguous();
  }

  /// Sample `index` (0-based within this data set): a float image [channels, height, width] (in the
  /// range, when one is set) and an int64 scalar label.
  torch::data::Example<> get(size_t index) override {
    NITRO_CHECK(static_cast<std::int64_t>(index) < o_.size, "SyntheticImages: index ", index,
                " is out of range; the data set has ", o_.size, " samples");
    const auto global = static_cast<std::uint64_t>(o_.offset) + index;
    const std::uint64_t h = mix(o_.seed, global);
    const auto label = static_cast<std::int64_t>(h % static_cast<std::uint64_t>(o_.classes));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(h);
    const auto span = 2 * o_.max_shift + 1;
    const auto dy = static_cast<std::int64_t>((h >> 20) % static_cast<std::uint64_t>(span)) - o_.max_shift;
    const auto dx = static_cast<std::int64_t>((h >> 40) % static_cast<std::uint64_t>(span)) - o_.max_shift;
    const double contrast = 0.75 + 0.5 * static_cast<double>((h >> 8) & 0xFFF) / 4095.0;
    auto image = prototypes_[label].roll({dy, dx}, {1, 2}).mul(contrast);
    if (o_.noise > 0) image.add_(at::randn(image.sizes(), gen), o_.noise).div_(std::sqrt(1.0 + o_.noise * o_.noise));
    if (o_.range) {
      // Phi(x) = (1 + erf(x / sqrt(2))) / 2, scaled to the range; clamped against rounding at the ends.
      const auto [low, high] = *o_.range;
      image.mul_(1 / std::numbers::sqrt2).erf_().add_(1.0).mul_(0.5 * (high - low)).add_(low).clamp_(low, high);
    }
    return {std::move(image), at::scalar_tensor(label, at::kLong)};
  }

  std::optional<size_t> size() const override { return static_cast<size_t>(o_.size); }

  /// Samples [begin, end) stacked: images [n, C, H, W] and labels [n].
  std::pair<at::Tensor, at::Tensor> stacked(std::int64_t begin, std::int64_t end) {
    NITRO_CHECK(0 <= begin && begin <= end && end <= o_.size, "SyntheticImages: range [", begin, ", ", end,
                ") is not within [0, ", o_.size, ")");
    std::vector<at::Tensor> images, labels;
    images.reserve(static_cast<size_t>(end - begin));
    labels.reserve(static_cast<size_t>(end - begin));
    for (auto i = begin; i < end; ++i) {
      auto e = get(static_cast<size_t>(i));
      images.push_back(std::move(e.data));
      labels.push_back(std::move(e.target));
    }
    if (images.empty()) return {at::empty({0, o_.channels, o_.height, o_.width}), at::empty({0}, at::kLong)};
    return {at::stack(images), at::stack(labels)};
  }

  /// The class prototypes [classes, C, H, W] (what a perfect classifier would match against), before
  /// any range is applied.
  const at::Tensor& prototypes() const noexcept { return prototypes_; }
  const Options& options() const noexcept { return o_; }

 private:
  // splitmix64 of a combination: decorrelates neighbouring indices and seeds.
  static std::uint64_t mix(std::uint64_t seed, std::uint64_t index) noexcept {
    std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  Options o_;
  at::Tensor prototypes_;
};

}  // namespace nitro::data
