#pragma once
// The definitions of nitro/infer/quantize.hpp's non-template functions: included by quantize.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/infer/quantize.hpp>

namespace nitro::infer::detail {

NITRO_INLINE const c10::OperatorHandle& linear_prepack_op() {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_prepack", "");
  return op;
}

NITRO_INLINE const c10::OperatorHandle& linear_dynamic_op() {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("quantized::linear_dynamic", "");
  return op;
}

NITRO_INLINE void check_qengine() {
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

}  // namespace nitro::infer::detail

namespace nitro::infer {

NITRO_INLINE DynamicInt8LinearImpl::DynamicInt8LinearImpl(const torch::nn::Linear& linear, QuantizeOptions options) : in_features_(linear->options.in_features()), out_features_(linear->options.out_features()) {
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

NITRO_INLINE at::Tensor DynamicInt8LinearImpl::forward(const at::Tensor& input) {
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

NITRO_INLINE void DynamicInt8LinearImpl::pretty_print(std::ostream& out) const {
  out << "nitro::infer::DynamicInt8Linear(in_features=" << in_features_ << ", out_features=" << out_features_
      << ")";
}

NITRO_INLINE torch::nn::Sequential quantize_dynamic(const torch::nn::Sequential& model, QuantizeOptions options) {
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
