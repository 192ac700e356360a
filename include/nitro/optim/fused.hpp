#pragma once
// Fused multi-tensor optimizers: FusedAdam, FusedAdamW and FusedSGD, LibTorch's torch::optim::Adam,
// AdamW and SGD with each step done by one fused kernel per (parameter group, device, dtype) instead
// of several kernels per parameter: at::_fused_adam_, at::_fused_adamw_ and at::_fused_sgd_, the
// kernels of Python's `fused=True` (CPU and CUDA in LibTorch 2.11).
//
//   nitro::optim::FusedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   nitro::TrainingLoop<nitro::amp::Fp16<>> loop{model, optimizer};   // the loss scaler folded in
//
// Each derives from its LibTorch counterpart (FusedAdam from torch::optim::Adam, and so on), so it
// *is* one: the same options (torch::optim::AdamOptions, ...), parameter groups with their own
// options, the same per-parameter state (torch::optim::AdamParamState: step, exp_avg, exp_avg_sq,
// max_exp_avg_sq; SGDParamState: momentum_buffer), so `torch::save`d state loads across both ways,
// and TrainingLoop, memory::StateBackup (the batch-size finder) and snapshots work unchanged.
// Snapshots record the optimizer's type: a snapshot of a FusedAdamW loads into a FusedAdamW only
// (torch::save / torch::load go across).
//
// What differs from LibTorch's loop over parameters:
// - The step counter the kernels read is a float32 scalar tensor per parameter on its device (as in
//   Python's fused optimizers), mirrored from AdamParamState::step: a step written into the state
//   (load, StateBackup, a snapshot) is copied to the device before the next step. Exact up to 2^24
//   steps, as in Python.
// - On a GPU the learning rate reaches the kernels as a device tensor (the kernels' tensor-lr form),
//   refreshed from the group's options().lr() when it changed, so a schedule that changes the rate
//   needs no new kernel arguments (what CUDA-graph capture needs). On the CPU it is passed as a number.
// - Results agree with LibTorch's optimizers to float rounding (the kernels order some operations
//   differently): tests/optim/fused.cpp checks 50 steps to rtol 1e-6 (fp32, CPU).
// - Parameters must be floating point and dense (a tensor of their own, contiguous or channels-last:
//   not a view with gaps), their gradients of the same dtype and device; anything else is a
//   nitro::Error naming the parameter's index. LibTorch's CPU kernels walk every tensor's memory in
//   the parameter's order without reading strides, so a gradient or a state of another layout (an
//   NCHW state loaded by a snapshot or torch::load for a channels-last parameter, a model converted
//   after its optimizer made state) is laid out like its parameter first (a copy, once for a state).
// - Tested with float32 and float64 parameters. FusedSGD with momentum refuses float16/bfloat16
//   parameters on the CPU: LibTorch 2.11's fused CPU kernel computes their momentum buffer wrongly
//   (an outside review measured a buffer off by 2.6 against float32's 0.02 for LibTorch's SGD).
//
// The loss scaler folded in (TrainingLoop with amp::Fp16 and one of these optimizers): when no
// policy reads the gradients before the optimizer step (no clip policy, no hook with
// before_optimizer_step), the loop does not unscale them in a pass of its own: it checks them for
// inf/NaN (LibTorch's check-and-unscale kernel with a scale of 1, as Python's GradScaler does for a
// fused optimizer), and, when they are finite, the fused kernel divides each gradient by the scale as
// it reads it (step_scaled()). With clip::Norm, clip::Value or a hook that sees the gradients, they
// are unscaled first (they must be, to clip), and the fused step runs on unscaled gradients. Either
// way a step with inf/NaN is skipped and the scale backs off exactly as before.
// Measured on the CPU (bench_optimizer's "fold" row, 2 cores): the folded step is not faster, 0.93 to
// 0.98 of the unfolded one's speed (the check is a pass over the gradients too, and the kernel writes
// the unscaled gradients back). What folding is for is a step whose skip needs no host decision, as
// CUDA-graph capture does; on a GPU it is not yet measured.
//
// For graph::Capture (graph/capture.hpp), FusedStep::step_on_device runs the step as device work
// only: the kernels take found_inf and change nothing when it is 1 (the step counters advanced on the
// device are put back with _foreach_sub_, as Python's fused path does), no host counter moves until
// advance_host, no state is made (a parameter without state is an error: run eager steps first), and
// the tensors used are kept in a record of that step (device_step_record: graph::Capture keeps one per
// graph and makes it current again before the graph's replay); prepare_device_step, before a capture
// and each replay, refreshes the device learning rates and step counters from the host and says
// whether the current record's tensors and baked-in options are still the optimizer's.
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>
#include <nitro/optim/fused_step.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <c10/core/ScalarType.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nitro::optim {

