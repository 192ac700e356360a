#pragma once
// nitro::ema::Model: a TrainingLoop hook policy that keeps an exponential moving average of the
// model's weights, the copy that YOLO (Ultralytics' ModelEMA) and image classifiers (timm's
// ModelEmaV2/V3) evaluate and export instead of the last weights.
//
//   using Loop = nitro::TrainingLoop<nitro::amp::Bf16, nitro::ema::Model>;
//   Loop loop{model, optimizer, {.hooks = {nitro::ema::Model::Options{.decay = 0.9999, .tau = 2000}}}};
//   for (auto& batch : *loader) loop.step(batch, loss_fn);
//   auto& ema = loop.hook<nitro::ema::Model>();
//   {
//     auto weights = ema.swap_into(*model);   // the average in the live model until the scope ends
//     model->eval();
//     evaluate(model);
//   }                                         // the training weights are back (also on an exception)
//   ema.copy_to(*export_model);               // or into another model of the same architecture
//
// The average starts as the model's parameters and buffers at the first step (before its forward: the
// model as it was when training began, as Ultralytics and timm copy it when the EMA is built), and
// after every `every`-th optimizer step that was taken (StepResult::stepped; a skipped step changes
// nothing) each averaged tensor moves towards the model's:
//   ema = d * ema + (1 - d) * model,   d = decay * (1 - exp(-updates / tau))   (tau > 0, Ultralytics)
//                                      d = decay                               (tau = 0, timm ModelEmaV2)
// where `updates` counts the updates including this one, so early averages follow the model closely
// instead of holding on to its random start. Parameters are averaged; floating-point buffers
// (BatchNorm's running statistics) are copied from the model at each update, or averaged like
// parameters with `.average_buffers = true` (as Ultralytics and timm do); other buffers (BatchNorm's
// num_batches_tracked) are always copied (Ultralytics leaves them at their first value). The
// average's tensors never require gradients.
//
// Cost per optimizer step: a counter; at each update, one at::_foreach_lerp_ per (device, dtype) group
// of averaged tensors and one at::_foreach_copy_ per group of copied buffers, with the weight a host
// number: no host-device synchronisation and no allocation beyond what the foreach kernels make.
// Memory: one copy of the model's parameters and buffers, on their devices and in their dtypes. The
// model's tensors are taken once, at the first step: moving the model to another device or dtype
// afterwards is not supported. The average has the model's dtype: of a model held in bf16 (not one
// trained under amp::Bf16, whose weights stay fp32) it stops moving once 1 - d is below bf16's
// precision (as Ultralytics' and timm's would); keep such a model's weights in fp32 for an EMA.
// LibTorch's Module::to(dtype) also converts integer buffers (BatchNorm's num_batches_tracked) to
// that dtype, which PyTorch's does not: with average_buffers they are then averaged.
//
// Saved (state_dict, and so in the loop's snapshots): the update count, the optimizer steps taken
// since the last update, and every tensor of the average by its name in the model; a snapshot's load
// restores it exactly. state_dict() copies the tensors (on their devices), so a saved state stays as
// it was while training goes on. A state loaded before the first step is checked against the model's
// names, shapes and dtypes at that step (the hook sees the model only then); one loaded later is
// checked before anything changes.
#include <nitro/core/concepts.hpp>
#include <nitro/core/error.hpp>
#include <nitro/core/state_dict.hpp>
#include <nitro/core/step_result.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_lerp.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nitro::ema {

/// Tensors by name, in a model's order: its parameters (named_parameters), then its buffers.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

namespace detail {

/// A model's parameters, then its buffers, by name (the handles, not copies).
inline NamedTensors named_state(const torch::nn::Module& model) {
  NamedTensors out;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) out.emplace_back(p.key(), p.value());
  for (const auto& b : model.named_buffers(/*recurse=*/true)) out.emplace_back(b.key(), b.value());
  return out;
}

