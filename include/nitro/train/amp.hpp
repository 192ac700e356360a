#pragma once
// Mixed precision: the AMP policies of TrainingLoop, the loss scalers, and an autocast guard.
//
//   amp::Off                  fp32 everywhere. The baseline.
//   amp::Bf16                 autocast to bfloat16 (CUDA and CPU). Same range as fp32, so no loss
//                             scaling; the usual choice on Ampere and newer GPUs and bf16 CPUs.
//   amp::Fp16<Scaler>         autocast to float16 with loss scaling; for GPUs without fast bf16.
//                             Scaler is DynamicLossScale (default) or StaticLossScale.
//   DynamicLossScale          torch.amp.GradScaler's algorithm, step for step: init 65536, growth
//                             2.0 after 2000 finite steps, backoff 0.5 on inf/NaN, the optimizer step
//                             skipped on inf/NaN, LibTorch's fused kernels; state saves and loads.
//   StaticLossScale           a fixed scale; inf/NaN steps are still detected and skipped.
//   AutocastGuard             RAII autocast region with the semantics of Python's torch.autocast.
#include <nitro/core/config.hpp>
#include <nitro/core/compat.hpp>
#include <nitro/core/compat_autocast.hpp>
#include <nitro/core/concepts.hpp>
#include <nitro/core/error.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cmath>
#include <concepts>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace nitro {

/// Autocast on `device` to `dtype` for a scope, as Python's `with torch.autocast(...)`: saves and
/// restores the enabled state and dtype, and clears the cast cache when the outermost region exits.
/// { nitro::AutocastGuard bf16{c10::DeviceType::CUDA, at::kBFloat16}; auto y = model->forward(x); }
class AutocastGuard {
 public:
  /// Enters the region: autocast on `device` set to `enabled` with `dtype`; the destructor restores
  /// the previous state. `enabled = false` opens a region with autocast off (as torch.autocast(enabled=False)).
  NITRO_INLINE AutocastGuard(c10::DeviceType device, c10::ScalarType dtype, bool enabled = true);
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
  /// Leaves the region: restores the enabled state and dtype, and clears the cast cache when this was
  /// the outermost region.
  NITRO_INLINE ~AutocastGuard();

 private:
  c10::DeviceType device_;
  bool was_enabled_;
  c10::ScalarType was_dtype_;
};

/// What a loss scaler saves: the keys of torch.amp.GradScaler.state_dict().
struct LossScaleState {
  double scale = 65536.0;               ///< the current loss scale
  double growth_factor = 2.0;           ///< the factor the scale grows by after growth_interval finite steps
  double backoff_factor = 0.5;          ///< the factor the scale shrinks by on a step with inf or NaN gradients
  std::int64_t growth_interval = 2000;  ///< finite steps in a row before the scale grows
  std::int64_t growth_tracker = 0;      ///< finite steps in a row so far, in [0, growth_interval)
};

namespace detail {

/// Gradients grouped by (device, dtype) for the fused multi-tensor kernels. The storage is reused
/// from step to step, so grouping allocates nothing once the groups exist.
class GradGroups {
 public:
  struct Group {
    c10::Device device;
    c10::ScalarType dtype;
    std::vector<at::Tensor> grads;
  };

  template <class Params>
  void assign(const Params& params) {
    for (auto& g : groups_) g.grads.clear();
    for (const auto& p : params) {
      const auto& grad = p.grad();
      if (!grad.defined()) continue;
      find(grad.device(), grad.scalar_type()).grads.push_back(grad);
    }
  }
  template <class F>
  void for_each(F&& f) {
    for (auto& g : groups_)
      if (!g.grads.empty()) f(g);
  }
  NITRO_INLINE bool empty() const noexcept;
  /// Drops the references to the gradients (keeping the storage of the lists): once the optimizer
  /// has stepped and the gradients are set to none, nothing here may keep them allocated.
  NITRO_INLINE void release() noexcept;

