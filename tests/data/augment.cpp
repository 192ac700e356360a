#include <nitro/data/augment.hpp>

#include "testing.hpp"

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

TEST_CASE("augment: ColorJitter follows torchvision's brightness, contrast and saturation formulas") {
  const auto x = images(4);
  const auto k = keys({3, 1, 4, 1});
  const auto gray = [](const at::Tensor& t) {
    return (0.299 * t.select(1, 0) + 0.587 * t.select(1, 1) + 0.114 * t.select(1, 2)).unsqueeze(1);
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
