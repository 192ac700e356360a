// graph::Capture. Without a GPU, the policy runs with its "direct" engine: everything of a captured
// step but the CUDA graph (warm-ups, static inputs, the step done on the device alone with the skip
// decided there, the host accounting after it, shapes, recapture when the optimizer changed), each
// "replay" running the step's device work again. The GPU cases capture real graphs.
#include <nitro/graph/capture.hpp>
#include <nitro/optim/fused.hpp>
#include <nitro/monitor/phases.hpp>

#include "testing.hpp"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace nitro_test_graph_capture {  // one namespace per file: an area is compiled as one translation unit

namespace {

using Direct = nitro::graph::detail::CaptureImpl<nitro::graph::detail::Engine::direct>;

torch::nn::Sequential make_mlp(std::uint64_t seed, const c10::Device& device = c10::kCPU) {
  torch::manual_seed(seed);
  torch::nn::Sequential m(torch::nn::Linear(6, 16), torch::nn::Functional(torch::tanh), torch::nn::Linear(16, 3));
  m->to(device);
  return m;
}

// Batch k: 8 rows (or `rows`), a fixed function of k.
std::pair<at::Tensor, at::Tensor> batch(int k, std::int64_t rows = 8, const c10::Device& device = c10::kCPU) {
  auto x = torch::sin(torch::arange(rows * 6, torch::kFloat).reshape({rows, 6}) * 0.21 + k);
  auto y = (torch::arange(rows) + k) % 3;
  return {x.to(device), y.to(device)};
}

std::vector<at::Tensor> values(const torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const auto x = a.detach().to(torch::kDouble).cpu(), y = b.detach().to(torch::kDouble).cpu();
  return ((x - y).abs().max() / (y.abs().max() + 1e-30)).item<double>();
}

struct Trajectory {
  std::vector<double> losses, scales;
  std::vector<bool> skipped;
  std::vector<at::Tensor> params;
  std::vector<std::int64_t> adam_steps;
  std::int64_t optimizer_steps = 0, skipped_steps = 0;
};

// `steps` steps of a loop of type Loop over the MLP with optimizer Opt; rows(k) gives batch k's rows,
// infs the steps whose loss is made infinite, lr(k) the learning rate set before step k.
template <class Loop, class Opt, class OptOptions, class Rows, class Lr>
Trajectory run(const OptOptions& options, int steps, Rows rows, const std::set<int>& infs, Lr lr,
               typename Loop::Options loop_options = {}) {
  auto model = make_mlp(3);
  Opt optimizer(model->parameters(), options);
  Loop loop{model, optimizer, std::move(loop_options)};
  Trajectory t;
  for (int k = 0; k < steps; ++k) {
    for (auto& g : optimizer.param_groups()) g.options().set_lr(lr(k));
    const auto r = loop.step(batch(k, rows(k)), [&](const auto& b) {
      auto loss = torch::cross_entropy_loss(model->forward(b.first), b.second);
      return infs.count(k) ? loss * std::numeric_limits<double>::infinity() : loss;
    });
    t.losses.push_back(r.loss.template item<double>());
    t.scales.push_back(r.loss_scale.defined() ? r.loss_scale.template item<double>() : 0.0);
    t.skipped.push_back(r.skipped);
    CHECK(r.stepped != r.skipped);
    CHECK(loop.pending_micro_batches() == 0);
  }
  for (const auto& p : model->parameters()) {
    CHECK_FALSE(p.grad().defined());  // as after an eager step: none left behind
    const auto it = optimizer.state().find(p.unsafeGetTensorImpl());
    if constexpr (std::is_same_v<Opt, nitro::optim::FusedAdamW>)
      t.adam_steps.push_back(it == optimizer.state().end() ? -1 : static_cast<torch::optim::AdamWParamState&>(*it->second).step());
  }
  t.params = values(*model);
  t.optimizer_steps = loop.optimizer_steps();
  t.skipped_steps = loop.skipped_steps();
  return t;
}

void check_same(const Trajectory& a, const Trajectory& b, double rtol) {
  REQUIRE(a.losses.size() == b.losses.size());
  for (std::size_t k = 0; k < a.losses.size(); ++k) {
    CAPTURE(k);
    if (std::isfinite(b.losses[k])) CHECK(a.losses[k] == doctest::Approx(b.losses[k]).epsilon(rtol));
  }
  CHECK(a.scales == b.scales);  // powers of two: exact
  CHECK(a.skipped == b.skipped);
  CHECK(a.adam_steps == b.adam_steps);
  CHECK(a.optimizer_steps == b.optimizer_steps);
  CHECK(a.skipped_steps == b.skipped_steps);
  for (std::size_t i = 0; i < b.params.size(); ++i) {
    CAPTURE(i);
    CHECK(max_rel_diff(a.params[i], b.params[i]) <= rtol);
  }
}

// 16 steps alternating between batches of `a` and `b` rows (a first): 8-row batches train the whole
// MLP, 5-row ones its first layer alone (the last layer gets no gradient: no update, no step). The
// optimizer has two parameter groups of the same options, the first layer's and the last layer's;
// change(k, optimizer), when given, runs before step k. Returns the parameters, each one's host step
// count (AdamW's state) and, with Hook (the capture policy in Loop), its counts.
struct Alternated {
  std::vector<at::Tensor> params;
  std::vector<std::int64_t> steps;
  std::int64_t eager = -1, captures = -1, replays = -1, graphs = -1;
};
template <class Loop, class Hook = void>
Alternated alternate(std::int64_t a, std::int64_t b, const c10::Device& device = c10::kCPU,
                     const std::function<void(int, nitro::optim::FusedAdamW&)>& change = {}) {
  auto model = make_mlp(3, device);
  const torch::optim::AdamWOptions options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(model[0]->parameters(), std::make_unique<torch::optim::AdamWOptions>(options));
  groups.emplace_back(model[2]->parameters(), std::make_unique<torch::optim::AdamWOptions>(options));
  nitro::optim::FusedAdamW optimizer(groups, options);
  Loop loop{model, optimizer};
  auto* first = model[0]->as<torch::nn::Linear>();
  const auto loss = [&](const auto& x) {
    if (x.first.size(0) == 5) return torch::tanh(first->forward(x.first)).pow(2).mean();
    return torch::cross_entropy_loss(model->forward(x.first), x.second);
  };
  for (int k = 0; k < 16; ++k) {
    if (change) change(k, optimizer);
    loop.step(batch(k, k % 2 == 0 ? a : b, device), loss);
  }
  CHECK(loop.optimizer_steps() == 16);
  Alternated out;
  if constexpr (!std::is_void_v<Hook>) {
    const auto& c = loop.template hook<Hook>();
    out.eager = c.eager_steps(), out.captures = c.captures(), out.replays = c.replays(), out.graphs = c.graphs();
  }
  for (const auto& p : model->parameters())
    out.steps.push_back(static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(p.unsafeGetTensorImpl())).step());
  out.params = values(*model);
  return out;
}

