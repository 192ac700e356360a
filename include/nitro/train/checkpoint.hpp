#pragma once
// Activation checkpointing: compute a block without keeping its activations, recompute them in the
// backward pass. Trades compute (one extra forward of each block) for memory.
//
//   checkpoint::run(fn, inputs...)    checkpoints one call of fn (tensors in, a tensor or a
//                                     vector of tensors out); usable inside any forward.
//   checkpoint::sequential(layers, segments, x)
//                                     runs layers (a torch::nn::Sequential, or a std::vector of
//                                     module holders) as `segments` pieces, all but the last
//                                     checkpointed (torch.utils.checkpoint.checkpoint_sequential).
//   checkpoint::sequential(layers, x) and checkpoint::block(fn, inputs...)
//                                     the same, but only when the TrainingLoop running this forward
//                                     has a checkpoint policy on (with its number of segments); plain
//                                     calls otherwise (evaluation, checkpoint::Off). How a custom
//                                     module (not a Sequential) gets level::Ultra's memory savings.
//   checkpoint::Off                   keep every activation. The baseline.
//   checkpoint::Segments<S>           S segments, all but the last recomputed.
//   checkpoint::Sqrt                  ceil(sqrt(n)) segments for n layers: O(sqrt(n)) activation
//                                     memory for one extra forward (Chen et al. 2016).
//
// Where the policy applies: with a torch::nn::Sequential model and a loss function that takes the
// forward, `[&](auto& forward, auto& b) { return loss(forward(b.data), b.target); }`, the loop runs
// the Sequential under the policy. Any other model applies it in its own forward with
// checkpoint::sequential(blocks_, x) or checkpoint::block(fn, x). A step in which the model's forward
// never took the policy (a Sequential called directly by a one-argument loss function, a custom model
// that never calls the two) throws nitro::Error before its backward: memory savings are never lost
// silently. Under no_grad these run plainly (there are no activations to save).
//
// The recomputation replays the forward exactly: it restores the CPU RNG state, the RNG state of
// every CUDA device the inputs live on, and the autocast state of the forward, so dropout masks and
// autocast casts are the same and the gradients equal those without checkpointing.
//
// Gradients are those of the plain forward, as with torch.utils.checkpoint(use_reentrant=False): an
// output the loss does not use gets none, and a parameter reached only through it no .grad at all;
// torch::autograd::grad writes no .grad, backward(inputs) only its inputs'; with create_graph the
// gradients can be differentiated again (a gradient penalty, a Hessian-vector product), through the
// inputs to what is upstream of them too.
// What a checkpoint hides from the graph is what its function reads without taking it as an input
// (the parameters of the modules it calls): torch::autograd::grad cannot ask for those (LibTorch
// says they were not used in the graph; one also used outside the checkpoint is a nitro::Error).
// Read their gradients from .grad after a backward().
// A differentiating backward (create_graph, torch::autograd::grad) of nested checkpoints keeps a
// little state per thread while it runs; LibTorch runs a reentrant backward on the thread that called
// it, so this holds on one device. Nested checkpoints whose backward crosses devices (a model split
// over several GPUs inside one checkpoint) are not covered by the tests.
//
// Lifetime: `fn` is kept (moved or copied) until the backward pass has recomputed it. Capture by
// value what it reads ([=], [this], [this, scale]; `mutable` when it calls a module holder captured
// by value, whose forward is not const); a [&] capture of the enclosing forward's locals dangles by
// the time backward runs. Modules it calls must outlive the backward (members do).
#include <nitro/core/compat_autocast.hpp>
#include <nitro/core/concepts.hpp>
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>
#include <nitro/train/amp.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/alias.h>
#include <ATen/ops/empty.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/nn/modules/container/sequential.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#if NITRO_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace nitro {
namespace detail {

using TensorFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// The state of the RNGs a forward consumed: CPU, and each CUDA device of the inputs.
struct RngState {
  at::Tensor cpu;
  std::vector<std::pair<c10::DeviceIndex, at::Tensor>> cuda;

  NITRO_INLINE static RngState capture(const std::vector<at::Tensor>& inputs);

