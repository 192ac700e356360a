#pragma once
// The definitions of nitro/train/ema.hpp's non-template functions: included by ema.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/train/ema.hpp>

namespace nitro::ema::detail {

NITRO_INLINE NamedTensors named_state(const torch::nn::Module& model) {
  NamedTensors out;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) out.emplace_back(p.key(), p.value());
  for (const auto& b : model.named_buffers(/*recurse=*/true)) out.emplace_back(b.key(), b.value());
  return out;
}

NITRO_INLINE std::vector<at::Tensor> match(const NamedTensors& want, std::string_view want_is, const NamedTensors& have, std::string_view have_is, bool same_device, std::string_view what, std::string_view remedy) {
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

NITRO_INLINE bool averageable(const at::Tensor& t) noexcept {
  return c10::isFloatingType(t.scalar_type()) || c10::isComplexType(t.scalar_type());
}

}  // namespace nitro::ema::detail

namespace nitro::ema {

NITRO_INLINE Model::Model(const Options& options, const c10::Device& device) : o_(validated(options)), device_(device) {}

NITRO_INLINE double Model::decay_now() const noexcept {
  return o_.tau > 0 ? o_.decay * (1 - std::exp(-static_cast<double>(updates_ + 1) / o_.tau)) : o_.decay;
}

NITRO_INLINE const at::Tensor& Model::tensor(std::string_view tensor_name) const {
  require_tensors("tensor");
  for (const auto& [n, t] : ema_)
    if (n == tensor_name) return t;
  ::nitro::detail::fail("ema::Model::tensor: the average has no tensor \"", tensor_name,
                        "\"; named_tensors() lists the names (the model's parameters and buffers)");
}

NITRO_INLINE void Model::copy_to(torch::nn::Module& model) const {
  require_tensors("copy_to");
  const auto live = detail::match(ema_, "the average", detail::named_state(model), "the model", false,
                                  "ema::Model::copy_to", "give a model of the architecture the average was taken of");
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < ema_.size(); ++i) live[i].copy_(ema_[i].second);
}

NITRO_INLINE Model::Swap::Swap(const NamedTensors& ema, torch::nn::Module& model) {
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

NITRO_INLINE void Model::Swap::restore(std::size_t n) noexcept {
  for (std::size_t i = n; i-- > 0;) live_[i].set_data(held_[i]);
}

NITRO_INLINE auto Model::swap_into(torch::nn::Module& model) -> Swap {
  require_tensors("swap_into");
  return Swap(ema_, model);
}

NITRO_INLINE StateDict Model::state_dict() const {
  StateDict s;
  s.integers["updates"] = updates_;
  s.integers["pending"] = pending_;
  for (const auto& [n, t] : ema_) s.tensors[n] = t.clone();
  return s;
}

NITRO_INLINE void Model::load_state_dict(const StateDict& s) {
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

NITRO_INLINE auto Model::validated(const Options& o) -> Options {
  NITRO_CHECK(o.decay > 0 && o.decay < 1, "ema::Model: decay must be in (0, 1), got ", o.decay,
              "; 0.9999 is the usual value (0.999 for short runs)");
  NITRO_CHECK(std::isfinite(o.tau) && o.tau >= 0, "ema::Model: tau must be >= 0 (updates of warm-up; 0: none), got ",
              o.tau, "; 2000 is Ultralytics' value");
  NITRO_CHECK(o.every >= 1, "ema::Model: every must be >= 1 (optimizer steps between updates), got ", o.every);
  return o;
}

NITRO_INLINE void Model::require_tensors(std::string_view what) const {
  NITRO_CHECK(!ema_.empty(), "ema::Model::", what, ": the average holds no tensors yet; it takes the model's at the "
              "first step of the loop (or from a loaded state)");
}

NITRO_INLINE void Model::bind(torch::nn::Module& model) {
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

NITRO_INLINE void Model::update() {
  const double d = decay_now();
  at::NoGradGuard no_grad;  // the model's parameters require grad: the in-place ops must not be recorded
  for (auto& g : groups_) {
    if (g.average) at::_foreach_lerp_(g.ema, g.live, at::Scalar(1.0 - d));
    else at::_foreach_copy_(g.ema, g.live);
  }
  ++updates_;
}

}  // namespace nitro::ema
