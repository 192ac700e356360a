// ema::Model (train/ema.hpp) against an average written out by hand and against Ultralytics' ModelEMA
// and timm's ModelEmaV2 in Python (tests/train/ema_reference.py); skipped steps, snapshots, swap_into,
// copy_to and the options' checks.
#include <nitro/hw/settings.hpp>
#include <nitro/snapshot/snapshot.hpp>
#include <nitro/train/ema.hpp>
#include <nitro/train/training_loop.hpp>

#include "testing.hpp"

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace nitro_test_train_ema {  // one namespace per file: an area is compiled as one translation unit

namespace {

using nitro::ema::Model;
using EmaLoop = nitro::TrainingLoop<Model>;

// Sequential(Linear(3, 4), BatchNorm1d(4), Linear(4, 2)), weights from sin of aranges (no RNG);
// `k` shifts them, for a model that starts elsewhere.
torch::nn::Sequential make_model(at::ScalarType dtype, double k = 0) {
  torch::nn::Sequential m(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4), torch::nn::Linear(4, 2));
  torch::NoGradGuard no_grad;
  // Module::to(dtype) would make num_batches_tracked floating point too (PyTorch's .double() does not).
  for (auto& t : m->parameters()) t.set_data(t.to(dtype));
  for (auto& t : m->buffers())
    if (t.is_floating_point()) t.set_data(t.to(dtype));
  double i = k;
  for (auto& p : m->parameters()) {
    p.copy_(torch::sin(torch::arange(p.numel(), torch::kDouble) * 0.37 + i).reshape(p.sizes()) * 0.5 + 0.1);
    i += 1;
  }
  return m;
}

at::Tensor batch(int k, at::ScalarType dtype) {
  return (torch::sin(torch::arange(24, torch::kDouble) * 0.3 + k) * 2).reshape({8, 3}).to(dtype);
}

// The loss of step k: the model's output against a target that moves with k.
auto loss_of(const torch::nn::Sequential& model) {
  return [m = model.ptr()](const at::Tensor& b) {
    return (m->forward(b) - torch::cos(b.sum(1, true))).pow(2).mean();
  };
}

// The average written out: plain loops over the model's parameters and buffers, the formula of
// Ultralytics (tau > 0) or of timm's ModelEmaV2 (tau = 0), in double.
struct HandEma {
  double decay, tau;
  std::int64_t every;
  bool average_buffers;
  std::map<std::string, at::Tensor> v;
  std::int64_t updates = 0, taken = 0;

  void start(const torch::nn::Module& model) {
    for (const auto& p : model.named_parameters()) v[p.key()] = p.value().detach().to(torch::kDouble).clone();
    for (const auto& b : model.named_buffers()) {
      const auto m = b.value().detach();
      v[b.key()] = m.is_floating_point() ? m.to(torch::kDouble).clone() : m.clone();
    }
  }
  void after_step(const torch::nn::Module& model) {
    if (++taken % every != 0) return;
    ++updates;
    const double d = tau > 0 ? decay * (1 - std::exp(-static_cast<double>(updates) / tau)) : decay;
    for (const auto& p : model.named_parameters()) {
      const auto m = p.value().detach().to(torch::kDouble);
      v[p.key()] = v[p.key()] * d + (1 - d) * m;
    }
    for (const auto& b : model.named_buffers()) {
      const auto m = b.value().detach();
      if (m.is_floating_point() && average_buffers) v[b.key()] = v[b.key()] * d + (1 - d) * m.to(torch::kDouble);
      else v[b.key()] = m.clone();
    }
  }
};

// Every tensor of the average against the hand-written one: floating point within `rtol` (of double
// rounding), others equal.
void check_against(const Model& ema, const HandEma& hand, double rtol) {
  REQUIRE(ema.named_tensors().size() == hand.v.size());
  for (const auto& [name, t] : ema.named_tensors()) {
    CAPTURE(name);
    REQUIRE(hand.v.contains(name));
    const auto& want = hand.v.at(name);
    CHECK_FALSE(t.requires_grad());
    if (t.is_floating_point()) {
      CHECK(torch::allclose(t.to(torch::kDouble), want.to(torch::kDouble), rtol, rtol));
    } else {
      CHECK(torch::equal(t, want));
    }
  }
}

// Copies of a model's parameters and buffers, by name.
std::map<std::string, at::Tensor> copies(const torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : nitro::ema::detail::named_state(model)) out[name] = t.detach().clone();
  return out;
}

