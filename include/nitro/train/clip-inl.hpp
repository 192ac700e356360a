#pragma once
// The definitions of nitro/train/clip.hpp's non-template functions: included by clip.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/train/clip.hpp>

namespace nitro::clip {

NITRO_INLINE void Norm::validate(const Options& o) {
  NITRO_CHECK(std::isfinite(o.max_norm) && o.max_norm > 0, "clip::Norm: max_norm must be > 0, got ", o.max_norm);
  NITRO_CHECK(o.norm_type > 0 || std::isinf(o.norm_type), "clip::Norm: norm_type must be > 0 or inf, got ",
              o.norm_type);
}

NITRO_INLINE at::Tensor Norm::apply(detail::GradGroups& grads, const Options& o) {
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

NITRO_INLINE void Value::validate(const Options& o) {
  NITRO_CHECK(std::isfinite(o.max_value) && o.max_value > 0, "clip::Value: max_value must be > 0, got ",
              o.max_value);
}

NITRO_INLINE at::Tensor Value::apply(detail::GradGroups& grads, const Options& o) {
  grads.for_each([&](detail::GradGroups::Group& g) {
    at::_foreach_clamp_min_(g.grads, -o.max_value);
    at::_foreach_clamp_max_(g.grads, o.max_value);
  });
  return {};
}

}  // namespace nitro::clip