namespace detail {

/// The step of each parameter as a float32 scalar tensor on its device, for the kernels; mirrors the
/// host counter of its state (a host counter changed by someone else is copied over before use).
class StepTensors {
 public:
  struct Slot {
    at::Tensor tensor;
    std::int64_t value = 0;
  };
  /// The slot of `param`, its tensor holding `host_step`. With `may_fill` false (a step being
  /// captured, where a fill would be replayed), a slot that is not up to date is an error.
  NITRO_INLINE Slot& get(const at::Tensor& param, std::int64_t host_step, bool may_fill = true);

 private:
  std::unordered_map<const void*, Slot> slots_;
};

/// The tensors of one fused kernel call: one (device, dtype) of one parameter group; State is the
/// optimizer's per-parameter state (whose host step advances with the counters; unused by SGD).
template <class State>
struct Bucket {
  c10::Device device = c10::kCPU;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<at::Tensor> params, grads, first, second, third, steps;
  std::vector<State*> states;
  std::vector<StepTensors::Slot*> counters;
  void clear() noexcept {
    params.clear(), grads.clear(), first.clear(), second.clear(), third.clear(), steps.clear();
    states.clear(), counters.clear();
  }
};

/// Buckets by (device, dtype), reused from step to step: no allocation once they exist.
template <class State>
class Buckets {
 public:
  Bucket<State>& find(c10::Device device, c10::ScalarType dtype) {
    for (std::size_t i = 0; i < used_; ++i)
      if (all_[i].device == device && all_[i].dtype == dtype) return all_[i];
    if (used_ == all_.size()) all_.emplace_back();
    Bucket<State>& b = all_[used_++];
    b.device = device, b.dtype = dtype;
    return b;
  }
  template <class F>
  void for_each(F&& f) {
    for (std::size_t i = 0; i < used_; ++i) f(all_[i]);
  }
  /// Drops every reference (to parameters, gradients, state), keeping the lists' storage.
  void clear() noexcept {
    for (auto& b : all_) b.clear();
    used_ = 0;
  }

 private:
  std::vector<Bucket<State>> all_;
  std::size_t used_ = 0;
};

/// The learning rate of each (parameter group, device) as a float32 scalar tensor on the device,
/// refreshed when the group's rate changed.
class LrTensors {
 public:
  /// With `may_fill` false (a step being captured), a rate that is not up to date is an error.
  NITRO_INLINE const at::Tensor& get(std::size_t group, c10::Device device, double lr, bool may_fill = true);

