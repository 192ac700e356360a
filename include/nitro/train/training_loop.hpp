#pragma once
// nitro::TrainingLoop<Policies...>: one training step with mixed precision, gradient accumulation,
// activation checkpointing, clipping and monitoring chosen as types, given in any order; a family
// left out is off.
//
//   using Loop = nitro::TrainingLoop<nitro::amp::Bf16, nitro::accumulate::Fixed<4>, nitro::clip::Norm>;
//   Loop loop{model, optimizer, {.clip = {.max_norm = 1.0}}};
//   for (auto& batch : *loader) {
//     auto r = loop.step(batch, [&](auto& b) { return torch::cross_entropy_loss(model->forward(b.data), b.target); });
//   }
//
// Families (one policy each at most): amp:: (Off, Bf16, Fp16<Scaler>), accumulate:: (Off, Fixed<N>,
// Dynamic, Adaptive), checkpoint:: (Off, Segments<S>, Sqrt), clip:: (Off, Norm, Value), monitor::
// (Off, Phases). A user-written policy declares its family and satisfies that family's concept in
// core/concepts.hpp, which checks everything the loop uses.
//
// A policy that is off costs nothing: the loop calls it under `if constexpr`. step() never
// synchronises the host with the device except where a policy must decide on the host whether to
// step: amp::Fp16 and skip_nonfinite read one flag per optimizer step (as torch.amp.GradScaler does).
// The loss comes back as a device tensor; read it with .item() only when you need the number.
//
// Checkpointing: with a torch::nn::Sequential model the loss function may take the model's forward as
// its first argument, `[&](auto& forward, auto& b) { return loss(forward(b.data), b.target); }`: the
// loop then runs the Sequential under the checkpoint policy. Any other model applies the policy in its
// own forward with nitro::checkpoint::sequential(blocks, x) or checkpoint::block(fn, x) (see
// train/checkpoint.hpp). A step whose model never took the policy throws nitro::Error.
//
// A monitor policy (monitor::Phases from monitor/phases.hpp) is told when each phase of a step ends;
// loop.monitor() gives its figures. monitor::Off, the default, is never called.
//
// Gradients belong to their step: each accumulation window starts from no gradient on the loop's own
// parameters (those of its optimizer): what another backward left there is released (set to none, no
// kernel) before the window's first forward, and the loop releases its gradients again after its
// optimizer step. So no zero_grad() is needed, also with several models in one run: in a GAN the
// generator's loss goes backward through the discriminator and leaves gradients there, which the
// discriminator loop's next step does not add (examples/dcgan.cpp; tests/train/two_models.cpp checks
// it equals the plain program with its zero_grad() calls bit for bit). Within a window, the loop adds
// its micro-batches' gradients, and anything else's that reaches its parameters meanwhile, as PyTorch
// does. Several loops in one run: snapshot::Run (snapshot/policy.hpp) saves them in one snapshot, and
// each monitor's pause() keeps the other loop's step out of its data wait (monitor/phases.hpp).
//
// The loop's own state (counters, accumulation window, loss scale, split) is state() / load_state():
// what memory::find_max_batch_size puts back after its trials, and what a snapshot saves.
#include <nitro/core/concepts.hpp>
#include <nitro/core/device.hpp>
#include <nitro/core/error.hpp>
#include <nitro/memory/oom.hpp>
#include <nitro/memory/trial_loops.hpp>
#include <nitro/train/accumulate.hpp>
#include <nitro/train/amp.hpp>
#include <nitro/train/checkpoint.hpp>
#include <nitro/train/clip.hpp>
#include <nitro/train/hooks.hpp>
#include <nitro/optim/fused_step.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_mul.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace nitro {

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

template <class Amp>
typename scaler_of<Amp>::type make_scaler(const typename Amp::Options& options) {
  if constexpr (Amp::scales_loss) {
    return typename Amp::scaler_type(options);
  } else {
    return {};
  }
}

/// The device of the optimizer's first parameter; the CPU when it has none (the loop then refuses it).
inline c10::Device first_parameter_device(torch::optim::Optimizer& optimizer) {
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) return p.device();
  return c10::Device(c10::kCPU);
}

template <class P>
inline constexpr bool is_loop_policy = OfFamily<P, family::Amp> || OfFamily<P, family::Accumulation> ||
                                       OfFamily<P, family::Checkpoint> || OfFamily<P, family::Clip> ||
                                       OfFamily<P, family::Monitor> || OfFamily<P, family::Hook>;
template <class Family, class... Ps>
inline constexpr int count_family = (0 + ... + (OfFamily<Ps, Family> ? 1 : 0));

// The policy of each family, checked against its concept: a policy that misses a piece the loop
// uses is refused here, with the piece named, rather than deep inside the loop.
template <AmpPolicy P>
struct checked_amp {
  using type = P;
};
template <AccumulationPolicy P>
struct checked_accumulation {
  using type = P;
};
template <CheckpointPolicy P>
struct checked_checkpoint {
  using type = P;
};
template <ClipPolicy P>
struct checked_clip {
  using type = P;
};
template <MonitorPolicy P>
struct checked_monitor {
  using type = P;
};
template <HookPolicy P>
struct checked_hook {
  using type = P;
};
template <class Tuple>
struct checked_hooks;
template <class... Hs>
struct checked_hooks<std::tuple<Hs...>> {
  using type = std::tuple<typename checked_hook<Hs>::type...>;
};

/// The checks of load_state that do not depend on the loop's policies: the counters of a State.
NITRO_INLINE void check_loop_counters(std::int64_t accumulation_steps, std::int64_t pending_micro_batches,
                                      std::int64_t optimizer_steps, std::int64_t skipped_steps, std::int64_t split,
                                      std::int64_t splits_made);

/// The predefined levels (level::Basic, Advanced, Ultra, Max): with NITRO_COMPILED their members are
/// compiled once, in Nitro's library, and each program only declares them (extern template).
template <class Loop>
inline constexpr bool is_predefined_level = false;

