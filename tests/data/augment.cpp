#include <nitro/data/augment.hpp>

#include "testing.hpp"

#include <array>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

namespace nitro_test_data_augment {  // one namespace per file: an area is compiled as one translation unit

namespace aug = nitro::data::augment;

namespace {

aug::Keys keys(std::vector<int64_t> index, int64_t epoch = 0, uint64_t seed = 9) {
  return {.seed = seed, .epoch = epoch, .index = torch::tensor(index, at::kLong)};
}

// Images whose every pixel differs, so a flip, turn or shift shows.
at::Tensor images(int64_t n, int64_t h = 12, int64_t w = 12) {
  torch::manual_seed(1);
  return torch::rand({n, 3, h, w});
}

}  // namespace

TEST_CASE("augment: flips and quarter turns are exact, and a sample's draw does not depend on its batch") {
  const auto x = images(6);
  CHECK(torch::equal(aug::HFlip{.p = 1.0}(x, keys({0, 1, 2, 3, 4, 5}), 0), x.flip({3})));
  CHECK(torch::equal(aug::HFlip{.p = 0.0}(x, keys({0, 1, 2, 3, 4, 5}), 0), x));
  const auto half = aug::HFlip{.p = 0.5}(x, keys({0, 1, 2, 3, 4, 5}), 0);
  int flipped = 0;
  for (int64_t i = 0; i < 6; ++i) {
    const bool f = torch::equal(half[i], x[i].flip({2}));
    CHECK((f || torch::equal(half[i], x[i])));
    flipped += f;
  }
  // Sample 3 alone in another batch, at another position: the same decision.
  const auto alone = aug::HFlip{.p = 0.5}(torch::stack({x[5], x[3]}), keys({5, 3}), 0);
  CHECK(torch::equal(alone[1], half[3]));
  CHECK(torch::equal(alone[0], half[5]));

  const auto turned = aug::Rotate90{}(x, keys({0, 1, 2, 3, 4, 5}), 1);
  for (int64_t i = 0; i < 6; ++i) {
    bool some = false;
    for (int64_t k = 0; k < 4; ++k) some = some || torch::equal(turned[i], x[i].rot90(k, {1, 2}));
    CHECK(some);
  }
  CHECK_THROWS_WITH_AS(aug::Rotate90{}(images(2, 8, 12), keys({0, 1}), 0), doctest::Contains("square"), nitro::Error);
}

TEST_CASE("augment: RandomResizedCrop equals F.interpolate of each sample's crop (bilinear, no antialias)") {
  const auto x = images(5, 20, 24);
  const aug::RandomResizedCrop crop{.height = 16, .width = 14, .scale_min = 0.1};
  const auto k = keys({10, 11, 12, 13, 14});
  const auto out = crop(x, k, 2);
  CHECK(out.sizes() == c10::IntArrayRef{5, 3, 16, 14});
  for (int64_t i = 0; i < 5; ++i) {
    aug::detail::Rng g(9, 0, 10 + i, 2);
    const auto b = crop.crop(g, 20, 24);
    CHECK(b[2] >= 1);
    CHECK(b[0] + b[2] <= 20);
    CHECK(b[1] + b[3] <= 24);
    const auto patch = x.slice(0, i, i + 1).slice(2, b[0], b[0] + b[2]).slice(3, b[1], b[1] + b[3]);
    const auto ref = torch::nn::functional::interpolate(
        patch, torch::nn::functional::InterpolateFuncOptions().size(std::vector<int64_t>{16, 14})
                   .mode(torch::kBilinear).align_corners(false));
    CHECK((out[i] - ref[0]).abs().max().item<double>() < 1e-5);
  }
}

TEST_CASE("augment: RandomResizedCrop rounds its sizes as torchvision's get_params does (Python's round: a tie to even)") {
  // int(round(x)) in Python (the values below checked with it): 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 3.5 -> 4, 4.5 -> 4.
  CHECK(aug::detail::round_half_even(0.5) == 0);
  CHECK(aug::detail::round_half_even(1.5) == 2);
  CHECK(aug::detail::round_half_even(2.5) == 2);
  CHECK(aug::detail::round_half_even(3.5) == 4);
  CHECK(aug::detail::round_half_even(4.5) == 4);
  CHECK(aug::detail::round_half_even(2.5000000000000004) == 3);  // not a tie
  CHECK(aug::detail::round_half_even(12.49) == 12);
  aug::detail::Rng g(9, 0, 0, 0);
  // A one-point scale and ratio 1 make every draw the same: target area H * W * 0.25 (exact), aspect
  // exp(0) = 1, so w = h = round(sqrt(target)): sqrt(6.25) = 2.5 -> 2 and sqrt(20.25) = 4.5 -> 4
  // (std::lround: 3 and 5), sqrt(12.25) = 3.5 -> 4.
  const aug::RandomResizedCrop quarter{.scale_min = 0.25, .scale_max = 0.25, .ratio_min = 1.0, .ratio_max = 1.0};
  for (const auto& [side, size] : {std::pair<int64_t, int64_t>{5, 2}, {9, 4}, {7, 4}}) {
    CAPTURE(side);
    const auto b = quarter.crop(g, side, side);
    CHECK(b[2] == size);
    CHECK(b[3] == size);
    CHECK(b[0] + b[2] <= side);
    CHECK(b[1] + b[3] <= side);
  }
  // The fallback's centre crop: with the whole area and ratio 2 (or 1/2) every attempt is 7 pixels
  // one way on a 5 x 5 image, so all ten fail; then h = round(5 / 2) = 2 (w = round(5 * 0.5) = 2),
  // centred at (5 - 2) // 2 = 1: torchvision's (i, j, h, w) = (1, 0, 2, 5) and (0, 1, 5, 2), where
  // std::lround gave 3. On 7 x 7, round(3.5) = 4: (1, 0, 4, 7).
  const aug::RandomResizedCrop wide{.scale_min = 1.0, .scale_max = 1.0, .ratio_min = 2.0, .ratio_max = 2.0};
  const aug::RandomResizedCrop tall{.scale_min = 1.0, .scale_max = 1.0, .ratio_min = 0.5, .ratio_max = 0.5};
  const auto listed = [](const std::array<int64_t, 4>& c) { return std::vector<int64_t>(c.begin(), c.end()); };
  CHECK(listed(wide.crop(g, 5, 5)) == std::vector<int64_t>{1, 0, 2, 5});
  CHECK(listed(tall.crop(g, 5, 5)) == std::vector<int64_t>{0, 1, 5, 2});
  CHECK(listed(wide.crop(g, 7, 7)) == std::vector<int64_t>{1, 0, 4, 7});
}

TEST_CASE("augment: ColorJitter follows torchvision's brightness, contrast and saturation formulas") {
  const auto x = images(4);
  const auto k = keys({3, 1, 4, 1});
  const auto gray = [](const at::Tensor& t) {
    return (0.2989 * t.select(1, 0) + 0.587 * t.select(1, 1) + 0.114 * t.select(1, 2)).unsqueeze(1);
  };
  const auto out = aug::ColorJitter{.brightness = 0.4, .contrast = 0.3, .saturation = 0.5}(x, k, 3);
  for (int64_t i = 0; i < 4; ++i) {
    aug::detail::Rng g(9, 0, k.index[i].item<int64_t>(), 3);
    const double b = g.uniform(0.6, 1.4), c = g.uniform(0.7, 1.3), s = g.uniform(0.5, 1.5);
    auto y = (x.slice(0, i, i + 1) * b).clamp(0, 1);
    y = (c * y + (1 - c) * gray(y).mean()).clamp(0, 1);
    y = (s * y + (1 - s) * gray(y)).clamp(0, 1);
    CHECK((out[i] - y[0]).abs().max().item<double>() < 1e-5);
  }
  // Samples 1 and 3 share the data-set index 1: the same factors.
  const auto twins = aug::ColorJitter{.brightness = 0.4}(torch::stack({x[0], x[0]}), keys({1, 1}), 3);
  CHECK(torch::equal(twins[0], twins[1]));
}

TEST_CASE("augment: GaussianBlur equals a per-sample 2-d Gaussian convolution with reflect padding") {
  const auto x = images(3, 10, 9);
  const aug::GaussianBlur blur{.kernel = 5, .sigma_min = 0.5, .sigma_max = 2.0};
  const auto k = keys({7, 8, 9});
  const auto out = blur(x, k, 4);
  for (int64_t i = 0; i < 3; ++i) {
    aug::detail::Rng g(9, 0, 7 + i, 4);
    const double sigma = g.uniform(0.5, 2.0);
    auto t = torch::linspace(-2, 2, 5, at::kDouble);
    auto k1 = torch::exp(-0.5 * (t / sigma).pow(2));
    k1 = (k1 / k1.sum()).to(at::kFloat);
    const auto k2 = torch::outer(k1, k1).view({1, 1, 5, 5}).repeat({3, 1, 1, 1});
    const auto padded = torch::reflection_pad2d(x.slice(0, i, i + 1), {2, 2, 2, 2});
    const std::vector<int64_t> one{1, 1}, zero{0, 0};
    const auto ref = torch::conv2d(padded, k2, at::Tensor(), one, zero, one, 3);
    CHECK((out[i] - ref[0]).abs().max().item<double>() < 1e-5);
  }
}

TEST_CASE("augment: GaussianNoise is a function of (seed, epoch, index), with the asked spread") {
  const auto x = torch::zeros({4, 3, 32, 32});
  const aug::GaussianNoise noise{.std = 0.2};
  const auto a = noise(x, keys({0, 1, 2, 3}), 5);
  const auto b = noise(x.slice(0, 0, 2), keys({3, 2}), 5);
  CHECK(torch::equal(a[3], b[0]));
  CHECK(torch::equal(a[2], b[1]));
  CHECK_FALSE(torch::equal(a[0], a[1]));
  CHECK_FALSE(torch::equal(a[0], noise(x, keys({0, 1, 2, 3}, /*epoch=*/1), 5)[0]));
  CHECK(std::abs(a.mean().item<double>()) < 0.01);
  CHECK(std::abs(a.std().item<double>() - 0.2) < 0.01);
}

TEST_CASE("augment::Compose: uint8 in, normalised crops out, the same per (seed, epoch, index) in any batch") {
  torch::manual_seed(2);
  const auto u8 = torch::randint(0, 256, {6, 3, 24, 24}, at::kByte);
  aug::Compose<aug::ToFloat, aug::RandomResizedCrop, aug::HFlip, aug::ColorJitter, aug::Normalize> pipeline{
      {}, {.height = 16, .width = 16}, {}, {.brightness = 0.4, .contrast = 0.4, .saturation = 0.4}, {}};
  const auto all = pipeline(u8, keys({0, 1, 2, 3, 4, 5}, 2));
  CHECK(all.sizes() == c10::IntArrayRef{6, 3, 16, 16});
  CHECK(all.scalar_type() == at::kFloat);
  const auto some = pipeline(torch::stack({u8[4], u8[1]}), keys({4, 1}, 2));
  CHECK((some[0] - all[4]).abs().max().item<double>() < 1e-6);
  CHECK((some[1] - all[1]).abs().max().item<double>() < 1e-6);
  // On the CPU the batch goes through in cache-sized slices: the same result as all at once.
  auto sliced = pipeline;
  sliced.cpu_slice_bytes = 1;  // one image per slice
  auto whole = pipeline;
  whole.cpu_slice_bytes = 0;
  CHECK((sliced(u8, keys({0, 1, 2, 3, 4, 5}, 2)) - whole(u8, keys({0, 1, 2, 3, 4, 5}, 2))).abs().max().item<double>() <
        1e-6);
  const auto next_epoch = pipeline(u8, keys({0, 1, 2, 3, 4, 5}, 3));
  CHECK_FALSE(torch::allclose(next_epoch, all));
  CHECK_THROWS_WITH_AS(pipeline(u8, keys({0, 1})), doctest::Contains("one data-set index per sample"), nitro::Error);
  CHECK_THROWS_WITH_AS((aug::Normalize{.mean = {0.5}, .std = {0.5}}(all, keys({0, 1, 2, 3, 4, 5}), 0)),
                       doctest::Contains("one value per channel"), nitro::Error);
}

TEST_CASE("augment: Normalize of uint8 images is ToFloat then Normalize in one pass, to a float rounding") {
  const auto u8 = torch::randint(0, 256, {4, 3, 9, 11}, torch::TensorOptions().dtype(torch::kUInt8));
  const aug::Normalize n{.mean = {0.485, 0.456, 0.406}, .std = {0.229, 0.224, 0.225}};
  const auto k = keys({0, 1, 2, 3});
  const auto two = n(aug::ToFloat{}(u8, k, 0), k, 1);
  for (const auto& x : {u8, u8.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2})}) {  // contiguous, channels-last
    const auto one = n(x, k, 0);
    CHECK(one.scalar_type() == torch::kFloat);
    CHECK(one.sizes() == u8.sizes());
    CHECK((one - two).abs().max().item<double>() < 2e-6);
  }
  // The values by hand: 255 in channel 0 is (1 - 0.485) / 0.229.
  const auto white = torch::full({1, 3, 1, 1}, 255, torch::TensorOptions().dtype(torch::kUInt8));
  CHECK(n(white, keys({0}), 0)[0][0][0][0].item<double>() == doctest::Approx((1 - 0.485) / 0.229).epsilon(1e-6));
  CHECK_THROWS_WITH_AS((aug::Normalize{}(u8.to(torch::kShort), k, 0)), doctest::Contains("expected floating images"),
                       nitro::Error);
}

