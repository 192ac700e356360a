#include <nitro/memory/tracking_allocator.hpp>
#include <nitro/train/levels.hpp>

#include "testing.hpp"

#include <cstdint>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace nitro_test_train_loop {  // one namespace per file: an area is compiled as one translation unit

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

TEST_CASE("clip::Norm by the largest magnitude (norm_type inf) takes a model with an empty parameter") {
  torch::nn::Linear model(4, 2);
  auto empty = torch::zeros({0}).requires_grad_(true);
  auto params = model->parameters();
  params.push_back(empty);
  torch::optim::SGD optimizer(params, 0.1);
  nitro::TrainingLoop<nitro::clip::Norm> loop{
      model, optimizer, {.clip = {.max_norm = 1.0, .norm_type = std::numeric_limits<double>::infinity()}}};
  // d/dW and d/db of the sum over 2 rows of ones: 2 everywhere, so the largest magnitude is 2.
  const auto r = loop.step(torch::ones({2, 4}), [&](const at::Tensor& in) { return model->forward(in).sum() + empty.sum(); });
  CHECK(r.grad_norm.item<double>() == doctest::Approx(2.0));
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

namespace {

std::int64_t tensor_bytes(const std::vector<at::Tensor>& ts) {
  std::int64_t n = 0;
  for (const auto& t : ts) n += static_cast<std::int64_t>(t.numel() * t.element_size());
  return n;
}

// Live CPU tensor bytes right after an optimizer step: the parameters and the optimizer's state, and
// nothing of the gradients (which zero_grad set to none).
template <class Loop>
void check_nothing_but_parameters_and_state_live(typename Loop::Options options, int micro_batches) {
  const auto batch = torch::randn({16, 256});
  nitro::memory::ScopedCpuTracking track;  // counts everything made from here on
  torch::nn::Sequential model(torch::nn::Linear(256, 256), torch::nn::Functional(torch::relu), torch::nn::Linear(256, 1));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  Loop loop{model, optimizer, options};
  const auto params = tensor_bytes(model->parameters());
  for (int round = 0; round < 2; ++round) {  // the first creates the momentum buffers
    nitro::StepResult r;
    for (int m = 0; m < micro_batches; ++m) r = loop.step(batch, [&](const at::Tensor& x) { return model->forward(x).pow(2).mean(); });
    REQUIRE(r.stepped);
  }
  const auto live = track.stats().live_bytes;
  CAPTURE(params);
  CAPTURE(live);
  // Parameters + one momentum buffer each, and the few scalars a StepResult holds.
  CHECK(live >= 2 * params);
  CHECK(live - 2 * params < 4096);
}

// An optimizer that fails on chosen calls of step(), as Adam running out of memory making its state.
struct FailingSGD : torch::optim::SGD {
  using torch::optim::SGD::SGD;
  int calls = 0;
  int fail_on = 1;
  at::Tensor step(LossClosure closure = nullptr) override {
    if (++calls == fail_on) throw c10::OutOfMemoryError({"step", __FILE__, __LINE__}, "CUDA out of memory (test)");
    return torch::optim::SGD::step(std::move(closure));
  }
};

// A clip policy that sees the gradients right after the non-finite check: their version counters
// tell whether anything wrote them in between.
struct Versions {
  using family = nitro::family::Clip;
  static constexpr std::string_view name = "versions";
  static constexpr bool enabled = true;
  struct Options {
    std::vector<std::int64_t>* seen = nullptr;
  };
  static void validate(const Options&) {}
  static at::Tensor apply(nitro::detail::GradGroups& grads, const Options& o) {
    grads.for_each([&](nitro::detail::GradGroups::Group& g) {
      for (const auto& t : g.grads) o.seen->push_back(static_cast<std::int64_t>(t._version()));
    });
    return {};
  }
};

}  // namespace

TEST_CASE("no gradient outlives its optimizer step: live bytes after a step are the parameters and the state") {
  check_nothing_but_parameters_and_state_live<nitro::level::Basic>({}, 1);
  check_nothing_but_parameters_and_state_live<nitro::TrainingLoop<nitro::accumulate::Fixed<2>, nitro::clip::Norm>>({}, 2);
  check_nothing_but_parameters_and_state_live<nitro::level::Basic>({.skip_nonfinite = true}, 1);
}

TEST_CASE("StepResult::loss_scale is a copy: later steps do not change it") {
  torch::nn::Linear model(3, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.01);
  nitro::TrainingLoop<nitro::amp::Fp16<>> loop{model, optimizer, {.amp = {.init_scale = 1024.0}}};
  const auto first = loop.step(x, [&](const at::Tensor& in) { return model->forward(in).mean(); });
  REQUIRE(first.stepped);
  const auto second = loop.step(x, [&](const at::Tensor& in) {
    return model->forward(in).mean() * std::numeric_limits<double>::infinity();  // backs the scale off
  });
  REQUIRE(second.skipped);
  CHECK(first.loss_scale.item<double>() == 1024.0);
  CHECK(second.loss_scale.item<double>() == 512.0);
  CHECK(loop.scaler().current_scale() == 512.0);
}

TEST_CASE("skip_nonfinite reads the gradients without writing them, and catches NaN as well as inf") {
  const auto versions = [](bool skip_nonfinite) {
    torch::manual_seed(0);
    torch::nn::Linear model(3, 2);
    torch::optim::SGD optimizer(model->parameters(), 0.1);
    std::vector<std::int64_t> seen;
    nitro::TrainingLoop<Versions> loop{model, optimizer, {.clip = {.seen = &seen}, .skip_nonfinite = skip_nonfinite}};
    loop.step(x, [&](const at::Tensor& in) { return model->forward(in).mean(); });
    return seen;
  };
  const auto plain = versions(false), checked = versions(true);
  REQUIRE(plain.size() == 2);
  CHECK(checked == plain);

  torch::nn::Linear model(3, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::level::Basic loop{model, optimizer, {.skip_nonfinite = true}};
  const auto before = model->weight.detach().clone();
  CHECK(loop.step(x, [&](const at::Tensor& in) { return model->forward(in).mean() * NAN; }).skipped);
  CHECK(model->weight.equal(before));
}

TEST_CASE("a failed optimizer step leaves no half-done window: the next steps start a new one") {
  torch::nn::Linear model(3, 1);
  FailingSGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  nitro::TrainingLoop<nitro::accumulate::Fixed<2>> loop{model, optimizer};
  const auto loss = [&](const at::Tensor& in) { return model->forward(in).mean(); };
  CHECK_FALSE(loop.step(x, loss).stepped);
  CHECK_THROWS_AS(loop.step(x, loss), c10::OutOfMemoryError);
  CHECK(loop.pending_micro_batches() == 0);
  CHECK(loop.optimizer_steps() == 0);
  for (const auto& p : model->parameters()) CHECK_FALSE(p.grad().defined());
  CHECK_FALSE(loop.step(x, loss).stepped);  // a new window of two
  CHECK(loop.step(x, loss).stepped);
  CHECK(loop.optimizer_steps() == 1);
}

TEST_CASE("state() and load_state() put the loop's counters, window and loss scale back, and refuse what does not fit") {
  torch::nn::Linear model(3, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.01);
  using Loop = nitro::TrainingLoop<nitro::accumulate::Dynamic, nitro::amp::Fp16<>>;
  Loop loop{model, optimizer, {.amp = {.init_scale = 256.0}, .accumulate = {.steps = 3}}};
  const auto loss = [&](const at::Tensor& in) { return model->forward(in).mean(); };
  const auto saved = loop.state();
  CHECK(saved.accumulation_steps == 3);
  CHECK(saved.pending_micro_batches == 0);
  REQUIRE(saved.loss_scale.has_value());
  CHECK(saved.loss_scale->scale == 256.0);
  for (int i = 0; i < 4; ++i) loop.step(x, loss);
  loop.step(x, [&](const at::Tensor& in) { return loss(in) * std::numeric_limits<double>::infinity(); });
  loop.step(x, loss);
  CHECK(loop.optimizer_steps() == 2);
  CHECK(loop.skipped_steps() == 1);
  CHECK(loop.scaler().current_scale() == 128.0);
  optimizer.zero_grad(true);
  loop.load_state(saved);
  CHECK(loop.optimizer_steps() == 0);
  CHECK(loop.skipped_steps() == 0);
  CHECK(loop.pending_micro_batches() == 0);
  CHECK(loop.scaler().current_scale() == 256.0);

  auto bad = saved;
  bad.pending_micro_batches = 3;
  CHECK_THROWS_WITH_AS(loop.load_state(bad), doctest::Contains("pending_micro_batches"), nitro::Error);
  bad = saved;
  bad.loss_scale.reset();
  CHECK_THROWS_WITH_AS(loop.load_state(bad), doctest::Contains("lacks a loss scale"), nitro::Error);
  bad = saved;
  bad.skipped_steps = 5;
  CHECK_THROWS_WITH_AS(loop.load_state(bad), doctest::Contains("skipped_steps"), nitro::Error);
  bad = saved;
  bad.loss_scale->growth_tracker = -1;
  CHECK_THROWS_AS(loop.load_state(bad), nitro::Error);
  CHECK(loop.scaler().current_scale() == 256.0);  // a refused state changed nothing

  nitro::TrainingLoop<nitro::accumulate::Fixed<2>> fixed{model, optimizer};
  auto other = fixed.state();
  other.accumulation_steps = 3;
  CHECK_THROWS_WITH_AS(fixed.load_state(other), doctest::Contains("only accumulate::Dynamic"), nitro::Error);
}

TEST_CASE("policies in any order make the same loop") {
  const auto run = [](auto loop_tag) {
    using Loop = typename decltype(loop_tag)::type;
    torch::manual_seed(0);
    torch::nn::Linear model(3, 1);
    torch::optim::SGD optimizer(model->parameters(), 0.5);
    Loop loop{model, optimizer, {.clip = {.max_norm = 0.1}}};
    for (int i = 0; i < 4; ++i) loop.step(x, [&](const at::Tensor& in) { return model->forward(in).pow(2).mean(); });
    return model->weight.detach().clone();
  };
  const auto a = run(std::type_identity<nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Fixed<2>, nitro::checkpoint::Off, nitro::clip::Norm>>{});
  const auto b = run(std::type_identity<nitro::TrainingLoop<nitro::clip::Norm, nitro::accumulate::Fixed<2>>>{});
  CHECK(a.equal(b));
}

namespace {
// A function whose backward throws, as a backward running out of memory half way does: the gradient
// of `before` (computed first) has already reached the parameters when it throws.
struct ThrowInBackward : torch::autograd::Function<ThrowInBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list) {
    throw c10::OutOfMemoryError({"backward", __FILE__, __LINE__}, "out of memory in backward (test)");
  }
};
}  // namespace