// NITRO_EXPLICIT_INSTANTIATE_ONLY (RAFT_EXPLICIT_INSTANTIATE_ONLY's idea): a member of a predefined
// level compiled in a program's own translation unit, which NITRO_COMPILED's extern template
// declarations exist to prevent, is a compile error instead of a silent slower build.
#if defined(NITRO_EXPLICIT_INSTANTIATE_ONLY) && !defined(NITRO_COMPILED_SOURCE)
template <class Loop>
inline constexpr bool implicit_instantiation_refused = is_predefined_level<Loop>;
#else
template <class Loop>
inline constexpr bool implicit_instantiation_refused = false;
#endif

}  // namespace detail

// The members of TrainingLoop defined out of the class, as explicit instantiation declarations
// (prefix `extern template`) or definitions (`template`) for the loop type L, a type alias: how the
// predefined levels are declared in their headers and compiled in Nitro's library (src/train.cpp).
#define NITRO_DETAIL_LOOP_MEMBERS(prefix, L)                                                            \
  prefix L::TrainingLoop(std::shared_ptr<torch::nn::Module>, torch::optim::Optimizer&, L::Options);    \
  prefix std::optional<::nitro::StepResult> L::flush();                                                 \
  prefix at::Tensor L::forward(const at::Tensor&);                                                      \
  prefix L::State L::state() const;                                                                     \
  prefix void L::load_state(const L::State&);                                                           \
  prefix void L::init();                                                                                \
  prefix void L::drop_window() noexcept;                                                                \
  prefix L::CheckedGrads L::check_grads(::nitro::StepResult&);                                          \
  prefix void L::count_step(::nitro::StepResult&, bool);                                                \
  prefix void L::optimizer_step(::nitro::StepResult&);                                                  \
  prefix std::vector<std::function<void()>> L::load_hook_states(                                        \
      const std::map<std::string, ::nitro::StateDict, std::less<>>&)

#define NITRO_DETAIL_NOT_IMPLICIT(Loop)                                                                          \
  static_assert(!::nitro::detail::implicit_instantiation_refused<Loop>,                                         \
                "NITRO_EXPLICIT_INSTANTIATE_ONLY: a member of a predefined level (level::Basic, Advanced, Ultra, " \
                "Max) is compiled in this translation unit; build with NITRO_COMPILED (link nitro::compiled), "    \
                "whose library holds them, and include the header that names the level (train/levels.hpp, "       \
                "graph/capture.hpp for Max)")

/// One training step with its policies chosen as types (see the top of this file).
/// @tparam Policies any number, in any order, at most one per family: an AMP policy (default
///         amp::Off), an accumulation policy (accumulate::Off), a checkpoint policy (checkpoint::Off),
///         a clip policy (clip::Off), a monitor policy (monitor::Off), and any number of hook
///         policies (train/hooks.hpp), called in the order given.
template <class... Policies>
class TrainingLoop {
  static_assert((detail::is_loop_policy<Policies> && ...),
                "TrainingLoop<Policies...>: each argument must be a policy of the amp::, accumulate::, "
                "checkpoint::, clip:: or monitor:: family, or a hook policy (a type with `using family = "
                "nitro::family::...`; see core/concepts.hpp and train/hooks.hpp); give them in any order");
  static_assert(detail::count_family<family::Amp, Policies...> <= 1, "TrainingLoop: give at most one AMP policy");
  static_assert(detail::count_family<family::Accumulation, Policies...> <= 1,
                "TrainingLoop: give at most one accumulation policy");
  static_assert(detail::count_family<family::Checkpoint, Policies...> <= 1,
                "TrainingLoop: give at most one checkpoint policy");
  static_assert(detail::count_family<family::Clip, Policies...> <= 1, "TrainingLoop: give at most one clip policy");
  static_assert(detail::count_family<family::Monitor, Policies...> <= 1,
                "TrainingLoop: give at most one monitor policy");

 public:
  /// The AMP policy (amp::Off when none is given).
  using amp_policy =
      typename detail::checked_amp<typename detail::find_policy<family::Amp, amp::Off, Policies...>::type>::type;
  /// The accumulation policy (accumulate::Off when none is given).
  using accumulation_policy = typename detail::checked_accumulation<
      typename detail::find_policy<family::Accumulation, accumulate::Off, Policies...>::type>::type;
  /// The checkpoint policy (checkpoint::Off when none is given).
  using checkpoint_policy = typename detail::checked_checkpoint<
      typename detail::find_policy<family::Checkpoint, checkpoint::Off, Policies...>::type>::type;
  /// The clip policy (clip::Off when none is given).
  using clip_policy =
      typename detail::checked_clip<typename detail::find_policy<family::Clip, clip::Off, Policies...>::type>::type;
  /// The monitor policy (monitor::Off when none is given).
  using monitor_policy = typename detail::checked_monitor<
      typename detail::find_policy<family::Monitor, monitor::Off, Policies...>::type>::type;
  /// The hook policies, in the order given, as a std::tuple of types.
  using hook_policies = typename detail::checked_hooks<typename detail::hook_list<Policies...>::type>::type;

 private:
  using Amp = amp_policy;
  using Accumulation = accumulation_policy;
  using Checkpoint = checkpoint_policy;
  using Slots = detail::hook_slots<monitor_policy, clip_policy, hook_policies>;
  static_assert(Slots::names_distinct(), "TrainingLoop: two hook policies have the same name (or one is named "
                "\"monitor\" or \"clip\"); a hook's name is the key of its state, so give each its own");
  static_assert(Slots::names_printable(), "TrainingLoop: a hook policy's name must be 1 to 64 printable characters "
                "without spaces: it names the hook's part in snapshots");

