#pragma once
// The concepts that name each policy family's static interface, built from small named pieces so a
// failed check names the piece that is missing (mp-units' habit). This header includes no LibTorch
// header: it forward-declares the two LibTorch types it names.
//
//   DeviceTag          Cpu, Cuda, Auto (core/device.hpp)
//   Batch              what a Prefetcher or TrainingLoop moves between devices: a tensor, a tuple or
//                      pair of batches, a vector of batches, torch::data::Example, or a user type
//                      that provides the customization point `nitro_map_tensors` (core/device.hpp)
//   BatchSource        a callable returning std::optional<Batch>; empty means the epoch ended
//   Policy             what every policy has: a name, a family, `enabled`, a nested Options aggregate
//   AmpPolicy, AccumulationPolicy, CheckpointPolicy, ClipPolicy, EvictionPolicy, MonitorPolicy
//                      a Policy of that family plus what the code that uses it calls (TrainingLoop, Cache):
//                      a user-written policy that passes its concept works in the loop, and one that
//                      does not is refused with the missing piece named
//   HookPolicy         a policy of the Hook family: an object the TrainingLoop owns and calls at the
//                      points of a step it has a member for (train/hooks.hpp lists them)
//   LossScaler         what amp::Fp16<Scaler> needs of Scaler (train/amp.hpp has the two Nitro ships)
//   monitor::Off       the monitor policy that records nothing (here, so that the training loop
//                      names its default without depending on monitor/; monitor::Phases is in
//                      monitor/phases.hpp)
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <c10/core/DeviceType.h>

namespace at {
class Tensor;
}
namespace c10 {
struct Device;
enum class ScalarType : std::int8_t;  // c10/core/ScalarType.h
}  // namespace c10
namespace torch::data {
template <typename Data, typename Target>
struct Example;
}