TEST_CASE("augment: a hue shift turns the colour wheel (red to yellow, green or back), as torchvision's adjust_hue") {
  // Pure red, pure green, a grey, and a mid orange, as one 2x2 image.
  auto img = torch::tensor({1.0f, 0.0f, 0.5f, 1.0f,    // R
                            0.0f, 1.0f, 0.5f, 0.5f,    // G
                            0.0f, 0.0f, 0.5f, 0.0f})   // B
                 .view({1, 3, 2, 2});
  const auto shift = [&](double by) {
    return aug::ColorJitter::shift_hue(img, torch::full({1, 1, 1, 1}, by));
  };
  CHECK((shift(0.0) - img).abs().max().item<double>() < 1e-6);
  const auto third = shift(1.0 / 3.0);  // red -> green, green -> blue, grey stays, orange -> (0, 1, 0.5)
  const auto expect = torch::tensor({0.0f, 0.0f, 0.5f, 0.0f,
                                     1.0f, 0.0f, 0.5f, 1.0f,
                                     0.0f, 1.0f, 0.5f, 0.5f}).view({1, 3, 2, 2});
  CHECK((third - expect).abs().max().item<double>() < 1e-5);
  const auto sixth = shift(1.0 / 6.0);  // red -> yellow
  CHECK((sixth.select(3, 0).select(2, 0)[0] - torch::tensor({1.0f, 1.0f, 0.0f})).abs().max().item<double>() < 1e-5);
  CHECK((shift(-1.0 / 3.0) - shift(2.0 / 3.0)).abs().max().item<double>() < 1e-5);
}

