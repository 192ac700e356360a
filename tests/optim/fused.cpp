#include <nitro/memory/batch_size.hpp>
#include <nitro/optim/fused.hpp>
#include <nitro/train/channels_last.hpp>
#include <nitro/train/levels.hpp>

#include "testing.hpp"

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace nitro_test_optim_fused {  // one namespace per file: an area is compiled as one translation unit

namespace {

using torch::optim::OptimizerParamGroup;

// Parameters of several shapes and two dtypes, in two groups; the same values for each call.
std::vector<std::vector<at::Tensor>> make_params() {
  torch::manual_seed(7);
  std::vector<at::Tensor> a{torch::randn({16, 8}), torch::randn({8}), torch::randn({4, 3, 3, 3}),
                            torch::randn({5}, torch::kDouble)};
  std::vector<at::Tensor> b{torch::randn({8, 16}), torch::randn({1}), torch::randn({3, 7}, torch::kDouble)};
  for (auto& p : a) p.requires_grad_(true);
  for (auto& p : b) p.requires_grad_(true);
  return {a, b};
}

std::vector<std::vector<at::Tensor>> clone_params(const std::vector<std::vector<at::Tensor>>& params) {
  std::vector<std::vector<at::Tensor>> out;
  for (const auto& g : params) {
    auto& o = out.emplace_back();
    for (const auto& p : g) o.push_back(p.detach().clone().requires_grad_(true));
  }
  return out;
}

// The values of `src` copied into `dst` (the same tensors stay in their optimizers).
void copy_values(std::vector<std::vector<at::Tensor>>& dst, const std::vector<std::vector<at::Tensor>>& src) {
  for (std::size_t g = 0; g < src.size(); ++g)
    for (std::size_t i = 0; i < src[g].size(); ++i) dst[g][i].detach().copy_(src[g][i].detach());
}

// Step k's gradient of parameter i: a fixed function of (k, i); parameter 1 of group 0 has none at
// steps 3 and 4 (an optimizer skips it), and every gradient grows and shrinks over the steps.
void set_grads(std::vector<std::vector<at::Tensor>>& params, int k) {
  int i = 0;
  for (auto& g : params)
    for (auto& p : g) {
      ++i;
      if (i == 2 && (k == 3 || k == 4)) {
        p.mutable_grad() = at::Tensor();
        continue;
      }
      const auto n = p.numel();
      p.mutable_grad() =
          (torch::sin(torch::arange(n, torch::TensorOptions().dtype(p.scalar_type()).device(p.device())) * (0.3 + 0.01 * i) + k) *
           (1.0 + 0.5 * std::sin(k * 0.7)))
              .reshape(p.sizes());
    }
}

// Step k of two optimizers over their own parameters, with the same gradients.
void step_both(torch::optim::Optimizer& a, std::vector<std::vector<at::Tensor>>& pa, torch::optim::Optimizer& b,
               std::vector<std::vector<at::Tensor>>& pb, int k) {
  set_grads(pa, k);
  set_grads(pb, k);
  a.step();
  b.step();
}

// The largest difference relative to the tensor's own scale (its largest magnitude).
double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const auto x = a.detach().to(torch::kDouble), y = b.detach().to(torch::kDouble);
  return ((x - y).abs().max() / (y.abs().max() + 1e-30)).item<double>();
}

// Every parameter and its state tensors agree to rtol of the tensor's scale (its largest magnitude):
// elementwise relative error says nothing of elements that cross zero, where one rounding is 100%.
template <class State>
void check_same(torch::optim::Optimizer& fused, torch::optim::Optimizer& ref,
                const std::vector<std::vector<at::Tensor>>& pf, const std::vector<std::vector<at::Tensor>>& pr,
                double rtol, double state_rtol = -1) {
  if (state_rtol < 0) state_rtol = rtol;
  for (std::size_t g = 0; g < pf.size(); ++g)
    for (std::size_t i = 0; i < pf[g].size(); ++i) {
      CAPTURE(g);
      CAPTURE(i);
      CHECK(max_rel_diff(pf[g][i], pr[g][i]) <= rtol);
      const auto sf = fused.state().find(pf[g][i].unsafeGetTensorImpl());
      const auto sr = ref.state().find(pr[g][i].unsafeGetTensorImpl());
      REQUIRE((sf == fused.state().end()) == (sr == ref.state().end()));
      if (sf == fused.state().end()) continue;
      auto& a = dynamic_cast<State&>(*sf->second);
      auto& b = dynamic_cast<State&>(*sr->second);
      std::vector<at::Tensor> ta, tb;
      nitro::memory::detail::for_each_state_tensor(a, [&](const at::Tensor& t, auto) { ta.push_back(t); });
      nitro::memory::detail::for_each_state_tensor(b, [&](const at::Tensor& t, auto) { tb.push_back(t); });
      for (std::size_t k = 0; k < ta.size(); ++k) {
        CAPTURE(k);
        REQUIRE(ta[k].defined() == tb[k].defined());
        if (ta[k].defined()) CHECK(max_rel_diff(ta[k], tb[k]) <= state_rtol);
      }
      if constexpr (nitro::memory::detail::state_has_step<State>) CHECK(a.step() == b.step());
    }
}

template <class Fused, class Ref, class State, class Options>
void compare(const Options& o0, const Options& o1, int steps = 50) {
  auto pf = make_params();
  auto pr = clone_params(pf);
  Fused fused({OptimizerParamGroup(pf[0], std::make_unique<Options>(o0)), OptimizerParamGroup(pf[1], std::make_unique<Options>(o1))}, o0);
  Ref ref({OptimizerParamGroup(pr[0], std::make_unique<Options>(o0)), OptimizerParamGroup(pr[1], std::make_unique<Options>(o1))}, o0);
  double worst = 0;
  for (int k = 0; k < steps; ++k) {
    step_both(fused, pf, ref, pr, k);
    for (std::size_t g = 0; g < pf.size(); ++g)
      for (std::size_t i = 0; i < pf[g].size(); ++i) worst = std::max(worst, max_rel_diff(pf[g][i], pr[g][i]));
  }
  MESSAGE("largest relative difference of a parameter over ", steps, " steps: ", worst);
  check_same<State>(fused, ref, pf, pr, 1e-6);
}

std::string save(const torch::optim::Optimizer& o) {
  torch::serialize::OutputArchive archive;
  o.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}
void load(torch::optim::Optimizer& o, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  o.load(archive);
}

}  // namespace