 private:
  struct Entry {
    std::size_t group;
    c10::Device device;
    double value;
    at::Tensor tensor;
  };
  std::vector<Entry> entries_;
};

/// What one step_on_device used (a captured step reads these tensors at every replay), held so that
/// none is freed while a graph may still read it, and so that prepare_device_step can tell whether
/// the optimizer still holds them. Made new by each step_on_device, never changed after.
template <class Options>
struct DeviceRecord final : DeviceStepRecord {
  struct Entry {
    at::Tensor param;
    const void* data = nullptr;                   // where the parameter's elements were
    torch::optim::OptimizerParamState* state = nullptr;
    at::Tensor first, second, third, step;        // state tensors (those the optimizer has)
    StepTensors::Slot* counter = nullptr;         // Adam: the device step's slot
  };
  const FusedStep* owner = nullptr;                // the optimizer that made it (the only one that reads it)
  std::size_t param_count = 0;                     // parameters of all groups at the time
  std::vector<Options> options;                    // each group's options as baked in
  std::vector<std::pair<std::size_t, double>> baked_lrs;  // (group, rate) passed as a number (double parameters)
  std::vector<Entry> entries;
};

/// The options a captured step baked in are all but the learning rate (read from a tensor).
NITRO_INLINE bool same_but_lr(const torch::optim::SGDOptions& a, const torch::optim::SGDOptions& b);
template <class Options>  // AdamOptions, AdamWOptions
bool same_but_lr(const Options& a, const Options& b) {
  return a.betas() == b.betas() && a.eps() == b.eps() && a.weight_decay() == b.weight_decay() &&
         a.amsgrad() == b.amsgrad();
}

/// The grad_scale of a step on each device it is needed (one copy per device, no synchronisation).
class PerDevice {
 public:
  NITRO_INLINE explicit PerDevice(const at::Tensor* t);
  NITRO_INLINE std::optional<at::Tensor> on(c10::Device device);

 private:
  const at::Tensor* t_;
  std::vector<std::pair<c10::Device, at::Tensor>> copies_;
};

NITRO_INLINE void check_param(const at::Tensor& p, const at::Tensor& grad, std::size_t index, std::string_view who);

/// `t` (a gradient or a state tensor of parameter `p`) with p's dtype, device and strides: the CPU
/// kernels walk every tensor's memory in the parameter's order and read no strides, so a state loaded
/// as NCHW (a snapshot, torch::load) for a channels-last parameter must be laid out again first. A
/// copy only when the layout differs (once for a state: it is stored back).
NITRO_INLINE bool laid_out_like(const at::Tensor& t, const at::Tensor& p);
NITRO_INLINE at::Tensor lay_out_like(const at::Tensor& t, const at::Tensor& p, std::size_t index, std::string_view who);

/// The loss of a step's closure (with gradients on, as LibTorch's optimizers do), or none.
NITRO_INLINE at::Tensor call_closure(const torch::optim::Optimizer::LossClosure& closure);

NITRO_INLINE void check_scale(const at::Tensor& scale, std::string_view who);

/// Where options come from, for messages (printed only when a check fails: nothing is built per step).
struct OptionsOf {
  std::ptrdiff_t group;  // < 0: the optimizer's defaults
};
NITRO_INLINE std::ostream& operator<<(std::ostream& out, OptionsOf where);

template <class Options>  // AdamOptions, AdamWOptions
void check_options(const Options& o, std::string_view who, OptionsOf where) {
  const auto [beta1, beta2] = o.betas();
  NITRO_CHECK(std::isfinite(o.lr()) && o.lr() >= 0, who, ": ", where, "lr must be >= 0, got ", o.lr());
  NITRO_CHECK(std::isfinite(o.eps()) && o.eps() >= 0, who, ": ", where, "eps must be >= 0, got ", o.eps());
  NITRO_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, who, ": ", where, "betas must be in [0, 1), got (",
              beta1, ", ", beta2, ")");
  NITRO_CHECK(std::isfinite(o.weight_decay()) && o.weight_decay() >= 0, who, ": ", where,
              "weight_decay must be >= 0, got ", o.weight_decay());
}

NITRO_INLINE void check_options(const torch::optim::SGDOptions& o, std::string_view who, OptionsOf where);

template <class Options>
const Options& options_of(const torch::optim::OptimizerParamGroup& group) {
  return static_cast<const Options&>(group.options());
}

