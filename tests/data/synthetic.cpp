#include <nitro/data/synthetic.hpp>

#include "testing.hpp"

#include <string>
#include <vector>

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
  SyntheticImages images{{.size = 3}};
  CHECK_THROWS_WITH_AS(images.get(3), doctest::Contains("index 3 is out of range"), nitro::Error);
  CHECK_THROWS_AS(images.stacked(2, 4), nitro::Error);
}
