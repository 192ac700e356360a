#pragma once
// nitro::TrainingLoop<Amp, Accumulation, Checkpoint, Extras...>: one training step with mixed
// precision, gradient accumulation, activation checkpointing, clipping and monitoring chosen as types.
//
//   using Loop = nitro::TrainingLoop<nitro::amp::Bf16, nitro::accumulate::Fixed<4>, nitro::checkpoint::Off,
//                                    nitro::clip::Norm>;
//   Loop loop{model, optimizer, {.clip = {.max_norm = 1.0}}};
//   for (auto& batch : *loader) {
//     auto r = loop.step(batch, [&](auto& b) { return torch::cross_entropy_loss(model->forward(b.data), b.target); });
//   }
//
// A policy that is off costs nothing: the loop calls it under `if constexpr`. step() never
// synchronises the host with the device except where a policy must decide on the host whether to
// step: amp::Fp16 and skip_nonfinite read one flag per optimizer step (as torch.amp.GradScaler does).
// The loss comes back as a device tensor; read it with .item() only when you need the number.
//
// With a torch::nn::Sequential model the loss function may take the model's forward as its first
// argument, `[&](auto& forward, auto& b) { return loss(forward(b.data), b.target); }`: the loop
// then runs the Sequential under the checkpoint policy. Other models use checkpoint::Off here and
// nitro::checkpoint::run(fn, inputs...) inside their own forward.
//
// A monitor policy among the extras (monitor::Phases from monitor/phases.hpp) is told when each
// phase of a step ends; loop.monitor() gives its figures. monitor::Off, the default, is never called.
#include <nitro/core/concepts.hpp>
#include <nitro/core/device.hpp>
#include <nitro/core/error.hpp>
#include <nitro/train/accumulate.hpp>
#include <nitro/train/amp.hpp>
#include <nitro/train/checkpoint.hpp>
#include <nitro/train/clip.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace nitro {

/// What one TrainingLoop::step did. Tensors are on the device; reading them synchronises.
struct StepResult {
  /// The micro-batch's loss as the loss function returned it (not divided, not scaled), detached.
  at::Tensor loss;
  /// The optimizer stepped after this micro-batch.
  bool stepped = false;
  /// An optimizer step was due and was skipped because a gradient (or the loss) was inf or NaN.
  bool skipped = false;
  /// The loss scale after this step (amp::Fp16 only; undefined otherwise).
  at::Tensor loss_scale;
  /// The total gradient norm before clipping (clip::Norm, on steps that stepped or skipped).
  at::Tensor grad_norm;
};

namespace detail {

template <class Family, class Default, class... Ps>
struct find_policy {
  using type = Default;
};
template <class Family, class Default, class P, class... Ps>
struct find_policy<Family, Default, P, Ps...> {
  using type = std::conditional_t<OfFamily<P, Family>, P, typename find_policy<Family, Default, Ps...>::type>;
};

struct NoScaler {};
template <class Amp, bool = Amp::scales_loss>
struct scaler_of {
  using type = NoScaler;
};
template <class Amp>
struct scaler_of<Amp, true> {
  using type = typename Amp::scaler_type;
};

template <class T>
inline constexpr bool is_sequential = std::is_base_of_v<torch::nn::SequentialImpl, T>;

/// Rows of a batch: the size of dimension 0 of its first tensor that has one; -1 when none has.
template <class Batch>
std::int64_t batch_rows(const Batch& batch) {
  std::int64_t rows = -1;
  nitro::for_each_tensor(batch, [&](const at::Tensor& t) {
    if (rows < 0 && t.defined() && t.dim() >= 1) rows = t.size(0);
  });
  return rows;
}

/// Rows [begin, begin + count) of every tensor of the batch whose dimension 0 has `rows` rows (views,
/// no copy); other tensors are passed whole.
template <class Batch>
Batch batch_slice(const Batch& batch, std::int64_t rows, std::int64_t begin, std::int64_t count) {
  return nitro::map_tensors(batch, [&](const at::Tensor& t) {
    return t.defined() && t.dim() >= 1 && t.size(0) == rows ? t.narrow(0, begin, count) : t;
  });
}

template <class P>
inline constexpr bool is_extra_policy = ClipPolicy<P> || MonitorPolicy<P>;
template <class Family, class... Ps>
inline constexpr int count_family = (0 + ... + (OfFamily<Ps, Family> ? 1 : 0));

}  // namespace detail