// What only the 8-row graph's step covers, changed before step 11 (an 8-row step right after a
// replay of the 5-row graph, with a = 5, b = 8): the Adam state of the last layer's weight replaced
// (as a load of it would), or the last layer's group's learning rate (a number in the graph on the
// CPU, and for double parameters on a GPU).
void replace_last_state(int k, nitro::optim::FusedAdamW& optimizer) {
  if (k != 11) return;
  const auto& p = optimizer.param_groups()[1].params()[0];
  auto& st = static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(p.unsafeGetTensorImpl()));
  st.exp_avg(st.exp_avg().mul(0.5));
}
void change_last_lr(int k, nitro::optim::FusedAdamW& optimizer) {
  if (k == 11) optimizer.param_groups()[1].options().set_lr(3e-3);
}

const auto eight = [](int) -> std::int64_t { return 8; };
const auto fixed_lr = [](int) { return 1e-2; };

}  // namespace

TEST_CASE("graph::Capture (direct engine): warm-up, capture, replays follow the eager loop step for step") {
  using Eager = nitro::TrainingLoop<nitro::amp::Off>;
  using Captured = nitro::TrainingLoop<nitro::amp::Off, Direct>;
  const torch::optim::AdamWOptions o(1e-2);
  const auto ref = run<Eager, nitro::optim::FusedAdamW>(o, 12, eight, {}, fixed_lr);
  auto model = make_mlp(3);
  nitro::optim::FusedAdamW optimizer(model->parameters(), o);
  Captured loop{model, optimizer, {.hooks = {Direct::Options{.warmup = 2}}}};
  for (int k = 0; k < 12; ++k)
    loop.step(batch(k), [&](const auto& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); });
  const auto& capture = loop.hook<Direct>();
  CHECK(capture.eager_steps() == 2);
  CHECK(capture.captures() == 1);
  CHECK(capture.replays() == 9);
  CHECK(capture.graphs() == 1);
  const auto got = values(*model);
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(max_rel_diff(got[i], ref.params[i]) <= 1e-6);
  CHECK(loop.optimizer_steps() == 12);
  for (const auto& p : model->parameters())
    CHECK(static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(p.unsafeGetTensorImpl())).step() == 12);

  // The full trajectory (losses, steps) with a learning rate that changes every step (on the CPU the
  // kernels take it as a number, so each change captures again; on a GPU they read it from a tensor).
  const auto schedule = [](int k) { return 1e-2 / (1.0 + k); };
  check_same(run<Captured, nitro::optim::FusedAdamW>(o, 15, eight, {}, schedule),
             run<Eager, nitro::optim::FusedAdamW>(o, 15, eight, {}, schedule), 1e-6);
}

namespace {
// Steps with another backward through the model after each (a GAN's generator loss through its
// discriminator): the parameters after 10 steps, and the replays made.
template <class Loop>
std::pair<std::vector<at::Tensor>, std::int64_t> steps_between_other_backwards(typename Loop::Options options) {
  auto model = make_mlp(3);
  nitro::optim::FusedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  Loop loop{model, optimizer, options};
  for (int k = 0; k < 10; ++k) {
    loop.step(batch(k), [&](const auto& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); });
    model->forward(batch(k + 100).first).square().sum().backward();  // leaves gradients on the model
  }
  std::int64_t replays = 0;
  if constexpr (!std::is_same_v<Loop, nitro::TrainingLoop<nitro::amp::Off>>) replays = loop.template hook<Direct>().replays();
  return {values(*model), replays};
}
}  // namespace