TEST_CASE("FusedAdam follows torch::optim::Adam for 50 steps: two groups, weight decay, amsgrad, float and double") {
  using O = torch::optim::AdamOptions;
  compare<nitro::optim::FusedAdam, torch::optim::Adam, torch::optim::AdamParamState>(O(1e-2), O(3e-3).weight_decay(0.1).betas({0.8, 0.99}).eps(1e-6));
  compare<nitro::optim::FusedAdam, torch::optim::Adam, torch::optim::AdamParamState>(O(1e-2).amsgrad(true).weight_decay(0.01), O(1e-3).amsgrad(true));
}

TEST_CASE("FusedAdamW follows torch::optim::AdamW for 50 steps: two groups, weight decay, amsgrad") {
  using O = torch::optim::AdamWOptions;
  compare<nitro::optim::FusedAdamW, torch::optim::AdamW, torch::optim::AdamWParamState>(O(1e-2), O(3e-3).weight_decay(0.2));
  compare<nitro::optim::FusedAdamW, torch::optim::AdamW, torch::optim::AdamWParamState>(O(1e-2).amsgrad(true), O(5e-3).amsgrad(true).weight_decay(0));
}

TEST_CASE("FusedSGD follows torch::optim::SGD for 50 steps: plain, momentum with dampening, Nesterov, weight decay") {
  using O = torch::optim::SGDOptions;
  compare<nitro::optim::FusedSGD, torch::optim::SGD, torch::optim::SGDParamState>(O(0.05), O(0.02).weight_decay(0.1));
  compare<nitro::optim::FusedSGD, torch::optim::SGD, torch::optim::SGDParamState>(O(0.05).momentum(0.9).dampening(0.1), O(0.02).momentum(0.5).weight_decay(0.01));
  compare<nitro::optim::FusedSGD, torch::optim::SGD, torch::optim::SGDParamState>(O(0.05).momentum(0.9).nesterov(true).weight_decay(0.01), O(0.1).momentum(0.8).nesterov(true));
}

TEST_CASE("a changed learning rate takes effect at the next step") {
  using O = torch::optim::AdamWOptions;
  auto pf = make_params();
  auto pr = clone_params(pf);
  nitro::optim::FusedAdamW fused({OptimizerParamGroup(pf[0]), OptimizerParamGroup(pf[1])}, O(1e-2));
  torch::optim::AdamW ref({OptimizerParamGroup(pr[0]), OptimizerParamGroup(pr[1])}, O(1e-2));
  for (int k = 0; k < 20; ++k) {
    const double lr = 1e-2 * (1.0 - k / 20.0);
    for (auto* o : std::vector<torch::optim::Optimizer*>{&fused, &ref})
      for (auto& g : o->param_groups()) g.options().set_lr(lr);
    step_both(fused, pf, ref, pr, k);
  }
  check_same<torch::optim::AdamWParamState>(fused, ref, pf, pr, 1e-6);
}