/// @tparam Amp optional, default amp::Off: amp::Off, amp::Bf16 or amp::Fp16<Scaler>.
/// @tparam Checkpoint optional, default checkpoint::Off: checkpoint::Off, Segments<S> or Sqrt
///         (the last two need a torch::nn::Sequential model).
/// @tparam Accumulation optional, default accumulate::Off: accumulate::Off, Fixed<N>, Dynamic or Adaptive.
/// @tparam Extras optional, in any order: at most one clip policy (clip::Norm or clip::Value; default
///         clip::Off) and at most one monitor policy (monitor::Phases; default monitor::Off).
template <AmpPolicy Amp = amp::Off, AccumulationPolicy Accumulation = accumulate::Off,
          CheckpointPolicy Checkpoint = checkpoint::Off, class... Extras>
class TrainingLoop {
  static_assert((detail::is_extra_policy<Extras> && ...),
                "TrainingLoop<Amp, Accumulation, Checkpoint, Extras...>: each extra policy must be a clip policy "
                "(nitro::clip::Norm or nitro::clip::Value) or a monitor policy (nitro::monitor::Phases); AMP, "
                "accumulation and checkpoint policies go in the first three places");
  static_assert(detail::count_family<family::Clip, Extras...> <= 1, "TrainingLoop: give at most one clip policy");
  static_assert(detail::count_family<family::Monitor, Extras...> <= 1,
                "TrainingLoop: give at most one monitor policy");

 public:
  using amp_policy = Amp;
  using accumulation_policy = Accumulation;
  using checkpoint_policy = Checkpoint;
  using clip_policy = typename detail::find_policy<family::Clip, clip::Off, Extras...>::type;
  using monitor_policy = typename detail::find_policy<family::Monitor, monitor::Off, Extras...>::type;

  struct Options {
    typename Amp::Options amp{};
    typename Accumulation::Options accumulate{};
    typename Checkpoint::Options checkpoint{};
    typename clip_policy::Options clip{};
    typename monitor_policy::Options monitor{};
    /// Skip an optimizer step whose gradients hold inf or NaN (fp32 and bf16; amp::Fp16 always
    /// does). Costs one host-device synchronisation per optimizer step.
    bool skip_nonfinite = false;
  };

  /// Any model: the loss function receives the batch only.
  TrainingLoop(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer)
      : TrainingLoop(std::move(model), optimizer, Options{}) {}
  TrainingLoop(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer, Options options)
      : model_(std::move(model)), optimizer_(&optimizer), o_(options) {
    static_assert(!Checkpoint::enabled,
                  "TrainingLoop: checkpoint::Segments and checkpoint::Sqrt apply to a torch::nn::Sequential model; "
                  "for another model use checkpoint::Off here and nitro::checkpoint::run(fn, inputs...) inside its forward");
    init();
  }

  /// A model held the LibTorch way (torch::nn::Linear, a TORCH_MODULE type, torch::nn::Sequential).
  template <class Impl>
  TrainingLoop(const torch::nn::ModuleHolder<Impl>& model, torch::optim::Optimizer& optimizer)
      : TrainingLoop(model, optimizer, Options{}) {}
  template <class Impl>
  TrainingLoop(const torch::nn::ModuleHolder<Impl>& model, torch::optim::Optimizer& optimizer, Options options)
      : model_(model.ptr()), optimizer_(&optimizer), o_(options) {
    static_assert(!Checkpoint::enabled || detail::is_sequential<Impl>,
                  "TrainingLoop: checkpoint::Segments and checkpoint::Sqrt apply to a torch::nn::Sequential model; "
                  "for another model use checkpoint::Off here and nitro::checkpoint::run(fn, inputs...) inside its forward");
    if constexpr (detail::is_sequential<Impl>) sequential_ = model.ptr();
    init();
  }

