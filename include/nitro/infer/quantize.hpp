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
#include <nitro/core/config.hpp>
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
NITRO_INLINE const c10::OperatorHandle& linear_prepack_op();
NITRO_INLINE const c10::OperatorHandle& linear_dynamic_op();

NITRO_INLINE void check_qengine();

}  // namespace detail

/// A Linear layer with int8 weights and dynamically quantised activations (see the top of this file).
class DynamicInt8LinearImpl : public torch::nn::Module {
 public:
  /// Quantises `linear`'s weight to int8 (its bias stays float32). Throws nitro::Error when the layer is
  /// not on the CPU in float32, or LibTorch has no x86/FBGEMM quantized engine.
  NITRO_INLINE explicit DynamicInt8LinearImpl(const torch::nn::Linear& linear, QuantizeOptions options = {});

  /// float32 input [..., in_features] -> float32 [..., out_features] (a 1-d input: one sample).
  NITRO_INLINE at::Tensor forward(const at::Tensor& input);

  /// Prints "nitro::infer::DynamicInt8Linear(in_features=..., out_features=...)".
  NITRO_INLINE void pretty_print(std::ostream& out) const override;

  /// The input size.
  [[nodiscard]] int64_t in_features() const { return in_features_; }
  /// The output size.
  [[nodiscard]] int64_t out_features() const { return out_features_; }

 private:
  int64_t in_features_;
  int64_t out_features_;
  c10::IValue packed_;
};
/// The module holder of DynamicInt8LinearImpl (as torch::nn::Linear is of LinearImpl).
TORCH_MODULE(DynamicInt8Linear);

/// A new Sequential whose Linear layers are DynamicInt8Linear (the Sequential's own items; a Linear inside
/// another module is left as it is); every other
/// module is shared with the input, which is left unchanged. The model must be on the CPU in float32.
NITRO_INLINE torch::nn::Sequential quantize_dynamic(const torch::nn::Sequential& model, QuantizeOptions options = {});

}  // namespace nitro::infer

#if !NITRO_COMPILED
#include <nitro/infer/quantize-inl.hpp>
#endif