bool have_python() { return std::string(NITRO_TEST_PYTHON).size() > 0; }

}  // namespace

TEST_CASE("ema::Model equals the average written out by hand, with and without tau, every 2, buffers both ways") {
  struct Case {
    double decay, tau;
    std::int64_t every;
    bool average_buffers;
    at::ScalarType dtype;
    double rtol;
  };
  // Double: the same arithmetic but for lerp's rounding; float: the float rounding of 20 updates.
  for (const Case c : {Case{0.9, 0, 1, false, torch::kDouble, 1e-12}, Case{0.9, 3, 1, true, torch::kDouble, 1e-12},
                       Case{0.8, 3, 2, false, torch::kDouble, 1e-12}, Case{0.95, 0, 2, true, torch::kDouble, 1e-12},
                       Case{0.9, 3, 1, true, torch::kFloat, 2e-6}}) {
    CAPTURE(c.decay);
    CAPTURE(c.tau);
    CAPTURE(c.every);
    CAPTURE(c.average_buffers);
    const std::string dtype = c10::toString(c.dtype);
    CAPTURE(dtype);
    auto model = make_model(c.dtype);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    EmaLoop loop{model, optimizer,
                 {.hooks = {Model::Options{.decay = c.decay, .tau = c.tau, .every = c.every,
                                           .average_buffers = c.average_buffers}}}};
    auto& ema = loop.hook<Model>();
    CHECK(ema.named_tensors().empty());
    HandEma hand{c.decay, c.tau, c.every, c.average_buffers, {}};
    hand.start(*model);  // the average starts from the model before training
    for (int k = 0; k < 20; ++k) {
      const double d = c.tau > 0 ? c.decay * (1 - std::exp(-static_cast<double>(hand.updates + 1) / c.tau)) : c.decay;
      CHECK(ema.decay_now() == d);
      const auto r = loop.step(batch(k, c.dtype), loss_of(model));
      REQUIRE(r.stepped);
      hand.after_step(*model);
      CHECK(ema.updates() == hand.updates);
    }
    CHECK(ema.updates() == 20 / c.every);
    CHECK(ema.tensor("1.num_batches_tracked").scalar_type() == torch::kLong);
    check_against(ema, hand, c.rtol);
    // Copied buffers are the model's: the running statistics with average_buffers false, the count always.
    CHECK(torch::equal(ema.tensor("1.num_batches_tracked"), model[1]->named_buffers()["num_batches_tracked"]));
    CHECK(torch::equal(ema.tensor("1.running_mean"), model[1]->named_buffers()["running_mean"]) == !c.average_buffers);
    CHECK_FALSE(torch::equal(ema.tensor("0.weight"), model[0]->named_parameters()["weight"]));
  }
}