/// For each tensor of `want`, the tensor of `have` with its name; nitro::Error naming the first
/// difference of names, shapes or dtypes (and devices, when `same_device`). `what` begins the message
/// and `remedy` ends it.
inline std::vector<at::Tensor> match(const NamedTensors& want, std::string_view want_is, const NamedTensors& have,
                                     std::string_view have_is, bool same_device, std::string_view what,
                                     std::string_view remedy) {
  std::map<std::string_view, const at::Tensor*> by_name;
  for (const auto& [name, t] : have) by_name.emplace(name, &t);
  std::vector<at::Tensor> out;
  out.reserve(want.size());
  for (const auto& [name, t] : want) {
    const auto it = by_name.find(name);
    NITRO_CHECK(it != by_name.end(), what, ": ", want_is, " has the tensor \"", name, "\", which ", have_is,
                " has not; ", remedy);
    const at::Tensor& h = *it->second;
    NITRO_CHECK(h.sizes() == t.sizes(), what, ": the tensor \"", name, "\" has shape ", t.sizes(), " in ", want_is,
                " but ", h.sizes(), " in ", have_is, "; ", remedy);
    NITRO_CHECK(h.scalar_type() == t.scalar_type(), what, ": the tensor \"", name, "\" is ", t.scalar_type(), " in ",
                want_is, " but ", h.scalar_type(), " in ", have_is, "; ", remedy);
    NITRO_CHECK(!same_device || h.device() == t.device(), what, ": the tensor \"", name, "\" is on ", t.device(),
                " in ", want_is, " but on ", h.device(), " in ", have_is,
                "; move the model to the average's device first");
    out.push_back(h);
  }
  if (have.size() != want.size()) {  // every name of `want` is in `have`, which holds more
    std::set<std::string_view> wanted;
    for (const auto& [name, t] : want) wanted.insert(name);
    for (const auto& [name, t] : have) {
      NITRO_CHECK(wanted.contains(name), what, ": ", have_is, " has the tensor \"", name, "\", which ", want_is,
                  " has not; ", remedy);
    }
  }
  return out;
}

/// Averaged (floating point or complex) or copied.
inline bool averageable(const at::Tensor& t) noexcept {
  return c10::isFloatingType(t.scalar_type()) || c10::isComplexType(t.scalar_type());
}

}  // namespace detail

/// The exponential moving average of a TrainingLoop's model (see the top of this file).
class Model {
 public:
  using family = nitro::family::Hook;
  static constexpr std::string_view name = "ema";
  static constexpr bool enabled = true;
  struct Options {
    /// The decay the average tends to, in (0, 1): the weight of the old average at each update.
    double decay = 0.9999;
    /// The warm-up, in updates, >= 0: the decay of update k is decay * (1 - exp(-k / tau))
    /// (Ultralytics' ModelEMA); 0: no warm-up, every update uses `decay` (timm's ModelEmaV2).
    double tau = 2000;
    /// Optimizer steps taken between two updates, >= 1 (skipped steps are not counted).
    std::int64_t every = 1;
    /// false: floating-point buffers (BatchNorm's running statistics) are copied from the model at
    /// each update; true: averaged like parameters (Ultralytics, timm). Other buffers are copied.
    bool average_buffers = false;
  };

  /// `device` is the model's (the loop's); a state loaded before the first step is put there.
  Model(const Options& options, const c10::Device& device) : o_(validated(options)), device_(device) {}
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Before the forward of each micro-batch: the first one takes the model's tensors.
  template <class Loop>
  void on_step_begin(Loop& loop) {
    if (!bound_) [[unlikely]] bind(loop.model());
  }

  // After each optimizer step: one taken (not skipped) counts, and every `every`-th updates.
  template <class Loop>
  void after_optimizer_step(Loop& loop, StepResult& result) {
    if (!result.stepped) return;
    if (!bound_) [[unlikely]] bind(loop.model());  // a loop whose step began without on_step_begin
    if (++pending_ < o_.every) return;
    pending_ = 0;
    update();
  }

  /// Updates made so far.
  [[nodiscard]] std::int64_t updates() const noexcept { return updates_; }
  /// The decay the next update uses: decay * (1 - exp(-(updates() + 1) / tau)), or decay when tau is 0.
  [[nodiscard]] double decay_now() const noexcept {
    return o_.tau > 0 ? o_.decay * (1 - std::exp(-static_cast<double>(updates_ + 1) / o_.tau)) : o_.decay;
  }
  /// The average's own tensors (not copies) by name: the model's parameters, then its buffers (a state
  /// loaded before the first step: in the order of its names until that step). Empty before the
  /// first step, unless a state was loaded.
  [[nodiscard]] const NamedTensors& named_tensors() const noexcept { return ema_; }
  /// The average's tensor of that name; nitro::Error when there is none.
  [[nodiscard]] const at::Tensor& tensor(std::string_view tensor_name) const {
    require_tensors("tensor");
    for (const auto& [n, t] : ema_)
      if (n == tensor_name) return t;
    ::nitro::detail::fail("ema::Model::tensor: the average has no tensor \"", tensor_name,
                          "\"; named_tensors() lists the names (the model's parameters and buffers)");
  }
  [[nodiscard]] const Options& options() const noexcept { return o_; }

