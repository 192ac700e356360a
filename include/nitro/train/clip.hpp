#pragma once
// Gradient clipping, always on unscaled gradients, without synchronising the host.
//
//   clip::Off      no clipping.
//   clip::Norm     scale all gradients so their total norm is at most max_norm (norm_type 2 by
//                  default; inf for the largest magnitude), as torch.nn.utils.clip_grad_norm_; the
//                  norm is returned as a device tensor in StepResult::grad_norm.
//   clip::Value    clamp each gradient element to [-max_value, max_value].
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

struct Off {
  using family = nitro::family::Clip;
  static constexpr std::string_view name = "off";
  static constexpr bool enabled = false;
  struct Options {};
};

struct Norm {
  using family = nitro::family::Clip;
  static constexpr std::string_view name = "norm";
  static constexpr bool enabled = true;
  struct Options {
    double max_norm = 1.0;
    double norm_type = 2.0;
  };
  static void validate(const Options& o) {
    NITRO_CHECK(std::isfinite(o.max_norm) && o.max_norm > 0, "clip::Norm: max_norm must be > 0, got ", o.max_norm);
    NITRO_CHECK(o.norm_type > 0 || std::isinf(o.norm_type), "clip::Norm: norm_type must be > 0 or inf, got ",
                o.norm_type);
  }
  /// Clips in place; returns the total norm before clipping (a device scalar), like
  /// torch.nn.utils.clip_grad_norm_ (coefficient max_norm / (norm + 1e-6), capped at 1).
  static at::Tensor apply(detail::GradGroups& grads, const Options& o) {
    std::vector<at::Tensor> norms, nonempty;
    c10::Device device = c10::kCPU;
    bool first = true;
    grads.for_each([&](detail::GradGroups::Group& g) {
      if (first) device = g.device;
      first = false;
      // An empty gradient adds nothing to any norm, and the infinity norm refuses it: left out (the
      // list is copied only when one is there).
      const bool has_empty =
          std::any_of(g.grads.begin(), g.grads.end(), [](const at::Tensor& t) { return t.numel() == 0; });
      if (has_empty) {
        nonempty.clear();
        std::copy_if(g.grads.begin(), g.grads.end(), std::back_inserter(nonempty),
                     [](const at::Tensor& t) { return t.numel() > 0; });
        if (nonempty.empty()) return;
      }
      for (auto& n : at::_foreach_norm(has_empty ? nonempty : g.grads, o.norm_type))
        norms.push_back(n.to(n.options().device(device), true));
    });
    if (norms.empty()) return {};
    const auto total = at::linalg_vector_norm(at::stack(norms), o.norm_type);
    const auto coef = at::clamp(o.max_norm / (total + 1e-6), c10::nullopt, 1.0);
    grads.for_each([&](detail::GradGroups::Group& g) { at::_foreach_mul_(g.grads, coef.to(g.device, true)); });
    return total;
  }
};

struct Value {
  using family = nitro::family::Clip;
  static constexpr std::string_view name = "value";
  static constexpr bool enabled = true;
  struct Options {
    double max_value = 1.0;
  };
  static void validate(const Options& o) {
    NITRO_CHECK(std::isfinite(o.max_value) && o.max_value > 0, "clip::Value: max_value must be > 0, got ",
                o.max_value);
  }
  static at::Tensor apply(detail::GradGroups& grads, const Options& o) {
    grads.for_each([&](detail::GradGroups::Group& g) {
      at::_foreach_clamp_min_(g.grads, -o.max_value);
      at::_foreach_clamp_max_(g.grads, o.max_value);
    });
    return {};
  }
};

static_assert(ClipPolicy<Off> && ClipPolicy<Norm> && ClipPolicy<Value>);

}  // namespace nitro::clip
