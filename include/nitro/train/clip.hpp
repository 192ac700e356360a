#pragma once
// Gradient clipping, always on unscaled gradients, without synchronising the host.
//
//   clip::Off      no clipping.
//   clip::Norm     scale all gradients so their total norm is at most max_norm (norm_type 2 by
//                  default; inf for the largest magnitude), as torch.nn.utils.clip_grad_norm_; the
//                  norm is returned as a device tensor in StepResult::grad_norm.
//   clip::Value    clamp each gradient element to [-max_value, max_value].
#include <nitro/core/config.hpp>
#include <nitro/core/concepts.hpp>
#include <nitro/core/error.hpp>
#include <nitro/train/amp.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_clamp_max.h>
#include <ATen/ops/_foreach_clamp_min.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string_view>
#include <vector>

namespace nitro::clip {

/// No clipping.
struct Off {
  /// The policy family this belongs to.
  using family = nitro::family::Clip;
  /// Name shown in reports and checked in snapshots.
  static constexpr std::string_view name = "off";
  /// Off: the loop never calls it.
  static constexpr bool enabled = false;
  /// No knobs.
  struct Options {};
};

/// Scales all gradients so their total norm is at most max_norm, as torch.nn.utils.clip_grad_norm_; the
/// norm before clipping comes back in StepResult::grad_norm.
struct Norm {
  /// The policy family this belongs to.
  using family = nitro::family::Clip;
  /// Name shown in reports and checked in snapshots.
  static constexpr std::string_view name = "norm";
  /// On: the loop calls apply() once per optimizer step, on unscaled gradients.
  static constexpr bool enabled = true;
  /// The knobs.
  struct Options {
    double max_norm = 1.0;   ///< the largest total norm allowed, finite and > 0
    double norm_type = 2.0;  ///< the p of the p-norm, > 0; infinity for the largest magnitude
  };
  /// Throws nitro::Error when max_norm is not finite and > 0, or norm_type is not > 0 (or infinity).
  NITRO_INLINE static void validate(const Options& o);
  /// Clips in place; returns the total norm before clipping (a device scalar), like
  /// torch.nn.utils.clip_grad_norm_ (coefficient max_norm / (norm + 1e-6), capped at 1).
  NITRO_INLINE static at::Tensor apply(detail::GradGroups& grads, const Options& o);
};

/// Clamps each gradient element to [-max_value, max_value].
struct Value {
  /// The policy family this belongs to.
  using family = nitro::family::Clip;
  /// Name shown in reports and checked in snapshots.
  static constexpr std::string_view name = "value";
  /// On: the loop calls apply() once per optimizer step, on unscaled gradients.
  static constexpr bool enabled = true;
  /// The knobs.
  struct Options {
    double max_value = 1.0;  ///< the bound of each element's magnitude, finite and > 0
  };
  /// Throws nitro::Error when max_value is not finite and > 0.
  NITRO_INLINE static void validate(const Options& o);
  /// Clamps in place; returns an undefined tensor (no norm is measured).
  NITRO_INLINE static at::Tensor apply(detail::GradGroups& grads, const Options& o);
};

static_assert(ClipPolicy<Off> && ClipPolicy<Norm> && ClipPolicy<Value>);

}  // namespace nitro::clip

#if !NITRO_COMPILED
#include <nitro/train/clip-inl.hpp>
#endif
