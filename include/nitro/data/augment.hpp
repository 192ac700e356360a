#pragma once
// Batched image augmentation as tensor operations, wherever the batch is (CPU workers, or the GPU on
// the prefetcher's copy stream through its `transform` option).
//
//   namespace aug = nitro::data::augment;
//   aug::Compose<aug::ToFloat, aug::RandomResizedCrop, aug::HFlip, aug::ColorJitter, aug::Normalize> pipeline{
//       {}, {.height = 224, .width = 224}, {}, {.brightness = 0.4, .contrast = 0.4, .saturation = 0.4},
//       {.mean = {0.485, 0.456, 0.406}, .std = {0.229, 0.224, 0.225}}};
//   at::Tensor out = pipeline(images_u8, {.seed = 7, .epoch = epoch, .index = sample_indices});
//
// Randomness is per sample: stage s of sample `index` in `epoch` draws its parameters from a generator
// keyed by (seed, epoch, index, s) (splitmix64), on the host, whatever the batch and its order. So a
// sample gets the same augmentation on the CPU and on a GPU, in any batch, with any number of workers,
// and again after a resume. The pixel work is batched: one grid_sample for all crops, one grouped
// convolution for all blurs, masks for flips.
//
// Stages (each with an Options aggregate; images are [N, C, H, W], float in [0, 1] after ToFloat):
//   ToFloat            uint8 -> float / 255
//   Normalize          (x - mean) / std per channel
//   HFlip              mirror left-right with probability p
//   Rotate90           a quarter turn k in {0, 1, 2, 3}, uniform (square images only)
//   RandomResizedCrop  torchvision's scale/ratio sampling, bilinear resampling to height x width
//                      (equal to F.interpolate of the crop, align_corners=false, no antialias)
//   ColorJitter        brightness, contrast, saturation factors in [1 - a, 1 + a] and a hue shift in
//                      [-hue, hue] (torchvision's formulas), applied in that fixed order
//   GaussianNoise      x + std * N(0, 1), the noise from a counter-based hash of (key, element), so
//                      the same on every device
//   GaussianBlur       an odd kernel, sigma uniform in [sigma_min, sigma_max], reflect padding
//
// Detection: boxes in YOLO format follow the geometric stages.
//
//   aug::Boxes targets = ...;  // one floating tensor [n_i, 5] per sample, rows (class, cx, cy, w, h),
//                              // cx and w as fractions of the image's width, cy and h of its height
//   auto [images, boxes] = pipeline(images_u8, targets, {.seed = 7, .epoch = epoch, .index = sample_indices});
//
// HFlip (cx -> 1 - cx), Rotate90 (the centre turns with the image, w and h swap for odd k) and
// RandomResizedCrop (boxes mapped into the crop and clipped to it) move a sample's boxes with the very
// draw they apply to its pixels: drawn once, used for both. The crop drops a box left with no area, or
// with less than `min_visibility` of its area (default 0: only the empty ones). The other stages say
// `geometric = false` and pass boxes unchanged; Compose rejects, at compile time, a stage of your own
// that says neither (see TransformsBoxes and KeepsGeometry). Boxes come back one tensor per sample, on
// their device and in their dtype; a sample whose boxes were all dropped gets [0, 5].
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace nitro::data::augment {

/// Who the samples of a batch are: their data-set indices (int64 [N], any device), the epoch and the seed.
struct Keys {
  uint64_t seed = 0;  ///< The run's seed: another seed, other draws.
  int64_t epoch = 0;  ///< The epoch: each epoch draws anew.
  at::Tensor index;   ///< The samples' data-set indices, int64 [N] on any device; a stage throws nitro::Error otherwise.
};

/// YOLO boxes of a batch: one floating tensor [n_i, 5] per sample (n_i may be 0), on any device, each
/// row (class, cx, cy, w, h) with the centre and size as fractions of the image's width (cx, w) and
/// height (cy, h).
using Boxes = std::vector<at::Tensor>;

namespace detail {

NITRO_INLINE uint64_t splitmix(uint64_t z);

/// The generator of stage `stage` of one sample.
class Rng {
 public:
  NITRO_INLINE Rng(uint64_t seed, int64_t epoch, int64_t index, int stage);
  uint64_t next() { return s_ = splitmix(s_); }
  /// Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double a, double b) { return a + (b - a) * uniform(); }
  /// Uniform integer in [0, n).
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }

 private:
  uint64_t s_;
};

/// Python's int(round(x)): to the nearest integer, a tie to the even one (round(2.5) == 2), whatever
/// the floating-point rounding mode. std::lround would give 3.
NITRO_INLINE int64_t round_half_even(double x);

/// One Rng per sample of the batch, for stage `stage`.
NITRO_INLINE std::vector<Rng> rngs(const Keys& keys, int64_t n, int stage);

NITRO_INLINE void check_images(const at::Tensor& x, const char* stage, bool floating);

/// Per-sample values as a [N, 1, 1, 1] tensor on the batch's device, in its dtype.
NITRO_INLINE at::Tensor per_sample(const std::vector<double>& v, const at::Tensor& like);

NITRO_INLINE void check_boxes(const Boxes& boxes, int64_t n, const char* stage);

/// A 31-bit integer hash, exact in int64 tensor arithmetic on every device (no product reaches 2^63).
NITRO_INLINE at::Tensor hash31(at::Tensor x);

}  // namespace detail

