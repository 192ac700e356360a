#pragma once
// The definitions of nitro/train/amp.hpp's non-template functions: included by amp.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/train/amp.hpp>

namespace nitro {

NITRO_INLINE AutocastGuard::AutocastGuard(c10::DeviceType device, c10::ScalarType dtype, bool enabled) : device_(device),
      was_enabled_(compat::autocast_enabled(device)),
      was_dtype_(compat::autocast_dtype(device)) {
  compat::set_autocast_enabled(device, enabled);
  compat::set_autocast_dtype(device, dtype);
  compat::autocast_increment_nesting();
}

NITRO_INLINE AutocastGuard::~AutocastGuard() {
  if (compat::autocast_decrement_nesting() == 0) compat::autocast_clear_cache();
  compat::set_autocast_enabled(device_, was_enabled_);
  compat::set_autocast_dtype(device_, was_dtype_);
}

}  // namespace nitro

namespace nitro::detail {

NITRO_INLINE bool GradGroups::empty() const noexcept {
  for (const auto& g : groups_)
    if (!g.grads.empty()) return false;
  return true;
}

NITRO_INLINE void GradGroups::release() noexcept {
  for (auto& g : groups_) g.grads.clear();
}

NITRO_INLINE auto GradGroups::find(c10::Device device, c10::ScalarType dtype) -> Group& {
  for (auto& g : groups_)
    if (g.device == device && g.dtype == dtype) return g;
  return groups_.emplace_back(Group{device, dtype, {}});
}

NITRO_INLINE void check_unscalable(const GradGroups::Group& g) {
  NITRO_CHECK(g.dtype != at::kHalf,
              "amp: gradients are float16, so they cannot be unscaled safely (as torch.amp.GradScaler refuses "
              "too); keep the parameters in float32 and let autocast run the float16 math");
}

NITRO_INLINE void check_and_unscale(GradGroups& groups, const at::Tensor& inv_scale, at::Tensor& found_inf) {
  groups.for_each([&](GradGroups::Group& g) {
    if (g.device == found_inf.device()) {
      at::_amp_foreach_non_finite_check_and_unscale_(g.grads, found_inf, inv_scale);
    } else {
      // Gradients on another device: check there, then fold into the scale's device (rare: models
      // split across devices). One small copy, no synchronisation.
      auto local = at::zeros({}, found_inf.options().device(g.device));
      at::_amp_foreach_non_finite_check_and_unscale_(g.grads, local, inv_scale.to(g.device, /*non_blocking=*/true));
      found_inf.add_(local.to(found_inf.device(), /*non_blocking=*/true));
    }
  });
}

NITRO_INLINE void unscale_grads(GradGroups& groups, const at::Tensor& inv_scale, at::Tensor& found_inf) {
  groups.for_each(check_unscalable);
  check_and_unscale(groups, inv_scale, found_inf);
}

NITRO_INLINE at::Tensor unscale_by(const at::Tensor& scale, GradGroups& grads) {
  const auto inv_scale = scale.to(at::kDouble).reciprocal().to(at::kFloat);
  auto found_inf = at::zeros({}, scale.options());
  unscale_grads(grads, inv_scale, found_inf);
  return found_inf;
}

NITRO_INLINE at::Tensor nonfinite_flag(GradGroups& groups, c10::Device device) {
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
  auto found_inf = at::zeros({}, options);
  check_and_unscale(groups, at::ones({}, options), found_inf);
  return found_inf;
}

}  // namespace nitro::detail

namespace nitro {

NITRO_INLINE DynamicLossScale::DynamicLossScale() : DynamicLossScale(Options{}) {}

NITRO_INLINE DynamicLossScale::DynamicLossScale(Options options) : o_(options) {
  NITRO_CHECK(std::isfinite(o_.init_scale) && o_.init_scale > 0, "DynamicLossScale: init_scale must be > 0, got ",
              o_.init_scale);
  NITRO_CHECK(o_.growth_factor > 1.0, "DynamicLossScale: growth_factor must be > 1, got ", o_.growth_factor);
  NITRO_CHECK(o_.backoff_factor > 0.0 && o_.backoff_factor < 1.0,
              "DynamicLossScale: backoff_factor must be in (0, 1), got ", o_.backoff_factor);
  NITRO_CHECK(o_.growth_interval >= 1, "DynamicLossScale: growth_interval must be >= 1, got ", o_.growth_interval);
}

NITRO_INLINE at::Tensor DynamicLossScale::scale(const at::Tensor& loss) {
  if (!scale_.defined()) {
    scale_ = at::full({}, o_.init_scale, at::TensorOptions().dtype(at::kFloat).device(loss.device()));
    growth_tracker_ = at::full({}, init_tracker_, at::TensorOptions().dtype(at::kInt).device(loss.device()));
  }
  return loss * scale_.to(loss.device(), /*non_blocking=*/true);
}

NITRO_INLINE at::Tensor DynamicLossScale::unscale(detail::GradGroups& grads) {
  NITRO_CHECK(scale_.defined(), "DynamicLossScale: unscale before any loss was scaled; call scale(loss) first");
  return detail::unscale_by(scale_, grads);
}

NITRO_INLINE void DynamicLossScale::update(const at::Tensor& found_inf) {
  NITRO_EXPECTS(scale_.defined());
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf, o_.growth_factor, o_.backoff_factor,
                         o_.growth_interval);
}

NITRO_INLINE LossScaleState DynamicLossScale::state_dict() const {
  return {current_scale(), o_.growth_factor, o_.backoff_factor, o_.growth_interval,
          growth_tracker_.defined() ? growth_tracker_.item<std::int64_t>() : init_tracker_};
}

NITRO_INLINE void DynamicLossScale::load_state_dict(const LossScaleState& s) {
  DynamicLossScale check{{s.scale, s.growth_factor, s.backoff_factor, s.growth_interval}};
  NITRO_CHECK(s.growth_tracker >= 0 && s.growth_tracker < s.growth_interval,
              "DynamicLossScale: growth_tracker must be in [0, growth_interval), got ", s.growth_tracker);
  o_ = {s.scale, s.growth_factor, s.backoff_factor, s.growth_interval};
  init_tracker_ = s.growth_tracker;
  if (scale_.defined()) {
    scale_.fill_(s.scale);
    growth_tracker_.fill_(s.growth_tracker);
  }
}

NITRO_INLINE StaticLossScale::StaticLossScale() : StaticLossScale(Options{}) {}

NITRO_INLINE StaticLossScale::StaticLossScale(Options options) : o_(options) {
  NITRO_CHECK(std::isfinite(o_.scale) && o_.scale > 0, "StaticLossScale: scale must be > 0, got ", o_.scale);
}

NITRO_INLINE at::Tensor StaticLossScale::scale(const at::Tensor& loss) {
  if (!scale_.defined()) scale_ = at::full({}, o_.scale, at::TensorOptions().dtype(at::kFloat).device(loss.device()));
  return loss * scale_;
}

NITRO_INLINE at::Tensor StaticLossScale::unscale(detail::GradGroups& grads) {
  NITRO_CHECK(scale_.defined(), "StaticLossScale: unscale before any loss was scaled; call scale(loss) first");
  return detail::unscale_by(scale_, grads);
}

NITRO_INLINE void StaticLossScale::load_state_dict(const LossScaleState& s) {
  StaticLossScale check{{s.scale}};
  o_.scale = s.scale;
  if (scale_.defined()) scale_.fill_(s.scale);
}

}  // namespace nitro