TEST_CASE("graph::Capture (direct engine): gradients another backward left on the model are released before a replay, as before an eager step") {
  const auto eager = steps_between_other_backwards<nitro::TrainingLoop<nitro::amp::Off>>({});
  const auto captured = steps_between_other_backwards<nitro::TrainingLoop<nitro::amp::Off, Direct>>(
      {.hooks = {Direct::Options{.warmup = 2}}});
  CHECK(captured.second == 7);
  for (std::size_t i = 0; i < eager.first.size(); ++i) CHECK(max_rel_diff(captured.first[i], eager.first[i]) <= 1e-6);
}

TEST_CASE("graph::Capture (direct engine) with amp::Fp16: inf steps skipped on the device, scale and counters as eager") {
  const std::set<int> infs{1, 5, 6, 11};  // 1: a warm-up step; 5, 6, 11: replays
  const torch::optim::AdamWOptions adamw(1e-2);
  typename nitro::TrainingLoop<nitro::amp::Fp16<>>::Options eager_options{.amp = {.init_scale = 4096.0, .growth_interval = 3}};
  typename nitro::TrainingLoop<nitro::amp::Fp16<>, Direct>::Options captured_options{
      .amp = {.init_scale = 4096.0, .growth_interval = 3}};
  SUBCASE("scaler folded into the kernels (no clipping)") {
    const auto ref = run<nitro::TrainingLoop<nitro::amp::Fp16<>>, nitro::optim::FusedAdamW>(adamw, 16, eight, infs,
                                                                                            fixed_lr, eager_options);
    const auto got = run<nitro::TrainingLoop<nitro::amp::Fp16<>, Direct>, nitro::optim::FusedAdamW>(
        adamw, 16, eight, infs, fixed_lr, captured_options);
    check_same(got, ref, 1e-6);
    CHECK(got.skipped_steps == 4);
    CHECK(got.adam_steps.front() == 12);
  }
  SUBCASE("unscaled first, then clipped (clip::Norm)") {
    using E = nitro::TrainingLoop<nitro::amp::Fp16<>, nitro::clip::Norm>;
    using C = nitro::TrainingLoop<nitro::amp::Fp16<>, nitro::clip::Norm, Direct>;
    typename E::Options eo{.amp = {.init_scale = 4096.0, .growth_interval = 3}, .clip = {.max_norm = 0.05}};
    typename C::Options co{.amp = {.init_scale = 4096.0, .growth_interval = 3}, .clip = {.max_norm = 0.05}};
    check_same(run<C, nitro::optim::FusedAdamW>(adamw, 16, eight, infs, fixed_lr, co),
               run<E, nitro::optim::FusedAdamW>(adamw, 16, eight, infs, fixed_lr, eo), 1e-6);
  }
  SUBCASE("FusedSGD with momentum: an update proportional to the gradient shows a missing or double unscale") {
    const torch::optim::SGDOptions sgd = torch::optim::SGDOptions(0.1).momentum(0.9);
    check_same(run<nitro::TrainingLoop<nitro::amp::Fp16<>, Direct>, nitro::optim::FusedSGD>(sgd, 16, eight, infs,
                                                                                            fixed_lr, captured_options),
               run<nitro::TrainingLoop<nitro::amp::Fp16<>>, nitro::optim::FusedSGD>(sgd, 16, eight, infs, fixed_lr,
                                                                                   eager_options),
               1e-6);
  }
  SUBCASE("amp::Off with skip_nonfinite: the skip is the kernels'") {
    using E = nitro::TrainingLoop<nitro::amp::Off>;
    using C = nitro::TrainingLoop<nitro::amp::Off, Direct>;
    const auto got = run<C, nitro::optim::FusedAdamW>(adamw, 16, eight, infs, fixed_lr, {.skip_nonfinite = true});
    check_same(got, run<E, nitro::optim::FusedAdamW>(adamw, 16, eight, infs, fixed_lr, {.skip_nonfinite = true}), 1e-6);
    CHECK(got.skipped_steps == 4);
  }
}

TEST_CASE("graph::Capture (direct engine): each shape its own capture up to max_graphs, other shapes eager") {
  // Epochs of 3 full batches and a last one of 5 rows; a third shape (3 rows) now and then.
  const auto rows = [](int k) -> std::int64_t { return k % 7 == 6 ? 3 : (k % 4 == 3 ? 5 : 8); };
  using Eager = nitro::TrainingLoop<>;
  using Captured = nitro::TrainingLoop<Direct>;
  const torch::optim::SGDOptions sgd = torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true);
  check_same(run<Captured, nitro::optim::FusedSGD>(sgd, 40, rows, {}, fixed_lr),
             run<Eager, nitro::optim::FusedSGD>(sgd, 40, rows, {}, fixed_lr), 1e-6);

  auto model = make_mlp(3);
  nitro::optim::FusedSGD optimizer(model->parameters(), sgd);
  Captured loop{model, optimizer, {.hooks = {Direct::Options{.warmup = 1, .max_graphs = 2}}}};
  for (int k = 0; k < 40; ++k)
    loop.step(batch(k, rows(k)), [&](const auto& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); });
  const auto& c = loop.hook<Direct>();
  CHECK(c.graphs() == 2);
  CHECK(c.captures() == 2);
  CHECK(c.captures() + c.replays() + c.eager_steps() == 40);
  // Eager: the warm-up of each shape (8 rows at k = 0, 5 at k = 3, 3 at k = 6), and the 3-row steps
  // once both graphs exist (k = 13, 20, 27, 34).
  CHECK(c.eager_steps() == 3 + 4);
  // reset(): no graph left, and a shape warms up again before its next capture.
  loop.hook<Direct>().reset();
  CHECK(c.graphs() == 0);
  for (int k = 0; k < 3; ++k)
    loop.step(batch(k, 8), [&](const auto& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); });
  CHECK(c.eager_steps() == 3 + 4 + 1);
  CHECK(c.captures() == 3);
  CHECK(c.graphs() == 1);
}