// ---- YOLO boxes through the geometric stages ----

namespace {

/// One sample's YOLO rows [n, 5] (class, cx, cy, w, h) from pixel rectangles (class, x0, y0, x1, y1),
/// x1 and y1 exclusive, in an H x W image.
at::Tensor yolo(std::vector<std::array<double, 5>> rects, int64_t H, int64_t W) {
  std::vector<float> v;
  for (const auto& [c, x0, y0, x1, y1] : rects) {
    v.push_back(static_cast<float>(c));
    v.push_back(static_cast<float>((x0 + x1) / 2 / static_cast<double>(W)));
    v.push_back(static_cast<float>((y0 + y1) / 2 / static_cast<double>(H)));
    v.push_back(static_cast<float>((x1 - x0) / static_cast<double>(W)));
    v.push_back(static_cast<float>((y1 - y0) / static_cast<double>(H)));
  }
  return torch::tensor(v).view({static_cast<int64_t>(rects.size()), 5});
}

/// Row r of YOLO boxes as a pixel rectangle {x0, y0, x1, y1} of an H x W image.
std::array<double, 4> pixels_of(const at::Tensor& boxes, int64_t r, int64_t H, int64_t W) {
  const auto b = boxes[r].to(at::kDouble);
  const double cx = b[1].item<double>(), cy = b[2].item<double>(), w = b[3].item<double>(), h = b[4].item<double>();
  return {(cx - w / 2) * static_cast<double>(W), (cy - h / 2) * static_cast<double>(H),
          (cx + w / 2) * static_cast<double>(W), (cy + h / 2) * static_cast<double>(H)};
}

/// The rectangle {x0, y0, x1, y1} (x1, y1 exclusive) of the pixels of a [H, W] image above `above`;
/// nothing when none is.
std::optional<std::array<double, 4>> extent(const at::Tensor& img, double above = 0.0) {
  const auto on = (img > above).nonzero();  // [k, 2]: row, column
  if (on.size(0) == 0) return std::nullopt;
  const auto lo = std::get<0>(on.min(0)), hi = std::get<0>(on.max(0));
  return std::array<double, 4>{lo[1].item<double>(), lo[0].item<double>(), hi[1].item<double>() + 1,
                               hi[0].item<double>() + 1};
}

/// A [n, channels, H, W] batch whose channel c is 1 inside rects[c] (x0, y0, x1, y1) and 0 elsewhere.
at::Tensor filled(int64_t n, int64_t H, int64_t W, const std::vector<std::array<int64_t, 4>>& rects) {
  auto x = torch::zeros({n, static_cast<int64_t>(rects.size()), H, W});
  for (size_t c = 0; c < rects.size(); ++c) {
    const auto& [x0, y0, x1, y1] = rects[c];
    x.select(1, static_cast<int64_t>(c)).slice(1, y0, y1).slice(2, x0, x1).fill_(1);
  }
  return x;
}

void check_same_place(const std::optional<std::array<double, 4>>& px, const std::array<double, 4>& box,
                      double tolerance) {
  REQUIRE(px.has_value());
  for (size_t e = 0; e < 4; ++e) CHECK(std::abs((*px)[e] - box[e]) <= tolerance);
}

}  // namespace