 public:
  /// The knobs of each policy, and the loop's own.
  struct Options {
    /// The AMP policy's (the loss scaler's with amp::Fp16).
    typename Amp::Options amp{};
    /// The accumulation policy's (e.g. `.accumulate = {.steps = 4}` with accumulate::Dynamic).
    typename Accumulation::Options accumulate{};
    /// The checkpoint policy's.
    typename Checkpoint::Options checkpoint{};
    /// The clip policy's (e.g. `.clip = {.max_norm = 1.0}` with clip::Norm).
    typename clip_policy::Options clip{};
    /// The monitor policy's.
    typename monitor_policy::Options monitor{};
    /// The hook policies' options, in the order of the loop's type: `.hooks = {MyHook::Options{...}}`.
    typename Slots::options hooks{};
    /// Skip an optimizer step whose gradients hold inf or NaN (fp32 and bf16; amp::Fp16 always
    /// does). The gradients stay as they are; costs one host-device synchronisation per optimizer step.
    bool skip_nonfinite = false;
  };

  /// The loop's own state, apart from the model, the optimizer and the gradients (which
  /// memory::StateBackup and snapshots keep): what load_state() puts back.
  struct State {
    /// Micro-batches per optimizer step (accumulate::Dynamic changes it).
    std::int64_t accumulation_steps = 1;
    /// Micro-batches since the last optimizer step: their gradients are in the parameters' .grad,
    /// which must be put back with the state.
    std::int64_t pending_micro_batches = 0;
    /// Optimizer steps taken, skipped ones included.
    std::int64_t optimizer_steps = 0;
    /// Optimizer steps skipped (inf or NaN gradients).
    std::int64_t skipped_steps = 0;
    /// accumulate::Adaptive: parts each batch is split into now.
    std::int64_t split = 1;
    /// accumulate::Adaptive: how many times a batch ran out of memory and the split doubled.
    std::int64_t splits_made = 0;
    /// amp::Fp16: the loss scaler's state (reading it synchronises with the device once).
    std::optional<LossScaleState> loss_scale;
    /// The state of each hook policy that has one (state_dict), under the hook's name.
    std::map<std::string, StateDict, std::less<>> hooks;
  };

  /// Any model: the loss function receives the batch only.
  TrainingLoop(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer)
      : TrainingLoop(std::move(model), optimizer, Options{}) {}
  /// Any model, with options. Throws nitro::Error when the model is null, the optimizer has no
  /// parameters, a policy refuses its options, or the AMP policy needs autocast on a device LibTorch has
  /// none for.
  TrainingLoop(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer, Options options);

  /// A model held the LibTorch way (torch::nn::Linear, a TORCH_MODULE type, torch::nn::Sequential).
  template <class Impl>
  TrainingLoop(const torch::nn::ModuleHolder<Impl>& model, torch::optim::Optimizer& optimizer)
      : TrainingLoop(model, optimizer, Options{}) {}
  /// A model held the LibTorch way, with options; throws as the constructor above.
  template <class Impl>
  TrainingLoop(const torch::nn::ModuleHolder<Impl>& model, torch::optim::Optimizer& optimizer, Options options)
      : model_(model.ptr()), optimizer_(&optimizer), o_(std::move(options)) {
    if constexpr (detail::is_sequential<Impl>) sequential_ = model.ptr();
    init();
  }

  TrainingLoop(const TrainingLoop&) = delete;
  TrainingLoop& operator=(const TrainingLoop&) = delete;

  /// One micro-batch: forward and loss under the AMP policy, backward, and the optimizer step when
  /// the accumulation window is full. `loss_fn(batch)` (or `loss_fn(forward, batch)` with a
  /// Sequential model) must return a scalar tensor.
  ///
  /// A step that throws (in the loss function, the backward or the optimizer step) leaves no
  /// half-done window: the gradients of the window are dropped and the next step() starts a new one.
  ///
  /// accumulate::Adaptive: the batch is one optimizer step; it is split along dimension 0 of its
  /// tensors when the forward or backward runs out of memory (the loss function must then return a
  /// mean over the rows). An optimizer step that fails (out of memory while Adam makes its state, or
  /// anything else) is not retried: its gradients are dropped, the window starts anew and the error
  /// reaches the caller (parameters LibTorch's optimizer had updated before failing stay updated: it
  /// steps one parameter at a time).
  ///
  /// Inside a trial of memory::find_max_batch_size that was not given this loop, throws nitro::Error
  /// before anything changes (the finder could not put the loop back).
  template <class Batch, class LossFn>
  StepResult step(const Batch& batch, LossFn&& loss_fn) {
    // One thread-local load when no search runs on this thread.
    if (memory::detail::trial_loops != nullptr) [[unlikely]] memory::detail::check_trial_step(this, "step");
    if constexpr (steps_runner != no_runner) {
      StepParts<Batch, std::remove_reference_t<LossFn>> parts(*this, batch, loss_fn);
      return std::get<steps_runner>(hooks_).hook.run_step(*this, parts);
    } else {
      return eager_step(batch, loss_fn);
    }
  }

  /// What a hook that takes over whole steps (run_step, train/hooks.hpp; graph::Capture) is given for
  /// one step: the loop's own step of the batch, and the pieces of a step done on the device alone.
  template <class Batch, class LossFn>
  class StepParts {
   public:
    /// Made by the loop for one step.
    StepParts(TrainingLoop& loop, const Batch& batch, LossFn& loss_fn) : loop_(loop), batch_(batch), loss_fn_(loss_fn) {}
    /// The batch of this step.
    const Batch& batch() const noexcept { return batch_; }
    /// The loop's own step of this batch (or of `batch`): every hook point called, as without the hook.
    StepResult eager() { return loop_.eager_step(batch_, loss_fn_); }
    /// The same after begin() was called for this step (on_step_begin is not called again).
    StepResult eager_after_begin() { return loop_.eager_step(batch_, loss_fn_, /*begun=*/true); }
    /// Forward, backward, the clip policy and the optimizer step of `batch` as device work only, for
    /// capture: the loss function under the AMP policy, the scaled backward, the inf check and
    /// unscale (or the scale folded into the kernels), clipping, the fused optimizer's step with the
    /// skip decided on the device (optim::FusedStep::step_on_device) and the loss scale's update. No
    /// hook but the clip policy is called, no host counter moves, nothing is read back, the
    /// gradients stay in the parameters' .grad. Needs a fused optimizer (optim/fused.hpp).
    DeviceStep on_device(const Batch& batch) { return loop_.device_step(batch, loss_fn_); }
    /// Before a step done by replaying on_device's work: the gradients other backward passes left on
    /// the loop's parameters released (the graph writes its own), the hooks' on_step_begin.
    void begin() {
      loop_.release_grads();
      loop_.begin_step();
    }
    /// After it: the one host decision (found_inf read, when defined, as an eager step reads it), the
    /// counters (the loop's, the optimizer's host step), the loss scale copied, the hooks'
    /// after_optimizer_step and on_step_end. `done` holds the device tensors of the step.
    StepResult finish(const DeviceStep& done) { return loop_.finish_device_step(batch_, done); }