/// What the three share: LibTorch's optimizer as the base; the defaults checked before it is built,
/// every group's options at construction and before every step; step() and step_scaled() over
/// Self::run(grad_scale or null).
template <class Self, class Base, class Options>
class Fused : public Base, public FusedStep {
 public:
  Fused(const std::vector<torch::optim::OptimizerParamGroup>& groups, Options defaults)
      : Base(groups, checked(std::move(defaults))) {
    check_groups();
  }
  Fused(std::vector<at::Tensor> params, Options defaults)
      : Fused(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))},
              std::move(defaults)) {}

  at::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override {
    at::Tensor loss = call_closure(closure);
    static_cast<Self&>(*this).run(nullptr);
    return loss;
  }
  void step_scaled(const at::Tensor& grad_scale) override {
    check_scale(grad_scale, Self::who);
    static_cast<Self&>(*this).run(&grad_scale);
  }
  void step_on_device(const at::Tensor* grad_scale, const at::Tensor& found_inf) override {
    if (grad_scale != nullptr) check_scale(*grad_scale, Self::who);
    NITRO_CHECK(!found_inf.defined() || (found_inf.numel() == 1 && found_inf.scalar_type() == at::kFloat), Self::who,
                "::step_on_device: found_inf must be a float32 scalar tensor (or undefined: never skip)");
    static_cast<Self&>(*this).run(grad_scale, &found_inf);
  }
  std::shared_ptr<const DeviceStepRecord> device_step_record() const override {
    return static_cast<const Self&>(*this).record_;
  }
  void use_device_step_record(std::shared_ptr<const DeviceStepRecord> record) override {
    auto mine = std::dynamic_pointer_cast<const DeviceRecord<Options>>(record);
    NITRO_EXPECTS(record == nullptr || (mine != nullptr && mine->owner == this));  // made by this optimizer
    static_cast<Self&>(*this).record_ = std::move(mine);
  }
  bool prepare_device_step() override {
    auto& self = static_cast<Self&>(*this);
    const auto& groups = this->param_groups();
    const DeviceRecord<Options>* record = self.record_.get();
    bool intact = record != nullptr && groups.size() == record->options.size();
    // One pass over the parameters: every rate the kernels read from a tensor and every device step
    // counter brought up to date (also those no capture used yet: a capture may not fill one), and the
    // record's entries (in the groups' order) compared with what the optimizer holds now.
    std::size_t count = 0, next = 0;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const auto& o = options_of<Options>(groups[g]);
      intact = intact && same_but_lr(o, record->options[g]);
      std::optional<c10::Device> last;  // each (group, device)'s rate once
      for (const auto& p : groups[g].params()) {
        ++count;
        if (p.device().is_cuda() && p.scalar_type() != at::kDouble && last != p.device()) {
          last = p.device();
          self.lrs_.get(g, p.device(), o.lr());
        }
        const auto* e = intact && next < record->entries.size() && record->entries[next].param.is_same(p)
                            ? &record->entries[next++]
                            : nullptr;
        const auto it = this->state().find(p.unsafeGetTensorImpl());
        auto* state = it != this->state().end() ? it->second.get() : nullptr;
        const at::Tensor* step = state != nullptr ? self.refresh(p, *state) : nullptr;  // Adam's counter
        if (intact && e != nullptr)  // (SGD without momentum keeps no state)
          intact = p.data_ptr() == e->data && (e->state == nullptr || (state == e->state && self.same_state(*state, *e))) &&
                   (!e->step.defined() || (step != nullptr && step->is_same(e->step)));
      }
    }
    intact = intact && count == record->param_count && next == record->entries.size();
    if (intact)
      for (const auto& [g, lr] : record->baked_lrs)  // a rate the kernels took as a number is in the graph
        intact = intact && g < groups.size() && options_of<Options>(groups[g]).lr() == lr;
    return intact;
  }
  void advance_host(bool stepped) override {
    auto& self = static_cast<Self&>(*this);
    if (stepped && self.record_ != nullptr) self.advance(*self.record_);
  }
  void release_device_step() noexcept override { static_cast<Self&>(*this).record_.reset(); }

 protected:
  void check_groups() const {
    const auto& groups = this->param_groups();
    for (std::size_t g = 0; g < groups.size(); ++g)
      check_options(options_of<Options>(groups[g]), Self::who, OptionsOf{static_cast<std::ptrdiff_t>(g)});
  }

 private:
  static Options checked(Options o) {
    check_options(o, Self::who, OptionsOf{-1});
    return o;
  }
};