namespace {

// Trains `model` (double) for `steps` steps under `options`, writing its state before training and
// after every step into `dir` for tests/train/ema_reference.py; returns the final average.
std::map<std::string, at::Tensor> train_and_write(const std::filesystem::path& dir, int steps,
                                                  const Model::Options& options) {
  auto model = make_model(torch::kDouble);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  EmaLoop loop{model, optimizer, {.hooks = {options}}};
  const auto write = [&](int k) {
    std::ofstream out(dir / ("step" + std::to_string(k) + ".txt"));
    out << std::setprecision(17);
    for (const auto& [name, t] : nitro::ema::detail::named_state(*model)) {
      out << name;
      const auto flat = t.detach().to(torch::kDouble).contiguous();
      for (std::int64_t i = 0; i < flat.numel(); ++i) out << ' ' << flat.data_ptr<double>()[i];
      out << '\n';
    }
  };
  write(0);
  for (int k = 1; k <= steps; ++k) {
    loop.step(batch(k, torch::kDouble), loss_of(model));
    write(k);
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : loop.hook<Model>().named_tensors()) out[name] = t.clone();
  return out;
}

struct PythonRun {
  const char* rule;
  Model::Options options;
};

// Trains one model per run, writes each trajectory into its own directory, runs the reference once
// for all of them (starting Python is the slow part), and compares the final averages.
void check_against_python(const std::vector<PythonRun>& runs) {
  const int steps = 20;
  nitro::test::TempDir dir("nitro-ema", true);
  std::vector<std::map<std::string, at::Tensor>> mine;
  std::ostringstream command;
  command << std::setprecision(17) << '"' << NITRO_TEST_PYTHON
          << "\" \"" NITRO_SOURCE_DIR "/tests/train/ema_reference.py\" " << steps;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const auto run_dir = dir / std::to_string(i);
    std::filesystem::create_directories(run_dir);
    mine.push_back(train_and_write(run_dir, steps, runs[i].options));
    command << " \"" << run_dir.string() << ',' << runs[i].rule << ',' << runs[i].options.decay << ','
            << runs[i].options.tau << ',' << runs[i].options.every << '"';
  }
  command << " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.str().c_str(), "r"), pclose);
  REQUIRE(pipe != nullptr);
  std::string text;
  std::size_t compared = 0;
  char line[1 << 16];
  while (std::fgets(line, sizeof line, pipe.get())) {
    text += line;
    std::istringstream in(line);
    std::size_t run = 0;
    std::string name;
    in >> run >> name;
    std::vector<double> values;
    for (double v; in >> v;) values.push_back(v);
    CAPTURE(run);
    CAPTURE(name);
    REQUIRE(run < runs.size());
    REQUIRE(mine[run].contains(name));
    const auto& t = mine[run].at(name);
    REQUIRE(static_cast<std::int64_t>(values.size()) == t.numel());
    CHECK(torch::allclose(t, torch::tensor(values, torch::kDouble).reshape(t.sizes()), 1e-12, 1e-12));
    ++compared;
  }
  INFO(text);
  CHECK(compared == 8 * runs.size());  // the floating-point entries: 6 parameters, 2 running statistics
}

}  // namespace

TEST_CASE("ema::Model follows Ultralytics' ModelEMA and timm's ModelEmaV2 in Python" *
          doctest::skip(!have_python())) {
  check_against_python({
      {"ultralytics", {.decay = 0.9, .tau = 5, .every = 1, .average_buffers = true}},   // warm-up, every step
      {"ultralytics", {.decay = 0.99, .tau = 3, .every = 2, .average_buffers = true}},  // every 2 steps
      {"timm", {.decay = 0.8, .tau = 0, .every = 1, .average_buffers = true}},          // ModelEmaV2: fixed decay
  });
}

TEST_CASE("ema::Model: skipped steps and micro-batches that do not step leave the average as it was") {
  auto model = make_model(torch::kFloat);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  EmaLoop loop{model, optimizer,
               {.hooks = {Model::Options{.decay = 0.9, .tau = 0, .every = 2}}, .skip_nonfinite = true}};
  auto& ema = loop.hook<Model>();
  const auto nan_loss = [&](const at::Tensor& b) { return loss_of(model)(b) * std::nan(""); };
  // good, NaN (skipped), good: the second good step is the second taken, so the first update.
  CHECK(loop.step(batch(0, torch::kFloat), loss_of(model)).stepped);
  CHECK(ema.updates() == 0);
  auto average = std::map<std::string, at::Tensor>{};
  for (const auto& [name, t] : ema.named_tensors()) average[name] = t.clone();
  CHECK(loop.step(batch(1, torch::kFloat), nan_loss).skipped);
  CHECK(ema.updates() == 0);
  CHECK(loop.step(batch(2, torch::kFloat), loss_of(model)).stepped);
  CHECK(ema.updates() == 1);
  // Now an update is due at every second taken step; a skipped one in between changes nothing.
  for (const auto& [name, t] : ema.named_tensors()) average[name] = t.clone();
  CHECK(loop.step(batch(3, torch::kFloat), nan_loss).skipped);
  CHECK(loop.step(batch(4, torch::kFloat), nan_loss).skipped);
  CHECK(loop.step(batch(5, torch::kFloat), loss_of(model)).stepped);
  CHECK(ema.updates() == 1);
  for (const auto& [name, t] : ema.named_tensors()) {
    CAPTURE(name);
    CHECK(torch::equal(t, average.at(name)));
  }
  CHECK(loop.step(batch(6, torch::kFloat), nan_loss).skipped);
  CHECK(ema.updates() == 1);
  CHECK(loop.step(batch(7, torch::kFloat), loss_of(model)).stepped);
  CHECK(ema.updates() == 2);

  // Accumulation: 6 micro-batches in windows of 3 are 2 optimizer steps, so 2 updates.
  auto m2 = make_model(torch::kFloat);
  torch::optim::SGD o2(m2->parameters(), 0.1);
  nitro::TrainingLoop<nitro::accumulate::Fixed<3>, Model> accumulating{m2, o2, {.hooks = {Model::Options{.tau = 0}}}};
  for (int k = 0; k < 6; ++k) accumulating.step(batch(k, torch::kFloat), loss_of(m2));
  CHECK(accumulating.optimizer_steps() == 2);
  CHECK(accumulating.hook<Model>().updates() == 2);
}

