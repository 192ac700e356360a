#pragma once
// nitro::optim::FusedStep: the one thing TrainingLoop needs to know of a fused optimizer
// (optim/fused.hpp) to fold amp::Fp16's loss scaler into its step. Kept apart so that the loop does
// not include the optimizers' headers.
#include <ATen/core/Tensor.h>

namespace nitro::optim {

/// An optimizer that can step on gradients still multiplied by the loss scale.
class FusedStep {
 public:
  virtual ~FusedStep() = default;
  /// One step on gradients that are still multiplied by `grad_scale` (a float32 scalar tensor, the
  /// loss scale): the kernels divide each gradient by it as they read it, and write the unscaled
  /// gradient back. The caller has checked that the gradients are finite.
  virtual void step_scaled(const at::Tensor& grad_scale) = 0;

 protected:
  FusedStep() = default;
  FusedStep(const FusedStep&) = default;
  FusedStep& operator=(const FusedStep&) = default;
};

}  // namespace nitro::optim