/// A stage that moves boxes as it moves pixels, with the same draw:
/// `auto [images, boxes] = stage(images, boxes, keys, stage_index)`.
template <class S>
concept TransformsBoxes = requires(const S& s, const at::Tensor& x, const Boxes& b, const Keys& k, int i) {
  { s(x, b, k, i) } -> std::same_as<std::pair<at::Tensor, Boxes>>;
};

/// A stage that leaves every pixel where it was (`static constexpr bool geometric = false`): boxes pass it unchanged.
template <class S>
concept KeepsGeometry = requires { requires !S::geometric; };

/// uint8 (or uint16) -> float32 in [0, 1]; floating images pass unchanged.
struct ToFloat {
  static constexpr bool geometric = false;  ///< Moves no pixel: boxes pass it unchanged (KeepsGeometry).
  /// The images as float32 in [0, 1]. Throws nitro::Error unless `x` is a batch [N, C, H, W] of
  /// uint8, uint16 or floating values.
  at::Tensor operator()(const at::Tensor& x, const Keys&, int) const {
    detail::check_images(x, "ToFloat", false);
    if (x.is_floating_point()) return x;
    NITRO_CHECK(x.scalar_type() == at::kByte || x.scalar_type() == at::kUInt16,
                "data::augment::ToFloat: expected uint8 or uint16 images (scaled by 255 or 65535) or floating ones, "
                "got ", x.scalar_type(), "; convert them to float in [0, 1] first");
    return x.to(at::kFloat).div_(x.scalar_type() == at::kByte ? 255.0 : 65535.0);
  }
};
static_assert(KeepsGeometry<ToFloat>);

