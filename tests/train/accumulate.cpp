#include <nitro/train/training_loop.hpp>

#include "testing.hpp"

#include <torch/optim/adam.h>

#include <vector>

#include <nitro/memory/tracking_allocator.hpp>

namespace nitro_test_train_accumulate {  // one namespace per file: an area is compiled as one translation unit

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

// ---- accumulate::Adaptive ---------------------------------------------------------------------------


namespace {

torch::nn::Sequential wide_mlp() {
  torch::manual_seed(3);
  // Wide activations, small weights: the activations of a batch are most of a step's memory.
  return torch::nn::Sequential(torch::nn::Linear(32, 4096), torch::nn::Functional(torch::relu), torch::nn::Linear(4096, 10));
}

struct Classification {
  at::Tensor x, y;
  explicit Classification(std::int64_t rows, std::int64_t seed) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
    x = torch::randn({rows, 32}, g);
    y = torch::randint(0, 10, {rows}, g);
  }
};

using AdaptiveLoop = nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Adaptive>;

// Runs `steps` steps of batch 256 with Adaptive and returns the parameters; `budget` 0: none.
std::vector<at::Tensor> train_adaptive(std::int64_t steps, std::int64_t initial_split, std::int64_t budget,
                                       std::int64_t* peak = nullptr, std::vector<nitro::accumulate::Adaptive::SplitEvent>* events = nullptr,
                                       std::int64_t* split = nullptr) {
  auto model = wide_mlp();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  std::vector<at::Tensor> out;
  {
    nitro::memory::ScopedCpuTracking track{{.budget_bytes = budget}};
    AdaptiveLoop::Options options;
    options.accumulate.initial_split = initial_split;
    if (events != nullptr) options.accumulate.on_split = [events](const auto& e) { events->push_back(e); };
    AdaptiveLoop loop{model, opt, options};
    for (std::int64_t s = 0; s < steps; ++s) {
      const Classification d(256, 100 + s);
      const auto r = loop.step(std::make_pair(d.x, d.y), [&](const auto& b) {
        return torch::cross_entropy_loss(model->forward(b.first), b.second);
      });
      CHECK(r.stepped);
    }
    if (peak != nullptr) *peak = track.stats().peak_bytes;
    if (split != nullptr) *split = loop.split();
  }
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

TEST_CASE("Adaptive splits a batch that runs out of memory and reaches the parameters of an unconstrained run") {
  std::int64_t peak_whole = 0, peak_halves = 0;
  const auto whole = train_adaptive(3, 1, 0, &peak_whole);
  const auto halves = train_adaptive(3, 2, 0, &peak_halves);
  REQUIRE(peak_halves < peak_whole);  // halving the batch halves the activations
  for (size_t i = 0; i < whole.size(); ++i) CHECK(torch::allclose(whole[i], halves[i], 1e-5, 1e-6));

  // A budget between the two peaks: the whole batch runs out of memory, halves fit.
  std::vector<nitro::accumulate::Adaptive::SplitEvent> events;
  std::int64_t split = 0;
  const auto constrained = train_adaptive(3, 1, (peak_whole + peak_halves) / 2, nullptr, &events, &split);
  CHECK(split == 2);
  REQUIRE(events.size() == 1);  // remembered: later steps start split
  CHECK(events[0].previous_split == 1);
  CHECK(events[0].split == 2);
  CHECK(events[0].batch_rows == 256);
  CHECK(events[0].reason.find("out of memory") != std::string::npos);
  for (size_t i = 0; i < whole.size(); ++i) CHECK(torch::allclose(whole[i], constrained[i], 1e-5, 1e-6));
  CHECK_FALSE(torch::allclose(whole[0], wide_mlp()->parameters()[0]));  // it did train
}

TEST_CASE("Adaptive passes the out-of-memory error on past max_split and leaves no partial gradients") {
  auto model = wide_mlp();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
  const auto before = model->parameters()[0].detach().clone();
  const Classification d(256, 7);
  nitro::memory::ScopedCpuTracking track{{.budget_bytes = 64 * 1024}};  // far too small for any split
  AdaptiveLoop loop{model, opt, {.accumulate = {.max_split = 4}}};
  CHECK_THROWS_AS(loop.step(std::make_pair(d.x, d.y),
                            [&](const auto& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); }),
                  c10::OutOfMemoryError);
  CHECK(loop.split() == 4);
  CHECK(loop.splits_made() == 2);
  for (const auto& p : model->parameters()) CHECK_FALSE(p.grad().defined());
  CHECK(torch::equal(model->parameters()[0], before));  // the optimizer never stepped
}

TEST_CASE("Adaptive bad input") {
  auto model = wide_mlp();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
  CHECK_THROWS_WITH_AS((AdaptiveLoop{model, opt, {.accumulate = {.initial_split = 0}}}),
                       doctest::Contains("initial_split must be >= 1"), nitro::Error);
  CHECK_THROWS_WITH_AS((AdaptiveLoop{model, opt, {.accumulate = {.initial_split = 4, .max_split = 2}}}),
                       doctest::Contains("max_split"), nitro::Error);
  AdaptiveLoop loop{model, opt};
  const auto scalar = torch::tensor(1.0);
  CHECK_THROWS_WITH_AS(loop.step(scalar, [&](const at::Tensor& x) { return model->forward(torch::ones({1, 32}) * x).sum(); }),
                       doctest::Contains("dimension 0"), nitro::Error);
}

TEST_CASE("Adaptive splits on out-of-memory that cuBLAS, cuDNN or CUDA report as a plain c10::Error") {
  const auto reference = train_adaptive(1, 4, 0);  // four parts of 64 rows, no budget
  auto model = wide_mlp();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  AdaptiveLoop loop{model, opt};
  const Classification d(256, 100);
  int refused = 0;
  const auto r = loop.step(std::make_pair(d.x, d.y), [&](const auto& b) {
    // What cuBLAS says near the limit, for anything over 64 rows.
    if (b.first.size(0) > 64) {
      ++refused;
      throw c10::Error("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`");
    }
    return torch::cross_entropy_loss(model->forward(b.first), b.second);
  });
  CHECK(r.stepped);
  CHECK(loop.split() == 4);
  CHECK(refused == 2);  // 256 rows, then 128
  const auto params = model->parameters();
  for (size_t i = 0; i < reference.size(); ++i) CHECK(torch::allclose(params[i], reference[i], 1e-5, 1e-6));
}

TEST_CASE("Adaptive passes any other error on at once, without splitting") {
  auto model = wide_mlp();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
  AdaptiveLoop loop{model, opt};
  const Classification d(256, 7);
  CHECK_THROWS_WITH_AS(loop.step(std::make_pair(d.x, d.y), [&](const auto& b) {
    return torch::cross_entropy_loss(model->forward(b.first.narrow(1, 0, 16)), b.second);  // a shape error
  }), doctest::Contains("shapes cannot be multiplied"), c10::Error);
  CHECK(loop.split() == 1);
  CHECK(loop.splits_made() == 0);
}

TEST_CASE("Adaptive: an out-of-memory in the optimizer step reaches the caller with the window reset") {
  // Adam's state made on the first step is what runs out: the budget fits forward and backward only.
  auto model = wide_mlp();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  const Classification d(4, 7);  // few rows: the gradients are most of forward and backward's memory
  std::int64_t params_bytes = 0;
  for (const auto& p : model->parameters()) params_bytes += p.numel() * 4;
  nitro::memory::ScopedCpuTracking track{{.budget_bytes = params_bytes * 2}};  // gradients fit, Adam's two moments do not
  AdaptiveLoop loop{model, opt};
  CHECK_THROWS_AS(loop.step(std::make_pair(d.x, d.y), [&](const auto& b) {
    return torch::cross_entropy_loss(model->forward(b.first), b.second);
  }), c10::OutOfMemoryError);
  CHECK(loop.split() == 1);  // the batch was not split: splitting does not shrink the optimizer's memory
  CHECK(loop.pending_micro_batches() == 0);
  CHECK(loop.optimizer_steps() == 0);
  for (const auto& p : model->parameters()) CHECK_FALSE(p.grad().defined());
}

}  // namespace nitro_test_train_accumulate
