#pragma once
// The definitions of nitro/core/compat.hpp's non-template functions: included by compat.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/core/compat.hpp>

namespace nitro::compat {

NITRO_INLINE Tf32State tf32_state() {
  auto& ctx = at::globalContext();
#if NITRO_TORCH_VERSION >= 211
  return {ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL),
          ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV)};
#else
  return {ctx.allowTF32CuBLAS(), ctx.allowTF32CuDNN()};
#endif
}

NITRO_INLINE void restore_tf32(const Tf32State& s) {
  auto& ctx = at::globalContext();
#if NITRO_TORCH_VERSION >= 211
  ctx.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL, s.matmul);
  ctx.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV, s.conv);
#else
  ctx.setAllowTF32CuBLAS(s.matmul);
  ctx.setAllowTF32CuDNN(s.conv);
#endif
}

NITRO_INLINE void set_tf32(bool on) {
#if NITRO_TORCH_VERSION >= 211
  const auto p = on ? at::Float32Precision::TF32 : at::Float32Precision::IEEE;
  restore_tf32({p, p});
#else
  restore_tf32({on, on});
#endif
}

NITRO_INLINE bool tf32_enabled() {
  const auto s = tf32_state();
#if NITRO_TORCH_VERSION >= 211
  return s.matmul == at::Float32Precision::TF32 && s.conv == at::Float32Precision::TF32;
#else
  return s.matmul && s.conv;
#endif
}

#if NITRO_WITH_CUDA
NITRO_INLINE void init_cuda_allocator() {
#if NITRO_TORCH_VERSION >= 206
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
#else
  at::globalContext().lazyInitCUDA();
#endif
}
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE std::optional<double> cuda_memory_fraction([[maybe_unused]] c10::DeviceIndex device) {
#if NITRO_TORCH_VERSION >= 210
  init_cuda_allocator();
  return c10::cuda::CUDACachingAllocator::getMemoryFraction(device);
#else
  return std::nullopt;
#endif
}
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE void set_cuda_memory_fraction(double fraction, c10::DeviceIndex device) {
  init_cuda_allocator();
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device);
}
#endif

}  // namespace nitro::compat