  NITRO_INLINE void restore() const;
};

/// The autocast state of CPU and CUDA at the forward.
struct AutocastState {
  bool cpu_enabled = compat::autocast_enabled(c10::DeviceType::CPU);
  c10::ScalarType cpu_dtype = compat::autocast_dtype(c10::DeviceType::CPU);
  bool cuda_enabled = compat::autocast_enabled(c10::DeviceType::CUDA);
  c10::ScalarType cuda_dtype = compat::autocast_dtype(c10::DeviceType::CUDA);
};

/// The checkpoint policy of the TrainingLoop whose forward runs on this thread, as the model's own
/// forward sees it (checkpoint::sequential(layers, x), checkpoint::block). Set by the loop for the
/// duration of its loss function; null everywhere else.
struct CheckpointContext {
  /// The policy's segments(layers, options).
  std::int64_t (*segments)(std::int64_t layers, const void* options) = nullptr;
  const void* options = nullptr;
  /// Times the model's forward took the policy since the context was set (checkpoint::run,
  /// sequential(layers, x) and block() with grad mode on, the loop's own forward of a Sequential):
  /// the loop checks that it did.
  std::int64_t consulted = 0;
};
inline thread_local CheckpointContext* checkpoint_context = nullptr;

/// Sets this thread's checkpoint context for a scope (null: none, as inside a checkpointed function,
/// where a nested block must run plainly so the recomputation does what the forward did).
class CheckpointContextScope {
 public:
  NITRO_INLINE explicit CheckpointContextScope(CheckpointContext* context) noexcept;
  CheckpointContextScope(const CheckpointContextScope&) = delete;
  CheckpointContextScope& operator=(const CheckpointContextScope&) = delete;
  ~CheckpointContextScope() { checkpoint_context = previous_; }

 private:
  CheckpointContext* previous_;
};

struct CheckpointState : torch::CustomClassHolder {
  TensorFn fn;
  RngState rng;
  AutocastState autocast;
};

/// The node a checkpoint's differentiable backward lists among the outputs of its engine call, so
/// that a checkpoint nested in the function sees that it runs inside it (and accumulates into the
/// parameters of its own function) rather than inside a torch::autograd::grad. Never executed.
NITRO_INLINE const std::shared_ptr<torch::autograd::Node>& checkpoint_accumulate_marker();

using ExecInfoMap = std::unordered_map<torch::autograd::Node*, torch::autograd::GraphTask::ExecInfo>;
NITRO_INLINE const ExecInfoMap*& caller_request();
struct RequestScope {
  const ExecInfoMap* previous;
  NITRO_INLINE explicit RequestScope(const ExecInfoMap* r);
  ~RequestScope() { caller_request() = previous; }
};

/// The input alias nodes that the enclosing checkpoints' engine calls on this thread have cut from
/// what is upstream of them, with the edges they had.
NITRO_INLINE std::vector<std::pair<torch::autograd::Node*, torch::autograd::Edge>>& cut_inputs();
struct CutInputs {
  std::size_t begin;
  NITRO_INLINE explicit CutInputs(const torch::autograd::edge_list& inputs);
  NITRO_INLINE ~CutInputs();
};
/// Reconnects the enclosing checkpoints' cut inputs for a nested checkpoint's backward, cuts them again after.
struct ReconnectEnclosing {
  std::size_t end = cut_inputs().size();
  NITRO_INLINE ReconnectEnclosing();
  NITRO_INLINE ~ReconnectEnclosing();
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // LibTorch runs forward with grad mode off: fn keeps no activations. Only the inputs are saved.
  NITRO_INLINE static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<CheckpointState> state, at::TensorList inputs);

  NITRO_INLINE static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs);

 private:
  /// The recomputed outputs the backward starts from (those with history and a gradient) and their
  /// gradients.
  NITRO_INLINE static std::pair<torch::autograd::edge_list, std::vector<at::Tensor>> roots_of(
      const std::vector<at::Tensor>& outputs, const torch::autograd::variable_list& grad_outputs);

  /// fn on `inputs` again, with the forward's RNG and autocast state and grad mode on; the RNG is put
  /// back where the backward found it.
  NITRO_INLINE static std::vector<at::Tensor> recompute(CheckpointState& state, const std::vector<at::Tensor>& inputs);

  /// The backward of a torch::autograd::grad, a backward(inputs), or any backward with create_graph
  /// (a gradient penalty, a Hessian-vector product). fn is recomputed on the inputs themselves, so
  /// that with create_graph the returned gradients are functions of the inputs and of the parameters
  /// and second-order gradients flow through the checkpoint as through the plain forward; the engine
  /// call captures the inputs' gradients and stops there. With `accumulate` (a backward() without
  /// inputs) the parameters fn reads get their gradients through their own accumulators, their
  /// hooks run once; otherwise no .grad is written, and a parameter the caller asked for, which the
  /// checkpoint cannot return, is an error.
  NITRO_INLINE static torch::autograd::variable_list differentiable_backward(
      CheckpointState& state, const std::vector<at::Tensor>& saved, const torch::autograd::variable_list& grad_outputs,
      bool accumulate, const std::unordered_map<torch::autograd::Node*, torch::autograd::GraphTask::ExecInfo>* exec_info);
};

}  // namespace detail