  TrainingLoop(const TrainingLoop&) = delete;
  TrainingLoop& operator=(const TrainingLoop&) = delete;

  /// One micro-batch: forward and loss under the AMP policy, backward, and the optimizer step when
  /// the accumulation window is full. `loss_fn(batch)` (or `loss_fn(forward, batch)` with a
  /// Sequential model) must return a scalar tensor.
  ///
  /// accumulate::Adaptive: the batch is one optimizer step; it is split along dimension 0 of its
  /// tensors when memory runs out (the loss function must then return a mean over the rows).
  template <class Batch, class LossFn>
  StepResult step(const Batch& batch, LossFn&& loss_fn) {
    if constexpr (monitor_policy::enabled) monitor_.begin_step();
    // Rows of the batch, where a policy needs them (split, samples counted): one pass a step.
    [[maybe_unused]] std::int64_t rows = -1;
    if constexpr (detail::SplitsOnOom<Accumulation> || monitor_policy::enabled) rows = detail::batch_rows(batch);
    StepResult result;
    if constexpr (detail::SplitsOnOom<Accumulation>) {
      result.loss = split_forward_backward(batch, rows, loss_fn);
    } else {
      result.loss = forward_backward(batch, loss_fn, Accumulation::enabled ? static_cast<double>(window_) : 1.0);
    }
    ++micro_;
    if (micro_ >= window_) optimizer_step(result);
    if constexpr (monitor_policy::enabled) {
      monitor_.mark(Phase::optimizer);
      monitor_.end_step(rows);
    }
    return result;
  }

  /// Steps on a partial accumulation window (at the end of an epoch), its gradient rescaled to the
  /// mean over the micro-batches it had. Returns nothing when the window is empty.
  std::optional<StepResult> flush() {
    if (micro_ == 0) return std::nullopt;
    StepResult result;
    if (micro_ < window_) {
      grads_.assign(params_);
      const double rescale = static_cast<double>(window_) / static_cast<double>(micro_);
      grads_.for_each([&](detail::GradGroups::Group& g) { at::_foreach_mul_(g.grads, rescale); });
    }
    optimizer_step(result);
    return result;
  }

  /// The forward of a Sequential model under the checkpoint policy.
  at::Tensor forward(const at::Tensor& x) {
    NITRO_CHECK(sequential_ != nullptr,
                "TrainingLoop::forward needs a torch::nn::Sequential model; call your model's forward yourself");
    if constexpr (Checkpoint::enabled) {
      return detail::run_segments(*sequential_,
                                  Checkpoint::segments(static_cast<std::int64_t>(sequential_->size()), o_.checkpoint), x);
    } else {
      return sequential_->forward(x);
    }
  }

  /// accumulate::Dynamic: micro-batches per optimizer step from now on; only between steps.
  void set_accumulation_steps(std::int64_t steps)
    requires std::same_as<Accumulation, accumulate::Dynamic>
  {
    NITRO_CHECK(micro_ == 0, "TrainingLoop::set_accumulation_steps: ", micro_,
                " micro-batches are waiting for the optimizer step; change it right after a step (or flush())");
    window_ = accumulate::Dynamic::steps({steps});
    o_.accumulate.steps = steps;
  }

  /// accumulate::Adaptive: the parts each batch is split into now (1 until memory first ran out).
  std::int64_t split() const noexcept
    requires detail::SplitsOnOom<Accumulation>
  {
    return split_;
  }
  /// accumulate::Adaptive: how many times a batch ran out of memory and the split doubled.
  std::int64_t splits_made() const noexcept
    requires detail::SplitsOnOom<Accumulation>
  {
    return splits_made_;
  }