   private:
    TrainingLoop& loop_;
    const Batch& batch_;
    LossFn& loss_fn_;
  };

 private:
  template <class Batch, class LossFn>
  StepResult eager_step(const Batch& batch, LossFn& loss_fn, bool begun = false) {
    // Rows of the batch, where a policy needs them (split, samples counted): one pass a step.
    [[maybe_unused]] std::int64_t rows = -1;
    if constexpr (detail::SplitsOnOom<Accumulation> || wants_rows) rows = detail::batch_rows(batch);
    StepResult result;
    try {
      // Gradients belong to their step: a window starts from none on this loop's parameters, so what
      // another backward left there (a GAN's generator loss through the discriminator) is not added.
      if (micro_ == 0) release_grads();
      if (!begun) begin_step();
      if constexpr (detail::SplitsOnOom<Accumulation>) {
        result.loss = split_forward_backward(batch, rows, loss_fn);
      } else {
        result.loss = forward_backward(batch, loss_fn, Accumulation::enabled ? static_cast<double>(window_) : 1.0);
      }
    } catch (...) {
      // A backward that failed midway has added part of its gradient: no window survives it.
      drop_window();
      throw;
    }
    ++micro_;
    if (micro_ >= window_) optimizer_step(result);
    end_step(result, rows);
    return result;
  }

  // Sets the parameters' gradients to none (no kernel, no allocation): what zero_grad(set_to_none)
  // does, without the optimizer's virtual call and its groups.
  void release_grads() noexcept {
    for (auto& p : params_)
      if (p.grad().defined()) p.mutable_grad().reset();
  }

  void begin_step() {
    each_hook([&](auto& h) {
      if constexpr (detail::HasStepBegin<std::remove_cvref_t<decltype(h)>, TrainingLoop>) h.on_step_begin(*this);
    });
  }
  void end_step(StepResult& result, [[maybe_unused]] std::int64_t rows) {
    each_hook([&](auto& h) {
      if constexpr (detail::HasStepEnd<std::remove_cvref_t<decltype(h)>, TrainingLoop>) h.on_step_end(*this, result, rows);
    });
  }

 public:
  /// Steps on a partial accumulation window (at the end of an epoch), its gradient rescaled to the
  /// mean over the micro-batches it had. Returns nothing when the window is empty. Inside a search's
  /// trial, the same check as step().
  std::optional<StepResult> flush();

  /// The forward of a Sequential model under the checkpoint policy.
  at::Tensor forward(const at::Tensor& x);

  /// The loop's state now (see State). With amp::Fp16 it reads the loss scale: one synchronisation.
  State state() const;