namespace checkpoint {

/// Runs `fn(inputs...)` without keeping its activations and recomputes it in the backward pass,
/// with the same RNG and autocast state. `fn` takes the tensors and returns a tensor or a
/// std::vector of tensors; checkpoint returns the same. Gradients reach the parameters fn uses even
/// when no input requires grad, and inputs may be of any dtype (int64 token ids included). `fn` is
/// kept until the backward pass: capture by value (see the banner).
///   auto h = nitro::checkpoint::run([this](const at::Tensor& x) { return block->forward(x); }, x);
template <class Fn, class... Tensors>
auto run(Fn&& fn, const Tensors&... inputs) {
  static_assert((std::is_convertible_v<const Tensors&, const at::Tensor&> && ...),
                "nitro::checkpoint::run(fn, inputs...): inputs must be tensors; capture anything else in fn");
  using Result = std::invoke_result_t<Fn&, const Tensors&...>;
  static_assert(std::is_same_v<Result, at::Tensor> || std::is_same_v<Result, std::vector<at::Tensor>>,
                "nitro::checkpoint::run(fn, inputs...): fn must return at::Tensor or std::vector<at::Tensor>");
  auto state = c10::make_intrusive<nitro::detail::CheckpointState>();
  state->fn = [f = std::forward<Fn>(fn)](const std::vector<at::Tensor>& args) mutable -> std::vector<at::Tensor> {
    auto call = [&]<std::size_t... I>(std::index_sequence<I...>) { return f(args[I]...); };
    if constexpr (std::is_same_v<Result, at::Tensor>) {
      return {call(std::index_sequence_for<Tensors...>{})};
    } else {
      return call(std::index_sequence_for<Tensors...>{});
    }
  };
  std::vector<at::Tensor> args{inputs...};
  for (std::size_t i = 0; i < args.size(); ++i)
    NITRO_CHECK(args[i].defined(), "nitro::checkpoint::run(fn, inputs...): input ", i, " is an undefined tensor; "
                "pass defined tensors only (capture an optional one in fn)");
  // With no input requiring grad, autograd would never call backward and the parameters inside fn
  // would get no gradient: an empty float tensor that requires grad keeps the node in the graph
  // (float whatever the inputs are: an integer tensor cannot require grad).
  bool any = false;
  std::optional<c10::Device> device;
  for (const auto& t : args) {
    if (t.defined() && !device) device = t.device();
    any = any || (t.defined() && t.requires_grad());
  }
  if (!any && at::GradMode::is_enabled())
    args.push_back(at::empty({0}, at::TensorOptions().dtype(at::kFloat).device(device.value_or(c10::kCPU))).requires_grad_());
  if (auto* context = nitro::detail::checkpoint_context; context != nullptr && at::GradMode::is_enabled())
    ++context->consulted;
  auto outputs = nitro::detail::CheckpointFunction::apply(state, at::TensorList(args));
  if constexpr (std::is_same_v<Result, at::Tensor>) {
    return outputs.at(0);
  } else {
    return outputs;
  }
}

/// Keep every activation.
struct Off {
  /// The policy family this belongs to.
  using family = nitro::family::Checkpoint;
  /// Name shown in reports and messages.
  static constexpr std::string_view name = "off";
  /// Off: nothing is recomputed.
  static constexpr bool enabled = false;
  /// No knobs.
  struct Options {};
};

/// S segments, all but the last recomputed.
/// @tparam S required: number of segments, >= 1.
template <std::int64_t S>
struct Segments {
  static_assert(S >= 1, "checkpoint::Segments<S>: S is the number of segments and must be >= 1 "
                        "(use checkpoint::Off to keep every activation)");
  /// The policy family this belongs to.
  using family = nitro::family::Checkpoint;
  /// Name shown in reports and messages.
  static constexpr std::string_view name = "segments";
  /// On: the loop's forward is checkpointed.
  static constexpr bool enabled = true;
  /// No knobs: S is in the type.
  struct Options {};
  /// S segments, whatever the number of layers.
  static constexpr std::int64_t segments(std::int64_t /*layers*/, const Options&) noexcept { return S; }
};

/// ceil(sqrt(n)) segments for n layers.
struct Sqrt {
  /// The policy family this belongs to.
  using family = nitro::family::Checkpoint;
  /// Name shown in reports and messages.
  static constexpr std::string_view name = "sqrt";
  /// On: the loop's forward is checkpointed.
  static constexpr bool enabled = true;
  /// No knobs.
  struct Options {};
  /// ceil(sqrt(layers)) segments, at least 1.
  NITRO_INLINE static std::int64_t segments(std::int64_t layers, const Options&);
};

static_assert(CheckpointPolicy<Off> && CheckpointPolicy<Segments<4>> && CheckpointPolicy<Sqrt>);

}  // namespace checkpoint
namespace detail {

template <class T>
inline constexpr bool always_false = false;

/// The layers of a module holder (torch::nn::Sequential), or the range itself.
template <class Layers>
decltype(auto) layer_range(Layers& layers) {
  if constexpr (!requires { std::begin(layers); } && requires { (*layers).begin(); }) {
    return (*layers);
  } else {
    return (layers);
  }
}
/// One layer's forward: an element of a Sequential (AnyModule), or a module holder / pointer.
template <class Layer>
at::Tensor call_layer(Layer& layer, const at::Tensor& x) {
  if constexpr (requires { layer.forward(x); }) {
    return layer.forward(x);
  } else if constexpr (requires { layer->forward(x); }) {
    return layer->forward(x);
  } else {
    static_assert(always_false<Layer>,
                  "nitro::checkpoint::sequential(layers, ...): a layer has no forward(at::Tensor) to call; a "
                  "torch::nn::ModuleList holds plain torch::nn::Module pointers, which have none: keep the blocks "
                  "in a std::vector of their holder type (std::vector<MyBlock>) or in a torch::nn::Sequential");
    return x;
  }
}
/// Runs layers [begin, end) in order.
template <class Range>
at::Tensor run_range(Range& layers, std::size_t begin, std::size_t end, at::Tensor x) {
  auto it = std::next(std::begin(layers), static_cast<std::ptrdiff_t>(begin));
  for (std::size_t i = begin; i < end; ++i, ++it) x = call_layer(*it, x);
  return x;
}

}  // namespace detail