 private:
  NITRO_INLINE Group& find(c10::Device device, c10::ScalarType dtype);
  std::vector<Group> groups_;
};

/// Refuses float16 gradients, as torch.amp.GradScaler does.
NITRO_INLINE void check_unscalable(const GradGroups::Group& g);

/// Multiplies every gradient by inv_scale and sets found_inf (a float32 scalar on its own device) to 1
/// if any is inf or NaN, with LibTorch's fused kernel per device and dtype (empty tensors and every
/// floating dtype welcome).
NITRO_INLINE void check_and_unscale(GradGroups& groups, const at::Tensor& inv_scale, at::Tensor& found_inf);

/// check_and_unscale for a loss scaler: float16 gradients refused first.
NITRO_INLINE void unscale_grads(GradGroups& groups, const at::Tensor& inv_scale, at::Tensor& found_inf);

/// Divides the gradients by `scale` (inverse computed in double, as GradScaler does); returns found_inf.
NITRO_INLINE at::Tensor unscale_by(const at::Tensor& scale, GradGroups& grads);

/// found_inf without changing the gradients: a float32 scalar on `device`, 1 when a gradient holds
/// inf or NaN. The same fused kernel with a scale of exactly 1 (as torch.amp.GradScaler checks the
/// gradients of a fused optimizer): every value times 1 is itself; one pass per device and dtype and
/// no tensor per gradient (fused infinity norms, read-only, made a tensor per gradient and were
/// several times slower).
NITRO_INLINE at::Tensor nonfinite_flag(GradGroups& groups, c10::Device device);

}  // namespace detail

/// torch.amp.GradScaler's dynamic loss scale. The scale lives on the device of the first loss it
/// scales; nothing here synchronises the host with the device (the caller reads found_inf).
class DynamicLossScale {
 public:
  /// The scaler's knobs, torch.amp.GradScaler's defaults.
  struct Options {
    double init_scale = 65536.0;          ///< the scale of the first step, finite and > 0
    double growth_factor = 2.0;           ///< the factor the scale grows by after growth_interval finite steps, > 1
    double backoff_factor = 0.5;          ///< the factor the scale shrinks by on an inf/NaN step, in (0, 1)
    std::int64_t growth_interval = 2000;  ///< finite steps in a row before the scale grows, >= 1
  };

  /// A scaler with the default Options.
  NITRO_INLINE DynamicLossScale();
  /// Throws nitro::Error when an option is out of its range (see Options).
  NITRO_INLINE explicit DynamicLossScale(Options options);

  /// loss * scale (the scale is created on the loss's device on first use).
  NITRO_INLINE at::Tensor scale(const at::Tensor& loss);

  /// Unscales the gradients in place; returns found_inf, a float32 scalar that is > 0 when any
  /// gradient was inf or NaN (read it to decide the step, as GradScaler.step does).
  NITRO_INLINE at::Tensor unscale(detail::GradGroups& grads);

  /// After the optimizer step (or its skip): back off on inf/NaN, grow after growth_interval
  /// finite steps, with LibTorch's fused kernel. No synchronisation.
  NITRO_INLINE void update(const at::Tensor& found_inf);

  /// The scale as a device tensor (undefined before the first loss); no synchronisation.
  const at::Tensor& scale_tensor() const noexcept { return scale_; }
  /// The scale as a number; synchronises when the scale is on a GPU.
  double current_scale() const { return scale_.defined() ? scale_.item<double>() : o_.init_scale; }

  /// The scale, factors and growth tracker, as GradScaler.state_dict() has them; synchronises when the
  /// scale is on a GPU.
  NITRO_INLINE LossScaleState state_dict() const;
  /// Restores a state_dict(). Throws nitro::Error when a value is out of its range (the scale not finite
  /// and > 0, growth_tracker not in [0, growth_interval)); the scaler is then unchanged.
  NITRO_INLINE void load_state_dict(const LossScaleState& s);
  /// The options in force (a loaded state replaces them).
  const Options& options() const noexcept { return o_; }

 private:
  Options o_;
  std::int64_t init_tracker_ = 0;
  at::Tensor scale_;
  at::Tensor growth_tracker_;
};

