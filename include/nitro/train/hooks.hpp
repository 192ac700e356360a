#pragma once
// Hook policies: what a TrainingLoop does besides forward, backward and the optimizer step, written
// outside Nitro and plugged in as a type. A hook policy is a Policy of the Hook family (core/concepts.hpp:
// HookPolicy) with any of the members below; the loop owns one object of it, made from its Options
// (and the model's device, if it takes one), and calls each member it has, under `if constexpr`: a
// member a hook lacks costs nothing, and a loop without hooks is the loop without this header.
//
//   struct CountSteps {                                        // a user's hook, nothing to register
//     using family = nitro::family::Hook;
//     static constexpr std::string_view name = "count_steps";  // the key of its state in snapshots
//     static constexpr bool enabled = true;
//     struct Options { std::int64_t every = 100; };
//     explicit CountSteps(const Options& o) : o_(o) {}
//     template <class Loop> void after_optimizer_step(Loop& loop, nitro::StepResult& r) {
//       if (r.stepped && loop.optimizer_steps() % o_.every == 0) std::printf("step %lld\n", ...);
//     }
//     nitro::StateDict state_dict() const { ... }             // saved in snapshots, restored by
//     void load_state_dict(const nitro::StateDict& s) { ... }  // load_state (validate first, then change)
//     Options o_;
//   };
//   nitro::TrainingLoop<nitro::amp::Bf16, CountSteps> loop{model, opt, {.hooks = {CountSteps::Options{.every = 10}}}};
//   loop.hook<CountSteps>()   // the object
//
// The points of one step, in order (Loop is the TrainingLoop's type; members may be templates on it):
//   on_step_begin(Loop&)                                   before the forward of each micro-batch
//   after_forward(Loop&, const at::Tensor& loss)           the loss function returned (loss not detached)
//   after_backward(Loop&)                                  the micro-batch's backward finished
//   before_optimizer_step(Loop&, detail::GradGroups&, StepResult&)
//                                                          the window is full: gradients summed and
//                                                          unscaled, before the inf check and the step
//   after_optimizer_step(Loop&, StepResult&)               stepped (or skipped), gradients zeroed,
//                                                          counters updated: the run's state is whole,
//                                                          as a snapshot needs; set StepResult::stop to
//                                                          ask the caller to stop
//   on_step_end(Loop&, StepResult&, std::int64_t rows)     end of every micro-batch; rows (size of
//                                                          dimension 0 of the batch) is counted only when
//                                                          a hook says `static constexpr bool wants_batch_rows = true`
//   before_flush(Loop&)                                    flush() is about to step on a partial window:
//                                                          its gradients are in .grad, not yet rescaled
//                                                          (dist::DataParallel averages them here)
//   StateDict state_dict() const / void load_state_dict(const StateDict&)
//                                                          part of the loop's State (and so of snapshots)
//   run_step(Loop&, Loop::StepParts<Batch, LossFn>&) -> StepResult
//                                                          takes over whole steps (one hook at most; it
//                                                          says `static constexpr bool runs_steps = true`):
//                                                          graph::Capture. The parts give the loop's own
//                                                          step of the batch (parts.eager(), every point
//                                                          above called), and the pieces of a step done
//                                                          on the device only (see TrainingLoop::StepParts)
//
// Hooks run in this order at each point: the monitor policy's recorder, the hook policies in the
// order the loop's type lists them, then the clip policy (clip and monitor are hooks too, adapted
// below). At after_optimizer_step, a hook that says `static constexpr bool sees_others_first = true`
// runs after every hook that does not: snapshot::Policy, so that what it saves there holds every
// other hook's update of that step (an ema::Model's average), whatever the order of the types. A hook that throws makes the step throw: before the optimizer step the window is dropped,
// as for any failed step. Adaptive accumulation calls after_forward/after_backward once per part.
#include <nitro/core/concepts.hpp>
#include <nitro/core/device.hpp>
#include <nitro/core/state_dict.hpp>
#include <nitro/core/step_result.hpp>
#include <nitro/train/amp.hpp>

