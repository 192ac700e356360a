#pragma once
// Inference levels, model preparation and the runner.
//
//   nitro::infer::prepare(module, options)   eval mode, no gradients, conv-BN folded (Sequential), the
//                                            device, half / bf16 weights, channels-last
//   nitro::infer::Runner<Level>              runs a batch under c10::InferenceMode (and autocast, as
//                                            its level says) on any infer::Model
//   nitro::infer::level::Basic               fp32, inference mode: the plain eager forward without autograd
//   nitro::infer::level::Fast                Basic + channels-last inputs and weights, cuDNN autotuning,
//                                            TF32 and bf16 autocast on a GPU (on the CPU: fp32, because
//                                            most CPUs have no bf16 arithmetic, see the README)
//
//   auto model = nitro::infer::prepare(cnn, nitro::infer::options_of<nitro::infer::level::Fast>(device));
//   nitro::hw::ScopedSettings hw{nitro::infer::hardware<nitro::infer::level::Fast>()};
//   nitro::infer::Runner<nitro::infer::level::Fast> run{nitro::infer::module_model(model)};
//   at::Tensor logits = run(images);                                // images on any device
//
// The levels are types, as the training side's: what a level does is fixed when the program is compiled,
// and a level's numbers are in bench/README.md (bench_infer).
#include <nitro/core/compat_autocast.hpp>
#include <nitro/core/error.hpp>
#include <nitro/hw/settings.hpp>
#include <nitro/infer/fold.hpp>
#include <nitro/infer/model.hpp>
#include <nitro/train/amp.hpp>
#include <nitro/train/channels_last.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace nitro::infer {

/// What an inference level does.
/// @tparam ChannelsLast     4-d inputs and convolution weights as NHWC.
/// @tparam GpuAutocast      the autocast dtype on a GPU (c10::ScalarType::Undefined: none).
/// @tparam FastKernels      cuDNN autotuning and TF32 (hardware<Level>()).
template <bool ChannelsLast, c10::ScalarType GpuAutocast, bool FastKernels>
struct Level {
  /// 4-d inputs and convolution weights as NHWC (ChannelsLast).
  static constexpr bool channels_last = ChannelsLast;
  /// The autocast dtype on a GPU; c10::ScalarType::Undefined: none (GpuAutocast).
  static constexpr c10::ScalarType gpu_autocast = GpuAutocast;
  /// cuDNN autotuning and TF32 (FastKernels).
  static constexpr bool fast_kernels = FastKernels;
};

/// Whether T is an infer::Level (InferLevel's test).
template <class T>
inline constexpr bool is_level_v = false;
/// True: a Level.
template <bool C, c10::ScalarType A, bool F>
inline constexpr bool is_level_v<Level<C, A, F>> = true;
/// An infer::Level type (level::Basic, level::Fast, or a Level of your own).
template <class T>
concept InferLevel = is_level_v<T>;

namespace level {
/// fp32 eager forward under c10::InferenceMode: what `model->eval(); model->forward(x)` computes, without
/// autograd's bookkeeping.
using Basic = Level<false, c10::ScalarType::Undefined, false>;
/// Basic + channels-last, cuDNN autotuning, TF32 and bf16 autocast on a GPU.
using Fast = Level<true, c10::ScalarType::BFloat16, true>;
}  // namespace level

/// The hw::Settings a level wants (apply with hw::ScopedSettings for the serving scope).
template <InferLevel L>
hw::Settings hardware() {
  return L::fast_kernels ? hw::Settings::fast() : hw::Settings{};
}

/// Options of prepare().
struct PrepareOptions {
  /// Fold every (convolution, batch norm) pair of a Sequential (infer/fold.hpp).
  bool fold_conv_bn = true;
  /// 4-d weights as channels-last (give the runner channels-last inputs too: Level::channels_last).
  bool channels_last = false;
  /// Weights converted to this floating dtype (at::kHalf, at::kBFloat16); empty: as they are.
  std::optional<c10::ScalarType> dtype;
  /// Weights moved to this device; empty: where they are.
  std::optional<c10::Device> device;
};