TEST_CASE("graph::Capture (direct engine): two graphs over different parameters, stepped alternately, follow the eager loop") {
  // Each shape is a graph of its own, and their steps alternate: each replay must advance the host
  // step counters (the optimizer's state: what a snapshot saves and a resumed run's bias correction
  // starts from) of its own graph's parameters, whichever graph was captured last. Both orders: the
  // last capture updating fewer parameters than the other graph (the others' counters left behind:
  // 4 for 8) and more (counters advanced without an update: 12 for 8).
  for (const auto& [a, b] : {std::pair<std::int64_t, std::int64_t>{8, 5}, {5, 8}}) {
    CAPTURE(a);
    const auto got = alternate<nitro::TrainingLoop<Direct>, Direct>(a, b);
    const auto ref = alternate<nitro::TrainingLoop<>>(a, b);
    CHECK(got.eager == 6);  // three warm-ups per shape, a capture each, then replays
    CHECK(got.captures == 2);
    CHECK(got.replays == 8);
    CHECK(got.graphs == 2);
    CHECK(ref.steps == std::vector<std::int64_t>{16, 16, 8, 8});  // first layer every step, last layer the 8-row ones
    CHECK(got.steps == ref.steps);
    for (std::size_t i = 0; i < ref.params.size(); ++i) {
      CAPTURE(i);
      CHECK(max_rel_diff(got.params[i], ref.params[i]) <= 1e-6);
    }
  }
}

TEST_CASE("graph::Capture (direct engine): two graphs: a change to what only one graph's step uses is seen before that graph's replay") {
  // Each graph's step is checked against its own record of what it captured, not the record of the
  // graph replayed last (the 5-row one's here, which covers neither change): the 8-row graph is
  // captured again at step 11, the 5-row one replays on, and the training follows the eager loop's.
  // (This engine runs the step again at each replay, so a stale graph would still compute the right
  // numbers here: the capture count is what shows it; on a GPU the numbers would show it too.)
  for (const auto& [what, change] : {std::pair<std::string, void (*)(int, nitro::optim::FusedAdamW&)>{
                                         "state replaced", replace_last_state},
                                     {"learning rate taken as a number", change_last_lr}}) {
    CAPTURE(what);
    const auto got = alternate<nitro::TrainingLoop<Direct>, Direct>(5, 8, c10::kCPU, change);
    const auto ref = alternate<nitro::TrainingLoop<>>(5, 8, c10::kCPU, change);
    CHECK(got.eager == 6);
    CHECK(got.captures == 3);  // steps 6 (5 rows) and 7 (8 rows); 11 (8 rows) again
    CHECK(got.replays == 7);
    CHECK(got.graphs == 2);
    CHECK(got.steps == ref.steps);
    for (std::size_t i = 0; i < ref.params.size(); ++i) {
      CAPTURE(i);
      CHECK(max_rel_diff(got.params[i], ref.params[i]) <= 1e-6);
    }
  }
}

TEST_CASE("graph::Capture (direct engine): state replaced under it (torch::load) is seen and the step captured again") {
  using Captured = nitro::TrainingLoop<Direct>;
  using Eager = nitro::TrainingLoop<>;
  const torch::optim::AdamWOptions o(1e-2);
  const auto go = [&](auto tag) {
    using Loop = typename decltype(tag)::type;
    auto model = make_mlp(3);
    nitro::optim::FusedAdamW optimizer(model->parameters(), o);
    Loop loop{model, optimizer};
    std::string saved;
    for (int k = 0; k < 14; ++k) {
      if (k == 6) {  // saved here, loaded back at step 10: new state tensors, an earlier step count
        torch::serialize::OutputArchive archive;
        optimizer.save(archive);
        std::ostringstream out;
        archive.save_to(out);
        saved = out.str();
      }
      if (k == 10) {
        torch::serialize::InputArchive archive;
        std::istringstream in(saved);
        archive.load_from(in);
        optimizer.load(archive);
      }
      if (k == 12) optimizer.param_groups()[0].options().set_lr(3e-3);
      if (k == 12) static_cast<torch::optim::AdamWOptions&>(optimizer.param_groups()[0].options()).weight_decay(0.1);
      loop.step(batch(k), [&](const auto& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); });
    }
    std::vector<std::int64_t> steps;
    for (const auto& p : model->parameters())
      steps.push_back(static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(p.unsafeGetTensorImpl())).step());
    if constexpr (std::is_same_v<Loop, Captured>) {
      CHECK(loop.template hook<Direct>().captures() == 3);  // at step 3, after the load (10), after the decay (12)
    }
    return std::make_pair(values(*model), steps);
  };
  const auto [gp, gs] = go(std::type_identity<Captured>{});
  const auto [rp, rs] = go(std::type_identity<Eager>{});
  CHECK(gs == rs);
  CHECK(gs.front() == 10);  // 6 saved + 4 after the load
  for (std::size_t i = 0; i < rp.size(); ++i) CHECK(max_rel_diff(gp[i], rp[i]) <= 1e-6);
}