TEST_CASE("a micro-batch whose backward fails half way leaves nothing of its window behind") {
  torch::nn::Linear model(3, 1), reference(3, 1);
  {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(model->weight);
    reference->bias.copy_(model->bias);
  }
  torch::optim::SGD optimizer(model->parameters(), 0.1), ref_opt(reference->parameters(), 0.1);
  nitro::TrainingLoop<nitro::accumulate::Fixed<2>> loop{model, optimizer}, plain{reference, ref_opt};
  const auto loss = [](torch::nn::Linear& m) { return [&m](const at::Tensor& in) { return m->forward(in).mean(); }; };
  CHECK_FALSE(loop.step(x, loss(model)).stepped);
  CHECK_THROWS_AS(loop.step(x, [&](const at::Tensor& in) {
    // Made first, so its backward runs last (autograd runs later nodes first): the forward's
    // gradients have reached the parameters when it throws.
    const auto failing = ThrowInBackward::apply(model->weight).sum() * 0.0;
    const auto fine = model->forward(in).mean();
    return fine + failing;
  }), c10::OutOfMemoryError);
  CHECK(loop.pending_micro_batches() == 0);
  for (const auto& p : model->parameters()) CHECK_FALSE(p.grad().defined());
  // The next window is a whole new one: the same update as a loop that never saw the failure.
  for (int i = 0; i < 2; ++i) {
    loop.step(x, loss(model));
    plain.step(x, loss(reference));
  }
  CHECK(torch::equal(model->weight, reference->weight));
  CHECK(torch::equal(model->bias, reference->bias));
}