static_assert(aug::TransformsBoxes<aug::HFlip> && aug::TransformsBoxes<aug::Rotate90> &&
              aug::TransformsBoxes<aug::RandomResizedCrop>);
static_assert(aug::KeepsGeometry<aug::ColorJitter> && !aug::TransformsBoxes<aug::ColorJitter>);
static_assert(!aug::KeepsGeometry<aug::HFlip>);
namespace {
struct Unmarked {  // a stage of one's own that says nothing about geometry: Compose with boxes rejects it
  at::Tensor operator()(const at::Tensor& x, const aug::Keys&, int) const { return x; }
};
}  // namespace
static_assert(!aug::KeepsGeometry<Unmarked> && !aug::TransformsBoxes<Unmarked>);

TEST_CASE("augment boxes: HFlip mirrors a box exactly where it mirrors the pixels, with the same draw") {
  const int64_t H = 10, W = 16;
  const auto x = filled(8, H, W, {{3, 2, 9, 5}});  // columns [3, 9), rows [2, 5)
  const aug::Boxes boxes(8, yolo({{7, 3, 2, 9, 5}}, H, W));
  const aug::HFlip flip{.p = 0.5};
  const auto k = keys({0, 1, 2, 3, 4, 5, 6, 7});
  const auto [out, moved] = flip(x, boxes, k, 2);
  CHECK(torch::equal(out, flip(x, k, 2)));  // the images are those of the box-less call
  const auto flips = flip.flips(k, 8, 2);
  int flipped = 0;
  for (int64_t i = 0; i < 8; ++i) {
    flipped += flips[static_cast<size_t>(i)];
    const auto expect = flips[static_cast<size_t>(i)] ? std::array<double, 4>{16 - 9, 2, 16 - 3, 5}
                                                      : std::array<double, 4>{3, 2, 9, 5};
    check_same_place(extent(out[i][0]), expect, 0.0);
    check_same_place(extent(out[i][0]), pixels_of(moved[static_cast<size_t>(i)], 0, H, W), 1e-4);
    CHECK(moved[static_cast<size_t>(i)][0][0].item<float>() == 7.0f);  // the class stays
  }
  CHECK(flipped > 0);
  CHECK(flipped < 8);
}