TEST_CASE("torch::save'd state loads across: FusedAdamW into AdamW and AdamW into FusedAdamW, FusedSGD and SGD") {
  using O = torch::optim::AdamWOptions;
  // Train 10 steps in one kind, move the state to the other kind, train 10 more: the same as 20 in one.
  auto p_all = make_params();
  auto p_a = clone_params(p_all);
  auto p_b = clone_params(p_all);
  torch::optim::AdamW all({OptimizerParamGroup(p_all[0]), OptimizerParamGroup(p_all[1])}, O(1e-2).amsgrad(true));
  nitro::optim::FusedAdamW first({OptimizerParamGroup(p_a[0]), OptimizerParamGroup(p_a[1])}, O(1e-2).amsgrad(true));
  torch::optim::AdamW second({OptimizerParamGroup(p_b[0]), OptimizerParamGroup(p_b[1])}, O(1e-2).amsgrad(true));
  for (int k = 0; k < 30; ++k) {
    set_grads(p_all, k);
    all.step();
    if (k < 10) {
      set_grads(p_a, k);
      first.step();
    } else if (k < 20) {
      if (k == 10) {
        copy_values(p_b, p_a);
        load(second, save(first));  // fused -> LibTorch
      }
      set_grads(p_b, k);
      second.step();
    } else {
      if (k == 20) {
        copy_values(p_a, p_b);
        load(first, save(second));  // LibTorch -> fused, into the fused optimizer whose device counters say 10
      }
      set_grads(p_a, k);
      first.step();
    }
  }
  check_same<torch::optim::AdamWParamState>(first, all, p_a, p_all, 1e-6);

  using S = torch::optim::SGDOptions;
  auto q = make_params();
  auto r = clone_params(q);
  torch::optim::SGD sgd({OptimizerParamGroup(r[0]), OptimizerParamGroup(r[1])}, S(0.05).momentum(0.9));
  for (int k = 0; k < 5; ++k) {
    set_grads(r, k);
    sgd.step();
  }
  copy_values(q, r);
  nitro::optim::FusedSGD fsgd({OptimizerParamGroup(q[0]), OptimizerParamGroup(q[1])}, S(0.05).momentum(0.9));
  load(fsgd, save(sgd));
  for (int k = 5; k < 10; ++k) {
    step_both(sgd, r, fsgd, q, k);
  }
  check_same<torch::optim::SGDParamState>(fsgd, sgd, q, r, 1e-6);
}

TEST_CASE("a step counter put back by StateBackup reaches the kernels: the restored run repeats exactly") {
  using O = torch::optim::AdamOptions;
  auto p = make_params();
  nitro::optim::FusedAdam fused({OptimizerParamGroup(p[0]), OptimizerParamGroup(p[1])}, O(1e-2));
  for (int k = 0; k < 5; ++k) {
    set_grads(p, k);
    fused.step();
  }
  std::vector<at::Tensor> after;
  {
    nitro::memory::StateBackup backup(nullptr, &fused);
    for (int k = 5; k < 15; ++k) {
      set_grads(p, k);
      fused.step();
    }
    for (auto& g : p)
      for (auto& t : g) after.push_back(t.detach().clone());
    // Put the optimizer back at step 5 (the parameters by hand: no model here) and redo the steps.
    backup.restore();
  }
  auto again = make_params();
  {
    nitro::optim::FusedAdam fresh({OptimizerParamGroup(again[0]), OptimizerParamGroup(again[1])}, O(1e-2));
    for (int k = 0; k < 5; ++k) {
      set_grads(again, k);
      fresh.step();
    }
    copy_values(p, again);
  }
  for (int k = 5; k < 15; ++k) {
    set_grads(p, k);
    fused.step();
  }
  std::size_t n = 0;
  for (auto& g : p)
    for (auto& t : g) CHECK(torch::equal(t.detach(), after[n++]));
}

TEST_CASE("options and parameters a fused kernel cannot take are a nitro::Error") {
  auto w = torch::randn({3}).requires_grad_(true);
  using A = torch::optim::AdamOptions;
  CHECK_THROWS_AS(nitro::optim::FusedAdam({w}, A(-1.0)), nitro::Error);
  CHECK_THROWS_AS(nitro::optim::FusedAdam({w}, A(1e-3).betas({1.0, 0.9})), nitro::Error);
  CHECK_THROWS_AS(nitro::optim::FusedAdamW({w}, torch::optim::AdamWOptions(1e-3).weight_decay(-0.1)), nitro::Error);
  CHECK_THROWS_AS(nitro::optim::FusedSGD({w}, torch::optim::SGDOptions(0.1).nesterov(true)), nitro::Error);
  CHECK_THROWS_AS(nitro::optim::FusedSGD({w}, torch::optim::SGDOptions(0.1).momentum(0.9).dampening(0.1).nesterov(true)),
                  nitro::Error);
  // A group's own options are checked too, at construction and (changed later) at the step.
  CHECK_THROWS_AS(nitro::optim::FusedAdam({OptimizerParamGroup({w}, std::make_unique<A>(A(-0.5)))}, A(1e-3)), nitro::Error);
  nitro::optim::FusedAdam adam({w}, A(1e-3));
  w.mutable_grad() = torch::ones({3});
  adam.param_groups()[0].options().set_lr(-1.0);
  CHECK_THROWS_WITH_AS(adam.step(), doctest::Contains("parameter group 0: lr must be >= 0"), nitro::Error);
  adam.param_groups()[0].options().set_lr(1e-3);
  // A gradient of another dtype than its parameter: named, nothing stepped.
  w.mutable_grad() = torch::ones({3}, torch::kDouble);
  const auto before = w.detach().clone();
  CHECK_THROWS_WITH_AS(adam.step(), doctest::Contains("the gradient of parameter 0"), nitro::Error);
  CHECK(torch::equal(w.detach(), before));
  // An integer parameter.
  auto n = torch::zeros({2}, torch::kInt);
  nitro::optim::FusedSGD sgd({w, n}, torch::optim::SGDOptions(0.1).momentum(0.9));
  w.mutable_grad() = torch::ones({3});
  n.mutable_grad() = torch::ones({2}, torch::kInt);
  CHECK_THROWS_WITH_AS(sgd.step(), doctest::Contains("parameter 1 is Int"), nitro::Error);
  // The first parameter's momentum buffer, made for a step that did not run, is not kept.
  CHECK(sgd.state().empty());
  n.mutable_grad() = at::Tensor();
  sgd.step();
  CHECK(torch::allclose(w.detach(), before - 0.1));
}