/// The PrepareOptions of a level on a device: channels-last as the level says; weights stay fp32 (the
/// level's autocast picks the precision per operation, which keeps batch norms and softmax in fp32).
template <InferLevel L>
PrepareOptions options_of(c10::Device device) {
  PrepareOptions o;
  o.channels_last = L::channels_last;
  o.device = device;
  return o;
}

/// `module` ready to serve: eval mode, parameters without gradients, folded (if it is a Sequential
/// and `fold_conv_bn`), moved and converted as `options` say. It consumes the module: a Sequential
/// comes back as a new one (folding replaces modules) that shares its other modules with the input,
/// which are changed in place (eval, no gradients, device, dtype, layout); any other module is
/// changed in place and returned. Keep a `clone()` if the original is still needed (for training).
template <class Holder>
Holder prepare(Holder module, const PrepareOptions& options = {}) {
  NITRO_CHECK(!module.is_empty(), "infer::prepare: the module holder is empty (default-constructed)");
  if (options.dtype)
    NITRO_CHECK(c10::isFloatingType(*options.dtype),
                "infer::prepare: dtype must be a floating type (at::kHalf, at::kBFloat16, at::kFloat), got ",
                c10::toString(*options.dtype));
  module->eval();
  if constexpr (std::is_same_v<Holder, torch::nn::Sequential>) {
    if (options.fold_conv_bn) module = fold_conv_bn(module);
  }
  for (auto& p : module->parameters()) p.set_requires_grad(false);
  if (options.device) module->to(*options.device);
  if (options.dtype) module->to(*options.dtype);
  if (options.channels_last) to_channels_last(*module);
  return module;
}

/// Runs batches through a Model as its level says. Inputs are moved to the model's device, floating
/// ones converted to its dtype (a half or bf16 prepared module), and made channels-last where the level
/// says so; outputs come back in float32 when the level autocasts.
/// Not thread-safe: one runner per thread, or the DynamicBatcher's one worker.
template <InferLevel L = level::Basic>
class Runner {
 public:
  /// A runner of `model` (module_model, load_aoti, load_torchscript). Throws nitro::Error when it is null.
  explicit Runner(std::shared_ptr<Model> model) : model_(std::move(model)) {
    NITRO_CHECK(model_ != nullptr, "infer::Runner: the model is null");
  }

  /// One batch, one input tensor; the model's first output.
  at::Tensor operator()(const at::Tensor& input) {
    inputs_.resize(1);
    inputs_[0] = input;
    auto out = run(inputs_);
    inputs_[0] = at::Tensor();
    NITRO_CHECK(!out.empty(), "infer::Runner: the model returned no output");
    return std::move(out.front());
  }

  /// One batch; every output.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) {
    c10::InferenceMode inference;
    const c10::Device device = model_->device();
    std::vector<at::Tensor> moved;
    moved.reserve(inputs.size());
    const auto dtype = model_->dtype();
    for (const auto& t : inputs) {
      // non_blocking only towards a GPU: a copy to the CPU must have landed before the CPU reads it.
      at::Tensor x = t.device() == device ? t : t.to(device, /*non_blocking=*/device.is_cuda());
      if (dtype && x.is_floating_point() && x.scalar_type() != *dtype) x = x.to(*dtype);
      if constexpr (L::channels_last) {
        if (x.dim() == 4) x = x.contiguous(c10::MemoryFormat::ChannelsLast);
      }
      moved.push_back(std::move(x));
    }
    constexpr bool autocast = L::gpu_autocast != c10::ScalarType::Undefined;
    if (autocast && device.is_cuda()) {
      AutocastGuard guard{c10::DeviceType::CUDA, L::gpu_autocast};
      auto out = model_->run(moved);
      for (auto& o : out)
        if (o.is_floating_point() && o.scalar_type() != at::kFloat) o = o.to(at::kFloat);
      return out;
    }
    return model_->run(moved);
  }

  /// The model it runs.
  [[nodiscard]] const std::shared_ptr<Model>& model() const { return model_; }

 private:
  std::shared_ptr<Model> model_;
  std::vector<at::Tensor> inputs_;
};

}  // namespace nitro::infer