namespace {

const Model::Options snapshot_options{.decay = 0.9, .tau = 3, .every = 2, .average_buffers = true};

struct Run {
  torch::nn::Sequential model;
  torch::optim::Adam optimizer;
  EmaLoop loop;
  explicit Run(double k)
      : model(make_model(torch::kFloat, k)),
        optimizer(model->parameters(), 0.01),
        loop(model, optimizer, {.hooks = {snapshot_options}}) {}
  void steps(int from, int to) {
    for (int k = from; k < to; ++k) loop.step(batch(k, torch::kFloat), loss_of(model));
  }
  Model& ema() { return loop.hook<Model>(); }
};

void check_bitwise(Model& a, Model& b) {
  CHECK(a.updates() == b.updates());
  REQUIRE(a.named_tensors().size() == b.named_tensors().size());
  for (std::size_t i = 0; i < a.named_tensors().size(); ++i) {
    CAPTURE(a.named_tensors()[i].first);
    CHECK(a.named_tensors()[i].first == b.named_tensors()[i].first);
    CHECK(torch::equal(a.named_tensors()[i].second, b.named_tensors()[i].second));
  }
}

}  // namespace

TEST_CASE("ema::Model: a snapshot saves and restores the average exactly, loaded before or after the first step") {
  nitro::hw::ScopedSettings one_thread{{.intra_op_threads = 1}};
  nitro::test::TempDir dir("nitro-ema-snapshot", true);
  Run a(0);
  nitro::snapshot::save(dir / "start.nitro", a.loop);  // before the first step: no tensors yet
  a.steps(0, 5);  // 5 taken steps: 2 updates, 1 pending
  nitro::snapshot::save(dir / "mid.nitro", a.loop);
  a.steps(5, 10);
  CHECK(a.ema().updates() == 5);

  SUBCASE("loaded into a new loop before its first step") {
    Run b(1);
    nitro::snapshot::load(dir / "mid.nitro", b.loop);
    CHECK(b.ema().updates() == 2);
    b.steps(5, 10);
    check_bitwise(a.ema(), b.ema());
  }
  SUBCASE("loaded into a loop that has stepped") {
    Run b(1);
    b.steps(0, 3);
    nitro::snapshot::load(dir / "mid.nitro", b.loop);
    b.steps(5, 10);
    check_bitwise(a.ema(), b.ema());
  }
  SUBCASE("a snapshot from before the first step makes a loop that has stepped take the model again") {
    Run b(1);
    b.steps(0, 3);
    nitro::snapshot::load(dir / "start.nitro", b.loop);
    CHECK(b.ema().named_tensors().empty());
    CHECK(b.ema().updates() == 0);
    b.steps(0, 10);
    check_bitwise(a.ema(), b.ema());
  }
}