TEST_CASE("augment boxes: Rotate90 turns a box and a bright pixel to the same place, for every k") {
  // One bright pixel at row 1, column 6 of an 8x8 image, and its one-pixel box.
  const int64_t S = 8;
  const auto x = filled(16, S, S, {{6, 1, 7, 2}, {2, 1, 7, 4}});  // and a 5 x 3 rectangle, to see w and h swap
  const aug::Boxes boxes(16, yolo({{0, 6, 1, 7, 2}, {1, 2, 1, 7, 4}}, S, S));
  const aug::Rotate90 rot;
  std::vector<int64_t> idx(16);
  std::iota(idx.begin(), idx.end(), 100);
  const auto k = keys(idx);
  const auto [out, moved] = rot(x, boxes, k, 3);
  CHECK(torch::equal(out, rot(x, k, 3)));
  const auto turns = rot.turns(k, 16, 3);
  std::array<int, 4> seen{};
  for (int64_t i = 0; i < 16; ++i) {
    const auto t = turns[static_cast<size_t>(i)];
    ++seen[static_cast<size_t>(t)];
    const auto& b = moved[static_cast<size_t>(i)];
    for (int64_t c = 0; c < 2; ++c) check_same_place(extent(out[i][c]), pixels_of(b, c, S, S), 1e-4);
    // By hand: counter-clockwise on screen, the top-right pixel (row 1, column 6) goes to the top left.
    const std::array<std::array<double, 4>, 4> pixel{{{6, 1, 7, 2}, {1, 1, 2, 2}, {1, 6, 2, 7}, {6, 6, 7, 7}}};
    check_same_place(extent(out[i][0]), pixel[static_cast<size_t>(t)], 0.0);
    const double w = b[1][3].item<double>() * S, h = b[1][4].item<double>() * S;
    CHECK(std::abs(w - (t % 2 ? 3 : 5)) < 1e-5);
    CHECK(std::abs(h - (t % 2 ? 5 : 3)) < 1e-5);
  }
  for (int t = 0; t < 4; ++t) CHECK(seen[static_cast<size_t>(t)] > 0);
}

