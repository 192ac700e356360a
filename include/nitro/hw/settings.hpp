#pragma once
// Process-wide hardware settings, applied for a scope and restored after it.
//
//   nitro::hw::Settings        what to change; every field left empty is left as it is
//   nitro::hw::ScopedSettings  applies Settings, restores the previous values on destruction
//   nitro::hw::current()       the values in force now
//   Settings::fast()           cuDNN autotuning and TF32: the usual choice for training on a GPU
//   Settings::reproducible()   deterministic cuDNN and algorithms, no autotuning, no TF32
//
// nitro::hw::ScopedSettings hw{{.cudnn_benchmark = true, .tf32 = true, .intra_op_threads = 8}};
//
// inter_op_threads is the exception to restoring: LibTorch lets a process set it once, before any
// inter-op parallel work, and never again. ScopedSettings sets it when it differs from the current
// value, throws nitro::Error when LibTorch can no longer change it, and leaves it set on exit.
#include <nitro/core/compat.hpp>
#include <nitro/core/config.hpp>
#include <nitro/core/device.hpp>
#include <nitro/core/error.hpp>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <optional>

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace nitro::hw {

/// What to change. Empty fields are left as they are.
struct Settings {
  /// cuDNN autotuning (`torch.backends.cudnn.benchmark`): faster convolutions for fixed shapes.
  std::optional<bool> cudnn_benchmark;
  /// Deterministic cuDNN algorithms (`torch.backends.cudnn.deterministic`).
  std::optional<bool> cudnn_deterministic;
  /// Deterministic algorithms everywhere (`torch.use_deterministic_algorithms`); an operation with no
  /// deterministic implementation then throws.
  std::optional<bool> deterministic_algorithms;
  /// TF32 in cuBLAS matmuls and cuDNN convolutions on Ampere and newer GPUs.
  std::optional<bool> tf32;
  /// Threads for intra-op parallelism (at::set_num_threads), >= 1.
  std::optional<int> intra_op_threads;
  /// Threads for inter-op parallelism, >= 1; settable once per process (see the top of this file).
  std::optional<int> inter_op_threads;
  /// Cap on the caching allocator of `cuda_device` as a fraction of its memory, in (0, 1].
  std::optional<double> cuda_memory_fraction;
  /// The device `cuda_memory_fraction` applies to; -1 means the current device.
  int cuda_device = -1;

  /// cuDNN autotuning and TF32 on.
  static Settings fast() {
    Settings s;
    s.cudnn_benchmark = true;
    s.tf32 = true;
    return s;
  }
  /// Deterministic cuDNN and algorithms, no autotuning, no TF32.
  static Settings reproducible() {
    Settings s;
    s.cudnn_benchmark = false;
    s.cudnn_deterministic = true;
    s.deterministic_algorithms = true;
    s.tf32 = false;
    return s;
  }
};

/// Throws nitro::Error naming the first setting that is out of range, and the range.
inline void validate(const Settings& s) {
  if (s.intra_op_threads)
    NITRO_CHECK(*s.intra_op_threads >= 1, "hw::Settings: intra_op_threads must be >= 1, got ", *s.intra_op_threads);
  if (s.inter_op_threads)
    NITRO_CHECK(*s.inter_op_threads >= 1, "hw::Settings: inter_op_threads must be >= 1, got ", *s.inter_op_threads);
  if (s.cuda_memory_fraction) {
    const double f = *s.cuda_memory_fraction;
    NITRO_CHECK(std::isfinite(f) && f > 0.0 && f <= 1.0,
                "hw::Settings: cuda_memory_fraction must be in (0, 1], got ", f);
    NITRO_CHECK(s.cuda_device >= -1, "hw::Settings: cuda_device must be -1 (current) or a device index, got ",
                s.cuda_device);
    require_available<Cuda>("hw::Settings::cuda_memory_fraction");
#if NITRO_WITH_CUDA
    NITRO_CHECK(s.cuda_device < static_cast<int>(c10::cuda::device_count()), "hw::Settings: cuda_device ",
                s.cuda_device, " does not exist; this process sees ", static_cast<int>(c10::cuda::device_count()),
                " CUDA device(s)");
#endif
  }
}

/// The values in force now (cuda_memory_fraction where this LibTorch can report it).
inline Settings current(int cuda_device = -1) {
  const auto& ctx = at::globalContext();
  Settings s;
  s.cudnn_benchmark = ctx.benchmarkCuDNN();
  s.cudnn_deterministic = ctx.deterministicCuDNN();
  s.deterministic_algorithms = ctx.deterministicAlgorithms();
  s.tf32 = compat::tf32_enabled();
  s.intra_op_threads = at::get_num_threads();
  s.inter_op_threads = static_cast<int>(at::get_num_interop_threads());
  s.cuda_device = cuda_device;
#if NITRO_WITH_CUDA
  if (Cuda::available()) {
    const auto index = cuda_device < 0 ? c10::cuda::current_device() : static_cast<c10::DeviceIndex>(cuda_device);
    s.cuda_memory_fraction = compat::cuda_memory_fraction(index);
  }
#endif
  return s;
}

/// Applies Settings on construction and restores what it changed on destruction (in reverse
/// order). Validates everything before changing anything; if applying fails midway, what was
/// already changed is restored before the exception leaves. Not copyable or movable: it is a scope.
class ScopedSettings {
 public:
  explicit ScopedSettings(const Settings& wanted) {
    validate(wanted);
    try {
      apply(wanted);
    } catch (...) {
      restore();
      throw;
    }
  }
  ScopedSettings(const ScopedSettings&) = delete;
  ScopedSettings& operator=(const ScopedSettings&) = delete;
  ~ScopedSettings() { restore(); }

 private:
  void apply(const Settings& s) {
    auto& ctx = at::globalContext();
    if (s.cudnn_benchmark) {
      saved_.cudnn_benchmark = ctx.benchmarkCuDNN();
      ctx.setBenchmarkCuDNN(*s.cudnn_benchmark);
    }
    if (s.cudnn_deterministic) {
      saved_.cudnn_deterministic = ctx.deterministicCuDNN();
      ctx.setDeterministicCuDNN(*s.cudnn_deterministic);
    }
    if (s.deterministic_algorithms) {
      saved_.deterministic_algorithms = ctx.deterministicAlgorithms();
      saved_warn_only_ = ctx.deterministicAlgorithmsWarnOnly();
      ctx.setDeterministicAlgorithms(*s.deterministic_algorithms, false);
    }
    if (s.tf32) {
      saved_tf32_ = compat::tf32_state();
      compat::set_tf32(*s.tf32);
    }
    if (s.intra_op_threads) {
      saved_.intra_op_threads = at::get_num_threads();
      at::set_num_threads(*s.intra_op_threads);
    }
    if (s.inter_op_threads && static_cast<std::size_t>(*s.inter_op_threads) != at::get_num_interop_threads()) {
      try {
        at::set_num_interop_threads(*s.inter_op_threads);
      } catch (const c10::Error&) {
        detail::fail("hw::Settings: inter_op_threads can no longer be changed (now ", at::get_num_interop_threads(),
                     "): LibTorch allows it once per process, before any inter-op parallel work; "
                     "apply it at the start of main()");
      }
    }
#if NITRO_WITH_CUDA
    if (s.cuda_memory_fraction) {
      device_ = s.cuda_device < 0 ? c10::cuda::current_device() : static_cast<c10::DeviceIndex>(s.cuda_device);
      // Where LibTorch cannot report the old fraction, the default (no cap) is what we restore.
      saved_.cuda_memory_fraction = compat::cuda_memory_fraction(device_).value_or(1.0);
      compat::set_cuda_memory_fraction(*s.cuda_memory_fraction, device_);
    }
#endif
  }

  void restore() noexcept {
    auto& ctx = at::globalContext();
#if NITRO_WITH_CUDA
    if (saved_.cuda_memory_fraction) compat::set_cuda_memory_fraction(*saved_.cuda_memory_fraction, device_);
#endif
    if (saved_.intra_op_threads) at::set_num_threads(*saved_.intra_op_threads);
    if (saved_tf32_) compat::restore_tf32(*saved_tf32_);
    if (saved_.deterministic_algorithms) ctx.setDeterministicAlgorithms(*saved_.deterministic_algorithms, saved_warn_only_);
    if (saved_.cudnn_deterministic) ctx.setDeterministicCuDNN(*saved_.cudnn_deterministic);
    if (saved_.cudnn_benchmark) ctx.setBenchmarkCuDNN(*saved_.cudnn_benchmark);
    saved_ = {};
    saved_tf32_.reset();
  }

  Settings saved_;  // only the fields this scope changed are set
  std::optional<compat::Tf32State> saved_tf32_;
  bool saved_warn_only_ = false;
  c10::DeviceIndex device_ = 0;
};

}  // namespace nitro::hw
