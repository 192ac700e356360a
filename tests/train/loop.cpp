#include <nitro/train/levels.hpp>

#include "testing.hpp"

#include <string>

namespace {
const auto x = torch::ones({4, 3});
}

TEST_CASE("a hand-computed SGD step: Basic does exactly what a plain loop does") {
  torch::nn::Linear model(3, 1);
  {
    torch::NoGradGuard no_grad;
    model->weight.fill_(0.5);
    model->bias.fill_(0.0);
  }
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::level::Basic loop{model, optimizer};
  // loss = mean over 4 rows of (sum of 3 ones * 0.5) = 1.5; dloss/dw_j = 1, dloss/db = 1.
  const auto r = loop.step(x, [&](const at::Tensor& b) { return model->forward(b).mean(); });
  CHECK(r.loss.item<double>() == doctest::Approx(1.5));
  CHECK(r.stepped);
  CHECK_FALSE(r.skipped);
  CHECK_FALSE(r.loss_scale.defined());
  CHECK_FALSE(r.grad_norm.defined());
  CHECK(torch::allclose(model->weight, torch::full({1, 3}, 0.4)));
  CHECK(model->bias.item<double>() == doctest::Approx(-0.1));
  CHECK_FALSE(model->weight.grad().defined());  // zero_grad(set_to_none)
  CHECK(loop.optimizer_steps() == 1);
}

TEST_CASE("clip::Norm reports the norm and clips to max_norm, and clip::Value clamps") {
  torch::nn::Linear model(3, 1);
  torch::optim::SGD optimizer(model->parameters(), 1.0);
  nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Off, nitro::checkpoint::Off, nitro::clip::Norm> loop{
      model, optimizer, {.clip = {.max_norm = 1.0}}};
  const auto w = model->weight.detach().clone(), b = model->bias.detach().clone();
  // Gradient: d/dw = 3 * ones(1, 3) (sum over rows... of 4 rows / 4 * 3) -> [3, 3, 3], d/db = 3: norm 6.
  const auto r = loop.step(x, [&](const at::Tensor& in) { return model->forward(in).sum() * 0.75; });
  CHECK(r.grad_norm.item<double>() == doctest::Approx(6.0));
  const auto step = torch::cat({(w - model->weight.detach()).flatten(), (b - model->bias.detach()).flatten()});
  CHECK(step.norm().item<double>() == doctest::Approx(1.0).epsilon(1e-5));  // lr 1: the clipped gradient

  torch::nn::Linear m2(3, 1);
  torch::optim::SGD o2(m2->parameters(), 1.0);
  nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Off, nitro::checkpoint::Off, nitro::clip::Value> by_value{
      m2, o2, {.clip = {.max_value = 0.5}}};
  const auto w2 = m2->weight.detach().clone();
  by_value.step(x, [&](const at::Tensor& in) { return m2->forward(in).sum(); });  // gradient 4 per weight
  CHECK(torch::allclose(w2 - m2->weight.detach(), torch::full({1, 3}, 0.5)));
}

TEST_CASE("skip_nonfinite guards fp32 steps and counts them") {
  torch::nn::Linear model(3, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::level::Basic loop{model, optimizer, {.skip_nonfinite = true}};
  const auto before = model->weight.detach().clone();
  const auto r = loop.step(x, [&](const at::Tensor& in) { return model->forward(in).mean() * INFINITY; });
  CHECK(r.skipped);
  CHECK_FALSE(r.stepped);
  CHECK(model->weight.equal(before));
  CHECK(loop.skipped_steps() == 1);
  CHECK(loop.step(x, [&](const at::Tensor& in) { return model->forward(in).mean(); }).stepped);
}

TEST_CASE("bad input: each a nitro::Error naming the problem") {
  torch::nn::Linear model(3, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::level::Basic loop{model, optimizer};
  CHECK_THROWS_WITH_AS(loop.step(x, [&](const at::Tensor& in) { return model->forward(in); }),
                       doctest::Contains("must return a scalar tensor"), nitro::Error);

  std::vector<at::Tensor> none;
  torch::optim::SGD empty(none, 0.1);
  CHECK_THROWS_WITH_AS(nitro::level::Basic(model, empty), doctest::Contains("the optimizer has no parameters"),
                       nitro::Error);

  using Clipped = nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Off, nitro::checkpoint::Off, nitro::clip::Norm>;
  CHECK_THROWS_WITH_AS(Clipped(model, optimizer, {.clip = {.max_norm = -1.0}}), doctest::Contains("max_norm must be > 0"),
                       nitro::Error);
  using Dyn = nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Dynamic>;
  CHECK_THROWS_WITH_AS(Dyn(model, optimizer, {.accumulate = {.steps = 0}}), doctest::Contains("steps must be >= 1"),
                       nitro::Error);

  // Parameters on a device where LibTorch has no autocast: the meta device.
  std::vector<at::Tensor> on_meta{torch::empty({3}, torch::device(torch::kMeta)).requires_grad_()};
  torch::optim::SGD meta_opt(on_meta, 0.1);
  CHECK_THROWS_WITH_AS(nitro::TrainingLoop<nitro::amp::Fp16<>>(model, meta_opt), doctest::Contains("amp::fp16 needs autocast"),
                       nitro::Error);
}

TEST_CASE("levels are the documented combinations, with their hardware settings") {
  static_assert(std::is_same_v<nitro::level::Basic::amp_policy, nitro::amp::Off>);
  static_assert(std::is_same_v<nitro::level::Advanced::amp_policy, nitro::amp::Bf16>);
  static_assert(std::is_same_v<nitro::level::Ultra::checkpoint_policy, nitro::checkpoint::Sqrt>);
  static_assert(std::is_same_v<nitro::level::Ultra::clip_policy, nitro::clip::Norm>);
  CHECK_FALSE(nitro::level::hardware<nitro::level::Basic>().cudnn_benchmark.has_value());
  CHECK(nitro::level::hardware<nitro::level::Advanced>().tf32 == true);
  CHECK(nitro::level::hardware<nitro::level::Ultra>().cudnn_benchmark == true);
}