namespace nitro {

struct LossScaleState;  // train/amp.hpp
namespace detail {
class GradGroups;  // train/amp.hpp
}  // namespace detail

// ---- device tags ------------------------------------------------------------------------------------

/// The tag names its LibTorch device type as a constant.
template <class T>
concept HasDeviceType = requires {
  { T::type } -> std::convertible_to<c10::DeviceType>;
  typename std::integral_constant<c10::DeviceType, T::type>;  // a constant expression
};
/// The tag has a printable name, for messages.
template <class T>
concept HasDeviceName = requires {
  { T::name } -> std::convertible_to<std::string_view>;
};
/// The tag can say whether such a device is present in this process.
template <class T>
concept ReportsAvailability = requires {
  { T::available() } -> std::same_as<bool>;
};
/// A device tag: a type naming a device kind (Cpu, Cuda) that templates are specialised on.
template <class T>
concept DeviceTag = HasDeviceType<T> && HasDeviceName<T> && ReportsAvailability<T>;

// ---- batches ----------------------------------------------------------------------------------------

namespace detail {
/// The identity as a callable with a name, to probe the customization point.
struct TensorIdentity {
  template <class Tensor>
  Tensor operator()(const Tensor& t) const {
    return t;
  }
};
}  // namespace detail

/// The customization point for a user batch type, found by argument-dependent lookup:
/// @code
///   struct MyBatch {
///     at::Tensor image, mask; int id;
///     template <class F> friend MyBatch nitro_map_tensors(const MyBatch& b, F&& f) {
///       return {f(b.image), f(b.mask), b.id};
///     }
///   };
/// @endcode
template <class B>
concept CustomBatch = requires(const B& b, detail::TensorIdentity f) {
  { nitro_map_tensors(b, f) } -> std::same_as<B>;
};

namespace detail {
template <class B>
inline constexpr bool is_batch = CustomBatch<B>;
template <>
inline constexpr bool is_batch<at::Tensor> = true;
template <class... Bs>
inline constexpr bool is_batch<std::tuple<Bs...>> = (is_batch<Bs> && ...);
template <class A, class B>
inline constexpr bool is_batch<std::pair<A, B>> = is_batch<A> && is_batch<B>;
template <class B, class Alloc>
inline constexpr bool is_batch<std::vector<B, Alloc>> = is_batch<B>;
template <class B>
inline constexpr bool is_batch<std::optional<B>> = is_batch<B>;
template <class Data, class Target>
inline constexpr bool is_batch<torch::data::Example<Data, Target>> =
    is_batch<Data> && (std::is_void_v<Target> || is_batch<Target>);
}  // namespace detail

/// Exactly an at::Tensor.
template <class B>
concept TensorBatch = std::same_as<B, at::Tensor>;
/// A tuple, pair, vector, optional or torch::data::Example whose elements are batches.
template <class B>
concept CompositeBatch = !TensorBatch<B> && !CustomBatch<B> && detail::is_batch<B>;
/// What Nitro can move to a device, pin, or record on a stream: see the list at the top.
template <class B>
concept Batch = detail::is_batch<std::remove_cvref_t<B>>;

// ---- batch sources ----------------------------------------------------------------------------------

namespace detail {
template <class T>
struct optional_value {};
template <class T>
struct optional_value<std::optional<T>> {
  using type = T;
};
}  // namespace detail

/// Calling it yields std::optional<Something>.
template <class S>
concept YieldsOptional = std::invocable<S&> && requires { typename detail::optional_value<std::invoke_result_t<S&>>::type; };
/// The batch type a source yields.
template <YieldsOptional S>
using source_batch_t = typename detail::optional_value<std::invoke_result_t<S&>>::type;
/// A source of batches: each call gives the next batch, std::nullopt at the end of the epoch.
template <class S>
concept BatchSource = YieldsOptional<S> && Batch<source_batch_t<S>>;

// ---- policies ---------------------------------------------------------------------------------------

/// The families policies belong to; a policy says `using family = nitro::family::Amp;`.
namespace family {
struct Amp {};
struct Accumulation {};
struct Checkpoint {};
struct Clip {};
struct Eviction {};
struct Monitor {};
/// Anything else a training step may do: a TrainingLoop calls its hooks (train/hooks.hpp).
struct Hook {};
}  // namespace family

/// The policy has a name for reports and messages: `static constexpr std::string_view name`.
template <class P>
concept NamedPolicy = requires {
  { P::name } -> std::convertible_to<std::string_view>;
};
/// The policy's runtime knobs: a nested `Options` aggregate that `{}` initialises.
template <class P>
concept HasOptions = requires { typename P::Options; } && std::is_aggregate_v<typename P::Options> &&
                     std::default_initializable<typename P::Options>;
/// Whether the policy does anything, as a constant: `static constexpr bool enabled`. A loop skips a
/// disabled policy under `if constexpr`, so it costs nothing.
template <class P>
concept Switchable = requires {
  { P::enabled } -> std::convertible_to<bool>;
  typename std::bool_constant<static_cast<bool>(P::enabled)>;  // a constant expression
};
/// The policy declares its family.
template <class P, class Family>
concept OfFamily = requires { typename P::family; } && std::same_as<typename P::family, Family>;

/// What every policy has.
template <class P>
concept Policy = NamedPolicy<P> && HasOptions<P> && Switchable<P>;

/// What a loss scaler does for amp::Fp16 (train/amp.hpp: DynamicLossScale, StaticLossScale): scales
/// the loss, unscales the gradients returning a found-inf flag tensor, updates itself from that flag,
/// shows its scale as a tensor, and saves and loads its state.
template <class S>
concept LossScaler = HasOptions<S> && std::constructible_from<S, const typename S::Options&> &&
                     requires(S& s, const S& cs, const at::Tensor& t, detail::GradGroups& g,
                              const LossScaleState& st) {
                       { s.scale(t) } -> std::same_as<at::Tensor>;
                       { s.unscale(g) } -> std::same_as<at::Tensor>;
                       s.update(t);
                       { cs.scale_tensor() } -> std::convertible_to<const at::Tensor&>;
                       { cs.state_dict() } -> std::same_as<LossScaleState>;
                       s.load_state_dict(st);
                     };

/// The AMP policy says whether it scales the loss: `static constexpr bool scales_loss`.
template <class P>
concept SaysIfScalesLoss = requires {
  { P::scales_loss } -> std::convertible_to<bool>;
  typename std::bool_constant<static_cast<bool>(P::scales_loss)>;
};
/// An AMP policy that autocasts names the type it casts to: `static constexpr c10::ScalarType dtype`.
template <class P>
concept NamesDtypeIfEnabled = (!static_cast<bool>(P::enabled)) || requires {
  { P::dtype } -> std::convertible_to<c10::ScalarType>;
};
/// An AMP policy that scales the loss names its scaler, a LossScaler made from the policy's Options:
/// `using scaler_type = ...`.
template <class P>
concept HasScalerIfScaling = (!static_cast<bool>(P::scales_loss)) || requires {
  typename P::scaler_type;
  requires LossScaler<typename P::scaler_type>;
  requires std::constructible_from<typename P::scaler_type, const typename P::Options&>;
};
/// Mixed precision (train/amp.hpp).
template <class P>
concept AmpPolicy = Policy<P> && OfFamily<P, family::Amp> && SaysIfScalesLoss<P> && NamesDtypeIfEnabled<P> &&
                    HasScalerIfScaling<P>;

/// The accumulation policy says how many micro-batches make one optimizer step:
/// `static std::int64_t steps(const Options&)` (it may validate the options and throw).
template <class P>
concept CountsMicroBatches = requires(const typename P::Options& o) {
  { P::steps(o) } -> std::convertible_to<std::int64_t>;
};

namespace accumulate {
/// What the loop reports when a policy that splits on running out of memory (accumulate::Adaptive)
/// splits a batch.
struct SplitEvent {
  std::int64_t previous_split = 1;  ///< Micro-batches each batch was split into before.
  std::int64_t split = 2;           ///< Micro-batches each batch is split into from now on.
  /// Rows (size of dimension 0) of the batch that ran out of memory.
  std::int64_t batch_rows = 0;
  /// The out-of-memory message.
  std::string reason;
};
}  // namespace accumulate

/// An accumulation policy that splits its batch on running out of memory (`static constexpr bool
/// splits_on_oom = true`) has the options the loop reads then: `initial_split`, `max_split`, and an
/// `on_split` callback (testable as a bool, callable with an accumulate::SplitEvent).
template <class P>
concept SplitsWithOptionsIfSplitting =
    (!requires { requires static_cast<bool>(P::splits_on_oom); }) ||
    requires(const typename P::Options& o, const accumulate::SplitEvent& e) {
      { o.initial_split } -> std::convertible_to<std::int64_t>;
      { o.max_split } -> std::convertible_to<std::int64_t>;
      static_cast<bool>(o.on_split);
      o.on_split(e);
    };
/// Gradient accumulation (train/accumulate.hpp).
template <class P>
concept AccumulationPolicy = Policy<P> && OfFamily<P, family::Accumulation> && CountsMicroBatches<P> &&
                             SplitsWithOptionsIfSplitting<P>;

/// A checkpoint policy that is on says how many segments n layers are cut into:
/// `static std::int64_t segments(std::int64_t layers, const Options&)`.
template <class P>
concept CutsSegmentsIfEnabled = (!static_cast<bool>(P::enabled)) || requires(std::int64_t n, const typename P::Options& o) {
  { P::segments(n, o) } -> std::convertible_to<std::int64_t>;
};
/// Activation checkpointing (train/checkpoint.hpp).
template <class P>
concept CheckpointPolicy = Policy<P> && OfFamily<P, family::Checkpoint> && CutsSegmentsIfEnabled<P>;

/// A clip policy that is on validates its options and clips the gradients in place, returning the
/// norm it measured or an undefined tensor: `static void validate(const Options&)`,
/// `static at::Tensor apply(detail::GradGroups&, const Options&)`.
template <class P>
concept ClipsIfEnabled = (!static_cast<bool>(P::enabled)) || requires(detail::GradGroups& g, const typename P::Options& o) {
  P::validate(o);
  { P::apply(g, o) } -> std::same_as<at::Tensor>;
};
/// Gradient clipping (train/clip.hpp).
template <class P>
concept ClipPolicy = Policy<P> && OfFamily<P, family::Clip> && ClipsIfEnabled<P>;

/// The phases of a training step a monitor times, in the order they happen.
enum class Phase : int {
  /// On the host, from the end of one step to the start of the next: the data loader's next(), and
  /// whatever else the caller does between steps.
  data = 0,
  forward = 1,
  backward = 2,
  /// Unscaling, clipping, the optimizer step and zeroing the gradients (zero on micro-batches that
  /// do not step).
  optimizer = 3,
};
inline constexpr int phase_count = 4;  ///< The number of Phase values.

/// What a monitor policy's Recorder is told by the training loop, in this order on every step:
/// begin_step(), mark(Phase::forward), mark(Phase::backward), mark(Phase::optimizer),
/// end_step(samples). It is made from the policy's Options and the device of the model (a concrete
/// device: cuda:1, not cuda).
template <class R>
concept PhaseRecorder = requires(R& r, Phase phase, std::int64_t samples) {
  r.begin_step();
  r.mark(phase);
  r.end_step(samples);
};
/// Monitoring (monitor/phases.hpp): a Policy of the Monitor family with a `Recorder` the loop owns.
template <class P>
concept MonitorPolicy = Policy<P> && OfFamily<P, family::Monitor> && requires { typename P::Recorder; } &&
                        std::constructible_from<typename P::Recorder, const typename P::Options&, const c10::Device&> &&
                        PhaseRecorder<typename P::Recorder>;

/// A hook policy (train/hooks.hpp): a Policy of the Hook family that the loop can make, from
/// (Options, device of the model), from (Options), or with no argument. Which hooks it has (any of
/// on_step_begin, after_forward, after_backward, before_optimizer_step, after_optimizer_step,
/// on_step_end, state_dict / load_state_dict) the loop checks against its own type.
template <class P>
concept HookPolicy = Policy<P> && OfFamily<P, family::Hook> &&
                     (std::constructible_from<P, const typename P::Options&, const c10::Device&> ||
                      std::constructible_from<P, const typename P::Options&> || std::default_initializable<P>);

namespace monitor {
/// Records nothing and costs nothing: the loop never calls it (`enabled` is false).
struct Off {
  using family = nitro::family::Monitor;  ///< The policy family this belongs to (MonitorPolicy).
  static constexpr std::string_view name = "off";  ///< Name shown in reports and checked in snapshots.
  static constexpr bool enabled = false;  ///< Off: the loop skips the monitor at compile time.
  struct Options {};
  /// The recorder the loop would own: every call does nothing.
  struct Recorder {
    /// Takes the options and the model's device, and keeps neither.
    Recorder(const Options&, const c10::Device&) noexcept {}
    void begin_step() noexcept {}  ///< Does nothing.
    void mark(Phase) noexcept {}  ///< Does nothing.
    void end_step(std::int64_t) noexcept {}  ///< Does nothing.
  };
};
}  // namespace monitor
static_assert(MonitorPolicy<monitor::Off>);

/// The bookkeeping an eviction policy keeps for a cache of Key. The cache gives each resident entry a
/// dense slot (a std::uint32_t) and tells the evictor of every insert (with the entry's weight in
/// bytes), hit and explicit erase; while over budget it asks for a victim, which the evictor picks and
/// forgets. The victim may be the entry just inserted: that is how a policy refuses admission.
template <class E, class Key>
concept EvictorFor = requires(E& e, const E& ce, const Key& key, std::uint32_t slot, std::size_t weight) {
  e.on_insert(key, slot, weight);
  e.on_access(key, slot);
  e.on_erase(slot);
  { e.victim() } -> std::same_as<std::optional<std::uint32_t>>;
  e.clear();
  { ce.memory_bytes() } -> std::convertible_to<std::size_t>;
};
/// The evictor is made from the policy's options and the cache's byte budget.
template <class P, class Key>
concept MakesEvictor = requires { typename P::template Evictor<Key>; } &&
                       std::constructible_from<typename P::template Evictor<Key>, const typename P::Options&, std::size_t>;
/// Cache eviction (cache/evict/): a Policy of the Eviction family whose `Evictor<Key>` keeps the books.
template <class P>
concept EvictionPolicy = NamedPolicy<P> && HasOptions<P> && OfFamily<P, family::Eviction> &&
                         MakesEvictor<P, std::int64_t> &&
                         EvictorFor<typename P::template Evictor<std::int64_t>, std::int64_t>;

}  // namespace nitro
