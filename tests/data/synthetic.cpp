#include <nitro/data/synthetic.hpp>

#include "testing.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace nitro_test_data_synthetic {  // one namespace per file: an area is compiled as one translation unit

using nitro::data::SyntheticImages;

TEST_CASE("samples depend only on (seed, offset + index)") {
  SyntheticImages a{{.size = 64, .seed = 7}};
  SyntheticImages b{{.size = 64, .seed = 7}};
  SyntheticImages other_seed{{.size = 64, .seed = 8}};
  SyntheticImages shifted{{.size = 16, .offset = 40, .seed = 7}};

  const auto late = b.get(41);  // read out of order first
  for (size_t i : {0, 1, 41, 63}) {
    CAPTURE(i);
    const auto x = a.get(i);
    const auto y = b.get(i);
    CHECK(x.data.equal(y.data));
    CHECK(x.target.item<std::int64_t>() == y.target.item<std::int64_t>());
    CHECK_FALSE(x.data.equal(other_seed.get(i).data));
  }
  CHECK(late.data.equal(a.get(41).data));
  CHECK(shifted.get(1).data.equal(a.get(41).data));  // offset 40 + index 1
  CHECK(a.prototypes().equal(shifted.prototypes()));  // same seed: same classes
}

TEST_CASE("shapes, dtypes, label range and balance") {
  SyntheticImages images{{.size = 2000, .classes = 10, .channels = 3, .height = 16, .width = 24}};
  CHECK(images.size() == 2000);
  std::vector<int> counts(10, 0);
  for (size_t i = 0; i < 2000; ++i) {
    const auto e = images.get(i);
    if (i == 0) {
      CHECK((e.data.sizes() == at::IntArrayRef{3, 16, 24}));
      CHECK(e.data.scalar_type() == at::kFloat);
      CHECK(e.target.scalar_type() == at::kLong);
      CHECK(e.target.dim() == 0);
    }
    const auto label = e.target.item<std::int64_t>();
    REQUIRE(label >= 0);
    REQUIRE(label < 10);
    ++counts[static_cast<size_t>(label)];
  }
  for (int c : counts) CHECK((c > 140 && c < 260));  // 200 expected each; binomial sd ~13
}

TEST_CASE("without noise or shift, a sample is its class prototype times a contrast in [0.75, 1.25]") {
  SyntheticImages images{{.size = 50, .classes = 5, .max_shift = 0, .noise = 0.0, .seed = 3}};
  for (size_t i = 0; i < 50; ++i) {
    const auto e = images.get(i);
    const auto proto = images.prototypes()[e.target.item<std::int64_t>()];
    const auto ratio = (e.data / proto);
    const double lo = ratio.min().item<double>(), hi = ratio.max().item<double>();
    CHECK(hi - lo == doctest::Approx(0.0).epsilon(1e-5));
    CHECK(lo >= 0.75 - 1e-6);
    CHECK(hi <= 1.25 + 1e-6);
  }
}

TEST_CASE("learnable: the nearest prototype classifies almost every noisy sample, chance without the labels") {
  SyntheticImages images{{.size = 500, .noise = 1.0, .seed = 11}};
  const auto [x, y] = images.stacked(0, 500);
  // Correlation with each prototype at each possible shift; the best match gives the class.
  const auto shift = images.options().max_shift;
  at::Tensor best;
  for (std::int64_t dy = -shift; dy <= shift; ++dy) {
    for (std::int64_t dx = -shift; dx <= shift; ++dx) {
      const auto p = images.prototypes().roll({dy, dx}, {2, 3}).flatten(1);
      const auto score = torch::mm(x.flatten(1), p.t());
      best = best.defined() ? torch::maximum(best, score) : score;
    }
  }
  const auto predicted = best.argmax(1);
  const double accuracy = predicted.eq(y).to(at::kDouble).mean().item<double>();
  CHECK(accuracy >= 0.99);
  const double shuffled = predicted.eq(y.index({torch::randperm(500)})).to(at::kDouble).mean().item<double>();
  CHECK(shuffled < 0.25);
}

TEST_CASE("stacked() equals get() one by one, and a torch::data loader reads every sample") {
  SyntheticImages images{{.size = 40, .height = 8, .width = 8}};
  const auto [x, y] = images.stacked(10, 20);
  CHECK((x.sizes() == at::IntArrayRef{10, 3, 8, 8}));
  for (std::int64_t i = 0; i < 10; ++i) {
    CHECK(x[i].equal(images.get(static_cast<size_t>(10 + i)).data));
    CHECK(y[i].item<std::int64_t>() == images.get(static_cast<size_t>(10 + i)).target.item<std::int64_t>());
  }
  CHECK(images.stacked(5, 5).first.size(0) == 0);

  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      images.map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(16));
  std::int64_t seen = 0;
  for (auto& batch : *loader) {
    CHECK(batch.data.size(0) == batch.target.size(0));
    seen += batch.data.size(0);
  }
  CHECK(seen == 40);
}

