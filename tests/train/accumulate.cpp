#include <nitro/train/training_loop.hpp>

#include "testing.hpp"

#include <vector>

namespace {

// An elementwise model: its forward has no matmul, so under fp16 autocast it still computes in fp32
// and the comparison isolates what accumulation and loss scaling do.
struct ScaleShiftImpl : torch::nn::Module {
  ScaleShiftImpl() {
    w = register_parameter("w", torch::linspace(-1.0, 1.0, 6));
    b = register_parameter("b", torch::tensor(0.25));
  }
  at::Tensor forward(const at::Tensor& x) { return (x * w).sum(1) + b; }
  at::Tensor w, b;
};
TORCH_MODULE(ScaleShift);

struct Data {
  at::Tensor x = torch::sin(torch::arange(32 * 6, torch::kFloat).reshape({32, 6}) * 0.7);
  at::Tensor y = torch::cos(torch::arange(32, torch::kFloat));
};

at::Tensor mse(ScaleShift& m, const at::Tensor& x, const at::Tensor& y) { return (m->forward(x) - y).pow(2).mean(); }

std::vector<at::Tensor> params_of(ScaleShift& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m->parameters()) out.push_back(p.detach().clone());
  return out;
}

// `Off` over the batch of 32 against `Fixed<4>` over four micro-batches of 8, three optimizer steps.
template <class Amp, class... Clip>
void check_equivalence(typename nitro::TrainingLoop<Amp, nitro::accumulate::Off, nitro::checkpoint::Off, Clip...>::Options whole_options,
                       typename nitro::TrainingLoop<Amp, nitro::accumulate::Fixed<4>, nitro::checkpoint::Off, Clip...>::Options micro_options) {
  const Data d;
  ScaleShift whole, micro;
  torch::optim::SGD opt_whole(whole->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD opt_micro(micro->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  nitro::TrainingLoop<Amp, nitro::accumulate::Off, nitro::checkpoint::Off, Clip...> a{whole, opt_whole, whole_options};
  nitro::TrainingLoop<Amp, nitro::accumulate::Fixed<4>, nitro::checkpoint::Off, Clip...> b{micro, opt_micro, micro_options};
  for (int step = 0; step < 3; ++step) {
    const auto ra = a.step(d.x, [&](const at::Tensor& x) { return mse(whole, x, d.y); });
    CHECK(ra.stepped);
    for (int m = 0; m < 4; ++m) {
      const auto xs = d.x.slice(0, m * 8, (m + 1) * 8), ys = d.y.slice(0, m * 8, (m + 1) * 8);
      const auto rb = b.step(xs, [&](const at::Tensor& x) { return mse(micro, x, ys); });
      CHECK(rb.stepped == (m == 3));
      if constexpr (sizeof...(Clip) > 0) {
        if (m == 3) CHECK(rb.grad_norm.template item<double>() == doctest::Approx(ra.grad_norm.template item<double>()).epsilon(1e-5));
      }
    }
  }
  CHECK(b.optimizer_steps() == 3);
  const auto pa = params_of(whole), pb = params_of(micro);
  for (size_t i = 0; i < pa.size(); ++i) CHECK(torch::allclose(pa[i], pb[i], 1e-5, 1e-7));
  CHECK_FALSE(torch::allclose(pa[0], torch::linspace(-1.0, 1.0, 6)));  // it did train
}

}  // namespace

TEST_CASE("Fixed<4> over micro-batches of 8 reaches the parameters of Off over the batch of 32") {
  check_equivalence<nitro::amp::Off>({}, {});
}

TEST_CASE("accumulation equivalence holds with amp::Fp16 (unscaled once per step)") {
  check_equivalence<nitro::amp::Fp16<>>({.amp = {.init_scale = 4096.0}}, {.amp = {.init_scale = 4096.0}});
}

TEST_CASE("accumulation equivalence holds with clipping by norm after unscaling, fp32 and fp16") {
  check_equivalence<nitro::amp::Off, nitro::clip::Norm>({.clip = {.max_norm = 0.05}}, {.clip = {.max_norm = 0.05}});
  check_equivalence<nitro::amp::Fp16<>, nitro::clip::Norm>({.amp = {.init_scale = 4096.0}, .clip = {.max_norm = 0.05}},
                                                           {.amp = {.init_scale = 4096.0}, .clip = {.max_norm = 0.05}});
}

TEST_CASE("flush() steps on a partial window as the mean over its micro-batches, and Dynamic changes N between steps") {
  const Data d;
  ScaleShift whole, micro;
  torch::optim::SGD opt_whole(whole->parameters(), 0.05);
  torch::optim::SGD opt_micro(micro->parameters(), 0.05);
  nitro::TrainingLoop<> a{whole, opt_whole};
  nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Dynamic> b{micro, opt_micro, {.accumulate = {.steps = 4}}};
  // Three micro-batches of 8 then flush == one step over those 24 samples.
  a.step(d.x.slice(0, 0, 24), [&](const at::Tensor& x) { return mse(whole, x, d.y.slice(0, 0, 24)); });
  for (int m = 0; m < 3; ++m) {
    const auto ys = d.y.slice(0, m * 8, (m + 1) * 8);
    CHECK_FALSE(b.step(d.x.slice(0, m * 8, (m + 1) * 8), [&](const at::Tensor& x) { return mse(micro, x, ys); }).stepped);
  }
  CHECK_THROWS_WITH_AS(b.set_accumulation_steps(2), doctest::Contains("3 micro-batches are waiting"), nitro::Error);
  const auto flushed = b.flush();
  REQUIRE(flushed.has_value());
  CHECK(flushed->stepped);
  CHECK_FALSE(b.flush().has_value());
  const auto pa = params_of(whole), pb = params_of(micro);
  for (size_t i = 0; i < pa.size(); ++i) CHECK(torch::allclose(pa[i], pb[i], 1e-5, 1e-7));

  b.set_accumulation_steps(2);
  CHECK(b.accumulation_steps() == 2);
  CHECK_FALSE(b.step(d.x, [&](const at::Tensor& x) { return mse(micro, x, d.y); }).stepped);
  CHECK(b.step(d.x, [&](const at::Tensor& x) { return mse(micro, x, d.y); }).stepped);
  CHECK_THROWS_WITH_AS(b.set_accumulation_steps(0), doctest::Contains("steps must be >= 1, got 0"), nitro::Error);
  CHECK(nitro::accumulate::Dynamic::for_batch(256, 32).steps == 8);
  CHECK_THROWS_AS(nitro::accumulate::Dynamic::for_batch(100, 32), nitro::Error);
}