  /// Puts the loop's state back (the gradients of pending micro-batches are the caller's to put
  /// back). Throws nitro::Error, changing nothing, for a state this loop cannot hold.
  void load_state(const State& s);

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
    return std::get<0>(hooks_).hook.recorder;
  }
  /// monitor() on a const loop.
  const auto& monitor() const noexcept
    requires(monitor_policy::enabled)
  {
    return std::get<0>(hooks_).hook.recorder;
  }

  /// The loop's object of hook policy P (one of its Policies).
  template <class P>
  P& hook() noexcept {
    static_assert(OfFamily<P, family::Hook>, "TrainingLoop::hook<P>(): P must be one of the loop's hook policies");
    return std::get<Slots::template position<P>>(hooks_).hook;
  }
  template <class P>
  /// hook() on a const loop.
  const P& hook() const noexcept {
    return std::get<Slots::template position<P>>(hooks_).hook;
  }

  /// The loss scaler (amp::Fp16): its state_dict() saves with the model.
  auto& scaler() noexcept
    requires Amp::scales_loss
  {
    return scaler_;
  }

  /// Calls f on each hook object, in the loop's order (the monitor's and the clip policy's adapters
  /// included): `loop.for_each_hook([](auto& h) { if constexpr (requires { h.report(); }) ...; })`.
  template <class F>
  void for_each_hook(F&& f) {
    each_hook(f);
  }
  /// The optimizer is one of optim/fused.hpp's (one fused kernel per group).
  bool fused_optimizer() const noexcept { return fused_ != nullptr; }

  /// Micro-batches per optimizer step (the accumulation policy's, or set_accumulation_steps()).
  std::int64_t accumulation_steps() const noexcept { return window_; }
  /// Micro-batches since the last optimizer step.
  std::int64_t pending_micro_batches() const noexcept { return micro_; }
  /// Optimizer steps taken, skipped ones included.
  std::int64_t optimizer_steps() const noexcept { return steps_; }
  /// Optimizer steps skipped because the gradients held inf or NaN (amp::Fp16, skip_nonfinite).
  std::int64_t skipped_steps() const noexcept { return skipped_; }
  /// The options the loop was made with (accumulate.steps follows set_accumulation_steps()).
  const Options& options() const noexcept { return o_; }
  /// The model the loop trains.
  torch::nn::Module& model() noexcept { return *model_; }
  /// The optimizer the loop steps (the one given).
  torch::optim::Optimizer& optimizer() noexcept { return *optimizer_; }

 private:
  struct Forward {
    TrainingLoop* loop;
    at::Tensor operator()(const at::Tensor& x) const {
      // Counted here, not by the thread-local context: the loss function may call it on any thread.
      if (loop->context_ != nullptr) ++loop->context_->consulted;
      return loop->forward(x);
    }
  };

  static std::int64_t checkpoint_segments(std::int64_t layers, const void* options)
    requires Checkpoint::enabled
  {
    return Checkpoint::segments(layers, *static_cast<const typename Checkpoint::Options*>(options));
  }

  // Forward and loss under the AMP policy, backward of loss / divisor; returns the loss, detached.
  template <class Batch, class LossFn>
  at::Tensor forward_backward(const Batch& batch, LossFn& loss_fn, double divisor, bool call_hooks = true) {
    at::Tensor loss;
    {
      std::optional<AutocastGuard> autocast;
      if constexpr (Amp::enabled) autocast.emplace(device_.type(), Amp::dtype);
      if constexpr (Checkpoint::enabled) {
        // The model's own forward sees the policy (checkpoint::sequential(blocks, x), checkpoint::block).
        detail::CheckpointContext context{&checkpoint_segments, &o_.checkpoint};
        detail::CheckpointContextScope scope(&context);
        context_ = &context;
        struct Clear {
          TrainingLoop* loop;
          ~Clear() { loop->context_ = nullptr; }
        } clear{this};
        loss = call(loss_fn, batch);
        NITRO_CHECK(context.consulted > 0 || !at::GradMode::is_enabled(), "TrainingLoop with checkpoint::",
                    Checkpoint::name, ": the model's forward never took the checkpoint policy in this step, so "
                    "the step saved no memory. ",
                    sequential_ != nullptr
                        ? "The model is a torch::nn::Sequential: let the loss function take its forward, "
                          "[&](auto& forward, auto& b) { return loss(forward(b.data), b.target); }, and call that "
                          "instead of model->forward"
                        : "The model is not a torch::nn::Sequential: call nitro::checkpoint::sequential(blocks, x) "
                          "or nitro::checkpoint::block(fn, x) in its forward (train/checkpoint.hpp)",
                    "; or use checkpoint::Off");
      } else {
        // A loop without checkpointing hides an enclosing loop's policy from its own model.
        detail::CheckpointContextScope scope(nullptr);
        loss = call(loss_fn, batch);
      }
    }
    NITRO_CHECK(loss.defined() && loss.numel() == 1,
                "TrainingLoop::step: the loss function must return a scalar tensor (reduce it with mean() or sum()); "
                "got ", loss.defined() ? "a tensor of shape " : "an undefined tensor",
                loss.defined() ? loss.sizes() : at::IntArrayRef{});
    if (call_hooks) {
      each_hook([&](auto& h) {
        if constexpr (detail::HasAfterForward<std::remove_cvref_t<decltype(h)>, TrainingLoop>) h.after_forward(*this, loss);
      });
    }
    at::Tensor objective = divisor != 1.0 ? loss / divisor : loss;
    if constexpr (Amp::scales_loss) objective = scaler_.scale(objective);
    objective.backward();
    if (call_hooks) {
      each_hook([&](auto& h) {
        if constexpr (detail::HasAfterBackward<std::remove_cvref_t<decltype(h)>, TrainingLoop>) h.after_backward(*this);
      });
    }
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
      } catch (const std::exception& e) {
        // Out of memory in any of its forms (the allocator's, cuBLAS's, cuDNN's): split. Anything
        // else (a shape error) reaches the caller as it is.
        if (!memory::is_out_of_memory(e)) throw;
        optimizer_->zero_grad(/*set_to_none=*/true);  // the gradients of the parts that finished
        if (parts >= limit) throw;
        const std::int64_t previous = split_;
        split_ = std::min(parts * 2, limit);
        ++splits_made_;
        if (o_.accumulate.on_split)
          o_.accumulate.on_split(accumulate::SplitEvent{previous, split_, rows, std::string(memory::error_message(e))});
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

  void init();

  // No half-done window survives a failed step.
  void drop_window() noexcept;

  // The gradients of a full window, checked for inf/NaN where a policy needs it and unscaled (or
  // left scaled for a fused kernel to unscale), then seen by the hooks (clipping): how the eager and
  // the device-only step both begin. The gradient lists are released again.
  struct CheckedGrads {
    at::Tensor found_inf;                 // undefined when nothing checks
    const at::Tensor* scale = nullptr;    // the loss scale the fused kernel divides by (folded)
  };
  CheckedGrads check_grads(StepResult& result);

  // After an optimizer step taken or skipped (and the loss scale copied into the result): the
  // counters, the hooks' after_optimizer_step (the run's state is whole here, as a snapshot needs; a
  // hook that throws now leaves it so).
  void count_step(StepResult& result, bool skip);

  void optimizer_step(StepResult& result);

  // StepParts::on_device: a step as device work only (see there).
  template <class Batch, class LossFn>
  DeviceStep device_step(const Batch& batch, LossFn& loss_fn) {
    NITRO_CHECK(fused_ != nullptr, "TrainingLoop: a step done on the device alone (graph::Capture) needs a fused "
                "optimizer, nitro::optim::FusedAdam, FusedAdamW or FusedSGD (optim/fused.hpp): torch::optim's optimizers "
                "keep the step count and the bias correction on the host");
    static_assert(!Accumulation::enabled && !Checkpoint::enabled,
                  "TrainingLoop: a step done on the device alone takes accumulate::Off and checkpoint::Off");
    DeviceStep done;
    try {
      done.loss = forward_backward(batch, loss_fn, 1.0, /*call_hooks=*/false);
      StepResult clipped;
      const CheckedGrads c = check_grads(clipped);
      done.found_inf = c.found_inf;
      done.grad_norm = clipped.grad_norm;
      fused_->step_on_device(c.scale, c.found_inf);
      if constexpr (Amp::scales_loss) scaler_.update(c.found_inf);
    } catch (...) {
      drop_window();
      throw;
    }
    return done;
  }

  // StepParts::finish: the host's part of a step done on the device.
  template <class Batch>
  StepResult finish_device_step(const Batch& batch, const DeviceStep& done) {
    StepResult result;
    result.loss = done.loss.clone();  // the next replay writes the same tensor again
    if (done.grad_norm.defined()) result.grad_norm = done.grad_norm.clone();
    const bool skip = done.found_inf.defined() && done.found_inf.item<float>() > 0.0f;
    fused_->advance_host(!skip);
    if constexpr (Amp::scales_loss) result.loss_scale = scaler_.scale_tensor().clone();
    count_step(result, skip);
    [[maybe_unused]] std::int64_t rows = -1;
    if constexpr (wants_rows) rows = detail::batch_rows(batch);
    end_step(result, rows);
    return result;
  }

  // amp::Fp16 with a fused optimizer (optim/fused.hpp): the kernel unscales the gradients as it reads
  // them, unless a policy reads them before the step (clipping, a hook with before_optimizer_step),
  // which needs them unscaled first.
  template <class Tuple>
  struct any_sees_grads;
  template <class... Slot>
  struct any_sees_grads<std::tuple<Slot...>> {
    static constexpr bool value = (detail::HasBeforeOptimizerStep<decltype(Slot::hook), TrainingLoop> || ...);
  };
  bool fold_scaler() const noexcept {
    if constexpr (Amp::scales_loss && !any_sees_grads<typename Slots::type>::value) {
      return fused_ != nullptr;
    } else {
      return false;
    }
  }

  template <class F>
  void each_hook(F&& f) {
    std::apply([&](auto&... slot) { (f(slot.hook), ...); }, hooks_);
  }
  template <class F>
  void each_hook(F&& f) const {
    std::apply([&](const auto&... slot) { (f(slot.hook), ...); }, hooks_);
  }

  // Loads each hook's state; if one refuses its state, those loaded before it get theirs back.
  // Returns what undoes the loads.
  std::vector<std::function<void()>> load_hook_states(const std::map<std::string, StateDict, std::less<>>& states);

  // What make() of each hook is given: its options (by the hook's place) and the model's device.
  struct HookArgs {
    const Options& o;
    const c10::Device& device;
    template <class P>
    const auto& options() const {
      if constexpr (std::same_as<P, detail::MonitorHook<monitor_policy>>) return o.monitor;
      else if constexpr (std::same_as<P, detail::ClipHook<clip_policy>>) return o.clip;
      else return std::get<Slots::template position<P> - 1>(o.hooks);
    }
  };
  template <class Tuple>
  struct any_wants_rows;
  template <class... Slot>
  struct any_wants_rows<std::tuple<Slot...>> {
    static constexpr bool value = (detail::WantsBatchRows<decltype(Slot::hook)> || ...);
  };
  static constexpr bool wants_rows = any_wants_rows<typename Slots::type>::value;
  // The slot of the hook that takes over whole steps (run_step), or no_runner.
  static constexpr std::size_t no_runner = static_cast<std::size_t>(-1);
  template <class Tuple>
  struct runner_of;
  template <class... Slot>
  struct runner_of<std::tuple<Slot...>> {
    static constexpr std::size_t count = (0 + ... + (detail::RunsSteps<decltype(Slot::hook)> ? 1 : 0));
    static constexpr std::size_t value = [] {
      constexpr bool runs[] = {detail::RunsSteps<decltype(Slot::hook)>...};
      for (std::size_t i = 0; i < sizeof...(Slot); ++i)
        if (runs[i]) return i;
      return no_runner;
    }();
  };
  static_assert(runner_of<typename Slots::type>::count <= 1,
                "TrainingLoop: at most one hook policy may take over whole steps (runs_steps, e.g. graph::Capture)");
  static constexpr std::size_t steps_runner = runner_of<typename Slots::type>::value;

  std::shared_ptr<torch::nn::Module> model_;
  std::shared_ptr<torch::nn::SequentialImpl> sequential_;
  torch::optim::Optimizer* optimizer_;
  // The optimizer as a fused one (optim/fused.hpp), or null: found once, used by amp::Fp16 only.
  optim::FusedStep* fused_ = dynamic_cast<optim::FusedStep*>(optimizer_);
  Options o_;
  std::vector<at::Tensor> params_;
  detail::GradGroups grads_;
  // One concrete device (cuda:1, not "the current one"), the first parameter's: the monitor's events
  // and memory figures are of the device the model is on, whatever device is current in a step.
  c10::Device device_ = detail::first_parameter_device(*optimizer_);
  std::int64_t window_ = 1;
  std::int64_t micro_ = 0;
  std::int64_t steps_ = 0;
  std::int64_t skipped_ = 0;
  std::int64_t split_ = 1;
  std::int64_t splits_made_ = 0;
  detail::CheckpointContext* context_ = nullptr;  // during the loss function, with checkpointing on
  // Each built once, in place: a user's scaler or recorder needs no default constructor or assignment.
  [[no_unique_address]] typename detail::scaler_of<Amp>::type scaler_ = detail::make_scaler<Amp>(o_.amp);
  // The monitor, the hook policies and the clip policy, each made in place (train/hooks.hpp).
  typename Slots::type hooks_ = make_slots(std::make_index_sequence<std::tuple_size_v<typename Slots::type>>{});
  template <std::size_t... I>
  typename Slots::type make_slots(std::index_sequence<I...>) {
    const HookArgs args{o_, device_};
    return typename Slots::type(((void)I, args)...);
  }
};

