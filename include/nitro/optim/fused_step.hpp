#pragma once
// nitro::optim::FusedStep: what TrainingLoop and graph::Capture need to know of a fused optimizer
// (optim/fused.hpp): a step on gradients still multiplied by amp::Fp16's loss scale, and a step whose
// skip is decided on the device (for CUDA-graph capture). Kept apart so that the loop does not include
// the optimizers' headers.
#include <nitro/core/error.hpp>

#include <ATen/core/Tensor.h>

#include <memory>

namespace nitro::optim {

/// step_on_device cannot run yet: a parameter has no state (no eager step made it: every warm-up
/// step was skipped for inf/NaN, a group was added, amsgrad turned on), or a state or rate is not on
/// the device yet. Not a mistake: run an eager step (it makes what is missing) and try again.
class DeviceStepNotReady : public nitro::Error {
 public:
  using nitro::Error::Error;
};

/// What one step_on_device used (FusedStep::device_step_record): the tensors a step captured from it
/// reads at every replay (held, so that none is freed while a graph may read it) and the options it
/// baked in: what prepare_device_step checks and advance_host advances. Opaque: only the optimizer
/// that made it reads it. Whoever replays captured steps holds each step's record (graph::Capture:
/// one per graph) and hands it back to the optimizer before that step's replay.
class DeviceStepRecord {
 public:
  virtual ~DeviceStepRecord() = default;

 protected:
  DeviceStepRecord() = default;
  DeviceStepRecord(const DeviceStepRecord&) = default;  ///< For the optimizers' records (an abstract base).
  DeviceStepRecord& operator=(const DeviceStepRecord&) = default;  ///< For the optimizers' records (an abstract base).
};

/// An optimizer that can step on gradients still multiplied by the loss scale, and step with the
/// skip decided on the device.
class FusedStep {
 public:
  virtual ~FusedStep() = default;
  /// One step on gradients that are still multiplied by `grad_scale` (a float32 scalar tensor, the
  /// loss scale): the kernels divide each gradient by it as they read it, and write the unscaled
  /// gradient back. The caller has checked that the gradients are finite.
  virtual void step_scaled(const at::Tensor& grad_scale) = 0;

  /// The step as device work only, for CUDA-graph capture (graph/capture.hpp): the kernels with
  /// `found_inf` (a float32 scalar on the parameters' device, 1 when the step must be skipped), which
  /// then change nothing (the step counters advanced on the device are put back; undefined: never skipped); `grad_scale` null,
  /// or the loss scale the gradients are still multiplied by. Changes no host counter (advance_host
  /// does, once the outcome is known), reads nothing back, allocates nothing once the state exists,
  /// and refuses to make state (DeviceStepNotReady, before anything is queued: run an eager step
  /// first). Makes a new record of the tensors it used, which becomes the optimizer's current one
  /// (device_step_record).
  virtual void step_on_device(const at::Tensor* grad_scale, const at::Tensor& found_inf) = 0;
  /// The current record: the last step_on_device's, or the one use_device_step_record set since; null
  /// when none. For a caller that captures several steps (over different parameters): save each
  /// one's record after its capture, and make it current again before that step's replay.
  virtual std::shared_ptr<const DeviceStepRecord> device_step_record() const = 0;
  /// Makes `record` (one this optimizer's device_step_record returned, or null: none) current: what
  /// the next prepare_device_step checks and advance_host advances.
  virtual void use_device_step_record(std::shared_ptr<const DeviceStepRecord> record) = 0;
  /// Before a capture and before each replay of one: brings the device copies of learning rates and
  /// step counters up to date with the host (work queued on the current stream). True when the tensors
  /// the current record's step used are still the optimizer's (parameters at the same addresses, the
  /// same state tensors) and the options it baked in (all but lr, and lr where it was a number)
  /// unchanged: a replay does what an eager step would. False (or no current record) means capture
  /// again.
  virtual bool prepare_device_step() = 0;
  /// After a replayed step_on_device: the host step counters of the parameters the current record
  /// covers advance when the step was taken (`stepped`, i.e. found_inf was 0).
  virtual void advance_host(bool stepped) = 0;
  /// Drops the optimizer's reference to the current record (once no graph replays its step any more),
  /// so that state tensors replaced since (a load) are not kept alive by it; records saved elsewhere
  /// live on until their holders let them go.
  virtual void release_device_step() noexcept = 0;

 protected:
  FusedStep() = default;
  FusedStep(const FusedStep&) = default;  ///< For the optimizers that implement it (an interface).
  FusedStep& operator=(const FusedStep&) = default;  ///< For the optimizers that implement it (an interface).
};

}  // namespace nitro::optim