/// (x - mean) / std per channel. Given uint8 images it is ToFloat and Normalize in one pass over the
/// pixels (x / 255 - mean) / std, computed as x * (1 / (255 std)) - mean / std in float (equal to the two
/// stages to a float rounding or two), into float32: on the CPU that is one pass where the two stages
/// make four.
struct Normalize {
  static constexpr bool geometric = false;  ///< Moves no pixel: boxes pass it unchanged (KeepsGeometry).
  std::vector<double> mean{0.485, 0.456, 0.406};  ///< One mean per channel; ImageNet's RGB by default.
  std::vector<double> std{0.229, 0.224, 0.225};   ///< One standard deviation (> 0) per channel; ImageNet's by default.
  /// The normalised images, in x's floating dtype (float32 for uint8). Throws nitro::Error unless `x` is
  /// a batch [N, C, H, W] of uint8 or floating values with one mean and one std (> 0) per channel.
  at::Tensor operator()(const at::Tensor& x, const Keys&, int) const {
    detail::check_images(x, "Normalize", x.scalar_type() != at::kByte);
    NITRO_CHECK(static_cast<int64_t>(mean.size()) == x.size(1) && mean.size() == std.size(),
                "data::augment::Normalize: mean and std need one value per channel (", x.size(1), "), got ",
                mean.size(), " and ", std.size());
    for (double s : std) NITRO_CHECK(s > 0, "data::augment::Normalize: std must be > 0");
    if (x.scalar_type() == at::kByte) return from_uint8(x);
    const auto o = at::TensorOptions().dtype(at::kDouble);
    const auto m = at::tensor(mean, o).to(x.device(), x.scalar_type()).view({1, -1, 1, 1});
    const auto s = at::tensor(std, o).to(x.device(), x.scalar_type()).view({1, -1, 1, 1});
    return (x - m) / s;
  }

 private:
  NITRO_INLINE at::Tensor from_uint8(const at::Tensor& x) const;
};
static_assert(KeepsGeometry<Normalize>);

/// Mirrors left-right with probability p; a flipped sample's boxes get cx -> 1 - cx.
struct HFlip {
  static constexpr bool geometric = true;  ///< Moves pixels, and moves boxes with them (TransformsBoxes).
  double p = 0.5;  ///< The probability that a sample is flipped, in [0, 1].

  /// The images, each sample flipped or not by its own draw. Throws nitro::Error unless `x` is a batch
  /// [N, C, H, W] and keys.index holds N indices.
  at::Tensor operator()(const at::Tensor& x, const Keys& keys, int stage) const {
    detail::check_images(x, "HFlip", false);
    return flip(x, flips(keys, x.size(0), stage));
  }
  /// The images and their boxes, flipped together by the same draw. Throws nitro::Error as the call
  /// above, or unless `boxes` has one [n_i, 5] tensor per sample.
  std::pair<at::Tensor, Boxes> operator()(const at::Tensor& x, const Boxes& boxes, const Keys& keys, int stage) const {
    detail::check_images(x, "HFlip", false);
    detail::check_boxes(boxes, x.size(0), "HFlip");
    const auto f = flips(keys, x.size(0), stage);
    return {flip(x, f), flip_boxes(boxes, f)};
  }

  /// Which samples flip (1) and which do not (0): the one draw that images and boxes share.
  [[nodiscard]] NITRO_INLINE std::vector<uint8_t> flips(const Keys& keys, int64_t n, int stage) const;
  /// `x` with the samples whose `flips` entry is 1 mirrored left-right.
  NITRO_INLINE static at::Tensor flip(const at::Tensor& x, const std::vector<uint8_t>& flips);
  /// `boxes` with cx -> 1 - cx for the samples whose `flips` entry is 1.
  NITRO_INLINE static Boxes flip_boxes(const Boxes& boxes, const std::vector<uint8_t>& flips);
};
static_assert(TransformsBoxes<HFlip>);

/// A quarter turn k in {0, 1, 2, 3} (counter-clockwise as seen on screen, as torch.rot90 over dims
/// {2, 3}), uniform per sample. A box turns with its sample: for k = 1, (cx, cy, w, h) -> (cy, 1 - cx, h, w).
struct Rotate90 {
  static constexpr bool geometric = true;  ///< Moves pixels, and moves boxes with them (TransformsBoxes).