TEST_CASE("skip_nonfinite works on float64 models and never skips finite gradients, however large") {
  torch::nn::Linear model(3, 1);
  model->to(torch::kDouble);
  torch::optim::SGD optimizer(model->parameters(), 1e-80);
  nitro::level::Basic loop{model, optimizer, {.skip_nonfinite = true}};
  const auto xd = x.to(torch::kDouble);
  CHECK(loop.step(xd, [&](const at::Tensor& in) { return model->forward(in).mean(); }).stepped);
  CHECK(loop.step(xd, [&](const at::Tensor& in) { return model->forward(in).mean() * NAN; }).skipped);
  // Gradients of 1e38 each: finite in float32 and float64 alike, though their sum would overflow float32.
  torch::nn::Linear wide(4, 1);
  torch::optim::SGD wide_opt(wide->parameters(), 1e-40);
  nitro::level::Basic guarded{wide, wide_opt, {.skip_nonfinite = true}};
  const auto r = guarded.step(torch::ones({1, 4}), [&](const at::Tensor& in) { return wide->forward(in).sum() * 1e38; });
  CHECK(r.stepped);
  CHECK_FALSE(r.skipped);
}

namespace {
// A loss scaler without a default constructor and a recorder that cannot be moved: both satisfy their
// concepts, so the loop must build them in place.
struct PickyScaler : nitro::StaticLossScale {
  explicit PickyScaler(const Options& o) : nitro::StaticLossScale(o) {}
};
struct PinnedMonitor {
  using family = nitro::family::Monitor;
  static constexpr std::string_view name = "pinned";
  static constexpr bool enabled = true;
  struct Options {};
  struct Recorder {
    Recorder(const Options&, const c10::Device& d) : device(d) {}
    void begin_step() { ++begun; }
    void mark(nitro::Phase) {}
    void end_step(std::int64_t) {}
    std::mutex lock;  // neither movable nor assignable
    c10::Device device;
    int begun = 0;
  };
};
}  // namespace