TEST_CASE("augment boxes: RandomResizedCrop maps, clips or drops a box as the pixels go, with the same draw") {
  const int64_t H = 40, W = 48, OH = 20, OW = 24;
  // Channel 0: a large rectangle most crops see; channel 1: a small one in a corner most crops miss.
  const std::vector<std::array<int64_t, 4>> rects{{10, 8, 36, 30}, {2, 33, 6, 38}};
  const int64_t n = 24;
  const auto x = filled(n, H, W, rects);
  const aug::Boxes boxes(static_cast<size_t>(n), yolo({{0, 10, 8, 36, 30}, {1, 2, 33, 6, 38}}, H, W));
  const aug::RandomResizedCrop crop{.height = OH, .width = OW, .scale_min = 0.1};
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  const auto k = keys(idx, 1);
  const auto [out, moved] = crop(x, boxes, k, 1);
  CHECK((out - crop(x, k, 1)).abs().max().item<double>() == 0);
  const auto drawn = crop.crops(k, n, H, W, 1);
  const auto by_hand = crop.crop_boxes(boxes, drawn, H, W);
  int kept = 0, dropped = 0, clipped = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto& b = moved[static_cast<size_t>(i)];
    CHECK(torch::equal(b, by_hand[static_cast<size_t>(i)]));
    const auto& [top, left, ch, cw] = drawn[static_cast<size_t>(i)];
    for (int64_t c = 0; c < 2; ++c) {
      const auto row = (b.select(1, 0) == static_cast<float>(c)).nonzero();
      // Bilinear resampling smears an edge over a source pixel: the pixels above 0.5 are those whose
      // centres lie inside the box, so their extent is the box's to within half an output pixel.
      // (The crop's clamp to its own border keeps that true at the edges.)
      const auto px = extent(out[i][c], 0.5);
      const auto& [x0, y0, x1, y1] = rects[static_cast<size_t>(c)];
      const bool overlaps = x0 < left + cw && left < x1 && y0 < top + ch && top < y1;
      CHECK(overlaps == (row.size(0) == 1));
      if (row.size(0) == 0) {
        ++dropped;
        CHECK(out[i][c].abs().max().item<double>() == 0);  // not one pixel of it in the crop
        continue;
      }
      ++kept;
      clipped += !(left <= x0 && x1 <= left + cw && top <= y0 && y1 <= top + ch);
      const auto box = pixels_of(b, row[0][0].item<int64_t>(), OH, OW);
      for (double e : box) CHECK((e >= -1e-4 && e <= std::max(OH, OW) + 1e-4));
      if (!px) {  // a sliver of the box under one output pixel: no pixel centre inside it
        CHECK((box[2] - box[0] <= 1 || box[3] - box[1] <= 1));
        continue;
      }
      check_same_place(px, box, 0.5 + 1e-3);
    }
  }
  CHECK(kept > 0);
  CHECK(dropped > 0);
  CHECK(clipped > 0);
}

TEST_CASE("augment boxes: RandomResizedCrop on a known crop, hand-computed boxes, clipping and min_visibility") {
  // A 100 x 200 image (H x W), the crop top 20, left 50, 40 high, 100 wide: x in [50, 150), y in [20, 60).
  const std::vector<std::array<int64_t, 4>> crop{{20, 50, 40, 100}};
  const auto b = torch::tensor({3.0f, 0.5f, 0.4f, 0.2f, 0.2f,     // x [80, 120], y [30, 50]: inside
                                1.0f, 0.75f, 0.5f, 0.2f, 0.4f,    // x [130, 170], y [30, 70]: 0.375 of it inside
                                2.0f, 0.1f, 0.1f, 0.1f, 0.1f,     // x [10, 30]: outside
                                4.0f, 0.2f, 0.4f, 0.1f, 0.2f,     // x [30, 50]: touches the crop's left edge
                                5.0f, 0.5f, 0.5f, 1.0f, 1.0f})    // the whole image: 0.2 of it inside
                     .view({5, 5});
  const auto run = [&](double min_visibility) {
    return aug::RandomResizedCrop{.min_visibility = min_visibility}.crop_boxes({b}, crop, 100, 200)[0];
  };
  // In fractions of the crop: x (x - 50) / 100, y (y - 20) / 40, clipped to [0, 1].
  const auto inside = torch::tensor({3.0f, 0.5f, 0.5f, 0.4f, 0.5f});
  const auto edge = torch::tensor({1.0f, 0.9f, 0.625f, 0.2f, 0.75f});  // x [0.8, 1.0], y [0.25, 1.0]
  const auto whole = torch::tensor({5.0f, 0.5f, 0.5f, 1.0f, 1.0f});
  const auto close = [](const at::Tensor& got, const at::Tensor& want) {
    return got.sizes() == want.sizes() && (got - want).abs().max().item<double>() < 1e-5;
  };
  CHECK(close(run(0.0), torch::stack({inside, edge, whole})));
  CHECK(run(0.0).scalar_type() == at::kFloat);
  CHECK(close(run(0.3), torch::stack({inside, edge})));
  CHECK(close(run(0.37), torch::stack({inside, edge})));  // 0.375 visible, up to float rounding
  CHECK(close(run(0.38), inside.view({1, 5})));
  CHECK(close(run(0.5), inside.view({1, 5})));
  CHECK(close(run(1.0), inside.view({1, 5})));
  // A sample without boxes, and one whose boxes all fall outside: [0, 5] each.
  const auto none = aug::RandomResizedCrop{}.crop_boxes({torch::zeros({0, 5}), b.slice(0, 2, 4)},
                                                        {crop[0], crop[0]}, 100, 200);
  CHECK(none[0].sizes() == c10::IntArrayRef{0, 5});
  CHECK(none[1].sizes() == c10::IntArrayRef{0, 5});
  CHECK_THROWS_WITH_AS(aug::RandomResizedCrop{.min_visibility = 1.5}.crop_boxes({b}, crop, 100, 200),
                       doctest::Contains("min_visibility"), nitro::Error);
}

