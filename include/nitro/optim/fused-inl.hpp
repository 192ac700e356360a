#pragma once
// The definitions of nitro/optim/fused.hpp's non-template functions: included by fused.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/optim/fused.hpp>

namespace nitro::optim::detail {

NITRO_INLINE auto StepTensors::get(const at::Tensor& param, std::int64_t host_step, bool may_fill) -> Slot& {
  Slot& s = slots_[param.unsafeGetTensorImpl()];
  if (!may_fill && !(s.tensor.defined() && s.tensor.device() == param.device() && s.value == host_step))
    throw DeviceStepNotReady("nitro::optim: a step counter is not on the device yet; call prepare_device_step() "
                             "before capturing");
  if (!s.tensor.defined() || s.tensor.device() != param.device()) {
    s.tensor = at::full({}, static_cast<double>(host_step), at::TensorOptions().dtype(at::kFloat).device(param.device()));
    s.value = host_step;
  } else if (s.value != host_step) {
    s.tensor.fill_(static_cast<double>(host_step));
    s.value = host_step;
  }
  return s;
}

NITRO_INLINE const at::Tensor& LrTensors::get(std::size_t group, c10::Device device, double lr, bool may_fill) {
  for (auto& e : entries_)
    if (e.group == group && e.device == device) {
      if (e.value != lr) {
        if (!may_fill)
          throw DeviceStepNotReady("nitro::optim: a learning rate is not on the device yet; call "
                                   "prepare_device_step() before capturing");
        e.tensor.fill_(lr), e.value = lr;
      }
      return e.tensor;
    }
  if (!may_fill)
    throw DeviceStepNotReady("nitro::optim: a learning rate tensor was never made; run an eager step before capturing");
  entries_.push_back({group, device, lr, at::full({}, lr, at::TensorOptions().dtype(at::kFloat).device(device))});
  return entries_.back().tensor;
}

NITRO_INLINE bool same_but_lr(const torch::optim::SGDOptions& a, const torch::optim::SGDOptions& b) {
  return a.momentum() == b.momentum() && a.dampening() == b.dampening() && a.weight_decay() == b.weight_decay() &&
         a.nesterov() == b.nesterov();
}

NITRO_INLINE PerDevice::PerDevice(const at::Tensor* t) : t_(t) {}

NITRO_INLINE std::optional<at::Tensor> PerDevice::on(c10::Device device) {
  if (t_ == nullptr) return std::nullopt;
  if (t_->device() == device) return *t_;
  for (auto& [d, copy] : copies_)
    if (d == device) return copy;
  // To a GPU: ordered on its stream, no wait. To the CPU: the kernel reads the value at once, so wait.
  return copies_.emplace_back(device, t_->to(device, /*non_blocking=*/!device.is_cpu())).second;
}

NITRO_INLINE void check_param(const at::Tensor& p, const at::Tensor& grad, std::size_t index, std::string_view who) {
  NITRO_CHECK(at::isFloatingType(p.scalar_type()), who, ": parameter ", index, " is ", c10::toString(p.scalar_type()),
              "; the fused kernels take floating-point parameters (float, double, half, bfloat16)");
  NITRO_CHECK(p.layout() == c10::kStrided && grad.layout() == c10::kStrided, who, ": parameter ", index,
              " or its gradient is sparse; the fused kernels take dense tensors only (use torch::optim's optimizer)");
  NITRO_CHECK(p.is_non_overlapping_and_dense(), who, ": parameter ", index, " (", p.sizes(), ", strides ", p.strides(),
              ") is a view with gaps or overlaps; the CPU kernels walk a parameter's memory in order, so they would "
              "write outside it: make the parameter a tensor of its own (contiguous or channels-last)");
  NITRO_CHECK(p.device().is_cpu() || p.device().is_cuda(), who, ": parameter ", index, " is on ", p.device().str(),
              "; LibTorch's fused kernels run on the CPU and CUDA");
  NITRO_CHECK(grad.scalar_type() == p.scalar_type() && grad.device() == p.device(), who, ": the gradient of parameter ",
              index, " is ", c10::toString(grad.scalar_type()), " on ", grad.device().str(), ", the parameter ",
              c10::toString(p.scalar_type()), " on ", p.device().str(), "; they must agree");
}

NITRO_INLINE bool laid_out_like(const at::Tensor& t, const at::Tensor& p) {
  return t.scalar_type() == p.scalar_type() && t.device() == p.device() && t.strides() == p.strides();
}

NITRO_INLINE at::Tensor lay_out_like(const at::Tensor& t, const at::Tensor& p, std::size_t index, std::string_view who) {
  NITRO_CHECK(t.sizes() == p.sizes(), who, ": the state of parameter ", index, " is ", t.sizes(), ", the parameter ",
              p.sizes(), "; load the state of an optimizer over the same parameters");
  return at::empty_like(p, c10::MemoryFormat::Preserve).copy_(t);
}

NITRO_INLINE at::Tensor call_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

NITRO_INLINE void check_scale(const at::Tensor& scale, std::string_view who) {
  NITRO_CHECK(scale.defined() && scale.numel() == 1 && scale.scalar_type() == at::kFloat, who,
              "::step_scaled: the scale must be a float32 scalar tensor");
}

NITRO_INLINE std::ostream& operator<<(std::ostream& out, OptionsOf where) {
  return where.group < 0 ? out << "default " : out << "parameter group " << where.group << ": ";
}

NITRO_INLINE void check_options(const torch::optim::SGDOptions& o, std::string_view who, OptionsOf where) {
  NITRO_CHECK(std::isfinite(o.lr()) && o.lr() >= 0, who, ": ", where, "lr must be >= 0, got ", o.lr());
  NITRO_CHECK(std::isfinite(o.momentum()) && o.momentum() >= 0, who, ": ", where, "momentum must be >= 0, got ",
              o.momentum());
  NITRO_CHECK(std::isfinite(o.dampening()), who, ": ", where, "dampening must be finite, got ", o.dampening());
  NITRO_CHECK(std::isfinite(o.weight_decay()) && o.weight_decay() >= 0, who, ": ", where,
              "weight_decay must be >= 0, got ", o.weight_decay());
  NITRO_CHECK(!o.nesterov() || (o.momentum() > 0 && o.dampening() == 0), who, ": ", where,
              "nesterov needs momentum > 0 and dampening 0, got momentum ", o.momentum(), " and dampening ",
              o.dampening());
}

}  // namespace nitro::optim::detail