  /// The images, each turned by its own draw. Throws nitro::Error unless `x` is a batch [N, C, H, W]
  /// of square images and keys.index holds N indices.
  at::Tensor operator()(const at::Tensor& x, const Keys& keys, int stage) const {
    check(x);
    return turn(x, turns(keys, x.size(0), stage));
  }
  /// The images and their boxes, turned together by the same draw. Throws nitro::Error as the call
  /// above, or unless `boxes` has one [n_i, 5] tensor per sample.
  std::pair<at::Tensor, Boxes> operator()(const at::Tensor& x, const Boxes& boxes, const Keys& keys, int stage) const {
    check(x);
    detail::check_boxes(boxes, x.size(0), "Rotate90");
    const auto ks = turns(keys, x.size(0), stage);
    return {turn(x, ks), turn_boxes(boxes, ks)};
  }

  /// Each sample's number of quarter turns: the one draw that images and boxes share.
  [[nodiscard]] NITRO_INLINE std::vector<int64_t> turns(const Keys& keys, int64_t n, int stage) const;
  /// `x` with sample i turned ks[i] quarter turns (torch.rot90 over dims {2, 3}).
  NITRO_INLINE static at::Tensor turn(const at::Tensor& x, const std::vector<int64_t>& ks);
  /// rot90(k = 1) sends pixel (row y, column x) to (row W - 1 - x, column y): in fractions of the side,
  /// (x, y) -> (y, 1 - x).
  NITRO_INLINE static Boxes turn_boxes(const Boxes& boxes, const std::vector<int64_t>& ks);

 private:
  NITRO_INLINE static void check(const at::Tensor& x);
};
static_assert(TransformsBoxes<Rotate90>);

/// torchvision's RandomResizedCrop: a crop of area scale x the image's and aspect ratio in `ratio`
/// (log-uniform), resampled bilinearly to height x width. Boxes are mapped into the crop and clipped to
/// it; a box keeps its place when its part inside the crop has some area and at least `min_visibility`
/// of its whole area, and is dropped otherwise.
struct RandomResizedCrop {
  static constexpr bool geometric = true;  ///< Moves pixels, and moves boxes with them (TransformsBoxes).
  int64_t height = 224;  ///< Output height in pixels (>= 1).
  int64_t width = 224;   ///< Output width in pixels (>= 1).
  /// The least crop area, as a fraction of the image's area (> 0).
  double scale_min = 0.08, scale_max = 1.0;  ///< The most crop area, as a fraction of the image's area (<= 1).
  /// The least crop aspect ratio, width / height (> 0); the ratio is drawn log-uniform.
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  ///< The most crop aspect ratio, width / height.
  /// The fraction of a box's area that must stay inside the crop for the box to be kept, in [0, 1].
  /// 0 (the default) drops only the boxes left with no area (outside the crop or on its border).
  double min_visibility = 0.0;

  /// The crop of one sample: top, left, height, width (torchvision's get_params, our generator; its
  /// sizes rounded as Python's round does, a tie to even).
  NITRO_INLINE std::array<int64_t, 4> crop(detail::Rng& g, int64_t H, int64_t W) const;

  /// Each sample's crop of an H x W batch: the one draw that images and boxes share.
  [[nodiscard]] NITRO_INLINE std::vector<std::array<int64_t, 4>> crops(const Keys& keys, int64_t n, int64_t H, int64_t W,
                                                          int stage) const;

  /// The images, each sample's crop resampled to height x width. Throws nitro::Error unless `x` is a
  /// floating batch [N, C, H, W], keys.index holds N indices and the options are in range.
  at::Tensor operator()(const at::Tensor& x, const Keys& keys, int stage) const {
    check(x);
    return resample(x, crops(keys, x.size(0), x.size(2), x.size(3), stage));
  }
  /// The cropped images and each sample's boxes in its crop (see crop_boxes). Throws nitro::Error as the
  /// call above, or unless `boxes` has one [n_i, 5] tensor per sample.
  std::pair<at::Tensor, Boxes> operator()(const at::Tensor& x, const Boxes& boxes, const Keys& keys, int stage) const {
    check(x);
    detail::check_boxes(boxes, x.size(0), "RandomResizedCrop");
    const auto c = crops(keys, x.size(0), x.size(2), x.size(3), stage);
    return {resample(x, c), crop_boxes(boxes, c, x.size(2), x.size(3))};
  }

