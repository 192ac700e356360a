#pragma once
// The one place that knows LibTorch version differences. Everything else in Nitro calls these
// wrappers, so supporting a new LibTorch release means editing this file only.
//
// Supported: LibTorch 2.4 and newer (the device-agnostic autocast API); tested on 2.11.
// The autocast part lives in core/compat_autocast.hpp: its LibTorch header is as heavy as ATen.h,
// and only the AMP policies need it.
#include <nitro/core/config.hpp>

#include <ATen/Context.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

#include <optional>

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

/// LibTorch's version as MAJOR * 100 + MINOR, e.g. 211 for 2.11.
#define NITRO_TORCH_VERSION (TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR)

static_assert(NITRO_TORCH_VERSION >= 204,
              "Nitro needs LibTorch 2.4 or newer (the device-agnostic at::autocast API); "
              "cmake/deps.sh installs the tested version");

namespace nitro::compat {

// ---- TF32 -------------------------------------------------------------------------------------------
// LibTorch 2.11 keeps a per-backend, per-operation float32 precision; the older bool flags still
// exist but mixing the two APIs makes LibTorch refuse to answer, so only one is ever used.

/// The TF32 state of cuBLAS matmuls and cuDNN convolutions, saved exactly so that it can be restored.
struct Tf32State {
#if NITRO_TORCH_VERSION >= 211
  at::Float32Precision matmul;
  at::Float32Precision conv;
#else
  bool matmul;
  bool conv;
#endif
};

inline Tf32State tf32_state() {
  auto& ctx = at::globalContext();
#if NITRO_TORCH_VERSION >= 211
  return {ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL),
          ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV)};
#else
  return {ctx.allowTF32CuBLAS(), ctx.allowTF32CuDNN()};
#endif
}

inline void restore_tf32(const Tf32State& s) {
  auto& ctx = at::globalContext();
#if NITRO_TORCH_VERSION >= 211
  ctx.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL, s.matmul);
  ctx.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV, s.conv);
#else
  ctx.setAllowTF32CuBLAS(s.matmul);
  ctx.setAllowTF32CuDNN(s.conv);
#endif
}

/// Allows (or forbids) TF32 in cuBLAS matmuls and cuDNN convolutions.
inline void set_tf32(bool on) {
#if NITRO_TORCH_VERSION >= 211
  const auto p = on ? at::Float32Precision::TF32 : at::Float32Precision::IEEE;
  restore_tf32({p, p});
#else
  restore_tf32({on, on});
#endif
}

/// Whether both cuBLAS matmuls and cuDNN convolutions may use TF32.
inline bool tf32_enabled() {
  const auto s = tf32_state();
#if NITRO_TORCH_VERSION >= 211
  return s.matmul == at::Float32Precision::TF32 && s.conv == at::Float32Precision::TF32;
#else
  return s.matmul && s.conv;
#endif
}

// ---- CUDA caching allocator -------------------------------------------------------------------------

#if NITRO_WITH_CUDA
/// The per-process memory fraction of a device, where this LibTorch can say (2.10 and newer).
// LibTorch makes the caching allocator's per-device state when CUDA is first used (its lazy init):
// before that, reading or setting a fraction is an internal assert ("Allocator not initialized for
// device"). Python's torch.cuda.set_per_process_memory_fraction initialises first; so do these.
inline void init_cuda_allocator() {
#if NITRO_TORCH_VERSION >= 206
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
#else
  at::globalContext().lazyInitCUDA();
#endif
}
inline std::optional<double> cuda_memory_fraction([[maybe_unused]] c10::DeviceIndex device) {
#if NITRO_TORCH_VERSION >= 210
  init_cuda_allocator();
  return c10::cuda::CUDACachingAllocator::getMemoryFraction(device);
#else
  return std::nullopt;
#endif
}
inline void set_cuda_memory_fraction(double fraction, c10::DeviceIndex device) {
  init_cuda_allocator();
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device);
}
#endif

}  // namespace nitro::compat