/// FusedAdam and FusedAdamW (Self): Base is torch::optim::Adam or AdamW.
template <class Self, class Base, class Options, class State, bool Decoupled>
class FusedAdamBase : public Fused<Self, Base, Options> {
  friend class Fused<Self, Base, Options>;
  static constexpr std::string_view who = Decoupled ? "nitro::optim::FusedAdamW" : "nitro::optim::FusedAdam";

 public:
  explicit FusedAdamBase(const std::vector<torch::optim::OptimizerParamGroup>& groups, Options defaults = {})
      : Fused<Self, Base, Options>(groups, std::move(defaults)) {}
  explicit FusedAdamBase(std::vector<at::Tensor> params, Options defaults = {})
      : Fused<Self, Base, Options>(std::move(params), std::move(defaults)) {}

 private:
  // Two phases: every group is checked and its lists made, then the kernels run; a mistake found in
  // any group leaves every parameter and counter as it was. With found_inf (step_on_device): the skip
  // is the kernels' (on the device), no state is made, no host counter moves, and what was used is
  // recorded for prepare_device_step.
  void run(const at::Tensor* grad_scale, const at::Tensor* found_inf = nullptr) {
    at::NoGradGuard no_grad;
    const bool on_device = found_inf != nullptr;
    PerDevice scale(grad_scale);
    auto& groups = this->param_groups();
    if (per_group_.size() < groups.size()) per_group_.resize(groups.size());
    struct Clear {
      std::vector<Buckets<State>>& b;
      ~Clear() {  // nothing here keeps a gradient or a state alive past the step
        for (auto& x : b) x.clear();
      }
    } clear{per_group_};
    this->check_groups();
    std::shared_ptr<DeviceRecord<Options>> record;  // on the device: this step's, the current one once it ran
    if (on_device) record = std::make_shared<DeviceRecord<Options>>(), record->owner = this;
    std::size_t index = 0;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const auto& o = options_of<Options>(groups[g]);
      if (on_device) record->options.push_back(o), record->param_count += groups[g].params().size();
      for (const auto& p : groups[g].params()) {
        const std::size_t i = index++;
        if (!p.grad().defined()) continue;
        check_param(p, p.grad(), i, who);
        if (!laid_out_like(p.grad(), p)) p.mutable_grad() = lay_out_like(p.grad(), p, i, who);
        auto& slot = this->state()[p.unsafeGetTensorImpl()];
        const bool makes_state = slot == nullptr || (o.amsgrad() && !static_cast<State&>(*slot).max_exp_avg_sq().defined());
        if (on_device && makes_state) {
          if (slot == nullptr) this->state().erase(p.unsafeGetTensorImpl());
          throw DeviceStepNotReady(nitro::detail::concat(
              who, ": parameter ", i, " has no optimizer state yet; a step captured for the device cannot make it (it "
              "would be made again at every replay): run an eager step first (graph::Capture does)"));
        }
        if (slot == nullptr) {
          auto s = std::make_unique<State>();
          s->step(0);
          s->exp_avg(at::zeros_like(p, c10::MemoryFormat::Preserve));
          s->exp_avg_sq(at::zeros_like(p, c10::MemoryFormat::Preserve));
          if (o.amsgrad()) s->max_exp_avg_sq(at::zeros_like(p, c10::MemoryFormat::Preserve));
          slot = std::move(s);
        }
        auto& state = static_cast<State&>(*slot);
        if (o.amsgrad() && !state.max_exp_avg_sq().defined())  // amsgrad turned on after some steps
          state.max_exp_avg_sq(at::zeros_like(p, c10::MemoryFormat::Preserve));
        const bool relaid = !laid_out_like(state.exp_avg(), p) || !laid_out_like(state.exp_avg_sq(), p) ||
                            (o.amsgrad() && !laid_out_like(state.max_exp_avg_sq(), p));
        if (on_device && relaid)
          throw DeviceStepNotReady(nitro::detail::concat(who, ": the state of parameter ", i, " is laid out unlike the "
                                                         "parameter; a captured step cannot replace it: run an eager step first"));
        if (!laid_out_like(state.exp_avg(), p)) state.exp_avg(lay_out_like(state.exp_avg(), p, i, who));
        if (!laid_out_like(state.exp_avg_sq(), p)) state.exp_avg_sq(lay_out_like(state.exp_avg_sq(), p, i, who));
        if (o.amsgrad() && !laid_out_like(state.max_exp_avg_sq(), p))
          state.max_exp_avg_sq(lay_out_like(state.max_exp_avg_sq(), p, i, who));
        auto& counter = steps_.get(p, state.step(), /*may_fill=*/!on_device);
        auto& b = per_group_[g].find(p.device(), p.scalar_type());
        b.params.push_back(p);
        b.grads.push_back(p.grad());
        b.first.push_back(state.exp_avg());
        b.second.push_back(state.exp_avg_sq());
        if (o.amsgrad()) b.third.push_back(state.max_exp_avg_sq());
        b.steps.push_back(counter.tensor);
        b.states.push_back(&state);
        b.counters.push_back(&counter);
        if (on_device) {
          record->entries.push_back({p, p.data_ptr(), &state, state.exp_avg(), state.exp_avg_sq(),
                                    o.amsgrad() ? state.max_exp_avg_sq() : at::Tensor(), counter.tensor, &counter});
        }
      }
    }
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const auto& o = options_of<Options>(groups[g]);
      const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
      per_group_[g].for_each([&](Bucket<State>& b) {
        const auto gs = scale.on(b.device);
        const auto fi = on_device && found_inf->defined() ? std::optional<at::Tensor>(*found_inf) : std::nullopt;
        const auto call = [&](const auto& lr) {
          if constexpr (Decoupled) {
            at::_fused_adamw_(b.params, b.grads, b.first, b.second, b.third, b.steps, lr, beta1, beta2,
                              o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false, gs, fi);
          } else {
            at::_fused_adam_(b.params, b.grads, b.first, b.second, b.third, b.steps, lr, beta1, beta2,
                             o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false, gs, fi);
          }
        };
        at::_foreach_add_(b.steps, 1);  // the kernels read the step of this update
        try {
          // The CPU takes the rate as a number; so do double parameters (a float32 rate would round it).
          if (b.device.is_cpu() || b.dtype == at::kDouble) {
            if (on_device) record->baked_lrs.emplace_back(g, o.lr());
            call(o.lr());
          } else {
            call(lrs_.get(g, b.device, o.lr(), /*may_fill=*/!on_device));
          }
        } catch (...) {
          at::_foreach_sub_(b.steps, 1);
          throw;
        }
        if (on_device) {
          // A skipped step (found_inf 1) puts the counters back, on the device, as Python's fused path does.
          if (fi) at::_foreach_sub_(b.steps, std::vector<at::Tensor>(b.steps.size(), *fi));
        } else {
          for (std::size_t k = 0; k < b.states.size(); ++k) {
            b.states[k]->step(b.states[k]->step() + 1);
            ++b.counters[k]->value;
          }
        }
      });
    }
    if (on_device) record_ = std::move(record);
  }

  // What prepare_device_step asks of each parameter with state: its device step counter up to date
  // (returned), and whether its state tensors are those a captured step used.
  const at::Tensor* refresh(const at::Tensor& p, torch::optim::OptimizerParamState& base) {
    return &steps_.get(p, static_cast<State&>(base).step()).tensor;
  }
  static bool same_state(torch::optim::OptimizerParamState& base, const typename DeviceRecord<Options>::Entry& e) {
    auto& s = static_cast<State&>(base);
    return s.exp_avg().is_same(e.first) && s.exp_avg_sq().is_same(e.second) &&
           (!e.third.defined() || s.max_exp_avg_sq().is_same(e.third));
  }
  static void advance(const DeviceRecord<Options>& record) {
    for (const auto& e : record.entries) {
      auto& s = static_cast<State&>(*e.state);
      s.step(s.step() + 1);
      ++e.counter->value;
    }
  }

  std::vector<Buckets<State>> per_group_;
  StepTensors steps_;
  LrTensors lrs_;
  std::shared_ptr<const DeviceRecord<Options>> record_;  // the current record (see FusedStep); null: none
};

}  // namespace detail