namespace stability {
class Guard;
}  // namespace stability
// level::Basic, Advanced and Ultra (train/levels.hpp, which declares their members extern) are marked
// here, before any member can be instantiated, in every program that can name their types: so
// NITRO_EXPLICIT_INSTANTIATE_ONLY refuses them whether or not train/levels.hpp is included.
// level::Max's mark is in graph/capture.hpp, the header that defines its capture policy.
template <>
inline constexpr bool detail::is_predefined_level<TrainingLoop<amp::Off, accumulate::Off, checkpoint::Off>> = true;
template <>
inline constexpr bool detail::is_predefined_level<TrainingLoop<amp::Bf16, accumulate::Off, checkpoint::Off>> = true;
template <>
inline constexpr bool detail::is_predefined_level<
    TrainingLoop<amp::Bf16, accumulate::Dynamic, checkpoint::Sqrt, clip::Norm, stability::Guard>> = true;

// ---- the members defined out of the class: with NITRO_COMPILED, the predefined levels' are compiled once
// in Nitro's library (the extern template declarations below), not in every program that names them.

template <class... Policies>
TrainingLoop<Policies...>::TrainingLoop(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer, Options options)
    : model_(std::move(model)), optimizer_(&optimizer), o_(std::move(options)) {
  NITRO_DETAIL_NOT_IMPLICIT(TrainingLoop);
  init();
}

