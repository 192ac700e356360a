#pragma once
// Dynamic int8 Linear layers: int8 weights, activations quantised per batch as they arrive.
//
//   nitro::infer::quantize_dynamic(sequential)   a new Sequential whose Linear layers are
//                                                DynamicInt8Linear; everything else is shared
//   nitro::infer::DynamicInt8Linear(linear)      one layer
//
// What Python's `torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)` does,
// through the quantized operators LibTorch ships, called through the dispatcher:
// `quantized::linear_prepack` once (the int8 weight packed for the x86 engine's GEMM), then
// `quantized::linear_dynamic` per batch (the input's range measured, the input quantised to uint8,
// an int8 x uint8 GEMM with int32 accumulation, the result scaled back to float32). Weights are
// quantised symmetrically, per output channel by default (per tensor as an option), as
// `per_channel_dynamic_qconfig` does; the activations' range is reduced to 7 bits
// (`reduce_range`) as Python does on x86, where 8 bits can overflow the int16 intermediate sums.
//
// CPU only (the quantized engines are CPU ones), float32 inputs; the layer is for inference (no
// gradient flows through it). bench_infer measures it against the fp32 layer (int8_linear_speedup;
// the numbers are in bench/README.md).
#include <nitro/core/error.hpp>

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <ATen/ops/quantize_per_channel.h>
#include <ATen/ops/quantize_per_tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <algorithm>
#include <memory>
#include <ostream>
#include <string>
#include <utility>

namespace nitro::infer {

/// How weights are quantised.
struct QuantizeOptions {
  /// One scale per output channel (more accurate); false: one scale for the whole weight.
  bool per_channel = true;
};

namespace detail {

// The handles are looked up once; they live as long as the dispatcher.
inline const c10::OperatorHandle& linear_prepack_op() {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_prepack", "");
  return op;
}
inline const c10::OperatorHandle& linear_dynamic_op() {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_dynamic", "");
  return op;
}

inline void check_qengine() {
  auto& ctx = at::globalContext();
  if (ctx.qEngine() == at::QEngine::X86 || ctx.qEngine() == at::QEngine::FBGEMM) return;
  for (auto e : ctx.supportedQEngines()) {
    if (e == at::QEngine::X86) {
      ctx.setQEngine(at::QEngine::X86);
      return;
    }
  }
  nitro::detail::fail("infer::quantize_dynamic: this LibTorch has no x86 (fbgemm) quantized engine; "
                      "dynamic int8 Linear layers need one (an x86-64 build of LibTorch)");
}

}  // namespace detail

/// A Linear layer with int8 weights and dynamically quantised activations (see the top of this file).
class DynamicInt8LinearImpl : public torch::nn::Module {
 public:
  explicit DynamicInt8LinearImpl(const torch::nn::Linear& linear, QuantizeOptions options = {})
      : in_features_(linear->options.in_features()), out_features_(linear->options.out_features()) {
    NITRO_CHECK(linear->weight.device().is_cpu(),
                "infer::DynamicInt8Linear: the Linear layer is on ", linear->weight.device(),
                "; int8 dynamic quantisation runs on the CPU (move the model to the CPU first)");
    NITRO_CHECK(linear->weight.scalar_type() == at::kFloat,
                "infer::DynamicInt8Linear: the Linear layer's weight is ", c10::toString(linear->weight.scalar_type()),
                "; quantise a float32 model");
    detail::check_qengine();
    c10::NoGradGuard no_grad;
    const at::Tensor w = linear->weight.detach().contiguous();
    at::Tensor wq;
    if (options.per_channel) {
      // Symmetric: scale = max|w| / 127 per row, zero point 0 (qint8 in [-128, 127]).
      const at::Tensor scales = (w.abs().amax(1).to(at::kDouble) / 127.0).clamp_min(1e-12);
      wq = at::quantize_per_channel(w, scales, at::zeros({out_features_}, at::kLong), 0, at::kQInt8);
    } else {
      const double scale = std::max(w.abs().max().item<double>() / 127.0, 1e-12);
      wq = at::quantize_per_tensor(w, scale, 0, at::kQInt8);
    }
    c10::IValue bias = linear->bias.defined() ? c10::IValue(linear->bias.detach().contiguous()) : c10::IValue();
    torch::jit::Stack stack{c10::IValue(wq), std::move(bias)};
    detail::linear_prepack_op().callBoxed(&stack);
    packed_ = std::move(stack.at(0));
  }

  /// float32 input [..., in_features] -> float32 [..., out_features] (a 1-d input: one sample).
  at::Tensor forward(const at::Tensor& input) {
    NITRO_CHECK(input.dim() >= 1 && input.size(-1) == in_features_ && input.scalar_type() == at::kFloat &&
                    input.device().is_cpu(),
                "infer::DynamicInt8Linear: expected a float32 CPU input of last dimension ", in_features_, ", got ",
                c10::toString(input.scalar_type()), " ", input.sizes(), " on ", input.device());
    const bool one = input.dim() == 1;  // the quantized op wants at least [batch, in_features]
    torch::jit::Stack stack{c10::IValue((one ? input.unsqueeze(0) : input).contiguous()), packed_, c10::IValue(true)};
    detail::linear_dynamic_op().callBoxed(&stack);
    at::Tensor out = std::move(stack.at(0)).toTensor();
    return one ? out.squeeze(0) : out;
  }

  void pretty_print(std::ostream& out) const override {
    out << "nitro::infer::DynamicInt8Linear(in_features=" << in_features_ << ", out_features=" << out_features_
        << ")";
  }

  [[nodiscard]] int64_t in_features() const { return in_features_; }
  [[nodiscard]] int64_t out_features() const { return out_features_; }

 private:
  int64_t in_features_;
  int64_t out_features_;
  c10::IValue packed_;
};
TORCH_MODULE(DynamicInt8Linear);

/// A new Sequential whose Linear layers are DynamicInt8Linear (the Sequential's own items; a Linear inside
/// another module is left as it is); every other
/// module is shared with the input, which is left unchanged. The model must be on the CPU in float32.
inline torch::nn::Sequential quantize_dynamic(const torch::nn::Sequential& model, QuantizeOptions options = {}) {
  NITRO_CHECK(!model.is_empty(), "infer::quantize_dynamic: the Sequential is empty (a default-constructed holder)");
  const auto children = model->named_children();
  torch::nn::Sequential out;
  auto it = model->begin();
  for (size_t i = 0; i < model->size(); ++i, ++it) {
    const std::string& name = children[i].key();
    const auto item = model->ptr(i);
    if (auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(item)) {
      out->push_back(std::string(name), DynamicInt8Linear(torch::nn::Linear(linear), options));
    } else {
      out->push_back(std::string(name), *it);
    }
  }
  if (!model->is_training()) out->eval();
  return out;
}

}  // namespace nitro::infer