TEST_CASE("channels-last: to_channels_last converts the 4-d tensors only, and a fused optimizer steps them like Adam") {
  torch::manual_seed(3);
  torch::nn::Sequential a(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).bias(false)), torch::nn::BatchNorm2d(8),
                          torch::nn::Flatten(), torch::nn::Linear(8 * 6 * 6, 4));
  torch::nn::Sequential b(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).bias(false)), torch::nn::BatchNorm2d(8),
                          torch::nn::Flatten(), torch::nn::Linear(8 * 6 * 6, 4));
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < a->parameters().size(); ++i) b->parameters()[i].copy_(a->parameters()[i]);
  }
  CHECK_FALSE(nitro::is_channels_last(*a));
  // The convolution's weight; BN's and the linear's are not 4-d. (No conv bias: before BN its gradient
  // is rounding noise, which Adam scales up to whole steps, differently in any two implementations.)
  CHECK(nitro::to_channels_last(*a) == 1);
  CHECK(nitro::is_channels_last(*a));
  CHECK(a->parameters()[0].is_contiguous(c10::MemoryFormat::ChannelsLast));
  CHECK(nitro::to_channels_last(*a) == 0);  // already
  nitro::optim::FusedAdam fa(a->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam fb(b->parameters(), torch::optim::AdamOptions(1e-2));
  for (int k = 0; k < 10; ++k) {
    const auto x = torch::sin(torch::arange(2 * 3 * 8 * 8, torch::kFloat).reshape({2, 3, 8, 8}) * 0.1 + k);
    for (auto [m, o] : {std::pair<torch::nn::Sequential*, torch::optim::Optimizer*>{&a, &fa}, {&b, &fb}}) {
      o->zero_grad();
      (*m)->forward(m == &a ? x.contiguous(c10::MemoryFormat::ChannelsLast) : x).square().mean().backward();
      o->step();
    }
  }
  CHECK(a->parameters()[0].is_contiguous(c10::MemoryFormat::ChannelsLast));  // the step kept the layout
  for (std::size_t i = 0; i < a->parameters().size(); ++i) {
    CAPTURE(i);
    CHECK(max_rel_diff(a->parameters()[i], b->parameters()[i]) <= 1e-5);
  }
}

namespace {

// An optimizer that says which of its steps the loop called, and does what a fused one does.
struct Spy final : torch::optim::SGD, nitro::optim::FusedStep {
  using torch::optim::SGD::SGD;
  int scaled_calls = 0, plain_calls = 0;
  at::Tensor step(LossClosure closure = nullptr) override {
    ++plain_calls;
    return torch::optim::SGD::step(closure);
  }
  void step_scaled(const at::Tensor& scale) override {
    ++scaled_calls;
    {
      torch::NoGradGuard no_grad;
      for (auto& p : param_groups()[0].params())
        if (p.grad().defined()) p.mutable_grad().div_(scale);
    }
    torch::optim::SGD::step();
  }
  // The device-only step (graph::Capture) is not what these tests look at.
  void step_on_device(const at::Tensor*, const at::Tensor&) override { throw nitro::Error("Spy: not for capture"); }
  std::shared_ptr<const nitro::optim::DeviceStepRecord> device_step_record() const override { return nullptr; }
  void use_device_step_record(std::shared_ptr<const nitro::optim::DeviceStepRecord>) override {}
  bool prepare_device_step() override { return false; }
  void advance_host(bool) override {}
  void release_device_step() noexcept override {}
};

struct SeesGrads {
  using family = nitro::family::Hook;
  static constexpr std::string_view name = "sees_grads";
  static constexpr bool enabled = true;
  struct Options {};
  explicit SeesGrads(const Options&) {}
  template <class Loop>
  void before_optimizer_step(Loop&, nitro::detail::GradGroups&, nitro::StepResult&) {}
};

}  // namespace