  /// Bilinear resampling of each sample's crop to height x width: source coordinates
  /// left + (j + 0.5) * w / width - 0.5, clamped to the crop, as F.interpolate computes them on the
  /// crop alone; one grid_sample for the batch.
  NITRO_INLINE at::Tensor resample(const at::Tensor& x, const std::vector<std::array<int64_t, 4>>& crops) const;

  /// Each sample's boxes in its crop of an H x W image (top, left, height, width, as crop() gives), as
  /// fractions of the crop, clipped to it; boxes with no area left (a thousandth of a pixel or less
  /// either way) or less than min_visibility of their area inside are dropped. The resampling maps the
  /// crop linearly onto the output, so these are the boxes of the output image.
  NITRO_INLINE Boxes crop_boxes(const Boxes& boxes, const std::vector<std::array<int64_t, 4>>& crops, int64_t H, int64_t W) const;

 private:
  NITRO_INLINE void check(const at::Tensor& x) const;
};
static_assert(TransformsBoxes<RandomResizedCrop>);

/// Brightness, contrast and saturation factors uniform in [max(0, 1 - a), 1 + a] and a hue shift
/// uniform in [-hue, hue] (hue <= 0.5, in turns of the colour wheel), applied in that order with
/// torchvision's formulas (float RGB images in [0, 1]).
struct ColorJitter {
  static constexpr bool geometric = false;  ///< Moves no pixel: boxes pass it unchanged (KeepsGeometry).
  /// The spread a of the brightness factor (>= 0; 0: no change). Likewise contrast and saturation.
  double brightness = 0.0, contrast = 0.0 /**< Contrast's spread (>= 0). */, saturation = 0.0 /**< Saturation's spread (>= 0). */, hue = 0.0;  ///< Hue shift's bound in turns, [0, 0.5].

  /// The jittered images, each sample with its own factors. Throws nitro::Error unless `x` is a floating
  /// batch [N, C, H, W], keys.index holds N indices and the options are in range.
  at::Tensor operator()(const at::Tensor& x, const Keys& keys, int stage) const {
    detail::check_images(x, "ColorJitter", true);
    NITRO_CHECK(brightness >= 0 && contrast >= 0 && saturation >= 0 && hue >= 0 && hue <= 0.5,
                "data::augment::ColorJitter: brightness, contrast and saturation must be >= 0, hue in [0, 0.5]");
    auto r = detail::rngs(keys, x.size(0), stage);
    std::vector<double> b, c, s, h;
    for (auto& g : r) {
      b.push_back(g.uniform(std::max(0.0, 1 - brightness), 1 + brightness));
      c.push_back(g.uniform(std::max(0.0, 1 - contrast), 1 + contrast));
      s.push_back(g.uniform(std::max(0.0, 1 - saturation), 1 + saturation));
      h.push_back(g.uniform(-hue, hue));
    }
    // Each step makes one new tensor and then works in place on it.
    auto y = x;
    if (brightness > 0) y = (y * detail::per_sample(b, y)).clamp_(0, 1);
    if (contrast > 0) {
      const auto f = detail::per_sample(c, y);
      const auto mean = gray(y).mean({1, 2, 3}, /*keepdim=*/true);
      y = (y * f).add_((1 - f) * mean).clamp_(0, 1);
    }
    if (saturation > 0) {
      const auto f = detail::per_sample(s, y);
      y = (y * f).add_(gray(y).mul_(1 - f)).clamp_(0, 1);
    }
    if (hue > 0) y = shift_hue(y, detail::per_sample(h, y));
    return y;
  }