TEST_CASE("ema::Model::load_state_dict refuses a state of another model and changes nothing") {
  Run a(0);
  a.steps(0, 4);
  const auto good = a.loop.state();
  const auto before = a.ema().state_dict();

  auto wrong_shape = good;
  wrong_shape.hooks.at("ema").tensors["0.weight"] = torch::zeros({5, 3});
  CHECK_THROWS_WITH_AS(a.loop.load_state(wrong_shape), doctest::Contains("\"0.weight\" has shape [4, 3]"),
                       nitro::Error);
  auto wrong_dtype = good;
  wrong_dtype.hooks.at("ema").tensors["2.bias"] = torch::zeros({2}, torch::kDouble);
  CHECK_THROWS_WITH_AS(a.loop.load_state(wrong_dtype), doctest::Contains("\"2.bias\" is Float"), nitro::Error);
  auto extra = good;
  extra.hooks.at("ema").tensors["3.weight"] = torch::zeros({2});
  CHECK_THROWS_WITH_AS(a.loop.load_state(extra), doctest::Contains("\"3.weight\""), nitro::Error);
  auto missing = good;
  missing.hooks.at("ema").tensors.erase("1.running_var");
  CHECK_THROWS_WITH_AS(a.loop.load_state(missing), doctest::Contains("\"1.running_var\""), nitro::Error);
  auto bad_pending = good;
  bad_pending.hooks.at("ema").integers["pending"] = 2;  // every = 2
  CHECK_THROWS_AS(a.loop.load_state(bad_pending), nitro::Error);
  auto bad_updates = good;
  bad_updates.hooks.at("ema").integers["updates"] = -1;
  CHECK_THROWS_AS(a.loop.load_state(bad_updates), nitro::Error);
  // Nothing changed.
  const auto after = a.ema().state_dict();
  CHECK(after.integers == before.integers);
  for (const auto& [name, t] : before.tensors) {
    CAPTURE(name);
    CHECK(torch::equal(after.tensors.at(name), t));
  }
  // The state_dict is a copy: later updates leave it as it was.
  a.steps(4, 6);
  CHECK_FALSE(torch::equal(a.ema().tensor("0.weight"), before.tensors.at("0.weight")));

  // Before the first step the model is unknown: the first step checks the loaded state against it.
  Run b(1);
  b.loop.load_state(wrong_shape);
  CHECK_THROWS_WITH_AS(b.steps(0, 1), doctest::Contains("\"0.weight\" has shape [4, 3] in the model but [5, 3]"),
                       nitro::Error);
}