TEST_CASE("optim::FusedStep::step_on_device: found_inf 1 changes nothing, the host step moves only with advance_host") {
  auto model = make_mlp(4);
  nitro::optim::FusedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2).amsgrad(true));
  auto grads = [&] {
    for (auto& p : model->parameters()) p.mutable_grad() = torch::ones_like(p) * 0.5;
  };
  grads();
  optimizer.step();  // makes the state
  grads();
  nitro::optim::FusedStep& fused = optimizer;
  CHECK_FALSE(fused.prepare_device_step());  // nothing captured yet
  const auto before = values(*model);
  fused.step_on_device(nullptr, torch::ones({}));  // skipped on the device
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(torch::equal(model->parameters()[i], before[i]));
  CHECK(fused.prepare_device_step());
  fused.advance_host(false);
  const auto p0 = model->parameters()[0];
  CHECK(static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(p0.unsafeGetTensorImpl())).step() == 1);
  fused.step_on_device(nullptr, torch::zeros({}));  // taken
  fused.advance_host(true);
  CHECK(static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(p0.unsafeGetTensorImpl())).step() == 2);
  CHECK_FALSE(torch::equal(p0, before[0]));
  // The same two steps eagerly give the same parameters: the skipped one left no trace (the device
  // counters were put back).
  auto twin = make_mlp(4);
  nitro::optim::FusedAdamW reference(twin->parameters(), torch::optim::AdamWOptions(1e-2).amsgrad(true));
  for (int k = 0; k < 2; ++k) {
    for (auto& p : twin->parameters()) p.mutable_grad() = torch::ones_like(p) * 0.5;
    reference.step();
  }
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(max_rel_diff(model->parameters()[i], twin->parameters()[i]) <= 1e-6);
  CHECK(fused.prepare_device_step());
  // A state tensor replaced: not intact any more. A parameter without state: refused on the device.
  auto& st = static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(p0.unsafeGetTensorImpl()));
  st.exp_avg(st.exp_avg().clone());
  CHECK_FALSE(fused.prepare_device_step());
  optimizer.state().erase(p0.unsafeGetTensorImpl());
  REQUIRE_THROWS_WITH_AS(fused.step_on_device(nullptr, torch::zeros({})),
                         doctest::Contains("has no optimizer state yet"), nitro::Error);
  CHECK(optimizer.state().count(p0.unsafeGetTensorImpl()) == 0);  // not made by the refused step
  // SGD: a parameter without a momentum buffer is refused likewise.
  nitro::optim::FusedSGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  grads();
  REQUIRE_THROWS_WITH_AS(sgd.step_on_device(nullptr, torch::zeros({})), doctest::Contains("no momentum buffer"),
                         nitro::Error);
  CHECK(sgd.state().empty());
}

TEST_CASE("graph::Capture: what it cannot take is refused with a nitro::Error") {
  auto model = make_mlp(5);
  nitro::optim::FusedAdamW fused(model->parameters(), torch::optim::AdamWOptions(1e-2));
#if NITRO_WITH_CUDA
  // A CUDA graph needs the model on a GPU.
  using Real = nitro::TrainingLoop<nitro::graph::Capture>;
  REQUIRE_THROWS_WITH_AS((Real{model, fused}), doctest::Contains("CUDA graphs capture GPU work"), nitro::Error);
#endif
  using Captured = nitro::TrainingLoop<Direct>;
  REQUIRE_THROWS_WITH_AS((Captured{model, fused, {.hooks = {Direct::Options{.warmup = 0}}}}),
                         doctest::Contains("warmup must be >= 1"), nitro::Error);
  REQUIRE_THROWS_WITH_AS((Captured{model, fused, {.hooks = {Direct::Options{.max_graphs = 0}}}}),
                         doctest::Contains("max_graphs must be >= 1"), nitro::Error);
  // torch::optim's optimizers keep the step on the host.
  torch::optim::AdamW plain(model->parameters(), torch::optim::AdamWOptions(1e-2));
  Captured loop{model, plain, {.hooks = {Direct::Options{.warmup = 1}}}};
  const auto loss = [&](const auto& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); };
  REQUIRE_THROWS_WITH_AS(loop.step(batch(0), loss), doctest::Contains("needs a fused optimizer"), nitro::Error);
  // A batch tensor on another device than the model's (here: a meta tensor, the model on the CPU).
  Captured other{model, fused};
  const auto on_meta = std::make_pair(torch::empty({8, 6}, torch::kMeta), torch::empty({8}, torch::kMeta));
  REQUIRE_THROWS_WITH_AS(other.step(on_meta, loss), doctest::Contains("a graph reads its inputs from the GPU"),
                         nitro::Error);
}