  /// torchvision's adjust_hue, batched: RGB to HSV, h + shift (mod 1), back to RGB. `shift`: [N, 1, 1, 1].
  NITRO_INLINE static at::Tensor shift_hue(const at::Tensor& x, const at::Tensor& shift);

  /// torchvision's rgb_to_grayscale: 0.2989 R + 0.587 G + 0.114 B, [N, 1, H, W].
  NITRO_INLINE static at::Tensor gray(const at::Tensor& x);
};
static_assert(KeepsGeometry<ColorJitter>);

/// x + std * N(0, 1), the noise a function of (seed, epoch, index, stage, element): the same on any device.
struct GaussianNoise {
  static constexpr bool geometric = false;  ///< Moves no pixel: boxes pass it unchanged (KeepsGeometry).
  double std = 0.05;  ///< The noise's standard deviation, in the images' units (>= 0; 0.05 of a [0, 1] range by default).
  /// The images with noise added. Throws nitro::Error unless `x` is a floating batch [N, C, H, W],
  /// keys.index holds N indices and std >= 0.
  at::Tensor operator()(const at::Tensor& x, const Keys& keys, int stage) const {
    detail::check_images(x, "GaussianNoise", true);
    NITRO_CHECK(std >= 0, "data::augment::GaussianNoise: std must be >= 0, got ", std);
    auto r = detail::rngs(keys, x.size(0), stage);  // checks the keys, even for an empty batch
    if (x.numel() == 0) return x;
    const int64_t N = x.size(0), E = x[0].numel();
    std::vector<int64_t> k1, k2;
    for (auto& g : r) {
      k1.push_back(static_cast<int64_t>(g.next() & 0x7FFFFFFF));
      k2.push_back(static_cast<int64_t>(g.next() & 0x7FFFFFFF));
    }
    const auto lo = at::TensorOptions().dtype(at::kLong).device(x.device());
    const auto K1 = at::tensor(k1, at::TensorOptions().dtype(at::kLong)).to(x.device()).view({N, 1});
    const auto K2 = at::tensor(k2, at::TensorOptions().dtype(at::kLong)).to(x.device()).view({N, 1});
    const auto e = at::arange(E, lo).view({1, E});
    const auto u = [&](int64_t which) {
      auto h = detail::hash31(at::bitwise_xor(detail::hash31(e * 2 + which), K1));
      h = detail::hash31(at::bitwise_xor(h, K2));
      return (h.to(at::kDouble) + 0.5) / 2147483648.0;
    };
    const auto z = at::sqrt(-2 * at::log(u(0))) * at::cos(2 * M_PI * u(1));  // Box-Muller
    return x + (std * z).to(x.scalar_type()).view(x.sizes());
  }
};
static_assert(KeepsGeometry<GaussianNoise>);

