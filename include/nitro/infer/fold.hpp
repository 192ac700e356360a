#pragma once
// Convolution + batch-norm folding for inference.
//
//   nitro::infer::fold_conv_bn(sequential)  a new Sequential in which every Conv{1,2,3}d directly followed
//                                           by a BatchNorm{1,2,3}d of the same dimension is one convolution
//   nitro::infer::fold_conv_bn(conv, bn)    a pair the user names (in a custom module): the folded conv
//
// In eval mode a batch norm is an affine map per channel, y = (x - mean) * gamma / sqrt(var + eps) + beta,
// so it folds into the convolution before it:
//   w' = w * gamma / sqrt(var + eps)      (per output channel)
//   b' = (b - mean) * gamma / sqrt(var + eps) + beta     (b = 0 for a convolution without bias)
// computed in float64 and stored in the convolution's dtype. One kernel instead of two, and one
// activation less to write and read.
//
//   model->eval();
//   auto folded = nitro::infer::fold_conv_bn(model);        // model itself is left as it was
//
// What is left unfolded, as it is: a batch norm without running statistics (it normalises by the
// batch's own, even in eval mode), a batch norm not directly after a convolution, transposed
// convolutions, and what is inside other modules (LibTorch cannot nest a Sequential in a Sequential
// without a subclass, which this function cannot rebuild: fold such a block with its own call). Modules
// not folded are shared, not copied, with the input. A model in training mode is refused (its batch norms use the batch's statistics, and would go
// on updating the running ones: folding them would change what it computes). For the pair form the
// caller puts the returned convolution in place of both (`replace_module` and the member, as LibTorch
// documents) and stops calling the batch norm.
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/sqrt.h>
#include <c10/core/GradMode.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>

#include <cstddef>
#include <cstdint>
#include <vector>
#include <memory>
#include <string>

namespace nitro::infer {

namespace detail {

/// A convolution's options (ConvNdImpl keeps the general ConvNdOptions) as its constructor takes them.
template <size_t D>
torch::nn::ConvOptions<D> conv_options(const torch::nn::detail::ConvNdOptions<D>& o) {
  return torch::nn::ConvOptions<D>(o.in_channels(), o.out_channels(), o.kernel_size())
      .stride(o.stride())
      .padding(o.padding())
      .dilation(o.dilation())
      .groups(o.groups())
      .padding_mode(o.padding_mode())
      .bias(true);
}

/// The folded weight and bias of `conv` followed by `bn` (both eval), in `conv`'s dtype and device.
template <size_t D, class ConvImpl, class BnImpl>
std::shared_ptr<ConvImpl> folded_conv(const ConvImpl& conv, const BnImpl& bn) {
  NITRO_CHECK(!conv.is_training() && !bn.is_training(),
              "infer::fold_conv_bn: the model is in training mode; call model->eval() first (a batch norm "
              "in training mode uses each batch's statistics, which no folded convolution can reproduce)");
  NITRO_CHECK(bn.running_mean.defined() && bn.running_var.defined(),
              "infer::fold_conv_bn: this batch norm keeps no running statistics (track_running_stats(false)) "
              "and cannot be folded; leave it as it is");
  const auto out_channels = conv.weight.size(0);
  NITRO_CHECK(bn.running_mean.numel() == out_channels,
              "infer::fold_conv_bn: the batch norm has ", bn.running_mean.numel(), " channels but the convolution "
              "before it has ", out_channels, " output channels; they do not belong together");
  c10::NoGradGuard no_grad;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor mean = bn.running_mean.to(at::kDouble);
  const at::Tensor var = bn.running_var.to(at::kDouble);
  const at::Tensor gamma = bn.weight.defined() ? bn.weight.to(at::kDouble) : at::ones_like(mean, f64);
  const at::Tensor beta = bn.bias.defined() ? bn.bias.to(at::kDouble) : at::zeros_like(mean, f64);
  const at::Tensor scale = gamma / at::sqrt(var + bn.options.eps());
  const at::Tensor bias = conv.bias.defined() ? conv.bias.to(at::kDouble) : at::zeros_like(mean, f64);

  auto out = std::make_shared<ConvImpl>(conv_options<D>(conv.options));
  out->to(conv.weight.device(), conv.weight.scalar_type());
  std::vector<int64_t> shape(static_cast<size_t>(conv.weight.dim()), 1);
  shape[0] = out_channels;
  out->weight.set_data((conv.weight.to(at::kDouble) * scale.reshape(shape)).to(conv.weight.options()));
  out->bias.set_data(((bias - mean) * scale + beta).to(conv.weight.options()));
  out->weight.set_requires_grad(conv.weight.requires_grad());
  out->bias.set_requires_grad(conv.weight.requires_grad());
  out->eval();
  return out;
}

/// If `a` is a convolution of some dimension and `b` the batch norm of the same dimension, the folded
/// convolution; else null.
NITRO_INLINE std::shared_ptr<torch::nn::Module> try_fold(const std::shared_ptr<torch::nn::Module>& a,
                                                   const std::shared_ptr<torch::nn::Module>& b);

}  // namespace detail

/// A new Sequential with every (convolution, batch norm) pair folded into one convolution. The input
/// is left unchanged; modules that are not folded are shared.
/// Throws nitro::Error if the model is in training mode.
NITRO_INLINE torch::nn::Sequential fold_conv_bn(const torch::nn::Sequential& model);

/// The convolution that computes `bn(conv(x))` (both in eval mode), for a pair inside a custom module.
/// conv_ = register_module... : `conv_ = replace_module("conv", nitro::infer::fold_conv_bn(conv_, bn_));`
/// then leave bn_ out of forward.
NITRO_INLINE torch::nn::Conv2d fold_conv_bn(torch::nn::Conv2d conv, torch::nn::BatchNorm2d bn);
/// As above, for a 1-d convolution and batch norm.
NITRO_INLINE torch::nn::Conv1d fold_conv_bn(torch::nn::Conv1d conv, torch::nn::BatchNorm1d bn);
/// As above, for a 3-d convolution and batch norm.
NITRO_INLINE torch::nn::Conv3d fold_conv_bn(torch::nn::Conv3d conv, torch::nn::BatchNorm3d bn);

}  // namespace nitro::infer

#if !NITRO_COMPILED
#include <nitro/infer/fold-inl.hpp>
#endif