TEST_CASE("bad options and indices throw nitro::Error naming them") {
  auto message = [](SyntheticImages::Options o) -> std::string {
    try {
      SyntheticImages s{o};
    } catch (const nitro::Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(message({.size = -1}).find("size must be >= 0") != std::string::npos);
  CHECK(message({.classes = 1}).find("classes must be >= 2") != std::string::npos);
  CHECK(message({.height = 30}).find("block (4) must be >= 1 and divide height (30)") != std::string::npos);
  CHECK(message({.max_shift = 32}).find("max_shift") != std::string::npos);
  CHECK(message({.noise = -0.1}).find("noise must be >= 0") != std::string::npos);
  CHECK(message({.range = SyntheticImages::Range{1, 1}}).find("range must have finite bounds with low < high") !=
        std::string::npos);
  CHECK(message({.range = SyntheticImages::Range{1, 0}}).find("got [1, 0]") != std::string::npos);
  CHECK(message({.range = SyntheticImages::Range{0, std::numeric_limits<double>::infinity()}}).find("range must") !=
        std::string::npos);
  CHECK(message({.range = SyntheticImages::Range{std::nan(""), 1}}).find("range must") != std::string::npos);
  SyntheticImages images{{.size = 3}};
  CHECK_THROWS_WITH_AS(images.get(3), doctest::Contains("index 3 is out of range"), nitro::Error);
  CHECK_THROWS_AS(images.stacked(2, 4), nitro::Error);
}

namespace {
// The bits of every image element, summed with a weight per position: a change of any bit of any
// element, or a permutation, changes it.
std::int64_t bits_signature(SyntheticImages& images, std::int64_t n) {
  const auto [x, y] = images.stacked(0, n);
  const auto bits = x.contiguous().view(at::kInt).to(at::kLong).flatten();
  const auto weights = torch::arange(1, bits.numel() + 1, at::kLong).remainder(1009).add(1);
  return bits.mul(weights).sum().item<std::int64_t>() + y.mul(torch::arange(1, n + 1, at::kLong)).sum().item<std::int64_t>();
}
}  // namespace

TEST_CASE("without a range, samples are bit for bit those of before the option") {
  SyntheticImages standard{{.size = 16}};
  SyntheticImages small{{.size = 32, .classes = 4, .channels = 1, .height = 8, .width = 8, .noise = 0.5, .seed = 9}};
  // Computed by this function from the header as it was before `range` (commit d1fde23).
  CHECK(bits_signature(standard, 16) == -1185849474335090);
  CHECK(bits_signature(small, 32) == -98751231036527);
}

TEST_CASE("with a range, images are bounded by it, spread nearly uniformly, and a monotone map of the unbounded ones") {
  for (const auto range : {SyntheticImages::Range{0, 1}, SyntheticImages::Range{-1, 1}, SyntheticImages::Range{-3, 10}}) {
    CAPTURE(range.low);
    CAPTURE(range.high);
    for (const double noise : {0.0, 1.0}) {
      CAPTURE(noise);
      SyntheticImages plain{{.size = 200, .noise = noise, .seed = 4}};
      SyntheticImages bounded{{.size = 200, .noise = noise, .seed = 4, .range = range}};
      const auto [x, y] = bounded.stacked(0, 200);
      const auto [u, v] = plain.stacked(0, 200);
      CHECK(y.equal(v));  // the same labels
      CHECK(x.scalar_type() == at::kFloat);
      CHECK(x.min().item<double>() >= range.low);
      CHECK(x.max().item<double>() <= range.high);
      // Exactly low + (high - low) * Phi(unbounded pixel), up to float rounding.
      const auto phi = u.to(at::kDouble).div(std::sqrt(2.0)).erf().add(1).mul(0.5);
      const auto expected = phi.mul(range.high - range.low).add(range.low);
      CHECK(x.to(at::kDouble).sub(expected).abs().max().item<double>() <= 1e-6 * (range.high - range.low + 1));
      // Spread: each tenth of the range holds 5% to 15% of the pixels (10% if exactly uniform).
      const auto fraction = x.to(at::kDouble).sub(range.low).div(range.high - range.low);
      const auto counts = fraction.mul(10).floor().clamp(0, 9).to(at::kLong).flatten().bincount({}, 10);
      const double total = static_cast<double>(x.numel());
      for (std::int64_t b = 0; b < 10; ++b) {
        CAPTURE(b);
        const double share = static_cast<double>(counts[b].item<std::int64_t>()) / total;
        CHECK(share > 0.05);
        CHECK(share < 0.15);
      }
    }
  }
  // Deterministic per (seed, index), in any order.
  SyntheticImages a{{.size = 50, .seed = 6, .range = SyntheticImages::Range{0, 1}}};
  SyntheticImages b{{.size = 50, .seed = 6, .range = SyntheticImages::Range{0, 1}}};
  const auto late = b.get(33);
  CHECK(late.data.equal(a.get(33).data));
  CHECK(a.get(0).data.equal(b.get(0).data));
}

TEST_CASE("with a range [0, 1], the nearest centred prototype still classifies almost every noisy sample") {
  SyntheticImages images{{.size = 500, .noise = 1.0, .seed = 11, .range = SyntheticImages::Range{0, 1}}};
  const auto [x, y] = images.stacked(0, 500);
  const auto centred = x.flatten(1) - x.mean();
  const auto shift = images.options().max_shift;
  at::Tensor best;
  for (std::int64_t dy = -shift; dy <= shift; ++dy) {
    for (std::int64_t dx = -shift; dx <= shift; ++dx) {
      const auto p = images.prototypes().roll({dy, dx}, {2, 3}).flatten(1);
      const auto score = torch::mm(centred, p.t());
      best = best.defined() ? torch::maximum(best, score) : score;
    }
  }
  const double accuracy = best.argmax(1).eq(y).to(at::kDouble).mean().item<double>();
  CHECK(accuracy >= 0.98);
}

}  // namespace nitro_test_data_synthetic