TEST_CASE("augment::Compose with boxes: the same boxes per (seed, epoch, index) in a batch of 1 or 8") {
  torch::manual_seed(3);
  const int64_t n = 8;
  const auto u8 = torch::randint(0, 256, {n, 3, 32, 32}, at::kByte);
  aug::Boxes boxes;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t m = i % 4;  // 0 to 3 boxes
    const auto centre = torch::rand({m, 2}) * 0.6 + 0.2, size = torch::rand({m, 2}) * 0.3 + 0.05;
    boxes.push_back(torch::cat({torch::full({m, 1}, static_cast<float>(i)), centre, size}, 1));
  }
  using Pipeline =
      aug::Compose<aug::ToFloat, aug::RandomResizedCrop, aug::HFlip, aug::Rotate90, aug::ColorJitter, aug::Normalize>;
  Pipeline pipeline{{}, {.height = 16, .width = 16, .scale_min = 0.3}, {}, {}, {.brightness = 0.4, .hue = 0.1}, {}};
  const auto k = keys({0, 1, 2, 3, 4, 5, 6, 7}, 4);
  const auto [all, all_boxes] = pipeline(u8, boxes, k);
  CHECK(all.sizes() == c10::IntArrayRef{n, 3, 16, 16});
  REQUIRE(all_boxes.size() == static_cast<size_t>(n));
  // The images are those of the box-less pipeline.
  CHECK((all - pipeline(u8, k)).abs().max().item<double>() < 1e-6);
  // By hand, stage by stage, with Compose's stage indices.
  const aug::RandomResizedCrop crop{.height = 16, .width = 16, .scale_min = 0.3};
  auto [x1, b1] = crop(u8.to(at::kFloat) / 255, boxes, k, 1);
  auto [x2, b2] = aug::HFlip{}(x1, b1, k, 2);
  auto [x3, b3] = aug::Rotate90{}(x2, b2, k, 3);
  for (size_t i = 0; i < all_boxes.size(); ++i) CHECK(torch::equal(all_boxes[i], b3[i]));
  // Sample 5 alone (position 0 of a batch of 1), and sample 2 at position 6 of a reversed batch of 8.
  const auto [one, one_boxes] = pipeline(u8.slice(0, 5, 6), {boxes[5]}, keys({5}, 4));
  CHECK(torch::equal(one_boxes[0], all_boxes[5]));
  CHECK((one[0] - all[5]).abs().max().item<double>() < 1e-6);
  const auto rev = u8.flip({0});
  const aug::Boxes rev_boxes(boxes.rbegin(), boxes.rend());
  const auto [back, back_boxes] = pipeline(rev, rev_boxes, keys({7, 6, 5, 4, 3, 2, 1, 0}, 4));
  for (size_t i = 0; i < all_boxes.size(); ++i) CHECK(torch::equal(back_boxes[all_boxes.size() - 1 - i], all_boxes[i]));
  // In CPU slices or whole: the same.
  auto sliced = pipeline;
  sliced.cpu_slice_bytes = 1;
  const auto [s_img, s_boxes] = sliced(u8, boxes, k);
  for (size_t i = 0; i < all_boxes.size(); ++i) CHECK(torch::equal(s_boxes[i], all_boxes[i]));
  CHECK((s_img - all).abs().max().item<double>() < 1e-6);
  // Another epoch moves them.
  const auto [_, next] = pipeline(u8, boxes, keys({0, 1, 2, 3, 4, 5, 6, 7}, 5));
  bool moved = false;
  for (size_t i = 1; i < all_boxes.size(); ++i) moved = moved || !torch::equal(next[i], all_boxes[i]);
  CHECK(moved);
  // Stages that move no pixel pass the boxes as they came.
  aug::Compose<aug::ToFloat, aug::ColorJitter, aug::GaussianNoise, aug::GaussianBlur, aug::Normalize> colour{
      {}, {.brightness = 0.4, .hue = 0.2}, {}, {}, {}};
  const auto [c_img, c_boxes] = colour(u8, boxes, k);
  for (size_t i = 0; i < boxes.size(); ++i) CHECK(torch::equal(c_boxes[i], boxes[i]));
}

