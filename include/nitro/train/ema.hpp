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
#include <nitro/core/config.hpp>
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
NITRO_INLINE NamedTensors named_state(const torch::nn::Module& model);

/// For each tensor of `want`, the tensor of `have` with its name; nitro::Error naming the first
/// difference of names, shapes or dtypes (and devices, when `same_device`). `what` begins the message
/// and `remedy` ends it.
NITRO_INLINE std::vector<at::Tensor> match(const NamedTensors& want, std::string_view want_is, const NamedTensors& have,
                                     std::string_view have_is, bool same_device, std::string_view what,
                                     std::string_view remedy);

/// Averaged (floating point or complex) or copied.
NITRO_INLINE bool averageable(const at::Tensor& t) noexcept;

}  // namespace detail

/// The exponential moving average of a TrainingLoop's model (see the top of this file).
class Model {
 public:
  /// The policy family this belongs to (a hook of TrainingLoop).
  using family = nitro::family::Hook;
  /// Name shown in reports, and the key of its state in snapshots.
  static constexpr std::string_view name = "ema";
  /// On: the loop calls its hooks.
  static constexpr bool enabled = true;
  /// The knobs.
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

  /// `device` is the model's (the loop's); a state loaded before the first step is put there. Throws
  /// nitro::Error when decay is not in (0, 1), tau is not finite and >= 0, or every < 1.
  NITRO_INLINE Model(const Options& options, const c10::Device& device);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  /// Before the forward of each micro-batch: the first one takes the model's tensors.
  template <class Loop>
  void on_step_begin(Loop& loop) {
    if (!bound_) [[unlikely]] bind(loop.model());
  }

  /// After each optimizer step: one taken (not skipped) counts, and every `every`-th updates.
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
  [[nodiscard]] NITRO_INLINE double decay_now() const noexcept;
  /// The average's own tensors (not copies) by name: the model's parameters, then its buffers (a state
  /// loaded before the first step: in the order of its names until that step). Empty before the
  /// first step, unless a state was loaded.
  [[nodiscard]] const NamedTensors& named_tensors() const noexcept { return ema_; }
  /// The average's tensor of that name; nitro::Error when there is none.
  [[nodiscard]] NITRO_INLINE const at::Tensor& tensor(std::string_view tensor_name) const;
  /// The options the average was made with.
  [[nodiscard]] const Options& options() const noexcept { return o_; }

  /// Copies the average into `model` (an evaluation or export copy of the same architecture, on any
  /// device). nitro::Error naming the first tensor whose name, shape or dtype differs, before
  /// anything is copied.
  NITRO_INLINE void copy_to(torch::nn::Module& model) const;

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
    NITRO_INLINE Swap(const NamedTensors& ema, torch::nn::Module& model);
    // In reverse: a tensor the model holds under two names (tied weights) gets its first storage back.
    NITRO_INLINE void restore(std::size_t n) noexcept;
    std::vector<at::Tensor> live_, held_;
  };

  /// Puts the average into `model` (the one it was taken of: same names, shapes, dtypes and devices)
  /// until the returned object goes out of scope:
  ///   { auto in_use = ema.swap_into(*model); model->eval(); evaluate(model); }
  /// During the scope the model must not be trained: an optimizer step, or a forward in training mode
  /// (BatchNorm's running statistics), would write into the average.
  [[nodiscard]] NITRO_INLINE Swap swap_into(torch::nn::Module& model);

  /// The update count, the steps taken since the last update, and a copy of every tensor of the
  /// average, by name (none before the first step).
  [[nodiscard]] NITRO_INLINE StateDict state_dict() const;
  /// Loads what state_dict() saved. Checks everything before it changes anything: the counters, and
  /// the tensors' names, shapes and dtypes against the average's (or, before the first step, against
  /// the model's at that step). A state without tensors (saved before the first step) makes the next
  /// step take the model's tensors again.
  NITRO_INLINE void load_state_dict(const StateDict& s);

 private:
  // One multi-tensor op per step for each of these: tensors of one device and dtype, averaged or copied.
  struct Group {
    c10::Device device;
    c10::ScalarType dtype;
    bool average;
    std::vector<at::Tensor> ema, live;
  };

  NITRO_INLINE static Options validated(const Options& o);

  NITRO_INLINE void require_tensors(std::string_view what) const;

  // Takes the model's tensors: copies of them, or the loaded state's, checked against them.
  NITRO_INLINE void bind(torch::nn::Module& model);

  NITRO_INLINE void update();

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

#if !NITRO_COMPILED
#include <nitro/train/ema-inl.hpp>
#endif
