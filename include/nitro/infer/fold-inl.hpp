#pragma once
// The definitions of nitro/infer/fold.hpp's non-template functions: included by fold.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/infer/fold.hpp>

namespace nitro::infer::detail {

NITRO_INLINE std::shared_ptr<torch::nn::Module> try_fold(const std::shared_ptr<torch::nn::Module>& a, const std::shared_ptr<torch::nn::Module>& b) {
  if (auto c = std::dynamic_pointer_cast<torch::nn::Conv2dImpl>(a))
    if (auto n = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(b))
      if (n->running_mean.defined()) return folded_conv<2>(*c, *n);
  if (auto c = std::dynamic_pointer_cast<torch::nn::Conv1dImpl>(a))
    if (auto n = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(b))
      if (n->running_mean.defined()) return folded_conv<1>(*c, *n);
  if (auto c = std::dynamic_pointer_cast<torch::nn::Conv3dImpl>(a))
    if (auto n = std::dynamic_pointer_cast<torch::nn::BatchNorm3dImpl>(b))
      if (n->running_mean.defined()) return folded_conv<3>(*c, *n);
  return nullptr;
}

}  // namespace nitro::infer::detail

namespace nitro::infer {

NITRO_INLINE torch::nn::Sequential fold_conv_bn(const torch::nn::Sequential& model) {
  NITRO_CHECK(!model.is_empty(), "infer::fold_conv_bn: the Sequential is empty (a default-constructed holder)");
  NITRO_CHECK(!model->is_training(),
              "infer::fold_conv_bn: the model is in training mode; call model->eval() first (a batch norm in "
              "training mode uses each batch's statistics, which no folded convolution can reproduce)");
  const auto children = model->named_children();
  NITRO_EXPECTS(children.size() == model->size());
  torch::nn::Sequential out;
  for (size_t i = 0; i < model->size(); ++i) {
    const std::string& name = children[i].key();
    const std::shared_ptr<torch::nn::Module> item = model->ptr(i);
    if (i + 1 < model->size()) {
      if (auto folded = detail::try_fold(item, model->ptr(i + 1))) {
        if (auto c = std::dynamic_pointer_cast<torch::nn::Conv2dImpl>(folded))
          out->push_back(std::string(name), torch::nn::Conv2d(c));
        else if (auto c1 = std::dynamic_pointer_cast<torch::nn::Conv1dImpl>(folded))
          out->push_back(std::string(name), torch::nn::Conv1d(c1));
        else
          out->push_back(std::string(name), torch::nn::Conv3d(std::dynamic_pointer_cast<torch::nn::Conv3dImpl>(folded)));
        ++i;  // the batch norm is inside the convolution now
        continue;
      }
    }
    out->push_back(std::string(name), *(model->begin() + static_cast<std::ptrdiff_t>(i)));  // the same module, shared
  }
  out->eval();
  return out;
}

NITRO_INLINE torch::nn::Conv2d fold_conv_bn(torch::nn::Conv2d conv, torch::nn::BatchNorm2d bn) {
  return torch::nn::Conv2d(detail::folded_conv<2>(*conv, *bn));
}

NITRO_INLINE torch::nn::Conv1d fold_conv_bn(torch::nn::Conv1d conv, torch::nn::BatchNorm1d bn) {
  return torch::nn::Conv1d(detail::folded_conv<1>(*conv, *bn));
}

NITRO_INLINE torch::nn::Conv3d fold_conv_bn(torch::nn::Conv3d conv, torch::nn::BatchNorm3d bn) {
  return torch::nn::Conv3d(detail::folded_conv<3>(*conv, *bn));
}

}  // namespace nitro::infer