  /// The monitor policy's recorder (e.g. monitor::Phases: summary(), records).
  auto& monitor() noexcept
    requires(monitor_policy::enabled)
  {
    return monitor_;
  }
  const auto& monitor() const noexcept
    requires(monitor_policy::enabled)
  {
    return monitor_;
  }

  /// The loss scaler (amp::Fp16): its state_dict() saves with the model.
  auto& scaler() noexcept
    requires Amp::scales_loss
  {
    return scaler_;
  }

  std::int64_t accumulation_steps() const noexcept { return window_; }
  /// Micro-batches since the last optimizer step.
  std::int64_t pending_micro_batches() const noexcept { return micro_; }
  std::int64_t optimizer_steps() const noexcept { return steps_; }
  std::int64_t skipped_steps() const noexcept { return skipped_; }
  const Options& options() const noexcept { return o_; }
  torch::nn::Module& model() noexcept { return *model_; }
  torch::optim::Optimizer& optimizer() noexcept { return *optimizer_; }

 private:
  struct Forward {
    TrainingLoop* loop;
    at::Tensor operator()(const at::Tensor& x) const { return loop->forward(x); }
  };

  // Forward and loss under the AMP policy, backward of loss / divisor; returns the loss, detached.
  template <class Batch, class LossFn>
  at::Tensor forward_backward(const Batch& batch, LossFn& loss_fn, double divisor) {
    at::Tensor loss;
    {
      std::optional<AutocastGuard> autocast;
      if constexpr (Amp::enabled) autocast.emplace(device_type_, Amp::dtype);
      loss = call(loss_fn, batch);
    }
    NITRO_CHECK(loss.defined() && loss.numel() == 1,
                "TrainingLoop::step: the loss function must return a scalar tensor (reduce it with mean() or sum()); "
                "got ", loss.defined() ? "a tensor of shape " : "an undefined tensor",
                loss.defined() ? loss.sizes() : at::IntArrayRef{});
    if constexpr (monitor_policy::enabled) monitor_.mark(Phase::forward);
    at::Tensor objective = divisor != 1.0 ? loss / divisor : loss;
    if constexpr (Amp::scales_loss) objective = scaler_.scale(objective);
    objective.backward();
    if constexpr (monitor_policy::enabled) monitor_.mark(Phase::backward);
    return loss.detach();
  }

  // accumulate::Adaptive: forward and backward over split_ parts of the batch; on running out of
  // memory, drop the partial gradients, double the split and start again. The optimizer step stays
  // outside: it must never run twice on one batch.
  template <class Batch, class LossFn>
  at::Tensor split_forward_backward(const Batch& batch, std::int64_t rows, LossFn& loss_fn) {
    NITRO_CHECK(rows >= 1, "TrainingLoop::step with accumulate::Adaptive: the batch needs a tensor whose "
                "dimension 0 holds its rows (the samples) to split it; got none with rows");
    const std::int64_t limit =
        o_.accumulate.max_split > 0 ? std::min(o_.accumulate.max_split, rows) : rows;
    for (;;) {
      const std::int64_t parts = std::min(split_, rows);
      try {
        if (parts == 1) return forward_backward(batch, loss_fn, 1.0);
        at::Tensor total;
        for (std::int64_t i = 0; i < parts; ++i) {
          const std::int64_t begin = i * rows / parts, count = (i + 1) * rows / parts - begin;
          const double share = static_cast<double>(count) / static_cast<double>(rows);
          const at::Tensor part = forward_backward(detail::batch_slice(batch, rows, begin, count), loss_fn,
                                                   static_cast<double>(rows) / static_cast<double>(count));
          total = total.defined() ? total.add(part, share) : part.mul(share);
        }
        return total;
      } catch (const c10::OutOfMemoryError& e) {
        optimizer_->zero_grad(/*set_to_none=*/true);  // the gradients of the parts that finished
        if (parts >= limit) throw;
        const std::int64_t previous = split_;
        split_ = std::min(parts * 2, limit);
        ++splits_made_;
        if (o_.accumulate.on_split)
          o_.accumulate.on_split({previous, split_, rows, std::string(e.what_without_backtrace())});
      }
    }
  }