TEST_CASE("graph::Capture (direct engine): the monitor counts every step and its samples") {
  using Loop = nitro::TrainingLoop<nitro::monitor::Phases, Direct>;
  auto model = make_mlp(6);
  nitro::optim::FusedSGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  Loop loop{model, optimizer, {.monitor = {.warmup_steps = 0}}};
  for (int k = 0; k < 9; ++k)
    loop.step(batch(k), [&](const auto& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); });
  const auto& totals = loop.monitor().totals();
  CHECK(totals.steps == 9);  // 3 warm-ups, the capture, 5 replays
  CHECK(totals.samples == 72);
  CHECK(totals.phase_ms[static_cast<int>(nitro::Phase::optimizer)] > 0);
}

TEST_CASE("graph::Capture (direct engine): state missing at capture (Fp16 warm-ups all skipped, a group added, layers unfrozen) means an eager step, then a capture") {
  using E = nitro::TrainingLoop<nitro::amp::Fp16<>>;
  using C = nitro::TrainingLoop<nitro::amp::Fp16<>, Direct>;
  const torch::optim::AdamWOptions adamw(1e-2);
  // Steps 0 to 4 overflow: no eager step has made Adam's state when the capture comes (step 3).
  const std::set<int> infs{0, 1, 2, 3, 4, 9};
  const auto got = run<C, nitro::optim::FusedAdamW>(adamw, 14, eight, infs, fixed_lr, {.amp = {.growth_interval = 4}});
  check_same(got, run<E, nitro::optim::FusedAdamW>(adamw, 14, eight, infs, fixed_lr, {.amp = {.growth_interval = 4}}), 1e-6);
  CHECK(got.skipped_steps == 6);

  // The first layer frozen, then unfrozen at step 8 (its parameters have no state then); the model
  // put in eval mode at step 11 and back at 12: each change seen, the step captured again.
  const auto go = [&](auto tag) {
    using Loop = typename decltype(tag)::type;
    auto model = make_mlp(7);
    for (auto& p : model[0]->parameters()) p.requires_grad_(false);
    nitro::optim::FusedAdamW optimizer(model->parameters(), adamw);
    Loop loop{model, optimizer};
    for (int k = 0; k < 16; ++k) {
      if (k == 8)
        for (auto& p : model[0]->parameters()) p.requires_grad_(true);
      if (k == 11) model->eval();
      if (k == 12) model->train();
      loop.step(batch(k), [&](const auto& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); });
    }
    if constexpr (std::is_same_v<Loop, nitro::TrainingLoop<Direct>>) {
      const auto& c = loop.template hook<Direct>();
      CHECK(c.captures() == 4);     // step 3; 9 (after 8's eager step made the new state); 11; 12
      CHECK(c.eager_steps() == 4);  // 3 warm-ups; step 8
    }
    return values(*model);
  };
  const auto a = go(std::type_identity<nitro::TrainingLoop<Direct>>{});
  const auto b = go(std::type_identity<nitro::TrainingLoop<>>{});
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(max_rel_diff(a[i], b[i]) <= 1e-6);
}

TEST_CASE("graph::Capture (direct engine): an optimizer state replaced under one graph is let go by every graph it concerns") {
  // Two graphs (5 rows: a loss of the first layer only; 8 rows: the whole model), both over the first
  // layer. Its optimizer state replaced (as a load does) before a 5-row step: that graph is captured
  // again, and the 8-row graph, whose step read the old tensors too, must not keep them alive until
  // its shape comes again (it may never).
  using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  auto model = make_mlp(3);
  const torch::optim::AdamWOptions options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(model[0]->parameters(), std::make_unique<torch::optim::AdamWOptions>(options));
  groups.emplace_back(model[2]->parameters(), std::make_unique<torch::optim::AdamWOptions>(options));
  nitro::optim::FusedAdamW optimizer(groups, options);
  nitro::TrainingLoop<Direct> loop{model, optimizer};
  auto* first = model[0]->as<torch::nn::Linear>();
  const auto loss = [&](const auto& x) {
    if (x.first.size(0) == 5) return torch::tanh(first->forward(x.first)).pow(2).mean();
    return torch::cross_entropy_loss(model->forward(x.first), x.second);
  };
  std::optional<WeakImpl> old_avg, old_sq;
  for (int k = 0; k < 11; ++k) {
    if (k == 10) {
      const auto& p = optimizer.param_groups()[0].params()[0];
      auto& st = static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(p.unsafeGetTensorImpl()));
      old_avg.emplace(st.exp_avg().getIntrusivePtr());
      old_sq.emplace(st.exp_avg_sq().getIntrusivePtr());
      st.exp_avg(st.exp_avg().clone());
      st.exp_avg_sq(st.exp_avg_sq().clone());
    }
    loop.step(batch(k, k % 2 == 0 ? 5 : 8), loss);
  }
  CHECK(old_avg->expired());
  CHECK(old_sq->expired());
  CHECK(loop.hook<Direct>().graphs() == 1);  // the 5-row graph, captured again; the 8-row one dropped
}