TEST_CASE("ema::Model::swap_into puts the training weights back exactly, also on an exception, and copy_to checks the model") {
  Run a(0);
  auto& ema = a.ema();
  CHECK_THROWS_WITH_AS((void)ema.swap_into(*a.model), doctest::Contains("no tensors yet"), nitro::Error);
  a.steps(0, 6);
  const auto training = copies(*a.model);
  std::map<std::string, const void*> storage;
  for (const auto& [name, t] : nitro::ema::detail::named_state(*a.model)) storage[name] = t.data_ptr();
  // The average's outputs, from a copy of the model.
  auto eval_model = make_model(torch::kFloat, 2);
  ema.copy_to(*eval_model);
  eval_model->eval();
  const auto expected = eval_model->forward(batch(0, torch::kFloat));
  {
    auto in_use = ema.swap_into(*a.model);
    for (const auto& [name, t] : nitro::ema::detail::named_state(*a.model)) {
      CAPTURE(name);
      CHECK(torch::equal(t, ema.tensor(name)));
      CHECK(t.data_ptr() == ema.tensor(name).data_ptr());  // no copy
    }
    a.model->eval();
    CHECK(torch::equal(a.model->forward(batch(0, torch::kFloat)), expected));
    a.model->train();
  }
  const auto check_training = [&] {
    for (const auto& [name, t] : nitro::ema::detail::named_state(*a.model)) {
      CAPTURE(name);
      CHECK(torch::equal(t, training.at(name)));
      CHECK(t.data_ptr() == storage.at(name));
    }
  };
  check_training();
  try {
    auto in_use = ema.swap_into(*a.model);
    CHECK(torch::equal(a.model[0]->named_parameters()["weight"], ema.tensor("0.weight")));
    throw std::runtime_error("evaluation failed");
  } catch (const std::runtime_error&) {
  }
  check_training();
  // Training goes on with its own weights: the loop's step still updates the parameters in place.
  a.steps(6, 7);
  CHECK_FALSE(torch::equal(a.model[0]->named_parameters()["weight"], training.at("0.weight")));

  // copy_to: another architecture, another dtype, a missing layer.
  torch::nn::Sequential wider(torch::nn::Linear(3, 5), torch::nn::BatchNorm1d(5), torch::nn::Linear(5, 2));
  CHECK_THROWS_WITH_AS(ema.copy_to(*wider), doctest::Contains("\"0.weight\" has shape [4, 3]"), nitro::Error);
  CHECK_THROWS_WITH_AS((void)ema.swap_into(*wider), doctest::Contains("\"0.weight\""), nitro::Error);
  auto in_double = make_model(torch::kDouble);
  CHECK_THROWS_WITH_AS(ema.copy_to(*in_double), doctest::Contains("\"0.weight\" is Float"), nitro::Error);
  torch::nn::Sequential shorter(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
  CHECK_THROWS_WITH_AS(ema.copy_to(*shorter), doctest::Contains("\"2.weight\""), nitro::Error);
  const auto untouched = copies(*wider);
  CHECK_THROWS_AS(ema.copy_to(*wider), nitro::Error);
  for (const auto& [name, t] : copies(*wider)) CHECK(torch::equal(t, untouched.at(name)));
}

TEST_CASE("ema::Model: every invalid option throws nitro::Error") {
  const c10::Device cpu(c10::kCPU);
  CHECK_THROWS_WITH_AS(Model({.decay = 0}, cpu), doctest::Contains("decay must be in (0, 1)"), nitro::Error);
  CHECK_THROWS_AS(Model({.decay = 1}, cpu), nitro::Error);
  CHECK_THROWS_AS(Model({.decay = -0.5}, cpu), nitro::Error);
  CHECK_THROWS_AS(Model({.decay = 1.5}, cpu), nitro::Error);
  CHECK_THROWS_AS(Model({.decay = std::nan("")}, cpu), nitro::Error);
  CHECK_THROWS_WITH_AS(Model({.tau = -1}, cpu), doctest::Contains("tau must be >= 0"), nitro::Error);
  CHECK_THROWS_AS(Model({.tau = std::nan("")}, cpu), nitro::Error);
  CHECK_THROWS_AS(Model({.tau = INFINITY}, cpu), nitro::Error);
  CHECK_THROWS_WITH_AS(Model({.every = 0}, cpu), doctest::Contains("every must be >= 1"), nitro::Error);
  CHECK_THROWS_AS(Model({.every = -3}, cpu), nitro::Error);
  CHECK_NOTHROW(Model({.decay = 0.5, .tau = 0, .every = 1}, cpu));
  // Through the loop, as a user writes it.
  auto model = make_model(torch::kFloat);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  CHECK_THROWS_AS((EmaLoop{model, optimizer, {.hooks = {Model::Options{.decay = 1.0}}}}), nitro::Error);
}

TEST_CASE("ema::Model in the loop of its banner: amp::Bf16, decay 0.9999, tau 2000") {
  using Loop = nitro::TrainingLoop<nitro::amp::Bf16, nitro::ema::Model>;
  auto model = make_model(torch::kFloat);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  Loop loop{model, optimizer, {.hooks = {nitro::ema::Model::Options{.decay = 0.9999, .tau = 2000}}}};
  const auto start = copies(*model);
  for (int k = 0; k < 3; ++k) loop.step(batch(k, torch::kFloat), loss_of(model));
  auto& ema = loop.hook<nitro::ema::Model>();
  CHECK(ema.updates() == 3);
  CHECK(ema.decay_now() == 0.9999 * (1 - std::exp(-4.0 / 2000)));
  // d = 0.9999 * (1 - exp(-k / 2000)) is about k / 2000: the average is almost the model itself.
  CHECK(torch::allclose(ema.tensor("0.weight"), model[0]->named_parameters()["weight"], 0, 1e-2));
  CHECK_FALSE(torch::equal(ema.tensor("0.weight"), start.at("0.weight")));
  CHECK(ema.tensor("0.weight").scalar_type() == torch::kFloat);
}

TEST_CASE("gpu: ema::Model updates on the GPU without a host-device synchronisation" * nitro::test::needs_gpu()) {
#if NITRO_WITH_CUDA
  auto model = make_model(torch::kFloat);
  model->to(torch::kCUDA);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  EmaLoop loop{model, optimizer, {.hooks = {Model::Options{.decay = 0.9, .tau = 3, .average_buffers = true}}}};
  std::vector<at::Tensor> batches;
  for (int k = 0; k < 6; ++k) batches.push_back(batch(k, torch::kFloat).to(torch::kCUDA));
  HandEma hand{0.9, 3, 1, true, {}};
  hand.start(*model);
  loop.step(batches[0], loss_of(model));  // warm-up: lazy initialisation may synchronise
  hand.after_step(*model);
  c10::cuda::device_synchronize();
  {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);  // a sync throws
    struct Disable {
      ~Disable() { c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED); }
    } disable;
    for (int k = 1; k < 6; ++k) {
      CHECK_NOTHROW(loop.step(batches[k], loss_of(model)));
      hand.after_step(*model);
    }
  }
  const auto& ema = loop.hook<Model>();
  CHECK(ema.updates() == 6);
  CHECK(ema.tensor("0.weight").is_cuda());
  check_against(ema, hand, 1e-5);
#endif
}

}  // namespace nitro_test_train_ema