  template <class LossFn, class Batch>
  at::Tensor call(LossFn& loss_fn, const Batch& batch) {
    if constexpr (std::is_invocable_v<LossFn&, Forward&, const Batch&>) {
      Forward forward{this};
      return loss_fn(forward, batch);
    } else {
      static_assert(std::is_invocable_v<LossFn&, const Batch&>,
                    "TrainingLoop::step(batch, loss_fn): loss_fn must be callable as loss_fn(batch), or as "
                    "loss_fn(forward, batch) with a torch::nn::Sequential model, and return the loss tensor");
      return loss_fn(batch);
    }
  }

  void init() {
    NITRO_CHECK(model_ != nullptr, "TrainingLoop: the model is null");
    for (const auto& group : optimizer_->param_groups())
      for (const auto& p : group.params()) params_.push_back(p);
    NITRO_CHECK(!params_.empty(),
                "TrainingLoop: the optimizer has no parameters; build it from the model's parameters(), e.g. "
                "torch::optim::SGD(model->parameters(), 0.1)");
    window_ = Accumulation::steps(o_.accumulate);
    if constexpr (detail::SplitsOnOom<Accumulation>) split_ = o_.accumulate.initial_split;
    if constexpr (clip_policy::enabled) clip_policy::validate(o_.clip);
    device_type_ = params_.front().device().type();
    if constexpr (monitor_policy::enabled) monitor_ = typename monitor_policy::Recorder(o_.monitor, device_type_);
    if constexpr (Amp::enabled) {
      NITRO_CHECK(compat::autocast_available(device_type_), "TrainingLoop: amp::", Amp::name,
                  " needs autocast, which LibTorch does not offer on ", c10::DeviceTypeName(device_type_),
                  "; use amp::Off there");
    }
    if constexpr (Amp::scales_loss) scaler_ = typename Amp::scaler_type(o_.amp);
  }

  void optimizer_step(StepResult& result) {
    grads_.assign(params_);
    at::Tensor found_inf;
    if constexpr (Amp::scales_loss) {
      found_inf = scaler_.unscale(grads_);
    } else {
      if (o_.skip_nonfinite) {
        if (!one_.defined()) one_ = at::ones({}, params_.front().options().dtype(at::kFloat));
        found_inf = at::zeros({}, one_.options());
        detail::unscale_grads(grads_, one_, found_inf);  // multiplies by 1: only the check
      }
    }
    if constexpr (clip_policy::enabled) result.grad_norm = clip_policy::apply(grads_, o_.clip);
    // The one host decision of a step, where a policy needs it.
    const bool skip = found_inf.defined() && found_inf.item<float>() > 0.0f;
    if (!skip) optimizer_->step();
    if constexpr (Amp::scales_loss) {
      scaler_.update(found_inf);
      result.loss_scale = scaler_.scale_tensor();
    }
    optimizer_->zero_grad(/*set_to_none=*/true);
    micro_ = 0;
    ++steps_;
    skipped_ += skip ? 1 : 0;
    result.stepped = !skip;
    result.skipped = skip;
  }

  std::shared_ptr<torch::nn::Module> model_;
  std::shared_ptr<torch::nn::SequentialImpl> sequential_;
  torch::optim::Optimizer* optimizer_;
  Options o_;
  std::vector<at::Tensor> params_;
  detail::GradGroups grads_;
  c10::DeviceType device_type_ = c10::DeviceType::CPU;
  std::int64_t window_ = 1;
  std::int64_t micro_ = 0;
  std::int64_t steps_ = 0;
  std::int64_t skipped_ = 0;
  at::Tensor one_;
  std::int64_t split_ = 1;
  std::int64_t splits_made_ = 0;
  [[no_unique_address]] typename detail::scaler_of<Amp>::type scaler_{};
  [[no_unique_address]] typename monitor_policy::Recorder monitor_{o_.monitor, device_type_};
};

}  // namespace nitro