TEST_CASE("graph::Capture (direct engine): a shape is also the loss function's type, out of memory at a capture is tried again, another error makes the shape eager") {
  auto model = make_mlp(8);
  nitro::optim::FusedSGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  nitro::TrainingLoop<Direct> loop{model, optimizer, {.hooks = {Direct::Options{.warmup = 1}}}};
  const auto& c = loop.hook<Direct>();
  const auto ce = [&](const auto& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); };
  const auto sq = [&](const auto& b) { return model->forward(b.first).square().mean(); };
  for (int k = 0; k < 8; ++k) {
    if (k % 2) loop.step(batch(k), sq);
    else loop.step(batch(k), ce);
  }
  CHECK(c.graphs() == 2);  // one per loss function, same batch shape
  CHECK(c.captures() == 2);
  CHECK(c.replays() == 4);

  // Out of memory at the capture of a new shape: the error reaches the caller as it is, and the next
  // step of that shape captures. Another error: that shape is eager from then on.
  int calls = 0;
  const auto oom_once = [&](const auto& b) {
    if (++calls == 2) throw std::bad_alloc();  // the second call is the capture (after one warm-up)
    return torch::cross_entropy_loss(model->forward(b.first), b.second);
  };
  nitro::TrainingLoop<Direct> fresh{model, optimizer, {.hooks = {Direct::Options{.warmup = 1}}}};
  fresh.step(batch(0, 6), oom_once);
  CHECK_THROWS_AS(fresh.step(batch(1, 6), oom_once), std::bad_alloc);
  fresh.step(batch(2, 6), oom_once);
  CHECK(fresh.hook<Direct>().captures() == 1);
  CHECK(fresh.pending_micro_batches() == 0);
  int other_calls = 0;
  const auto fails_once = [&](const auto& b) {
    if (++other_calls == 2) throw std::runtime_error("a user's error");
    return torch::cross_entropy_loss(model->forward(b.first), b.second);
  };
  nitro::TrainingLoop<Direct> third{model, optimizer, {.hooks = {Direct::Options{.warmup = 1}}}};
  third.step(batch(0, 5), fails_once);
  CHECK_THROWS_WITH(third.step(batch(1, 5), fails_once), "a user's error");
  for (int k = 2; k < 5; ++k) third.step(batch(k, 5), fails_once);
  CHECK(third.hook<Direct>().captures() == 0);
  CHECK(third.hook<Direct>().eager_steps() == 4);
  for (const auto& p : model->parameters()) CHECK_FALSE(p.grad().defined());
}

// ---- on a GPU: real graphs -----------------------------------------------------------------------
#if NITRO_WITH_CUDA

namespace {

struct SmallCnn : torch::nn::Module {
  SmallCnn()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1)))),
        drop(register_module("drop", torch::nn::Dropout(0.2))),
        fc(register_module("fc", torch::nn::Linear(16, 10))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto y = torch::relu(conv1(x));
    y = torch::relu(conv2(y));
    y = drop(torch::adaptive_avg_pool2d(y, {1, 1}).flatten(1));
    return fc(y);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Dropout drop;
  torch::nn::Linear fc;
};

// The same steps with and without graph::Capture on the GPU; returns the parameters of each.
template <class Model, class Make, class Batch, class Loss>
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> both_ways(Make make, Batch make_batch, Loss loss, int steps) {
  const c10::Device cuda(c10::kCUDA, 0);
  std::vector<at::Tensor> out[2];
  for (int graphed = 0; graphed < 2; ++graphed) {
    auto model = make();
    model->to(cuda);
    nitro::optim::FusedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
    torch::manual_seed(100);  // the same dropout masks both ways (default generator, graph-safe in the graph)
    const auto f = [&](const auto& b) { return loss(*model, b); };
    if (graphed) {
      nitro::TrainingLoop<nitro::graph::Capture> loop{model, optimizer};
      for (int k = 0; k < steps; ++k) loop.step(make_batch(k), f);
      CHECK(loop.hook<nitro::graph::Capture>().replays() == steps - 4);
    } else {
      nitro::TrainingLoop<> loop{model, optimizer};
      for (int k = 0; k < steps; ++k) loop.step(make_batch(k), f);
    }
    out[graphed] = values(*model);
  }
  return {out[0], out[1]};
}

}  // namespace

TEST_CASE("gpu: graph::Capture replays an MLP and a CNN with dropout as the eager steps go" * nitro::test::needs_gpu()) {
  const c10::Device cuda(c10::kCUDA, 0);
  const auto [eager, graphed] = both_ways<torch::nn::SequentialImpl>(
      [] { return make_mlp(8).ptr(); }, [&](int k) { return batch(k, 64, cuda); },
      [](auto& m, const auto& b) { return torch::cross_entropy_loss(m.forward(b.first), b.second); }, 30);
  for (std::size_t i = 0; i < eager.size(); ++i) CHECK(max_rel_diff(graphed[i], eager[i]) <= 1e-5);
  const auto [ce, cg] = both_ways<SmallCnn>(
      [] {
        torch::manual_seed(9);
        return std::make_shared<SmallCnn>();
      },
      [&](int k) {
        return std::make_pair(torch::sin(torch::arange(16 * 3 * 12 * 12, torch::kFloat).reshape({16, 3, 12, 12}) * 0.01 + k).to(cuda),
                              ((torch::arange(16) + k) % 10).to(cuda));
      },
      [](auto& m, const auto& b) { return torch::cross_entropy_loss(m.forward(b.first), b.second); }, 20);
  for (std::size_t i = 0; i < ce.size(); ++i) CHECK(max_rel_diff(cg[i], ce[i]) <= 1e-5);
}

