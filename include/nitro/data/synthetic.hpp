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
#include <nitro/core/config.hpp>
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

/// An image-classification data set computed from a seed: deterministic, random access, no download
/// (see the top of this header).
class SyntheticImages : public torch::data::datasets::Dataset<SyntheticImages> {
 public:
  /// Bounds of the pixel values: low < high, both finite.
  struct Range {
    double low = 0;   ///< The smallest pixel value.
    double high = 1;  ///< The largest pixel value.
  };

  /// The data set's size, shape, difficulty, seed and pixel range.
  struct Options {
    /// Number of samples.
    std::int64_t size = 10'000;
    /// Index of the first sample: splits with the same seed and disjoint ranges share no sample.
    std::int64_t offset = 0;
    std::int64_t classes = 10;   ///< Number of classes, >= 2; labels are 0 .. classes - 1.
    std::int64_t channels = 3;   ///< Channels of each image, >= 1.
    std::int64_t height = 32;    ///< Image height in pixels, >= 1.
    std::int64_t width = 32;     ///< Image width in pixels, >= 1.
    /// Side of the prototype's square blocks in pixels; must divide height and width.
    std::int64_t block = 4;
    /// Largest shift of the prototype in pixels, each axis, either way.
    std::int64_t max_shift = 2;
    /// Standard deviation of the added noise relative to the prototypes' (1): 0 is trivial, 10 is hard.
    double noise = 1.0;
    std::uint64_t seed = 0;  ///< Seed of the prototypes and of every sample.
    /// Pixels in [low, high], spread nearly uniformly (see the top of this header); unset: unbounded,
    /// mean 0 and variance about 1.
    std::optional<Range> range{};
  };

  /// Makes the class prototypes. Throws nitro::Error on an option out of range (size or offset < 0,
  /// classes < 2, an empty image, a block that does not divide height and width, max_shift outside
  /// [0, min(height, width)), noise < 0, a range not finite with low < high).
  NITRO_INLINE explicit SyntheticImages(Options options);

  /// Sample `index` (0-based within this data set): a float image [channels, height, width] (in the
  /// range, when one is set) and an int64 scalar label.
  NITRO_INLINE torch::data::Example<> get(size_t index) override;

  /// Options::size.
  std::optional<size_t> size() const override { return static_cast<size_t>(o_.size); }

  /// Samples [begin, end) stacked: images [n, C, H, W] and labels [n].
  NITRO_INLINE std::pair<at::Tensor, at::Tensor> stacked(std::int64_t begin, std::int64_t end);

  /// The class prototypes [classes, C, H, W] (what a perfect classifier would match against), before
  /// any range is applied.
  const at::Tensor& prototypes() const noexcept { return prototypes_; }
  /// The options the data set was made with.
  const Options& options() const noexcept { return o_; }

 private:
  // splitmix64 of a combination: decorrelates neighbouring indices and seeds.
  NITRO_INLINE static std::uint64_t mix(std::uint64_t seed, std::uint64_t index) noexcept;

  Options o_;
  at::Tensor prototypes_;
};

}  // namespace nitro::data

#if !NITRO_COMPILED
#include <nitro/data/synthetic-inl.hpp>
#endif