TEST_CASE("augment boxes: boxes of the wrong shape, dtype or count throw nitro::Error saying what to give") {
  const auto x = torch::rand({2, 3, 8, 8});
  const auto k = keys({0, 1});
  aug::Compose<aug::HFlip, aug::Rotate90> pipeline;
  const auto good = torch::tensor({0.0f, 0.5f, 0.5f, 0.2f, 0.2f}).view({1, 5});
  CHECK_THROWS_WITH_AS(pipeline(x, {good, good, good}, k),
                       doctest::Contains("one box tensor per sample of the batch (2), got 3"), nitro::Error);
  CHECK_THROWS_WITH_AS(pipeline(x, {good, torch::rand({2, 4})}, k),
                       doctest::Contains("the boxes of sample 1 must be a floating tensor [n, 5] of YOLO rows"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(pipeline(x, {good, torch::ones({1, 5}, at::kLong)}, k), doctest::Contains("[n, 5]"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(aug::HFlip{}(x, {good, torch::zeros({0})}, k, 0), doctest::Contains("[n, 5]"), nitro::Error);
  CHECK_THROWS_WITH_AS((aug::RandomResizedCrop{.height = 4, .width = 4}(x, {good}, k, 0)),
                       doctest::Contains("one box tensor per sample"), nitro::Error);
  CHECK_NOTHROW(pipeline(x, {good, torch::zeros({0, 5})}, k));
}

TEST_CASE("augment: an empty batch passes every stage, and ToFloat scales by the integer type's range") {
  const auto empty = torch::zeros({0, 3, 16, 16}, at::kByte);
  aug::Compose<aug::ToFloat, aug::RandomResizedCrop, aug::HFlip, aug::Rotate90, aug::ColorJitter, aug::GaussianNoise,
               aug::GaussianBlur, aug::Normalize>
      all{{}, {.height = 8, .width = 8}, {}, {}, {.brightness = 0.4, .hue = 0.1}, {}, {}, {}};
  const auto out = all(empty, keys(std::vector<int64_t>{}));
  CHECK(out.size(0) == 0);
  CHECK(out.size(1) == 3);
  CHECK(out.scalar_type() == at::kFloat);
  // Images with no channels or no pixels are blurred to themselves; the kernel still has to fit real images.
  CHECK(aug::GaussianBlur{}(torch::zeros({2, 0, 16, 16}), keys({0, 1}), 0).sizes() == at::IntArrayRef{2, 0, 16, 16});
  CHECK(aug::GaussianBlur{}(torch::zeros({2, 3, 0, 0}), keys({0, 1}), 0).sizes() == at::IntArrayRef{2, 3, 0, 0});
  CHECK_THROWS_WITH_AS(aug::GaussianBlur{.kernel = 9}(torch::zeros({1, 3, 4, 4}), keys({0}), 0),
                       doctest::Contains("less than twice the image's side"), nitro::Error);
  // Keys that do not match the batch are refused even when there is nothing to draw for.
  CHECK_THROWS_WITH_AS(aug::GaussianBlur{}(torch::zeros({2, 0, 16, 16}), keys({0}), 0),
                       doctest::Contains("one data-set index per sample"), nitro::Error);
  CHECK_THROWS_WITH_AS(aug::GaussianNoise{}(torch::zeros({2, 3, 0, 0}), keys({0}), 0),
                       doctest::Contains("one data-set index per sample"), nitro::Error);
  // uint8 / 255 and uint16 / 65535; another integer type is refused, not divided by 255.
  const auto k = keys({0});
  CHECK(aug::ToFloat{}(torch::full({1, 1, 1, 1}, 255, at::kByte), k, 0).item<float>() == 1.0f);
  CHECK(aug::ToFloat{}(torch::full({1, 1, 1, 1}, 65535, at::kInt).to(at::kUInt16), k, 0).item<float>() == 1.0f);
  CHECK_THROWS_WITH_AS(aug::ToFloat{}(torch::full({1, 1, 1, 1}, 1000, at::kInt), k, 0),
                       doctest::Contains("expected uint8 or uint16 images"), nitro::Error);
}

}  // namespace nitro_test_data_augment