TEST_CASE("gpu: graph::Capture: a host sync in the step fails at capture with the named error, then runs eagerly" * nitro::test::needs_gpu()) {
  const c10::Device cuda(c10::kCUDA, 0);
  auto model = make_mlp(10, cuda);
  nitro::optim::FusedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  nitro::TrainingLoop<nitro::graph::Capture> loop{model, optimizer, {.hooks = {nitro::graph::Capture::Options{.warmup = 1}}}};
  const auto syncs = [&](const auto& b) {
    auto loss = torch::cross_entropy_loss(model->forward(b.first), b.second);
    if (loss.template item<float>() < 0) loss = loss * 2;  // a host sync
    return loss;
  };
  loop.step(batch(0, 8, cuda), syncs);  // warm-up: fine
  REQUIRE_THROWS_WITH_AS(loop.step(batch(1, 8, cuda), syncs), doctest::Contains("could not be captured"), nitro::Error);
  const auto r = loop.step(batch(2, 8, cuda), syncs);  // eager from now on
  CHECK(std::isfinite(r.loss.item<float>()));
  CHECK(loop.hook<nitro::graph::Capture>().graphs() == 0);
  // Memory and streams are usable after the failed capture.
  CHECK(torch::ones({4}, cuda).sum().item<float>() == 4.0f);
}

TEST_CASE("gpu: graph::Capture with amp::Fp16 and two shapes follows the eager loop" * nitro::test::needs_gpu()) {
  const c10::Device cuda(c10::kCUDA, 0);
  const auto rows = [](int k) -> std::int64_t { return k % 4 == 3 ? 5 : 8; };
  std::vector<at::Tensor> out[2];
  std::vector<double> scales[2];
  for (int graphed = 0; graphed < 2; ++graphed) {
    auto model = make_mlp(12, cuda);
    nitro::optim::FusedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
    const auto f = [&](const auto& b) {
      auto loss = torch::cross_entropy_loss(model->forward(b.first), b.second);
      return loss;
    };
    const auto go = [&](auto& loop) {
      for (int k = 0; k < 40; ++k) scales[graphed].push_back(loop.step(batch(k, rows(k), cuda), f).loss_scale.template item<double>());
    };
    if (graphed) {
      nitro::TrainingLoop<nitro::amp::Fp16<>, nitro::graph::Capture> loop{model, optimizer, {.amp = {.growth_interval = 5}}};
      go(loop);
      CHECK(loop.hook<nitro::graph::Capture>().graphs() == 2);
    } else {
      nitro::TrainingLoop<nitro::amp::Fp16<>> loop{model, optimizer, {.amp = {.growth_interval = 5}}};
      go(loop);
    }
    out[graphed] = values(*model);
  }
  CHECK(scales[0] == scales[1]);
  for (std::size_t i = 0; i < out[0].size(); ++i) CHECK(max_rel_diff(out[1][i], out[0][i]) <= 1e-5);
}

TEST_CASE("gpu: graph::Capture: two graphs over different parameters, stepped alternately, follow the eager loop" * nitro::test::needs_gpu()) {
  // As the direct engine's case: here a replay runs no host code, so only the graph's own record of
  // its step, which run_step makes current before the replay, tells the optimizer which counters to
  // advance.
  const c10::Device cuda(c10::kCUDA, 0);
  for (const auto& [a, b] : {std::pair<std::int64_t, std::int64_t>{8, 5}, {5, 8}}) {
    CAPTURE(a);
    const auto got = alternate<nitro::TrainingLoop<nitro::graph::Capture>, nitro::graph::Capture>(a, b, cuda);
    const auto ref = alternate<nitro::TrainingLoop<>>(a, b, cuda);
    CHECK(got.eager == 6);
    CHECK(got.captures == 2);
    CHECK(got.replays == 8);
    CHECK(ref.steps == std::vector<std::int64_t>{16, 16, 8, 8});
    CHECK(got.steps == ref.steps);
    for (std::size_t i = 0; i < ref.params.size(); ++i) {
      CAPTURE(i);
      CHECK(max_rel_diff(got.params[i], ref.params[i]) <= 1e-5);
    }
  }
  // A state only the 8-row graph reads, replaced after a replay of the other: a stale graph would go
  // on reading the old tensor (parameters off the eager loop's); the graph is captured again.
  // (A float parameter's learning rate is read from a tensor here: a change needs no capture.)
  const auto got = alternate<nitro::TrainingLoop<nitro::graph::Capture>, nitro::graph::Capture>(5, 8, cuda, replace_last_state);
  const auto ref = alternate<nitro::TrainingLoop<>>(5, 8, cuda, replace_last_state);
  CHECK(got.captures == 3);
  CHECK(got.replays == 7);
  CHECK(got.steps == ref.steps);
  for (std::size_t i = 0; i < ref.params.size(); ++i) {
    CAPTURE(i);
    CHECK(max_rel_diff(got.params[i], ref.params[i]) <= 1e-5);
  }
}
#endif  // NITRO_WITH_CUDA

}  // namespace nitro_test_graph_capture