/// A fixed loss scale. Steps with inf/NaN gradients are still detected and skipped.
class StaticLossScale {
 public:
  /// The scaler's knobs.
  struct Options {
    double scale = 1024.0;  ///< the fixed loss scale, finite and > 0
  };
  /// A scaler with the default scale, 1024.
  NITRO_INLINE StaticLossScale();
  /// Throws nitro::Error when the scale is not finite and > 0.
  NITRO_INLINE explicit StaticLossScale(Options options);
  /// loss * scale (the scale is created on the loss's device on first use).
  NITRO_INLINE at::Tensor scale(const at::Tensor& loss);
  /// Unscales the gradients in place; returns found_inf, a float32 scalar that is > 0 when any gradient
  /// was inf or NaN. Throws nitro::Error before any loss was scaled, or for float16 gradients.
  NITRO_INLINE at::Tensor unscale(detail::GradGroups& grads);
  /// Does nothing: the scale is fixed.
  void update(const at::Tensor&) noexcept {}
  /// The scale as a device tensor (undefined before the first loss).
  const at::Tensor& scale_tensor() const noexcept { return scale_; }
  /// The scale as a number.
  double current_scale() const noexcept { return o_.scale; }
  /// The scale, with factors 1 and growth interval 1 (it never changes).
  LossScaleState state_dict() const { return {o_.scale, 1.0, 1.0, 1, 0}; }
  /// Takes the scale of a saved state; the other fields are ignored. Throws nitro::Error when the scale
  /// is not finite and > 0.
  NITRO_INLINE void load_state_dict(const LossScaleState& s);
  /// The options in force.
  const Options& options() const noexcept { return o_; }

 private:
  Options o_;
  at::Tensor scale_;
};

static_assert(LossScaler<DynamicLossScale> && LossScaler<StaticLossScale>);

namespace amp {

/// fp32 everywhere.
struct Off {
  /// The policy family this belongs to.
  using family = nitro::family::Amp;
  /// Name shown in reports and checked in snapshots.
  static constexpr std::string_view name = "fp32";
  /// Off: the loop does no autocast and no scaling.
  static constexpr bool enabled = false;
  /// No loss scaling.
  static constexpr bool scales_loss = false;
  /// No knobs.
  struct Options {};
};

/// Autocast to bfloat16 on the model's device; no loss scaling (bf16 has fp32's range).
struct Bf16 {
  /// The policy family this belongs to.
  using family = nitro::family::Amp;
  /// Name shown in reports and checked in snapshots.
  static constexpr std::string_view name = "bf16";
  /// On: the loop autocasts the forward pass.
  static constexpr bool enabled = true;
  /// No loss scaling: bfloat16 has float32's range.
  static constexpr bool scales_loss = false;
  /// The type autocast casts to.
  static constexpr c10::ScalarType dtype = c10::ScalarType::BFloat16;
  /// No knobs.
  struct Options {};
};

/// Autocast to float16 with loss scaling by Scaler (DynamicLossScale or StaticLossScale).
/// @tparam Scaler optional, default DynamicLossScale: a type satisfying nitro::LossScaler.
template <class Scaler = DynamicLossScale>
struct Fp16 {
  static_assert(LossScaler<Scaler>,
                "amp::Fp16<Scaler>: Scaler must be a loss scaler such as nitro::DynamicLossScale or "
                "nitro::StaticLossScale (see nitro/train/amp.hpp); for bfloat16, which needs none, use amp::Bf16");
  /// The policy family this belongs to.
  using family = nitro::family::Amp;
  /// The loss scaler the loop makes from Options.
  using scaler_type = Scaler;
  /// Name shown in reports and checked in snapshots.
  static constexpr std::string_view name = "fp16";
  /// On: the loop autocasts the forward pass.
  static constexpr bool enabled = true;
  /// The loss is scaled, and the gradients unscaled and checked for inf or NaN before the step.
  static constexpr bool scales_loss = true;
  /// The type autocast casts to.
  static constexpr c10::ScalarType dtype = c10::ScalarType::Half;
  /// The scaler's knobs (DynamicLossScale::Options by default).
  using Options = typename Scaler::Options;
};

static_assert(AmpPolicy<Off> && AmpPolicy<Bf16> && AmpPolicy<Fp16<>> && AmpPolicy<Fp16<StaticLossScale>>);

}  // namespace amp
}  // namespace nitro

#if !NITRO_COMPILED
#include <nitro/train/amp-inl.hpp>
#endif