TEST_CASE("a user's scaler without a default constructor and a recorder that cannot move plug in") {
  static_assert(nitro::LossScaler<PickyScaler> && nitro::MonitorPolicy<PinnedMonitor>);
  torch::nn::Linear model(3, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::TrainingLoop<PinnedMonitor, nitro::amp::Fp16<PickyScaler>> loop{model, optimizer, {.amp = {.scale = 8.0}}};
  CHECK(loop.step(x, [&](const at::Tensor& in) { return model->forward(in).mean(); }).stepped);
  CHECK(loop.monitor().begun == 1);
  CHECK(loop.monitor().device == c10::Device(c10::kCPU));
  CHECK(loop.scaler().current_scale() == 8.0);
}

namespace {
// A user's hook policy with every hook: it logs the points in order, sees the gradients before the
// step (unscaled, before clipping), and asks the caller to stop after the second optimizer step.
struct Recorder {
  using family = nitro::family::Hook;
  static constexpr std::string_view name = "recorder";
  static constexpr bool enabled = true;
  static constexpr bool wants_batch_rows = true;
  struct Options {
    std::vector<std::string>* log = nullptr;
  };
  Recorder(const Options& o, const c10::Device& device) : log(o.log), device(device) {}
  template <class Loop>
  void on_step_begin(Loop& loop) {
    log->push_back("begin " + std::to_string(loop.pending_micro_batches()));
  }
  template <class Loop>
  void after_forward(Loop&, const at::Tensor& loss) {
    log->push_back("forward " + std::to_string(loss.requires_grad()));
  }
  template <class Loop>
  void after_backward(Loop&) {
    log->push_back("backward");
  }
  template <class Loop>
  void before_optimizer_step(Loop&, nitro::detail::GradGroups& grads, nitro::StepResult& r) {
    double total = 0;
    grads.for_each([&](nitro::detail::GradGroups::Group& g) {
      for (const auto& t : g.grads) total += t.abs().sum().item<double>();
    });
    log->push_back("before " + std::to_string(total) + " " + std::to_string(r.grad_norm.defined()));
  }
  template <class Loop>
  void after_optimizer_step(Loop& loop, nitro::StepResult& r) {
    log->push_back("after " + std::to_string(loop.optimizer_steps()) + " " + std::to_string(loop.pending_micro_batches()));
    if (loop.optimizer_steps() == 2) {
      r.stop = true;
      r.stop_reason = "enough";
    }
  }
  template <class Loop>
  void on_step_end(Loop&, nitro::StepResult& r, std::int64_t rows) {
    log->push_back("end " + std::to_string(rows) + " " + std::to_string(r.stepped));
  }
  nitro::StateDict state_dict() const {
    nitro::StateDict s;
    s.integers["entries"] = static_cast<std::int64_t>(log->size());
    return s;
  }
  void load_state_dict(const nitro::StateDict& s) {
    const auto n = s.integer("entries", name);
    NITRO_CHECK(n >= 0, "Recorder: entries must be >= 0");
    loaded = n;
  }
  std::vector<std::string>* log;
  c10::Device device;
  std::int64_t loaded = -1;
};
}  // namespace

TEST_CASE("a user's hook policy is called at each point of the step, in order, with its state in the loop's") {
  torch::nn::Linear model(3, 1);
  {
    torch::NoGradGuard no_grad;
    model->weight.fill_(0.5);
    model->bias.fill_(0.0);
  }
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  std::vector<std::string> log;
  nitro::TrainingLoop<nitro::accumulate::Fixed<2>, Recorder, nitro::clip::Norm> loop{
      model, optimizer, {.clip = {.max_norm = 100.0}, .hooks = {{.log = &log}}}};
  CHECK(loop.hook<Recorder>().device == c10::Device(c10::kCPU));
  const auto loss = [&](const at::Tensor& b) { return model->forward(b).mean(); };
  CHECK_FALSE(loop.step(x, loss).stop);
  const auto r = loop.step(x, loss);
  CHECK_FALSE(r.stop);
  // Gradient of mean(x w + b) over 4 rows of ones, divided by the window of 2, summed over 2
  // micro-batches: dw_j = 1 each (3), db = 1; |grads| summed = 4. The clip hook runs after the
  // user's (its norm is not yet there).
  const std::vector<std::string> first_step{"begin 0",  "forward 1",  "backward", "end 4 0",
                                            "begin 1",  "forward 1",  "backward", "before 4.000000 0",
                                            "after 1 0", "end 4 1"};
  CHECK(log == first_step);
  loop.step(x, loss);
  const auto stopped = loop.step(x, loss);
  CHECK(stopped.stop);
  CHECK(stopped.stop_reason == "enough");
  CHECK(stopped.grad_norm.defined());  // clip ran
  const auto s = loop.state();
  REQUIRE(s.hooks.contains("recorder"));
  CHECK(s.hooks.at("recorder").integers.at("entries") == 20);
  loop.load_state(s);
  CHECK(loop.hook<Recorder>().loaded == 20);
  // A state without the hook's part, or with one this loop lacks, is refused and changes nothing.
  auto missing = s;
  missing.hooks.clear();
  missing.optimizer_steps = 7;
  CHECK_THROWS_WITH_AS(loop.load_state(missing), doctest::Contains("hook policy \"recorder\""), nitro::Error);
  auto extra = s;
  extra.hooks["other"] = {};
  CHECK_THROWS_WITH_AS(loop.load_state(extra), doctest::Contains("\"other\""), nitro::Error);
  auto refused = s;
  refused.hooks["recorder"].integers["entries"] = -1;
  loop.hook<Recorder>().loaded = 5;
  CHECK_THROWS_AS(loop.load_state(refused), nitro::Error);
  CHECK(loop.hook<Recorder>().loaded == 5);
  CHECK(loop.optimizer_steps() == 2);
}

}  // namespace nitro_test_train_loop