template <class... Policies>
auto TrainingLoop<Policies...>::flush() -> std::optional<StepResult> {
  NITRO_DETAIL_NOT_IMPLICIT(TrainingLoop);
  if (memory::detail::trial_loops != nullptr) [[unlikely]] memory::detail::check_trial_step(this, "flush");
  if (micro_ == 0) return std::nullopt;
  StepResult result;
  try {
    each_hook([&](auto& h) {
      if constexpr (detail::HasBeforeFlush<std::remove_cvref_t<decltype(h)>, TrainingLoop>) h.before_flush(*this);
    });
  } catch (...) {
    drop_window();
    throw;
  }
  if (micro_ < window_) {
    grads_.assign(params_);
    const double rescale = static_cast<double>(window_) / static_cast<double>(micro_);
    grads_.for_each([&](detail::GradGroups::Group& g) { at::_foreach_mul_(g.grads, rescale); });
    grads_.release();
  }
  optimizer_step(result);
  return result;
}

template <class... Policies>
auto TrainingLoop<Policies...>::forward(const at::Tensor& x) -> at::Tensor {
  NITRO_DETAIL_NOT_IMPLICIT(TrainingLoop);
  NITRO_CHECK(sequential_ != nullptr,
              "TrainingLoop::forward needs a torch::nn::Sequential model; call your model's forward yourself");
  if constexpr (Checkpoint::enabled) {
    return checkpoint::sequential(
        *sequential_, Checkpoint::segments(static_cast<std::int64_t>(sequential_->size()), o_.checkpoint), x);
  } else {
    return sequential_->forward(x);
  }
}

template <class... Policies>
auto TrainingLoop<Policies...>::state() const -> State {
  NITRO_DETAIL_NOT_IMPLICIT(TrainingLoop);
  State s{window_, micro_, steps_, skipped_, split_, splits_made_, std::nullopt, {}};
  if constexpr (Amp::scales_loss) s.loss_scale = scaler_.state_dict();
  each_hook([&](const auto& h) {
    using H = std::remove_cvref_t<decltype(h)>;
    if constexpr (detail::HasState<H>) s.hooks.emplace(std::string(H::name), h.state_dict());
  });
  return s;
}

template <class... Policies>
void TrainingLoop<Policies...>::load_state(const State& s) {
  NITRO_DETAIL_NOT_IMPLICIT(TrainingLoop);
  if constexpr (std::same_as<Accumulation, accumulate::Dynamic>) {
    (void)accumulate::Dynamic::steps({s.accumulation_steps});
  } else {
    NITRO_CHECK(s.accumulation_steps == window_, "TrainingLoop::load_state: accumulation_steps is ",
                s.accumulation_steps, " but this loop's accumulation policy (", Accumulation::name, ") takes ",
                window_, " micro-batches per step; only accumulate::Dynamic can change it");
  }
  detail::check_loop_counters(s.accumulation_steps, s.pending_micro_batches, s.optimizer_steps, s.skipped_steps,
                              s.split, s.splits_made);
  NITRO_CHECK(s.loss_scale.has_value() == Amp::scales_loss, "TrainingLoop::load_state: the state ",
              s.loss_scale ? "holds" : "lacks", " a loss scale, but this loop's AMP policy (", Amp::name, ") ",
              Amp::scales_loss ? "scales the loss" : "does not scale the loss");
  each_hook([&](const auto& h) {
    using H = std::remove_cvref_t<decltype(h)>;
    if constexpr (detail::HasState<H>) {
      NITRO_CHECK(s.hooks.contains(H::name), "TrainingLoop::load_state: the state has nothing for the hook policy \"",
                  H::name, "\"; it was saved by a loop without that hook");
    }
  });
  for (const auto& entry : s.hooks) {
    const std::string& name = entry.first;
    bool known = false;
    each_hook([&](const auto& h) {
      using H = std::remove_cvref_t<decltype(h)>;
      if constexpr (detail::HasState<H>) known = known || name == H::name;
    });
    NITRO_CHECK(known, "TrainingLoop::load_state: the state holds the hook policy \"", name,
                "\", which this loop does not have; load it into a loop of the same type");
  }
  // The hooks' states (each validated by its hook; undone if a later one or the scaler refuses).
  auto undo = load_hook_states(s.hooks);
  try {
    if constexpr (Amp::scales_loss) scaler_.load_state_dict(*s.loss_scale);  // validates, then changes
  } catch (...) {
    for (auto it = undo.rbegin(); it != undo.rend(); ++it) (*it)();
    throw;
  }
  if constexpr (std::same_as<Accumulation, accumulate::Dynamic>) o_.accumulate.steps = s.accumulation_steps;
  window_ = s.accumulation_steps;
  micro_ = s.pending_micro_batches;
  steps_ = s.optimizer_steps;
  skipped_ = s.skipped_steps;
  split_ = s.split;
  splits_made_ = s.splits_made;
}