TEST_CASE("amp::Fp16 with a fused optimizer: the scaler is folded in where nothing reads the gradients first") {
  const auto run = [](auto tag, auto make_optimizer, const std::set<int>& infs, int steps) {
    using Loop = typename decltype(tag)::type;
    torch::manual_seed(11);
    torch::nn::Sequential model(torch::nn::Linear(6, 16), torch::nn::Functional(torch::tanh), torch::nn::Linear(16, 3));
    auto optimizer = make_optimizer(model->parameters());
    Loop loop{model, *optimizer, {.amp = {.init_scale = 4096.0, .growth_interval = 3}}};
    std::vector<std::pair<double, bool>> trajectory;
    for (int k = 0; k < steps; ++k) {
      const auto x = torch::sin(torch::arange(48, torch::kFloat).reshape({8, 6}) * 0.21 + k);
      const auto y = (torch::arange(8) + k) % 3;
      const auto r = loop.step(std::make_pair(x, y), [&](const auto& b) {
        auto loss = torch::cross_entropy_loss(model->forward(b.first), b.second);
        return infs.count(k) ? loss * std::numeric_limits<double>::infinity() : loss;
      });
      trajectory.emplace_back(r.loss_scale.template item<double>(), r.skipped);
    }
    std::vector<at::Tensor> params;
    for (const auto& p : model->parameters()) params.push_back(p.detach().clone());
    return std::make_tuple(trajectory, params, std::move(optimizer));
  };
  using Fp16 = nitro::TrainingLoop<nitro::amp::Fp16<>>;
  const std::set<int> infs{2, 3, 9, 15};
  const auto adamw = [](auto params) {
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-2));
  };
  const auto fused_adamw = [](auto params) {
    return std::make_unique<nitro::optim::FusedAdamW>(params, torch::optim::AdamWOptions(1e-2));
  };
  const auto [ref_t, ref_p, ref_o] = run(std::type_identity<Fp16>{}, adamw, infs, 20);
  const auto [fused_t, fused_p, fused_o] = run(std::type_identity<Fp16>{}, fused_adamw, infs, 20);
  CHECK(fused_t == ref_t);  // every scale (powers of two: exact) and every skip
  int skipped = 0;
  for (const auto& [scale, skip] : ref_t) skipped += skip;
  CHECK(skipped == 4);
  for (std::size_t i = 0; i < ref_p.size(); ++i) CHECK(torch::allclose(fused_p[i], ref_p[i], 1e-5, 1e-7));

  // SGD's update is proportional to the gradient (Adam's hardly depends on its scale): a missing or
  // double unscale would show at once.
  const auto fused_sgd = [](auto params) {
    return std::make_unique<nitro::optim::FusedSGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  };
  const auto sgd_momentum = [](auto params) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  };
  const auto [fs_t, fs_p, fs_o] = run(std::type_identity<Fp16>{}, fused_sgd, infs, 20);
  const auto [rs_t, rs_p, rs_o] = run(std::type_identity<Fp16>{}, sgd_momentum, infs, 20);
  CHECK(fs_t == rs_t);
  for (std::size_t i = 0; i < rs_p.size(); ++i) CHECK(max_rel_diff(fs_p[i], rs_p[i]) <= 1e-6);

  // Which step the loop calls: step_scaled without clipping, step() (on unscaled gradients) with it
  // or with a hook that sees the gradients; both follow LibTorch's SGD.
  const auto spy = [](auto params) { return std::make_unique<Spy>(params, torch::optim::SGDOptions(0.1)); };
  const auto sgd = [](auto params) { return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1)); };
  const auto [st, sp, so] = run(std::type_identity<Fp16>{}, spy, infs, 12);
  const auto [rt, rp, ro] = run(std::type_identity<Fp16>{}, sgd, infs, 12);
  CHECK(so->scaled_calls == 9);  // 12 steps, 3 of them skipped (steps 2, 3 and 9)
  CHECK(so->plain_calls == 0);
  CHECK(st == rt);
  for (std::size_t i = 0; i < rp.size(); ++i) CHECK(torch::allclose(sp[i], rp[i], 1e-6, 1e-7));
  const auto [ct, cp, co] = run(std::type_identity<nitro::TrainingLoop<nitro::amp::Fp16<>, nitro::clip::Norm>>{}, spy, infs, 12);
  CHECK(co->scaled_calls == 0);
  CHECK(co->plain_calls == 9);
  const auto [ht, hp, ho] = run(std::type_identity<nitro::TrainingLoop<nitro::amp::Fp16<>, SeesGrads>>{}, spy, infs, 12);
  CHECK(ho->scaled_calls == 0);
  CHECK(ho->plain_calls == 9);
  CHECK(ht == rt);
  for (std::size_t i = 0; i < rp.size(); ++i) CHECK(torch::allclose(hp[i], rp[i], 1e-6, 1e-7));
}