/// Gaussian blur with an odd kernel and sigma uniform in [sigma_min, sigma_max], reflect padding
/// (torchvision's gaussian_blur, as one grouped separable convolution for the batch).
struct GaussianBlur {
  static constexpr bool geometric = false;  ///< Moves no pixel: boxes pass it unchanged (KeepsGeometry).
  int64_t kernel = 5;  ///< The kernel's side in pixels: odd, >= 1, less than twice the image's side.
  /// The least sigma, in pixels (> 0).
  double sigma_min = 0.1, sigma_max = 2.0;  ///< The most sigma, in pixels (>= sigma_min).
  /// The blurred images, each sample with its own sigma. Throws nitro::Error unless `x` is a floating
  /// batch [N, C, H, W], keys.index holds N indices and the options are in range.
  at::Tensor operator()(const at::Tensor& x, const Keys& keys, int stage) const {
    detail::check_images(x, "GaussianBlur", true);
    NITRO_CHECK(kernel >= 1 && kernel % 2 == 1, "data::augment::GaussianBlur: kernel must be odd and >= 1, got ", kernel);
    NITRO_CHECK(0 < sigma_min && sigma_min <= sigma_max, "data::augment::GaussianBlur: needs 0 < sigma_min <= sigma_max");
    const int64_t N = x.size(0), C = x.size(1);
    auto r = detail::rngs(keys, N, stage);  // checks the keys, even for an empty batch
    if (x.numel() == 0) return x;           // no images, no channels or no pixels: nothing to blur
    NITRO_CHECK(kernel / 2 < std::min(x.size(2), x.size(3)),
                "data::augment::GaussianBlur: kernel must be less than twice the image's side (reflect padding), got ",
                kernel, " for ", x.size(2), "x", x.size(3), " images; use a smaller kernel");
    const auto o = at::TensorOptions().dtype(at::kDouble);
    const auto t = at::linspace(-(kernel - 1) / 2.0, (kernel - 1) / 2.0, kernel, o).view({1, kernel});
    std::vector<double> sig;
    for (auto& g : r) sig.push_back(g.uniform(sigma_min, sigma_max));
    auto k1 = at::exp(-0.5 * at::pow(t / at::tensor(sig, o).view({N, 1}), 2));
    k1 = (k1 / k1.sum(1, true)).to(x.device(), x.scalar_type());          // [N, k]
    const auto kc = k1.repeat_interleave(C, 0);                           // [N*C, k]
    const int64_t p = kernel / 2;
    auto y = at::reflection_pad2d(x.reshape({1, N * C, x.size(2), x.size(3)}), {p, p, p, p});
    const std::vector<int64_t> one{1, 1}, zero{0, 0};
    y = at::conv2d(y, kc.view({N * C, 1, 1, kernel}), at::Tensor(), one, zero, one, N * C);
    y = at::conv2d(y, kc.view({N * C, 1, kernel, 1}), at::Tensor(), one, zero, one, N * C);
    return y.view(x.sizes());
  }
};
static_assert(KeepsGeometry<GaussianBlur>);

/// Stages applied in order, stage s drawing from the generators of stage s (see the top of the file).
template <class... Stages>
class Compose {
 public:
  Compose() = default;
  /// The stages, in the order they apply (each an Options aggregate: `{}` for its defaults).
  explicit Compose(Stages... stages) : stages_(std::move(stages)...) {}

  /// On the CPU the batch goes through in slices of about `cpu_slice_bytes` of float pixels (a few
  /// images of 224x224), each through every stage: a chain of whole-batch operations would stream
  /// every intermediate through memory, while a slice stays in the cache. Each sample's draws are
  /// its own, so the result is the same either way. On a GPU the batch goes through whole.
  at::Tensor operator()(at::Tensor batch, const Keys& keys) const {
    NITRO_CHECK(batch.defined() && batch.dim() >= 1, "data::augment::Compose: expected a batch [N, C, H, W]");
    const int64_t n = batch.size(0), slice = slice_of(batch);
    if (slice >= n) return apply(std::move(batch), keys, std::index_sequence_for<Stages...>{});
    check_keys(keys, n);
    at::Tensor out;
    for (int64_t i = 0; i < n; i += slice) {
      const int64_t j = std::min(n, i + slice);
      place(out, apply(batch.slice(0, i, j), {keys.seed, keys.epoch, keys.index.slice(0, i, j)},
                       std::index_sequence_for<Stages...>{}),
            i, n);
    }
    return out;
  }