/// torch::optim::Adam with one fused kernel per (group, device, dtype). Options: torch::optim::AdamOptions.
class FusedAdam final : public detail::FusedAdamBase<FusedAdam, torch::optim::Adam, torch::optim::AdamOptions,
                                                     torch::optim::AdamParamState, false> {
 public:
  using FusedAdamBase::FusedAdamBase;
};

/// torch::optim::AdamW (decoupled weight decay) with one fused kernel per (group, device, dtype).
/// Options: torch::optim::AdamWOptions.
class FusedAdamW final : public detail::FusedAdamBase<FusedAdamW, torch::optim::AdamW, torch::optim::AdamWOptions,
                                                      torch::optim::AdamWParamState, true> {
 public:
  using FusedAdamBase::FusedAdamBase;
};

/// torch::optim::SGD (momentum, dampening, Nesterov, weight decay) with one fused kernel per
/// (group, device, dtype). Options: torch::optim::SGDOptions. Momentum buffers are made on a
/// parameter's first step, as LibTorch does (the buffer starts as the gradient).
class FusedSGD final : public detail::Fused<FusedSGD, torch::optim::SGD, torch::optim::SGDOptions> {
  friend class detail::Fused<FusedSGD, torch::optim::SGD, torch::optim::SGDOptions>;
  static constexpr std::string_view who = "nitro::optim::FusedSGD";