  /// Copies the average into `model` (an evaluation or export copy of the same architecture, on any
  /// device). nitro::Error naming the first tensor whose name, shape or dtype differs, before
  /// anything is copied.
  void copy_to(torch::nn::Module& model) const {
    require_tensors("copy_to");
    const auto live = detail::match(ema_, "the average", detail::named_state(model), "the model", false,
                                    "ema::Model::copy_to", "give a model of the architecture the average was taken of");
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < ema_.size(); ++i) live[i].copy_(ema_[i].second);
  }

  /// The average in a live model for a scope (ema::Model::swap_into): no copy, the model's parameters
  /// and buffers share the average's storage until the scope ends, when the training weights come back
  /// exactly, also when an exception leaves the scope.
  class [[nodiscard]] Swap {
   public:
    Swap(const Swap&) = delete;
    Swap& operator=(const Swap&) = delete;
    ~Swap() { restore(live_.size()); }

   private:
    friend class Model;
    Swap(const NamedTensors& ema, torch::nn::Module& model) {
      live_ = detail::match(ema, "the average", detail::named_state(model), "the model", true, "ema::Model::swap_into",
                            "give the model the average was taken of");
      held_.reserve(live_.size());
      try {
        for (std::size_t i = 0; i < live_.size(); ++i) {
          held_.push_back(live_[i].detach());  // the training storage, kept alive
          live_[i].set_data(ema[i].second);
        }
      } catch (...) {
        restore(held_.size());
        throw;
      }
    }
    // In reverse: a tensor the model holds under two names (tied weights) gets its first storage back.
    void restore(std::size_t n) noexcept {
      for (std::size_t i = n; i-- > 0;) live_[i].set_data(held_[i]);
    }
    std::vector<at::Tensor> live_, held_;
  };

  /// Puts the average into `model` (the one it was taken of: same names, shapes, dtypes and devices)
  /// until the returned object goes out of scope:
  ///   { auto in_use = ema.swap_into(*model); model->eval(); evaluate(model); }
  /// During the scope the model must not be trained: an optimizer step, or a forward in training mode
  /// (BatchNorm's running statistics), would write into the average.
  [[nodiscard]] Swap swap_into(torch::nn::Module& model) {
    require_tensors("swap_into");
    return Swap(ema_, model);
  }

  /// The update count, the steps taken since the last update, and a copy of every tensor of the
  /// average, by name (none before the first step).
  [[nodiscard]] StateDict state_dict() const {
    StateDict s;
    s.integers["updates"] = updates_;
    s.integers["pending"] = pending_;
    for (const auto& [n, t] : ema_) s.tensors[n] = t.clone();
    return s;
  }
  /// Loads what state_dict() saved. Checks everything before it changes anything: the counters, and
  /// the tensors' names, shapes and dtypes against the average's (or, before the first step, against
  /// the model's at that step). A state without tensors (saved before the first step) makes the next
  /// step take the model's tensors again.
  void load_state_dict(const StateDict& s) {
    const std::int64_t updates = s.integer("updates", "ema::Model"), pending = s.integer("pending", "ema::Model");
    NITRO_CHECK(updates >= 0, "ema::Model::load_state_dict: updates is ", updates, ", which is negative; the state is "
                "not an ema::Model's");
    NITRO_CHECK(pending >= 0 && pending < o_.every, "ema::Model::load_state_dict: pending is ", pending,
                ", outside [0, every = ", o_.every, "); load a state saved with the same `every`");
    NITRO_CHECK(!s.tensors.empty() || (updates == 0 && pending == 0), "ema::Model::load_state_dict: the state counts ",
                updates, " updates but holds no tensors; it is not an ema::Model's");
    NamedTensors saved;
    for (const auto& [n, t] : s.tensors) {
      NITRO_CHECK(t.defined(), "ema::Model::load_state_dict: the tensor \"", n, "\" is undefined");
      saved.emplace_back(n, t);
    }
    if (saved.empty()) {  // the next step takes the model's tensors
      ema_.clear();
      groups_.clear();
      bound_ = false;
    } else if (bound_) {
      const auto from = detail::match(ema_, "the average", saved, "the loaded state", false,
                                      "ema::Model::load_state_dict", "load a state saved with the same model");
      at::NoGradGuard no_grad;
      for (std::size_t i = 0; i < ema_.size(); ++i) ema_[i].second.copy_(from[i]);
    } else {
      for (auto& [n, t] : saved) t = t.to(device_, /*non_blocking=*/false, /*copy=*/true);
      ema_ = std::move(saved);  // checked against the model at the first step
    }
    updates_ = updates;
    pending_ = pending;
  }

 private:
  // One multi-tensor op per step for each of these: tensors of one device and dtype, averaged or copied.
  struct Group {
    c10::Device device;
    c10::ScalarType dtype;
    bool average;
    std::vector<at::Tensor> ema, live;
  };

  static Options validated(const Options& o) {
    NITRO_CHECK(o.decay > 0 && o.decay < 1, "ema::Model: decay must be in (0, 1), got ", o.decay,
                "; 0.9999 is the usual value (0.999 for short runs)");
    NITRO_CHECK(std::isfinite(o.tau) && o.tau >= 0, "ema::Model: tau must be >= 0 (updates of warm-up; 0: none), got ",
                o.tau, "; 2000 is Ultralytics' value");
    NITRO_CHECK(o.every >= 1, "ema::Model: every must be >= 1 (optimizer steps between updates), got ", o.every);
    return o;
  }

  void require_tensors(std::string_view what) const {
    NITRO_CHECK(!ema_.empty(), "ema::Model::", what, ": the average holds no tensors yet; it takes the model's at the "
                "first step of the loop (or from a loaded state)");
  }

  // Takes the model's tensors: copies of them, or the loaded state's, checked against them.
  void bind(torch::nn::Module& model) {
    NamedTensors live = detail::named_state(model);
    NamedTensors ema;
    ema.reserve(live.size());
    {
      at::NoGradGuard no_grad;
      if (ema_.empty()) {
        for (const auto& [n, t] : live) ema.emplace_back(n, t.detach().clone());
      } else {
        const auto loaded = detail::match(live, "the model", ema_, "the loaded average", false, "ema::Model",
                                          "load a state saved with the same model");
        for (std::size_t i = 0; i < live.size(); ++i)
          ema.emplace_back(live[i].first, loaded[i].device() == live[i].second.device()
                                              ? loaded[i]
                                              : loaded[i].to(live[i].second.device(), false, true));
      }
    }
    const std::size_t parameters = model.parameters(/*recurse=*/true).size();  // live: these, then buffers
    std::vector<Group> groups;
    for (std::size_t i = 0; i < live.size(); ++i) {
      const at::Tensor& t = live[i].second;
      const bool average = detail::averageable(t) && (i < parameters || o_.average_buffers);
      Group* g = nullptr;
      for (auto& candidate : groups)
        if (candidate.device == t.device() && candidate.dtype == t.scalar_type() && candidate.average == average)
          g = &candidate;
      if (g == nullptr) g = &groups.emplace_back(Group{t.device(), t.scalar_type(), average, {}, {}});
      g->ema.push_back(ema[i].second);
      g->live.push_back(t);
    }
    ema_ = std::move(ema);
    groups_ = std::move(groups);
    bound_ = true;
  }

  void update() {
    const double d = decay_now();
    at::NoGradGuard no_grad;  // the model's parameters require grad: the in-place ops must not be recorded
    for (auto& g : groups_) {
      if (g.average) at::_foreach_lerp_(g.ema, g.live, at::Scalar(1.0 - d));
      else at::_foreach_copy_(g.ema, g.live);
    }
    ++updates_;
  }

  Options o_;
  c10::Device device_;
  NamedTensors ema_;
  std::vector<Group> groups_;
  bool bound_ = false;
  std::int64_t updates_ = 0;
  std::int64_t pending_ = 0;
};
static_assert(HookPolicy<Model>);

}  // namespace nitro::ema