  /// Images and their YOLO boxes (see Boxes): the geometric stages move each sample's boxes with the
  /// draw they apply to its pixels, the others pass them unchanged. Returns the images and the boxes
  /// left, one tensor per sample as given (a crop may leave a sample [0, 5]).
  ///   auto [images, boxes] = pipeline(images_u8, targets, keys);
  std::pair<at::Tensor, Boxes> operator()(at::Tensor batch, const Boxes& boxes, const Keys& keys) const {
    NITRO_CHECK(batch.defined() && batch.dim() >= 1, "data::augment::Compose: expected a batch [N, C, H, W]");
    const int64_t n = batch.size(0), slice = slice_of(batch);
    detail::check_boxes(boxes, n, "Compose");
    if (slice >= n) return apply(std::move(batch), boxes, keys, std::index_sequence_for<Stages...>{});
    check_keys(keys, n);
    at::Tensor images;
    Boxes out;
    out.reserve(boxes.size());
    for (int64_t i = 0; i < n; i += slice) {
      const int64_t j = std::min(n, i + slice);
      auto [x, b] = apply(batch.slice(0, i, j), Boxes(boxes.begin() + i, boxes.begin() + j),
                          {keys.seed, keys.epoch, keys.index.slice(0, i, j)}, std::index_sequence_for<Stages...>{});
      place(images, x, i, n);
      for (auto& t : b) out.push_back(std::move(t));
    }
    return {std::move(images), std::move(out)};
  }

  /// Bytes of float pixels per slice on the CPU (see operator()); 0 or less: the whole batch at once.
  int64_t cpu_slice_bytes = int64_t{2} << 20;

  /// Stage I (0-based), as given.
  template <size_t I>
  [[nodiscard]] const auto& stage() const {
    return std::get<I>(stages_);
  }

 private:
  /// Slice [i, i + part's N) of the batch's result, copied while the slice is still in the cache (a
  /// cat at the end would read every slice back from memory); `out` made at the first slice.
  static void place(at::Tensor& out, const at::Tensor& part, int64_t i, int64_t n) {
    if (!out.defined()) {
      auto sizes = part.sizes().vec();
      sizes[0] = n;
      out = at::empty(sizes, part.options().memory_format(part.suggest_memory_format()));
    }
    out.slice(0, i, i + part.size(0)).copy_(part);
  }

  /// Samples per slice; n or more: the batch goes through whole.
  [[nodiscard]] int64_t slice_of(const at::Tensor& batch) const {
    const int64_t n = batch.size(0);
    if (!batch.device().is_cpu() || cpu_slice_bytes <= 0) return n;
    const int64_t per_sample = std::max<int64_t>(1, batch.numel() / std::max<int64_t>(1, n) * 4);
    return std::max<int64_t>(1, cpu_slice_bytes / per_sample);
  }

  static void check_keys(const Keys& keys, int64_t n) {
    NITRO_CHECK(keys.index.defined() && keys.index.dim() == 1 && keys.index.size(0) == n,
                "data::augment: Keys::index must hold one data-set index per sample (int64 [", n, "])");
  }

  template <size_t... I>
  at::Tensor apply(at::Tensor x, const Keys& keys, std::index_sequence<I...>) const {
    ((x = std::get<I>(stages_)(x, keys, static_cast<int>(I))), ...);
    return x;
  }

  template <size_t... I>
  std::pair<at::Tensor, Boxes> apply(at::Tensor x, Boxes b, const Keys& keys, std::index_sequence<I...>) const {
    (step<I>(x, b, keys), ...);
    return {std::move(x), std::move(b)};
  }

  template <size_t I>
  void step(at::Tensor& x, Boxes& b, const Keys& keys) const {
    using S = std::tuple_element_t<I, std::tuple<Stages...>>;
    static_assert(TransformsBoxes<S> || KeepsGeometry<S>,
                  "data::augment::Compose with boxes: each stage must either move boxes with its pixels "
                  "(operator()(images, boxes, keys, stage) returning std::pair<at::Tensor, Boxes>) or declare "
                  "that it moves no pixel (static constexpr bool geometric = false)");
    if constexpr (TransformsBoxes<S>) std::tie(x, b) = std::get<I>(stages_)(x, b, keys, static_cast<int>(I));
    else x = std::get<I>(stages_)(x, keys, static_cast<int>(I));
  }

  std::tuple<Stages...> stages_;
};

}  // namespace nitro::data::augment

#if !NITRO_COMPILED
#include <nitro/data/augment-inl.hpp>
#endif