#include <ATen/core/Tensor.h>

#include <concepts>
#include <cstddef>
#include <iterator>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

namespace nitro {

/// A training step done as device work alone (TrainingLoop::StepParts::on_device, for graph::Capture):
/// device tensors, valid until the same work runs again (a captured graph's replay writes the same
/// tensors).
struct DeviceStep {
  at::Tensor loss;       ///< the loss, detached
  at::Tensor found_inf;  ///< float32 scalar, 1 when the step was skipped; undefined when it never is
  at::Tensor grad_norm;  ///< clip::Norm's norm, or undefined
};

namespace detail {

template <class P, class... Ps>
inline constexpr std::size_t index_of = 0;
template <class P, class Q, class... Ps>
inline constexpr std::size_t index_of<P, Q, Ps...> = std::is_same_v<P, Q> ? 0 : 1 + index_of<P, Ps...>;

/// The hook policies among a loop's policies, in order, as a std::tuple.
template <class... Ps>
struct hook_list {
  using type = std::tuple<>;
};
template <class P, class... Ps>
struct hook_list<P, Ps...> {
  using rest = typename hook_list<Ps...>::type;
  using type = std::conditional_t<OfFamily<P, family::Hook>,
                                  decltype(std::tuple_cat(std::declval<std::tuple<P>>(), std::declval<rest>())), rest>;
};

/// Makes a hook from its options and the model's device, whichever way it is made.
template <class P, class O>
P make_hook(const O& options, const c10::Device& device) {
  if constexpr (std::constructible_from<P, const O&, const c10::Device&>) {
    return P(options, device);
  } else if constexpr (std::constructible_from<P, const O&>) {
    return P(options);
  } else {
    return P();
  }
}

/// A place in the loop's tuple of hooks, made in place (a hook need not be movable).
template <class P>
struct HookSlot {
  template <class Args>
  explicit HookSlot(const Args& args) : hook(make_hook<P>(args.template options<P>(), args.device)) {}
  P hook;
};

/// The monitor policy as a hook: its recorder is told when each phase ends.
template <class M>
struct MonitorHook {
  using family = nitro::family::Hook;
  static constexpr std::string_view name = "monitor";
  static constexpr bool enabled = M::enabled;
  static constexpr bool wants_batch_rows = true;
  struct Options {};
  MonitorHook(const typename M::Options& options, const c10::Device& device) : recorder(options, device) {}
  template <class Loop>
  void on_step_begin(Loop&) {
    recorder.begin_step();
  }
  template <class Loop>
  void after_forward(Loop&, const at::Tensor&) {
    recorder.mark(Phase::forward);
  }
  template <class Loop>
  void after_backward(Loop&) {
    recorder.mark(Phase::backward);
  }
  template <class Loop>
  void on_step_end(Loop&, StepResult&, std::int64_t rows) {
    recorder.mark(Phase::optimizer);
    recorder.end_step(rows);
  }
  typename M::Recorder recorder;
};
/// monitor::Off: no members, so no calls.
template <class M>
  requires(!M::enabled)
struct MonitorHook<M> {
  using family = nitro::family::Hook;
  static constexpr std::string_view name = "monitor";
  static constexpr bool enabled = false;
  struct Options {};
  MonitorHook(const typename M::Options&, const c10::Device&) noexcept {}
};

/// The clip policy as a hook: clips the unscaled gradients before the optimizer step.
template <class C>
struct ClipHook {
  using family = nitro::family::Hook;
  static constexpr std::string_view name = "clip";
  static constexpr bool enabled = C::enabled;
  struct Options {};
  explicit ClipHook(const typename C::Options& o) : options(o) { C::validate(options); }
  template <class Loop>
  void before_optimizer_step(Loop&, GradGroups& grads, StepResult& result) {
    result.grad_norm = C::apply(grads, options);
  }
  typename C::Options options;
};
template <class C>
  requires(!C::enabled)
struct ClipHook<C> {
  using family = nitro::family::Hook;
  static constexpr std::string_view name = "clip";
  static constexpr bool enabled = false;
  struct Options {};
  explicit ClipHook(const typename C::Options&) noexcept {}
};

// Which points a hook has, for a loop of type Loop.
template <class H, class Loop>
concept HasStepBegin = requires(H& h, Loop& l) { h.on_step_begin(l); };
template <class H, class Loop>
concept HasAfterForward = requires(H& h, Loop& l, const at::Tensor& t) { h.after_forward(l, t); };
template <class H, class Loop>
concept HasAfterBackward = requires(H& h, Loop& l) { h.after_backward(l); };
template <class H, class Loop>
concept HasBeforeOptimizerStep = requires(H& h, Loop& l, GradGroups& g, StepResult& r) {
  h.before_optimizer_step(l, g, r);
};
template <class H, class Loop>
concept HasAfterOptimizerStep = requires(H& h, Loop& l, StepResult& r) { h.after_optimizer_step(l, r); };
// A hook whose after_optimizer_step must see every other hook's (it saves the run's state).
template <class H>
concept SeesOthersFirst = requires { requires H::sees_others_first; };
template <class H, class Loop>
concept HasStepEnd = requires(H& h, Loop& l, StepResult& r, std::int64_t rows) { h.on_step_end(l, r, rows); };
template <class H, class Loop>
concept HasBeforeFlush = requires(H& h, Loop& l) { h.before_flush(l); };
template <class H>
concept HasState = requires(const H& ch, H& h, const StateDict& s) {
  { ch.state_dict() } -> std::convertible_to<StateDict>;
  h.load_state_dict(s);
};
/// Has a member called state_dict or load_state_dict, but not the pair HasState accepts: a hook whose
/// state would silently be left out of snapshots.
template <class H>
concept BadState = (requires(const H& h) { h.state_dict(); } || requires(H& h) { &H::load_state_dict; }) &&
                   !HasState<H>;
/// The slots of a loop's hooks: the monitor first, the hook policies in order, the clip policy last.
template <class Monitor, class Clip, class Hooks>
struct hook_slots;
template <class Monitor, class Clip, class... Hs>
struct hook_slots<Monitor, Clip, std::tuple<Hs...>> {
  using type = std::tuple<HookSlot<MonitorHook<Monitor>>, HookSlot<Hs>..., HookSlot<ClipHook<Clip>>>;
  using options = std::tuple<typename Hs::Options...>;
  template <class P>
  static constexpr std::size_t position = 1 + index_of<P, Hs...>;
  static constexpr bool names_distinct() {
    constexpr std::string_view names[] = {std::string_view("monitor"), Hs::name..., std::string_view("clip")};
    for (std::size_t i = 0; i < std::size(names); ++i)
      for (std::size_t j = i + 1; j < std::size(names); ++j)
        if (names[i] == names[j]) return false;
    return true;
  }
  /// Names are the keys of the hooks' states and of their parts in snapshots: printable, no spaces.
  static constexpr bool names_printable() {
    constexpr std::string_view names[] = {std::string_view("x"), Hs::name...};
    for (const auto name : names) {
      if (name.empty() || name.size() > 64) return false;
      for (const char c : name)
        if (c <= ' ' || c > '~') return false;
    }
    return true;
  }
};

/// A hook that takes over whole steps (run_step).
template <class H>
concept RunsSteps = requires { requires static_cast<bool>(H::runs_steps); };
template <class H, class Loop>
inline constexpr bool has_any_hook = RunsSteps<H> || HasStepBegin<H, Loop> || HasAfterForward<H, Loop> || HasAfterBackward<H, Loop> ||
                                     HasBeforeOptimizerStep<H, Loop> || HasAfterOptimizerStep<H, Loop> ||
                                     HasStepEnd<H, Loop> || HasBeforeFlush<H, Loop> || HasState<H>;
template <class H>
concept WantsBatchRows = requires { requires static_cast<bool>(H::wants_batch_rows); };

}  // namespace detail
}  // namespace nitro
