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

  static RngState capture(const std::vector<at::Tensor>& inputs) {
    RngState s;
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      s.cpu = gen.get_state();
    }
#if NITRO_WITH_CUDA
    for (const auto& t : inputs) {
      if (!t.defined() || !t.is_cuda()) continue;
      const auto index = t.device().index();
      bool seen = false;
      for (const auto& [i, _] : s.cuda) seen = seen || i == index;
      if (seen) continue;
      auto gen = at::cuda::detail::getDefaultCUDAGenerator(index);
      std::lock_guard<std::mutex> lock(gen.mutex());
      s.cuda.emplace_back(index, gen.get_state());
    }
#else
    (void)inputs;
#endif
    return s;
  }

  void restore() const {
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(cpu);
    }
#if NITRO_WITH_CUDA
    for (const auto& [index, state] : cuda) {
      auto gen = at::cuda::detail::getDefaultCUDAGenerator(index);
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
#endif
  }
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
  explicit CheckpointContextScope(CheckpointContext* context) noexcept : previous_(checkpoint_context) {
    checkpoint_context = context;
  }
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
inline const std::shared_ptr<torch::autograd::Node>& checkpoint_accumulate_marker() {
  struct Marker : torch::autograd::Node {
    torch::autograd::variable_list apply(torch::autograd::variable_list&&) override { return {}; }
  };
  static const std::shared_ptr<torch::autograd::Node> marker = std::make_shared<Marker>();
  return marker;
}

using ExecInfoMap = std::unordered_map<torch::autograd::Node*, torch::autograd::GraphTask::ExecInfo>;
inline const ExecInfoMap*& caller_request() {
  static thread_local const ExecInfoMap* request = nullptr;
  return request;
}
struct RequestScope {
  const ExecInfoMap* previous;
  explicit RequestScope(const ExecInfoMap* r) : previous(caller_request()) { caller_request() = r; }
  ~RequestScope() { caller_request() = previous; }
};

/// The input alias nodes that the enclosing checkpoints' engine calls on this thread have cut from
/// what is upstream of them, with the edges they had.
inline std::vector<std::pair<torch::autograd::Node*, torch::autograd::Edge>>& cut_inputs() {
  static thread_local std::vector<std::pair<torch::autograd::Node*, torch::autograd::Edge>> cut;
  return cut;
}
struct CutInputs {
  std::size_t begin;
  explicit CutInputs(const torch::autograd::edge_list& inputs) : begin(cut_inputs().size()) {
    for (const auto& e : inputs)
      if (e.is_valid()) {
        cut_inputs().emplace_back(e.function.get(), e.function->next_edges()[0]);
        e.function->next_edges()[0] = torch::autograd::Edge{};
      }
  }
  ~CutInputs() {
    auto& cut = cut_inputs();
    for (std::size_t i = begin; i < cut.size(); ++i) cut[i].first->next_edges()[0] = cut[i].second;
    cut.resize(begin);
  }
};
/// Reconnects the enclosing checkpoints' cut inputs for a nested checkpoint's backward, cuts them again after.
struct ReconnectEnclosing {
  std::size_t end = cut_inputs().size();
  ReconnectEnclosing() {
    for (std::size_t i = 0; i < end; ++i) cut_inputs()[i].first->next_edges()[0] = cut_inputs()[i].second;
  }
  ~ReconnectEnclosing() {
    for (std::size_t i = 0; i < end; ++i) cut_inputs()[i].first->next_edges()[0] = torch::autograd::Edge{};
  }
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // LibTorch runs forward with grad mode off: fn keeps no activations. Only the inputs are saved.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<CheckpointState> state, at::TensorList inputs) {
    std::vector<at::Tensor> args(inputs.begin(), inputs.end());
    state->rng = RngState::capture(args);
    std::vector<at::Tensor> outputs;
    {
      CheckpointContextScope plain(nullptr);
      outputs = state->fn(args);
    }
    ctx->save_for_backward(args);
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    // An output the loss does not use gets an undefined gradient, not zeros: the parameters reached
    // only through it get no .grad at all, as without checkpointing.
    ctx->set_materialize_grads(false);
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    // The engine runs a backward with grad mode on exactly when its caller asked for create_graph. An
    // empty exec info is a plain backward(), which accumulates into every leaf; a torch::autograd::grad
    // or a backward(inputs) fills it with what it asked for, and leaves every other .grad alone.
    const bool create_graph = at::GradMode::is_enabled();
    const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
    const bool accumulate =
        exec_info == nullptr || exec_info->empty() || exec_info->count(checkpoint_accumulate_marker().get()) != 0;
    if (create_graph || !accumulate) return differentiable_backward(*state, saved, grad_outputs, accumulate, exec_info);

