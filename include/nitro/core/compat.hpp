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
  at::Float32Precision matmul;  ///< cuBLAS matmuls' float32 precision.
  at::Float32Precision conv;    ///< cuDNN convolutions' float32 precision.
#else
  bool matmul;  ///< TF32 allowed in cuBLAS matmuls.
  bool conv;    ///< TF32 allowed in cuDNN convolutions.
#endif
};

/// The current TF32 state, to be put back with restore_tf32().
NITRO_INLINE Tf32State tf32_state();

/// Puts back a state tf32_state() returned.
NITRO_INLINE void restore_tf32(const Tf32State& s);

/// Allows (or forbids) TF32 in cuBLAS matmuls and cuDNN convolutions.
NITRO_INLINE void set_tf32(bool on);

/// Whether both cuBLAS matmuls and cuDNN convolutions may use TF32.
NITRO_INLINE bool tf32_enabled();

// ---- CUDA caching allocator -------------------------------------------------------------------------

#if NITRO_WITH_CUDA
// LibTorch makes the caching allocator's per-device state when CUDA is first used (its lazy init):
// before that, reading or setting a fraction is an internal assert ("Allocator not initialized for
// device"). Python's torch.cuda.set_per_process_memory_fraction initialises first; so do these.
/// Runs LibTorch's lazy CUDA initialisation, which makes the caching allocator's per-device state.
NITRO_INLINE void init_cuda_allocator();
/// The per-process memory fraction of a device, where this LibTorch can say (2.10 and newer);
/// nullopt with older ones.
NITRO_INLINE std::optional<double> cuda_memory_fraction([[maybe_unused]] c10::DeviceIndex device);
/// Caps the caching allocator of `device` at `fraction` of its memory (initialising CUDA first).
NITRO_INLINE void set_cuda_memory_fraction(double fraction, c10::DeviceIndex device);
#endif

}  // namespace nitro::compat

#if !NITRO_COMPILED
#include <nitro/core/compat-inl.hpp>
#endif