namespace nitro::optim {

NITRO_INLINE FusedSGD::FusedSGD(const std::vector<torch::optim::OptimizerParamGroup>& groups, torch::optim::SGDOptions defaults) : Fused(groups, std::move(defaults)) {}

NITRO_INLINE FusedSGD::FusedSGD(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults) : Fused(std::move(params), std::move(defaults)) {}

NITRO_INLINE void FusedSGD::run(const at::Tensor* grad_scale, const at::Tensor* found_inf) {
  at::NoGradGuard no_grad;
  const bool on_device = found_inf != nullptr;
  detail::PerDevice scale(grad_scale);
  auto& groups = param_groups();
  std::shared_ptr<detail::DeviceRecord<torch::optim::SGDOptions>> record;  // as FusedAdam's
  if (on_device) record = std::make_shared<detail::DeviceRecord<torch::optim::SGDOptions>>(), record->owner = this;
  if (stepped_.size() < groups.size()) stepped_.resize(groups.size()), fresh_.resize(groups.size());
  created_.clear();
  struct Clear {
    FusedSGD& o;
    ~Clear() {  // nothing here keeps a gradient or a state alive past the step
      for (auto& x : o.stepped_) x.clear();
      for (auto& x : o.fresh_) x.clear();
      o.created_.clear();
    }
  } clear{*this};
  check_groups();
  std::size_t index = 0;
  try {
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const auto& o = detail::options_of<torch::optim::SGDOptions>(groups[g]);
      const bool momentum = o.momentum() != 0;
      if (on_device) record->options.push_back(o), record->param_count += groups[g].params().size();
      for (const auto& p : groups[g].params()) {
        const std::size_t i = index++;
        if (!p.grad().defined()) continue;
        detail::check_param(p, p.grad(), i, who);
        NITRO_CHECK(!momentum || !p.device().is_cpu() ||
                        (p.scalar_type() != at::kHalf && p.scalar_type() != at::kBFloat16),
                    who, ": parameter ", i, " is ", c10::toString(p.scalar_type()), " on the CPU with momentum: "
                    "LibTorch 2.11's fused CPU kernel reads such a momentum buffer as float32 and computes it wrongly; "
                    "keep the parameter in float32 (autocast still runs the math in reduced precision) or use "
                    "torch::optim::SGD");
        if (!detail::laid_out_like(p.grad(), p)) p.mutable_grad() = detail::lay_out_like(p.grad(), p, i, who);
        detail::Bucket<torch::optim::SGDParamState>* b = nullptr;
        if (momentum) {
          auto& slot = state()[p.unsafeGetTensorImpl()];
          if (slot == nullptr || !static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer().defined()) {
            if (on_device) {
              if (slot == nullptr) state().erase(p.unsafeGetTensorImpl());
              throw DeviceStepNotReady(nitro::detail::concat(
                  who, ": parameter ", i, " has no momentum buffer yet; a step captured for the device cannot make it "
                  "(its first step would be replayed every time): run an eager step first (graph::Capture does)"));
            }
            auto s = std::make_unique<torch::optim::SGDParamState>();
            s->momentum_buffer(at::empty_like(p, c10::MemoryFormat::Preserve));
            slot = std::move(s);
            created_.push_back(p.unsafeGetTensorImpl());
            b = &fresh_[g].find(p.device(), p.scalar_type());
          } else {
            auto& st = static_cast<torch::optim::SGDParamState&>(*slot);
            if (on_device && !detail::laid_out_like(st.momentum_buffer(), p))
              throw DeviceStepNotReady(nitro::detail::concat(who, ": the momentum buffer of parameter ", i, " is laid "
                                                             "out unlike the parameter; a captured step cannot replace "
                                                             "it: run an eager step first"));
            if (!detail::laid_out_like(st.momentum_buffer(), p))
              st.momentum_buffer(detail::lay_out_like(st.momentum_buffer(), p, i, who));
            b = &stepped_[g].find(p.device(), p.scalar_type());
          }
          b->first.push_back(static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer());
        } else {
          b = &stepped_[g].find(p.device(), p.scalar_type());
        }
        b->params.push_back(p);
        b->grads.push_back(p.grad());
        if (on_device) {
          auto* st = momentum ? state()[p.unsafeGetTensorImpl()].get() : nullptr;
          record->entries.push_back({p, p.data_ptr(), st, momentum ? b->first.back() : at::Tensor(), {}, {}, {}, nullptr});
        }
      }
    }
  } catch (...) {
    // A buffer made for a first step that did not run holds no gradient yet: no state is kept.
    for (void* key : created_) state().erase(key);
    throw;
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto& o = detail::options_of<torch::optim::SGDOptions>(groups[g]);
    const auto call = [&](detail::Bucket<torch::optim::SGDParamState>& b, bool first_step) {
      const auto gs = scale.on(b.device);
      const auto fi = on_device && found_inf->defined() ? std::optional<at::Tensor>(*found_inf) : std::nullopt;
      if (b.device.is_cpu() || b.dtype == at::kDouble) {
        if (on_device) record->baked_lrs.emplace_back(g, o.lr());
        at::_fused_sgd_(b.params, b.grads, b.first, o.weight_decay(), o.momentum(), o.lr(), o.dampening(),
                        o.nesterov(), /*maximize=*/false, first_step, gs, fi);
      } else {
        at::_fused_sgd_(b.params, b.grads, b.first, o.weight_decay(), o.momentum(),
                        lrs_.get(g, b.device, o.lr(), /*may_fill=*/!on_device), o.dampening(), o.nesterov(),
                        /*maximize=*/false, first_step, gs, fi);
      }
    };
    // First steps first: a parameter listed twice has its buffer made before its second update reads it.
    fresh_[g].for_each([&](detail::Bucket<torch::optim::SGDParamState>& b) { call(b, true); });
    stepped_[g].for_each([&](detail::Bucket<torch::optim::SGDParamState>& b) { call(b, false); });
  }
  if (on_device) record_ = std::move(record);
}

NITRO_INLINE bool FusedSGD::same_state(torch::optim::OptimizerParamState& base, const detail::DeviceRecord<torch::optim::SGDOptions>::Entry& e) {
  return !e.first.defined() || static_cast<torch::optim::SGDParamState&>(base).momentum_buffer().is_same(e.first);
}

}  // namespace nitro::optim