template <class... Policies>
void TrainingLoop<Policies...>::init() {
  NITRO_DETAIL_NOT_IMPLICIT(TrainingLoop);
  detail::check_library_version();
  NITRO_CHECK(model_ != nullptr, "TrainingLoop: the model is null");
  for (const auto& group : optimizer_->param_groups())
    for (const auto& p : group.params()) params_.push_back(p);
  NITRO_CHECK(!params_.empty(),
              "TrainingLoop: the optimizer has no parameters; build it from the model's parameters(), e.g. "
              "torch::optim::SGD(model->parameters(), 0.1)");
  window_ = Accumulation::steps(o_.accumulate);
  if constexpr (detail::SplitsOnOom<Accumulation>) split_ = o_.accumulate.initial_split;
  each_hook([&](auto& h) {
    using H = std::remove_cvref_t<decltype(h)>;
    static_assert(!detail::BadState<H>, "TrainingLoop: a hook policy's state needs both `nitro::StateDict "
                  "state_dict() const` and `void load_state_dict(const nitro::StateDict&)`; this one has a member "
                  "of those names that does not fit, so its state would be left out of snapshots");
    static_assert(!H::enabled || detail::has_any_hook<H, TrainingLoop>,
                  "TrainingLoop: this hook policy has none of the hooks of train/hooks.hpp (on_step_begin, "
                  "after_forward, after_backward, before_optimizer_step, after_optimizer_step, on_step_end, "
                  "state_dict/load_state_dict) callable with this loop; check their signatures");
  });
  if constexpr (Amp::enabled) {
    NITRO_CHECK(compat::autocast_available(device_.type()), "TrainingLoop: amp::", Amp::name,
                " needs autocast, which LibTorch does not offer on ", c10::DeviceTypeName(device_.type()),
                "; use amp::Off there");
  }
}

template <class... Policies>
void TrainingLoop<Policies...>::drop_window() noexcept {
  NITRO_DETAIL_NOT_IMPLICIT(TrainingLoop);
  grads_.release();
  try {
    optimizer_->zero_grad(/*set_to_none=*/true);
  } catch (...) {  // zero_grad does not throw in practice; the original error matters more
  }
  micro_ = 0;
}

template <class... Policies>
auto TrainingLoop<Policies...>::check_grads(StepResult& result) -> CheckedGrads {
  NITRO_DETAIL_NOT_IMPLICIT(TrainingLoop);
  grads_.assign(params_);
  CheckedGrads c;
  if constexpr (Amp::scales_loss) {
    if (fold_scaler()) {
      NITRO_CHECK(scaler_.scale_tensor().defined(), "TrainingLoop: the optimizer step came before any loss was scaled");
      grads_.for_each(detail::check_unscalable);
      c.found_inf = detail::nonfinite_flag(grads_, scaler_.scale_tensor().device());
      c.scale = &scaler_.scale_tensor();
    } else {
      c.found_inf = scaler_.unscale(grads_);
    }
  } else {
    if (o_.skip_nonfinite) c.found_inf = detail::nonfinite_flag(grads_, device_);
  }
  each_hook([&](auto& h) {
    if constexpr (detail::HasBeforeOptimizerStep<std::remove_cvref_t<decltype(h)>, TrainingLoop>)
      h.before_optimizer_step(*this, grads_, result);
  });
  grads_.release();  // zero_grad must be able to free them
  return c;
}

template <class... Policies>
void TrainingLoop<Policies...>::count_step(StepResult& result, bool skip) {
  NITRO_DETAIL_NOT_IMPLICIT(TrainingLoop);
  ++steps_;
  skipped_ += skip ? 1 : 0;
  result.stepped = !skip;
  result.skipped = skip;
  micro_ = 0;
  each_hook([&](auto& h) {
    using H = std::remove_cvref_t<decltype(h)>;
    if constexpr (detail::HasAfterOptimizerStep<H, TrainingLoop> && !detail::SeesOthersFirst<H>)
      h.after_optimizer_step(*this, result);
  });
  each_hook([&](auto& h) {  // those that save the run: after every other hook's update
    using H = std::remove_cvref_t<decltype(h)>;
    if constexpr (detail::HasAfterOptimizerStep<H, TrainingLoop> && detail::SeesOthersFirst<H>)
      h.after_optimizer_step(*this, result);
  });
}

template <class... Policies>
void TrainingLoop<Policies...>::optimizer_step(StepResult& result) {
  NITRO_DETAIL_NOT_IMPLICIT(TrainingLoop);
  bool skip = false;
  try {
    const CheckedGrads c = check_grads(result);
    // The one host decision of a step, where a policy needs it.
    skip = c.found_inf.defined() && c.found_inf.template item<float>() > 0.0f;
    if (!skip) {
      if constexpr (Amp::scales_loss) {
        if (c.scale != nullptr) fused_->step_scaled(*c.scale);
        else optimizer_->step();
      } else {
        optimizer_->step();
      }
    }
    if constexpr (Amp::scales_loss) {
      scaler_.update(c.found_inf);
      result.loss_scale = scaler_.scale_tensor().clone();  // the live scale changes in place later
    }
    optimizer_->zero_grad(/*set_to_none=*/true);
  } catch (...) {
    drop_window();
    throw;
  }
  count_step(result, skip);
}

template <class... Policies>
auto TrainingLoop<Policies...>::load_hook_states(const std::map<std::string, StateDict, std::less<>>& states) -> std::vector<std::function<void()>> {
  NITRO_DETAIL_NOT_IMPLICIT(TrainingLoop);
  std::vector<std::function<void()>> undo;
  try {
    each_hook([&](auto& h) {
      using H = std::remove_cvref_t<decltype(h)>;
      if constexpr (detail::HasState<H>) {
        StateDict before = h.state_dict();
        h.load_state_dict(states.find(H::name)->second);
        undo.push_back([&h, before = std::move(before)] { h.load_state_dict(before); });
      }
    });
  } catch (...) {
    for (auto it = undo.rbegin(); it != undo.rend(); ++it) (*it)();
    throw;
  }
  return undo;
}

}  // namespace nitro

#include <nitro/core/config.hpp>
#if !NITRO_COMPILED
#include <nitro/train/training_loop-inl.hpp>
#endif