    std::vector<at::Tensor> inputs;
    inputs.reserve(saved.size());
    for (const auto& t : saved) inputs.push_back(t.defined() ? t.detach().requires_grad_(t.requires_grad()) : t);
    auto outputs = recompute(*state, inputs);
    auto [roots, grads] = roots_of(outputs, grad_outputs);
    // The recomputed outputs are let go before the backward through them: what the graph saved of
    // them lives until the node that reads it has run, as in Python's non-reentrant checkpoint,
    // instead of to the end of this backward (one activation more at the peak, measured by
    // bench/peers' checkpoint workload). The engine call is what torch::autograd::backward makes.
    outputs.clear();
    if (!roots.empty())
      torch::autograd::Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/false, /*create_graph=*/false,
                                                            /*accumulate_grad=*/true);

    torch::autograd::variable_list result;
    result.reserve(inputs.size() + 1);
    result.emplace_back();  // for the state argument
    for (const auto& t : inputs) result.push_back(t.defined() && t.requires_grad() ? t.grad() : at::Tensor{});
    return result;
  }

 private:
  /// The recomputed outputs the backward starts from (those with history and a gradient) and their
  /// gradients.
  static std::pair<torch::autograd::edge_list, std::vector<at::Tensor>> roots_of(
      const std::vector<at::Tensor>& outputs, const torch::autograd::variable_list& grad_outputs) {
    std::pair<torch::autograd::edge_list, std::vector<at::Tensor>> out;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        out.first.push_back(torch::autograd::impl::gradient_edge(outputs[i]));
        out.second.push_back(grad_outputs[i]);
      }
    }
    return out;
  }

  /// fn on `inputs` again, with the forward's RNG and autocast state and grad mode on; the RNG is put
  /// back where the backward found it.
  static std::vector<at::Tensor> recompute(CheckpointState& state, const std::vector<at::Tensor>& inputs) {
    const auto now = RngState::capture(inputs);
    state.rng.restore();
    AutocastGuard cpu{c10::DeviceType::CPU, state.autocast.cpu_dtype, state.autocast.cpu_enabled};
    AutocastGuard cuda{c10::DeviceType::CUDA, state.autocast.cuda_dtype, state.autocast.cuda_enabled};
    at::AutoGradMode grad(true);
    CheckpointContextScope plain(nullptr);
    auto outputs = state.fn(inputs);
    now.restore();
    return outputs;
  }

  /// The backward of a torch::autograd::grad, a backward(inputs), or any backward with create_graph
  /// (a gradient penalty, a Hessian-vector product). fn is recomputed on the inputs themselves, so
  /// that with create_graph the returned gradients are functions of the inputs and of the parameters
  /// and second-order gradients flow through the checkpoint as through the plain forward; the engine
  /// call captures the inputs' gradients and stops there. With `accumulate` (a backward() without
  /// inputs) the parameters fn reads get their gradients through their own accumulators, their
  /// hooks run once; otherwise no .grad is written, and a parameter the caller asked for, which the
  /// checkpoint cannot return, is an error.
  static torch::autograd::variable_list differentiable_backward(
      CheckpointState& state, const std::vector<at::Tensor>& saved, const torch::autograd::variable_list& grad_outputs,
      bool accumulate, const std::unordered_map<torch::autograd::Node*, torch::autograd::GraphTask::ExecInfo>* exec_info) {
    using torch::autograd::Edge;
    const bool create_graph = at::GradMode::is_enabled();
    // Each input that requires grad enters as an alias of itself, whose node is where its gradient is
    // captured: an input passed twice, or one computed from another (x and x * 2), then gets the
    // gradient of its own place only, as a detached input would, instead of the sum over its places.
    std::vector<at::Tensor> inputs;
    torch::autograd::edge_list input_edges(saved.size());
    inputs.reserve(saved.size());
    for (std::size_t i = 0; i < saved.size(); ++i) {
      const auto& t = saved[i];
      if (t.defined() && t.requires_grad()) {
        at::AutoGradMode grad(true);
        inputs.push_back(at::alias(t));
        input_edges[i] = torch::autograd::impl::gradient_edge(inputs.back());
      } else {
        inputs.push_back(t);
      }
    }
    auto outputs = recompute(state, inputs);
    auto [roots, grads] = roots_of(outputs, grad_outputs);
    ReconnectEnclosing enclosing;
    torch::autograd::variable_list result(saved.size() + 1);  // the first for the state argument
    if (roots.empty()) return result;

    // What the recomputed graph reaches other than through the inputs: leaves to accumulate into, or,
    // for a caller that asked for gradients of its own choosing, something it asked for.
    torch::autograd::edge_list leaves;
    {
      std::vector<torch::autograd::Node*> stack;
      std::unordered_set<torch::autograd::Node*> seen;
      const auto visit = [&](const Edge& e) {
        if (!e.is_valid()) return;
        for (const auto& in : input_edges)
          if (in == e) return;
        auto* node = e.function.get();
        if (!seen.insert(node).second) return;
        NITRO_CHECK(accumulate || (exec_info->count(node) == 0 &&
                                   (caller_request() == nullptr || caller_request()->count(node) == 0)),
                    "nitro::checkpoint: torch::autograd::grad (or backward with inputs) asks for the gradient of a "
                    "tensor that a checkpointed function reads without taking it as an input (a parameter of a "
                    "module it calls, or a tensor it captured); the checkpoint returns gradients for its inputs "
                    "only. Pass that tensor to checkpoint::run(fn, inputs...) as an input and use it from there, "
                    "or call backward() without inputs and read .grad, or differentiate without checkpointing "
                    "(checkpoint::Off)");
        if (dynamic_cast<torch::autograd::AccumulateGrad*>(node) != nullptr) {
          if (accumulate) leaves.push_back(e);
          return;
        }
        stack.push_back(node);
      };
      for (const auto& root : roots) visit(root);
      while (!stack.empty()) {
        auto* node = stack.back();
        stack.pop_back();
        for (const auto& e : node->next_edges()) visit(e);
      }
    }
    torch::autograd::edge_list wanted;
    for (const auto& e : input_edges)
      if (e.is_valid()) wanted.push_back(e);
    wanted.insert(wanted.end(), leaves.begin(), leaves.end());
    if (accumulate) wanted.emplace_back(checkpoint_accumulate_marker(), 0);
    // The inputs' alias nodes are cut from what is upstream of them for the engine call: otherwise a
    // leaf both upstream and read inside (a tied weight, an input fn also captures) would get the
    // upstream part of its gradient here and again from the outer engine, and the engine would walk
    // the whole upstream graph. They are reconnected afterwards (create_graph's graph goes through them).
    // (A nested checkpoint's call finds them reconnected: what its function captured of this one's
    // inputs has its gradient carried upstream.)
    CutInputs cut(input_edges);
    // A nested checkpoint's backward sees this engine call's exec info, not the caller's: it checks
    // against the caller's request too.
    RequestScope request(accumulate ? nullptr : (caller_request() != nullptr ? caller_request() : exec_info));
    // With create_graph the recomputed graph is kept: the second-order graph reads what it saved.
    const auto captured = torch::autograd::Engine::get_default_engine().execute(
        roots, grads, /*keep_graph=*/create_graph, create_graph, /*accumulate_grad=*/false, wanted);
    std::size_t k = 0;
    for (std::size_t i = 0; i < input_edges.size(); ++i)
      if (input_edges[i].is_valid()) result[i + 1] = captured[k++];
    // Each leaf's gradient into its .grad, as the engine's call of its accumulator would do, but for the
    // tensor hooks, which the capture has already applied: AccumulateGrad::apply (with the
    // post-accumulate-grad hooks, and grad mode on: a gradient with history keeps it), then the
    // node's post hooks.
    for (const auto& leaf : leaves) {
      const auto& grad = captured[k++];
      if (!grad.defined()) continue;
      auto& node = *leaf.function;
      torch::autograd::variable_list in{grad};
      for (const auto& hook : node.pre_hooks()) in = (*hook)(in);
      auto out = node(torch::autograd::variable_list(in));
      for (const auto& hook : node.post_hooks()) out = (*hook)(out, in);
    }
    return result;
  }
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
  using family = nitro::family::Checkpoint;
  static constexpr std::string_view name = "off";
  static constexpr bool enabled = false;
  struct Options {};
};

/// S segments, all but the last recomputed.
/// @tparam S required: number of segments, >= 1.
template <std::int64_t S>
struct Segments {
  static_assert(S >= 1, "checkpoint::Segments<S>: S is the number of segments and must be >= 1 "
                        "(use checkpoint::Off to keep every activation)");
  using family = nitro::family::Checkpoint;
  static constexpr std::string_view name = "segments";
  static constexpr bool enabled = true;
  struct Options {};
  static constexpr std::int64_t segments(std::int64_t /*layers*/, const Options&) noexcept { return S; }
};

/// ceil(sqrt(n)) segments for n layers.
struct Sqrt {
  using family = nitro::family::Checkpoint;
  static constexpr std::string_view name = "sqrt";
  static constexpr bool enabled = true;
  struct Options {};
  static std::int64_t segments(std::int64_t layers, const Options&) {
    return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(layers)))));
  }
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