 public:
  /// An optimizer over `groups` (e.g. optim::groups()), a group without options of its own taking
  /// `defaults`. Throws nitro::Error naming the group when an option is out of range (lr, momentum or
  /// weight_decay negative or not finite, dampening not finite, nesterov without momentum > 0 and
  /// dampening 0).
  NITRO_INLINE FusedSGD(const std::vector<torch::optim::OptimizerParamGroup>& groups, torch::optim::SGDOptions defaults);
  /// An optimizer over `params` in one group with `defaults`. Throws as the overload above.
  NITRO_INLINE FusedSGD(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults);

 private:
  // Buckets' lists: `first` holds the momentum buffers. Per group, `fresh` holds the parameters taking
  // their first momentum step (the buffer starts as the gradient), `stepped` the others. Two phases,
  // as FusedAdam's: everything is checked and the lists made, then the kernels run.
  NITRO_INLINE void run(const at::Tensor* grad_scale, const at::Tensor* found_inf = nullptr);

  // What prepare_device_step and advance_host ask (no step counters in SGD).
  static const at::Tensor* refresh(const at::Tensor&, torch::optim::OptimizerParamState&) noexcept { return nullptr; }
  NITRO_INLINE static bool same_state(torch::optim::OptimizerParamState& base,
                         const detail::DeviceRecord<torch::optim::SGDOptions>::Entry& e);
  static void advance(const detail::DeviceRecord<torch::optim::SGDOptions>&) noexcept {}

  std::vector<detail::Buckets<torch::optim::SGDParamState>> stepped_, fresh_;
  detail::LrTensors lrs_;
  std::vector<void*> created_;
  std::shared_ptr<const detail::DeviceRecord<torch::optim::SGDOptions>> record_;  // the current record (see FusedStep)
};

}  // namespace nitro::optim

#if !NITRO_COMPILED
#include <nitro/optim/fused-inl.hpp>
#endif
