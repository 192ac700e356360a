#pragma once
// Activation checkpointing: compute a block without keeping its activations, recompute them in the
// backward pass. Trades compute (one extra forward of each block) for memory.
//
//   checkpoint::run(fn, inputs...)    checkpoints one call of fn (tensors in, a tensor or a
//                                     vector of tensors out); usable inside any forward.
//   checkpoint::Off                   keep every activation. The baseline.
//   checkpoint::Segments<S>           TrainingLoop runs a torch::nn::Sequential as S segments, all
//                                     but the last recomputed (torch.utils.checkpoint.checkpoint_sequential).
//   checkpoint::Sqrt                  ceil(sqrt(n)) segments for n layers: O(sqrt(n)) activation
//                                     memory for one extra forward (Chen et al. 2016).
//
// The recomputation replays the forward exactly: it restores the CPU RNG state, the RNG state of
// every CUDA device the inputs live on, and the autocast state of the forward, so dropout masks and
// autocast casts are the same and the gradients equal those without checkpointing.
#include <nitro/core/compat_autocast.hpp>
#include <nitro/core/concepts.hpp>
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>
#include <nitro/train/amp.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/container/sequential.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string_view>
#include <type_traits>
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

struct CheckpointState : torch::CustomClassHolder {
  TensorFn fn;
  RngState rng;
  AutocastState autocast;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // LibTorch runs forward with grad mode off: fn keeps no activations. Only the inputs are saved.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<CheckpointState> state, at::TensorList inputs) {
    std::vector<at::Tensor> args(inputs.begin(), inputs.end());
    state->rng = RngState::capture(args);
    auto outputs = state->fn(args);
    ctx->save_for_backward(args);
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    inputs.reserve(saved.size());
    for (const auto& t : saved) inputs.push_back(t.defined() ? t.detach().requires_grad_(t.requires_grad()) : t);

    std::vector<at::Tensor> outputs;
    {
      // Replay the forward's RNG and autocast, then put the RNG back where backward found it.
      const auto now = RngState::capture(inputs);
      state->rng.restore();
      AutocastGuard cpu{c10::DeviceType::CPU, state->autocast.cpu_dtype, state->autocast.cpu_enabled};
      AutocastGuard cuda{c10::DeviceType::CUDA, state->autocast.cuda_dtype, state->autocast.cuda_enabled};
      at::AutoGradMode grad(true);
      outputs = state->fn(inputs);
      now.restore();
    }
    std::vector<at::Tensor> roots, grads;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, grads);

    torch::autograd::variable_list result;
    result.reserve(inputs.size() + 1);
    result.emplace_back();  // for the state argument
    for (const auto& t : inputs) result.push_back(t.defined() && t.requires_grad() ? t.grad() : at::Tensor{});
    return result;
  }
};

}  // namespace detail

namespace checkpoint {

/// Runs `fn(inputs...)` without keeping its activations and recomputes it in the backward pass,
/// with the same RNG and autocast state. `fn` takes the tensors and returns a tensor or a
/// std::vector of tensors; checkpoint returns the same. Gradients reach the parameters fn uses even
/// when no input requires grad.
///   auto h = nitro::checkpoint::run([&](const at::Tensor& x) { return block->forward(x); }, x);
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
  // With no input requiring grad, autograd would never call backward and the parameters inside fn
  // would get no gradient: an empty tensor that requires grad keeps the node in the graph.
  bool any = false;
  for (const auto& t : args) any = any || (t.defined() && t.requires_grad());
  if (!any && at::GradMode::is_enabled()) args.push_back(at::empty({0}, args.empty() ? at::TensorOptions{} : args.front().options()).requires_grad_());
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

/// Runs modules [begin, end) of a Sequential in order.
inline at::Tensor run_range(torch::nn::SequentialImpl& seq, std::size_t begin, std::size_t end, at::Tensor x) {
  auto it = seq.begin() + static_cast<std::ptrdiff_t>(begin);
  for (std::size_t i = begin; i < end; ++i, ++it) x = it->forward(x);
  return x;
}

/// Runs a Sequential as `segments` pieces, checkpointing all but the last (checkpoint_sequential).
inline at::Tensor run_segments(torch::nn::SequentialImpl& seq, std::int64_t segments, const at::Tensor& input) {
  const auto n = seq.size();
  if (n == 0) return input;
  const auto s = static_cast<std::size_t>(std::min<std::int64_t>(segments, static_cast<std::int64_t>(n)));
  const auto per = (n + s - 1) / s;
  at::Tensor x = input;
  std::size_t begin = 0;
  while (begin + per < n) {
    const auto end = begin + per;
    x = checkpoint::run([&seq, begin, end](const at::Tensor& in) { return run_range(seq, begin, end, in); }, x);
    begin = end;
  }
  return run_range(seq, begin, n, x);
}

}  // namespace detail

}  // namespace nitro