TEST_CASE("levels take a fused optimizer: Basic with FusedSGD steps as with SGD") {
  torch::manual_seed(5);
  torch::nn::Linear a(4, 2), b(4, 2);
  {
    torch::NoGradGuard no_grad;
    b->weight.copy_(a->weight);
    b->bias.copy_(a->bias);
  }
  nitro::optim::FusedSGD fa(a->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD fb(b->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  nitro::level::Basic la{a, fa}, lb{b, fb};
  for (int k = 0; k < 10; ++k) {
    const auto x = torch::cos(torch::arange(12, torch::kFloat).reshape({3, 4}) + k);
    la.step(x, [&](const at::Tensor& in) { return a->forward(in).square().mean(); });
    lb.step(x, [&](const at::Tensor& in) { return b->forward(in).square().mean(); });
  }
  CHECK(torch::allclose(a->weight, b->weight, 1e-6, 1e-8));
  CHECK(torch::allclose(a->bias, b->bias, 1e-6, 1e-8));
}

TEST_CASE("state and gradients of another layout than their parameter are laid out like it: the steps stay LibTorch's") {
  // A channels-last parameter whose Adam state comes back NCHW (as a snapshot or torch::load makes it)
  // and whose gradient is NCHW: the CPU kernels walk memory in the parameter's order.
  torch::manual_seed(2);
  const auto w0 = torch::randn({4, 3, 3, 3});
  auto a = w0.contiguous(c10::MemoryFormat::ChannelsLast).requires_grad_(true);
  auto b = w0.clone().requires_grad_(true);
  nitro::optim::FusedAdam fa({a}, torch::optim::AdamOptions(1e-2));
  torch::optim::Adam fb({b}, torch::optim::AdamOptions(1e-2));
  for (int k = 0; k < 8; ++k) {
    const auto g = torch::sin(torch::arange(108, torch::kFloat).reshape({4, 3, 3, 3}) * 0.1 + k);
    a.mutable_grad() = k % 2 ? g.contiguous(c10::MemoryFormat::ChannelsLast) : g.clone();  // NCHW every other step
    b.mutable_grad() = g.clone();
    if (k == 4) {  // the state as a loader makes it: plain NCHW
      auto& s = static_cast<torch::optim::AdamParamState&>(*fa.state().at(a.unsafeGetTensorImpl()));
      s.exp_avg(s.exp_avg().contiguous());
      s.exp_avg_sq(s.exp_avg_sq().contiguous());
      REQUIRE_FALSE(s.exp_avg().is_contiguous(c10::MemoryFormat::ChannelsLast));
    }
    fa.step();
    fb.step();
  }
  CHECK(a.is_contiguous(c10::MemoryFormat::ChannelsLast));
  CHECK(max_rel_diff(a, b) <= 1e-6);
  auto& s = static_cast<torch::optim::AdamParamState&>(*fa.state().at(a.unsafeGetTensorImpl()));
  CHECK(s.exp_avg().is_contiguous(c10::MemoryFormat::ChannelsLast));  // laid out again, once

  // SGD's momentum buffer too.
  auto c = w0.contiguous(c10::MemoryFormat::ChannelsLast).requires_grad_(true);
  auto d = w0.clone().requires_grad_(true);
  nitro::optim::FusedSGD fc({c}, torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD fd({d}, torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int k = 0; k < 6; ++k) {
    const auto g = torch::cos(torch::arange(108, torch::kFloat).reshape({4, 3, 3, 3}) * 0.2 + k);
    c.mutable_grad() = g.clone();
    d.mutable_grad() = g.clone();
    if (k == 3) {
      auto& st = static_cast<torch::optim::SGDParamState&>(*fc.state().at(c.unsafeGetTensorImpl()));
      st.momentum_buffer(st.momentum_buffer().contiguous());
    }
    fc.step();
    fd.step();
  }
  CHECK(max_rel_diff(c, d) <= 1e-6);
}

TEST_CASE("what the fused kernels cannot take is refused before anything changes: views, fp16 momentum on the CPU, a bad group") {
  // A parameter that is a strided view: the CPU kernel would write between its elements.
  auto base = torch::zeros({4, 6});
  auto view = base.slice(1, 0, 6, 2).requires_grad_(true);
  view.mutable_grad() = torch::ones({4, 3});
  nitro::optim::FusedSGD on_view({view}, torch::optim::SGDOptions(0.1));
  CHECK_THROWS_WITH_AS(on_view.step(), doctest::Contains("is a view with gaps or overlaps"), nitro::Error);
  CHECK(torch::equal(base, torch::zeros({4, 6})));

  auto h = torch::ones({8}, torch::kBFloat16).requires_grad_(true);
  h.mutable_grad() = torch::ones({8}, torch::kBFloat16);
  nitro::optim::FusedSGD bf16({h}, torch::optim::SGDOptions(0.1).momentum(0.9));
  CHECK_THROWS_WITH_AS(bf16.step(), doctest::Contains("BFloat16 on the CPU with momentum"), nitro::Error);
  CHECK(bf16.state().empty());

  // A mistake in the second group: the first is not stepped either, and no counter moved.
  auto p0 = torch::ones({3}).requires_grad_(true);
  auto p1 = torch::ones({3}).requires_grad_(true);
  nitro::optim::FusedAdam adam({OptimizerParamGroup({p0}), OptimizerParamGroup({p1})}, torch::optim::AdamOptions(0.1));
  p0.mutable_grad() = torch::ones({3});
  p1.mutable_grad() = torch::ones({3});
  adam.step();
  const auto before = p0.detach().clone();
  p1.mutable_grad() = torch::ones({3}, torch::kDouble);
  CHECK_THROWS_AS(adam.step(), nitro::Error);
  CHECK(torch::equal(p0.detach(), before));
  CHECK(static_cast<torch::optim::AdamParamState&>(*adam.state().at(p0.unsafeGetTensorImpl())).step() == 1);
}

TEST_CASE("amp::Fp16 with a fused optimizer trains a model with an empty parameter") {
  torch::manual_seed(4);
  torch::nn::Linear model(4, 2);
  auto empty = torch::zeros({0}).requires_grad_(true);
  std::vector<at::Tensor> params = model->parameters();
  params.push_back(empty);
  nitro::optim::FusedAdamW optimizer(params, torch::optim::AdamWOptions(1e-2));
  // (init_scale 1024: at 65536 the float16 gradient of the output, 65536, would overflow, and skip.)
  nitro::TrainingLoop<nitro::amp::Fp16<>> loop{model, optimizer, {.amp = {.init_scale = 1024.0}}};
  const auto w = model->weight.detach().clone();
  for (int k = 0; k < 3; ++k)
    loop.step(torch::ones({2, 4}), [&](const at::Tensor& x) { return model->forward(x).sum() + empty.sum(); });
  CHECK(loop.optimizer_steps() == 3);
  CHECK(loop.skipped_steps() == 0);
  CHECK_FALSE(torch::equal(model->weight.detach(), w));
}

// The learning rate reaches the CUDA kernels as a device tensor that follows a schedule.
TEST_CASE("optim::FusedStep: each device step's record, held by its caller, is what prepare_device_step checks and advance_host advances") {
  // Two steps done on the device over different parameters, as two graphs of graph::Capture: A over
  // the first group, B over both. Each record, made current again, is checked and advanced on its
  // own; a change to what only B's step used is seen by B's record alone.
  using O = torch::optim::AdamWOptions;
  torch::manual_seed(3);
  std::vector<at::Tensor> first{torch::randn({4, 3}).requires_grad_(), torch::randn({4}).requires_grad_()};
  std::vector<at::Tensor> second{torch::randn({2, 4}).requires_grad_()};
  nitro::optim::FusedAdamW optimizer({OptimizerParamGroup(first), OptimizerParamGroup(second)}, O(1e-2));
  const auto grads = [&](bool both) {
    for (auto& p : first) p.mutable_grad() = torch::ones_like(p);
    for (auto& p : second) p.mutable_grad() = both ? torch::ones_like(p) : at::Tensor();
  };
  const auto step_of = [&](const at::Tensor& p) {
    return static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(p.unsafeGetTensorImpl())).step();
  };
  grads(true);
  optimizer.step();  // makes every state: each step 1
  nitro::optim::FusedStep& fused = optimizer;
  CHECK(fused.device_step_record() == nullptr);  // no step on the device yet
  const auto skip = torch::ones({});              // found_inf 1: the kernels change nothing
  grads(false);
  fused.step_on_device(nullptr, skip);
  const auto a = fused.device_step_record();
  grads(true);
  fused.step_on_device(nullptr, skip);
  const auto b = fused.device_step_record();
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(a != b);  // a new record for each step
  // advance_host advances the parameters of the current record's step, whichever ran last.
  fused.use_device_step_record(a);
  CHECK(fused.device_step_record() == a);
  CHECK(fused.prepare_device_step());
  fused.advance_host(true);
  CHECK(step_of(first[0]) == 2);
  CHECK(step_of(first[1]) == 2);
  CHECK(step_of(second[0]) == 1);
  fused.use_device_step_record(b);
  CHECK(fused.prepare_device_step());
  fused.advance_host(true);
  CHECK(step_of(first[0]) == 3);
  CHECK(step_of(second[0]) == 2);
  fused.advance_host(false);  // a skipped step: nothing
  CHECK(step_of(second[0]) == 2);

  // The learning rate of the group only B's step covers (a number in the kernels on the CPU): B's
  // record sees it, A's does not (A's step takes no rate of that group).
  optimizer.param_groups()[1].options().set_lr(3e-3);
  fused.use_device_step_record(a);
  CHECK(fused.prepare_device_step());
  fused.use_device_step_record(b);
  CHECK_FALSE(fused.prepare_device_step());
  optimizer.param_groups()[1].options().set_lr(1e-2);
  CHECK(fused.prepare_device_step());
  // A state tensor of the parameter only B's step updates, replaced: likewise.
  auto& st = static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(second[0].unsafeGetTensorImpl()));
  st.exp_avg_sq(st.exp_avg_sq().clone());
  fused.use_device_step_record(a);
  CHECK(fused.prepare_device_step());
  fused.use_device_step_record(b);
  CHECK_FALSE(fused.prepare_device_step());
  // An option of any group (baked into both steps): neither.
  static_cast<O&>(optimizer.param_groups()[0].options()).weight_decay(0.5);
  fused.use_device_step_record(a);
  CHECK_FALSE(fused.prepare_device_step());

  // release_device_step drops the optimizer's reference only: a record held elsewhere stays usable.
  static_cast<O&>(optimizer.param_groups()[0].options()).weight_decay(O(1e-2).weight_decay());
  fused.release_device_step();
  CHECK(fused.device_step_record() == nullptr);
  CHECK_FALSE(fused.prepare_device_step());
  fused.use_device_step_record(a);
  CHECK(fused.prepare_device_step());
  fused.use_device_step_record(nullptr);
  CHECK_FALSE(fused.prepare_device_step());
  // A record of another optimizer is a bug in the caller.
  nitro::optim::FusedAdamW other({OptimizerParamGroup(first), OptimizerParamGroup(second)}, O(1e-2));
  grads(true);
  other.step();
  grads(true);
  other.step_on_device(nullptr, skip);
  CHECK_THROWS_AS(fused.use_device_step_record(other.device_step_record()), nitro::ContractViolation);

  // FusedSGD: a momentum buffer only B's step reads, replaced.
  nitro::optim::FusedSGD sgd({OptimizerParamGroup(first), OptimizerParamGroup(second)},
                             torch::optim::SGDOptions(0.1).momentum(0.9));
  grads(true);
  sgd.step();
  grads(false);
  sgd.step_on_device(nullptr, skip);
  const auto sa = sgd.device_step_record();
  grads(true);
  sgd.step_on_device(nullptr, skip);
  const auto sb = sgd.device_step_record();
  auto& buffer = static_cast<torch::optim::SGDParamState&>(*sgd.state().at(second[0].unsafeGetTensorImpl()));
  buffer.momentum_buffer(buffer.momentum_buffer().clone());
  sgd.use_device_step_record(sa);
  CHECK(sgd.prepare_device_step());
  sgd.use_device_step_record(sb);
  CHECK_FALSE(sgd.prepare_device_step());
  for (auto& p : first) p.mutable_grad() = at::Tensor();
  for (auto& p : second) p.mutable_grad() = at::Tensor();
}

TEST_CASE("gpu: the fused optimizers on CUDA follow LibTorch's there and the CPU" * nitro::test::needs_gpu()) {
  const c10::Device cuda(c10::kCUDA, 0);
  auto on = [&](std::vector<std::vector<at::Tensor>> params, c10::Device device) {
    for (auto& g : params)
      for (auto& p : g) p = p.detach().to(device).requires_grad_(true);
    return params;
  };
  auto cpu = make_params();
  auto gpu = on(clone_params(cpu), cuda);
  auto ref = on(clone_params(cpu), cuda);
  using O = torch::optim::AdamWOptions;
  nitro::optim::FusedAdamW fused_gpu({OptimizerParamGroup(gpu[0]), OptimizerParamGroup(gpu[1])}, O(1e-2).amsgrad(true));
  torch::optim::AdamW ref_gpu({OptimizerParamGroup(ref[0]), OptimizerParamGroup(ref[1])}, O(1e-2).amsgrad(true));
  nitro::optim::FusedAdamW fused_cpu({OptimizerParamGroup(cpu[0]), OptimizerParamGroup(cpu[1])}, O(1e-2).amsgrad(true));
  for (int k = 0; k < 30; ++k) {
    const double lr = 1e-2 * (1.0 - k / 40.0);  // a schedule: the device tensor follows it
    for (auto* o : std::vector<torch::optim::Optimizer*>{&fused_gpu, &ref_gpu, &fused_cpu})
      for (auto& g : o->param_groups()) g.options().set_lr(lr);
    set_grads(cpu, k);
    for (auto* params : {&gpu, &ref}) {  // the CPU's gradients, moved over
      for (std::size_t g = 0; g < cpu.size(); ++g)
        for (std::size_t i = 0; i < cpu[g].size(); ++i)
          (*params)[g][i].mutable_grad() = cpu[g][i].grad().defined() ? cpu[g][i].grad().to(cuda) : at::Tensor();
    }
    fused_gpu.step();
    ref_gpu.step();
    fused_cpu.step();
    if (k == 0) {
      // PyTorch's CUDA kernel behind at::_fused_adamw_ (and Python's fused=True) updates the second
      // moment of a float parameter as fmaf(beta2, v, fmaf(-beta2, g * g, g * g)) with beta2 a float:
      // its weight on g * g is 1 - float(0.999) = 0.99998713e-3, not the 1e-3 of LibTorch's AdamW
      // (addcmul_ with 1 - beta2 in double), so the two differ by 1.29e-5 of v. After the first step
      // from v = 0, v is exactly g * g (rounded to float) times that weight, rounded once.
      const auto& p = gpu[0][0];
      const auto& v = static_cast<torch::optim::AdamWParamState&>(*fused_gpu.state().at(p.unsafeGetTensorImpl()));
      const auto g2 = (cpu[0][0].grad() * cpu[0][0].grad()).to(torch::kDouble);
      const double weight = 1.0 - static_cast<double>(static_cast<float>(0.999));
      const auto expected = (g2 * weight).to(torch::kFloat);
      CHECK(torch::equal(v.exp_avg_sq().cpu(), expected));
    }
  }
  // Parameters to 1e-6 of their scale; the moments to 2e-5 (the 1.29e-5 above).
  check_same<torch::optim::AdamWParamState>(fused_gpu, ref_gpu, gpu, ref, 1e-6, 2e-5);
  for (std::size_t g = 0; g < cpu.size(); ++g)
    for (std::size_t i = 0; i < cpu[g].size(); ++i) CHECK(max_rel_diff(gpu[g][i].cpu(), cpu[g][i]) <= 1e-5);

  // FusedSGD with Nesterov momentum on the GPU against LibTorch's SGD there.
  auto s1 = on(make_params(), cuda);
  auto s2 = on(clone_params(s1), cuda);
  using S = torch::optim::SGDOptions;
  nitro::optim::FusedSGD fsgd({OptimizerParamGroup(s1[0]), OptimizerParamGroup(s1[1])}, S(0.05).momentum(0.9).nesterov(true));
  torch::optim::SGD sgd({OptimizerParamGroup(s2[0]), OptimizerParamGroup(s2[1])}, S(0.05).momentum(0.9).nesterov(true));
  for (int k = 0; k < 20; ++k) {
    step_both(fsgd, s1, sgd, s2, k);
  }
  check_same<torch::optim::SGDParamState>(fsgd, sgd, s1, s2, 1e-6);
}

}  // namespace nitro_test_optim_fused
