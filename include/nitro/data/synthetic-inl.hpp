#pragma once
// The definitions of nitro/data/synthetic.hpp's non-template functions: included by synthetic.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/data/synthetic.hpp>

namespace nitro::data {

NITRO_INLINE SyntheticImages::SyntheticImages(Options options) : o_(options) {
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

NITRO_INLINE torch::data::Example<> SyntheticImages::get(size_t index) {
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

NITRO_INLINE std::pair<at::Tensor, at::Tensor> SyntheticImages::stacked(std::int64_t begin, std::int64_t end) {
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

NITRO_INLINE std::uint64_t SyntheticImages::mix(std::uint64_t seed, std::uint64_t index) noexcept {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace nitro::data
