#pragma once
// The definitions of nitro/memory/batch_size.hpp's non-template functions: included by batch_size.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/memory/batch_size.hpp>

namespace nitro::memory::detail {

NITRO_INLINE at::Tensor host_copy(const at::Tensor& t) {
  return t.defined() ? t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true) : at::Tensor{};
}

NITRO_INLINE std::optional<at::Tensor> put_back(const at::Tensor& live, const at::Tensor& saved, c10::Device device) {
  if (!saved.defined()) return live.defined() ? std::optional<at::Tensor>(at::Tensor{}) : std::nullopt;
  if (live.defined() && live.sizes() == saved.sizes() && live.dtype() == saved.dtype()) {
    live.detach().copy_(saved);
    return std::nullopt;
  }
  return saved.to(device, /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace nitro::memory::detail

namespace nitro::memory {

NITRO_INLINE StateBackup::StateBackup(torch::nn::Module* model, torch::optim::Optimizer* optimizer) : model_(model), optimizer_(optimizer) {
  at::NoGradGuard no_grad;
  if (model_ != nullptr) {
    for (const auto& p : model_->parameters()) params_.push_back({p, detail::host_copy(p), detail::host_copy(p.grad())});
    for (const auto& b : model_->buffers()) buffers_.push_back({b, detail::host_copy(b), {}});
  }
  if (optimizer_ != nullptr) {
    // The optimizer's parameters that the model does not own (a learnable loss temperature, a head
    // kept outside the model): it steps them too.
    std::unordered_set<const void*> known;
    for (const auto& e : params_) known.insert(e.live.unsafeGetTensorImpl());
    for (auto& group : optimizer_->param_groups())
      for (const auto& p : group.params())
        if (known.insert(p.unsafeGetTensorImpl()).second)
          params_.push_back({p, detail::host_copy(p), detail::host_copy(p.grad())});
    save_optimizer();
  }
  {
    // The engine itself, not get_state(): that makes a tensor, which would count against a CPU budget.
    auto cpu = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(cpu.mutex());
    auto* impl = cpu.get<at::CPUGeneratorImpl>();
    cpu_rng_ = CpuRng{impl->engine(), impl->next_float_normal_sample(), impl->next_double_normal_sample()};
  }
#if NITRO_WITH_CUDA
  if (c10::cuda::device_count() > 0) {  // at::cuda::is_available(), without ATen/cuda/CUDAContext.h
    // Every GPU the model is on, and the current one: the trials draw from all of them.
    for (const auto index : ::nitro::detail::cuda_indices(devices(), c10::cuda::current_device())) {
      auto gen = at::cuda::detail::getDefaultCUDAGenerator(index);
      std::lock_guard<std::mutex> lock(gen.mutex());
      cuda_rng_.emplace_back(index, gen.get_state());
    }
  }
#endif
}

NITRO_INLINE std::vector<c10::Device> StateBackup::devices() const {
  std::vector<c10::Device> out;
  const auto add = [&](const at::Tensor& t) {
    if (t.defined() && std::find(out.begin(), out.end(), t.device()) == out.end()) out.push_back(t.device());
  };
  for (const auto& e : params_) add(e.live);
  for (const auto& e : buffers_) add(e.live);
  if (optimizer_ != nullptr)
    for (auto& group : optimizer_->param_groups())
      for (const auto& p : group.params()) add(p);
  return out;
}

NITRO_INLINE void StateBackup::restore() {
  at::NoGradGuard no_grad;
  for (auto& e : params_) {
    if (auto fresh = detail::put_back(e.live, e.value, e.live.device())) e.live.detach().copy_(*fresh);
    if (auto fresh = detail::put_back(e.live.grad(), e.grad, e.live.device())) e.live.mutable_grad() = *fresh;
  }
  for (auto& e : buffers_) e.live.detach().copy_(e.value);
  if (optimizer_ != nullptr) restore_optimizer();
  {
    auto cpu = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(cpu.mutex());
    auto* impl = cpu.get<at::CPUGeneratorImpl>();
    impl->set_engine(cpu_rng_.engine);
    impl->set_next_float_normal_sample(cpu_rng_.next_float);
    impl->set_next_double_normal_sample(cpu_rng_.next_double);
  }
#if NITRO_WITH_CUDA
  for (const auto& [index, state] : cuda_rng_) {
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(index);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
#endif
}

NITRO_INLINE void StateBackup::save_optimizer() {
  for (auto& group : optimizer_->param_groups())
    options_.push_back(group.has_options() ? group.options().clone() : nullptr);
  std::unordered_map<void*, c10::Device> devices;
  for (auto& group : optimizer_->param_groups())
    for (const auto& p : group.params()) devices.emplace(p.unsafeGetTensorImpl(), p.device());
  for (const auto& [key, state] : optimizer_->state()) {
    auto copy = state->clone();
    const bool known = detail::with_state_type(*copy, [&]<class S>() {
      detail::for_each_state_tensor(static_cast<S&>(*copy),
                                    [](const at::Tensor& t, auto set) { set(detail::host_copy(t)); });
    });
    if (!known) {  // an optimizer whose state we cannot copy field by field: serialise all of it
      states_.clear();
      torch::serialize::OutputArchive archive;
      optimizer_->save(archive);
      std::ostringstream out;
      archive.save_to(out);
      serialized_ = std::move(out).str();
      return;
    }
    const auto device = devices.find(key);
    states_.push_back({key, device != devices.end() ? device->second : c10::Device(c10::kCPU), std::move(copy)});
  }
}

NITRO_INLINE void StateBackup::restore_optimizer() {
  for (std::size_t i = 0; i < options_.size() && i < optimizer_->param_groups().size(); ++i)
    if (options_[i]) optimizer_->param_groups()[i].set_options(options_[i]->clone());
  auto& live = optimizer_->state();
  if (serialized_) {
    live.clear();  // load() adds the saved states; it does not drop newer ones
    torch::serialize::InputArchive archive;
    std::istringstream in(*serialized_);
    archive.load_from(in);
    optimizer_->load(archive);
    return;
  }
  // States the trials created are dropped; saved ones are put back in place.
  for (auto it = live.begin(); it != live.end();) {
    const bool saved = std::any_of(states_.begin(), states_.end(), [&](const auto& s) { return s.key == it->first; });
    it = saved ? std::next(it) : live.erase(it);
  }
  for (auto& s : states_) {
    auto found = live.find(s.key);
    const auto same = [](const auto& a, const auto& b) { return typeid(a) == typeid(b); };
    const bool same_type = found != live.end() && same(*found->second, *s.state);
    if (!same_type) {
      auto copy = s.state->clone();
      detail::with_state_type(*copy, [&]<class S>() {
        detail::for_each_state_tensor(static_cast<S&>(*copy), [&](const at::Tensor& t, auto set) {
          set(t.defined() ? t.to(s.device, false, true) : at::Tensor{});
        });
      });
      live[s.key] = std::move(copy);
      continue;
    }
    auto& current = *found->second;
    detail::with_state_type(current, [&]<class S>() {
      auto& cur = static_cast<S&>(current);
      auto& saved = static_cast<S&>(*s.state);
      std::vector<at::Tensor> values;
      detail::for_each_state_tensor(saved, [&](const at::Tensor& t, auto) { values.push_back(t); });
      std::size_t i = 0;
      detail::for_each_state_tensor(cur, [&](const at::Tensor& t, auto set) {
        if (auto fresh = detail::put_back(t, values[i], s.device)) set(*fresh);
        ++i;
      });
      if constexpr (!std::is_same_v<S, torch::optim::SGDParamState>) cur.step(saved.step());
    });
  }
}

}  // namespace nitro::memory

namespace nitro::memory::detail {

NITRO_INLINE void release_cached_memory() {
#if NITRO_WITH_CUDA
  if (c10::cuda::device_count() > 0) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

}  // namespace nitro::memory::detail
