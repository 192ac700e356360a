#pragma once
// nitro::StepResult: what one training step did. The hook protocol's result (train/hooks.hpp), here in
// core/ so that hook policies of any layer (memory::Watch, snapshot::Policy, ...) name it without
// including the training loop.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string_view>

namespace nitro {

/// What one TrainingLoop::step did. Tensors are on the device; reading them synchronises.
struct StepResult {
  /// The micro-batch's loss as the loss function returned it (not divided, not scaled), detached.
  at::Tensor loss;
  /// The optimizer stepped after this micro-batch.
  bool stepped = false;
  /// An optimizer step was due and was skipped because a gradient (or the loss) was inf or NaN.
  bool skipped = false;
  /// The loss scale after this step (amp::Fp16 only; undefined otherwise): a copy, which later steps
  /// do not change.
  at::Tensor loss_scale;
  /// The total gradient norm before clipping (clip::Norm, on steps that stepped or skipped).
  at::Tensor grad_norm;
  /// A hook asks the caller to stop the run after this step (snapshot::Policy after a SIGTERM, once
  /// the snapshot is written); `stop_reason` says why, for the log.
  bool stop = false;
  std::string_view stop_reason{};  ///< Why `stop` was asked for, for the log; empty when it was not.
  /// stability::Guard's counts so far (0 without one): non-finite losses, parameters or skipped
  /// steps found, loss spikes, restores of the last good state.
  std::int64_t nonfinite_found = 0, spikes_found = 0 /**< Loss spikes found so far by stability::Guard. */, restores = 0;  ///< Restores of the last good state so far.
};

}  // namespace nitro