namespace checkpoint {

/// Runs `layers` (a torch::nn::Sequential, or a range of module holders such as
/// std::vector<torch::nn::Linear>, each called as layer->forward(x)) as `segments` pieces of equal
/// length, checkpointing all but the last: torch.utils.checkpoint.checkpoint_sequential. The layers
/// must outlive the backward pass (keep them as members).
///   x = nitro::checkpoint::sequential(blocks_, 4, x);
template <class Layers>
at::Tensor sequential(Layers& layers, std::int64_t segments, const at::Tensor& input) {
  NITRO_CHECK(segments >= 1, "checkpoint::sequential: segments must be >= 1, got ", segments);
  auto& range = nitro::detail::layer_range(layers);
  const auto n = static_cast<std::size_t>(std::distance(std::begin(range), std::end(range)));
  if (n == 0) return input;
  const auto s = static_cast<std::size_t>(std::min<std::int64_t>(segments, static_cast<std::int64_t>(n)));
  const auto per = (n + s - 1) / s;
  at::Tensor x = input;
  std::size_t begin = 0;
  while (begin + per < n) {
    const auto end = begin + per;
    x = run([&range, begin, end](const at::Tensor& in) { return nitro::detail::run_range(range, begin, end, in); }, x);
    begin = end;
  }
  return nitro::detail::run_range(range, begin, n, x);
}

/// Whether the TrainingLoop running this forward on this thread has a checkpoint policy on (false in
/// evaluation, in a loop with checkpoint::Off, and inside a function being checkpointed).
inline bool active() noexcept { return nitro::detail::checkpoint_context != nullptr; }

/// `layers` cut into as many segments as the running TrainingLoop's checkpoint policy asks for
/// (checkpoint::Sqrt: ceil(sqrt(n))), or all of them run plainly when no loop checkpoints (evaluation,
/// checkpoint::Off): what a custom module's forward calls to take part in level::Ultra.
///   at::Tensor forward(at::Tensor x) { return head->forward(nitro::checkpoint::sequential(blocks_, stem->forward(x))); }
template <class Layers>
at::Tensor sequential(Layers& layers, const at::Tensor& input) {
  auto* context = nitro::detail::checkpoint_context;
  auto& range = nitro::detail::layer_range(layers);
  const auto n = static_cast<std::int64_t>(std::distance(std::begin(range), std::end(range)));
  // Without gradients there are no activations to save: a plain call (an evaluation, a teacher).
  if (context == nullptr || !at::GradMode::is_enabled())
    return nitro::detail::run_range(range, 0, static_cast<std::size_t>(n), input);
  ++context->consulted;  // even when the policy asks for one segment, which checkpoints nothing
  return sequential(layers, context->segments(n, context->options), input);
}

/// `fn(inputs...)` checkpointed (as run) when the running TrainingLoop has a checkpoint policy on,
/// a plain call otherwise. Capture by value (see the banner).
///   x = nitro::checkpoint::block([this](const at::Tensor& x) { return features(x); }, x);
template <class Fn, class... Tensors>
auto block(Fn&& fn, const Tensors&... inputs) {
  if (!active() || !at::GradMode::is_enabled()) return std::invoke(fn, inputs...);
  return run(std::forward<Fn>(fn), inputs...);
}

}  // namespace checkpoint

}  // namespace nitro

#if !NITRO_COMPILED
#include <nitro/train/checkpoint-inl.hpp>
#endif
