#pragma once
// Out of memory in every form LibTorch reports it, told apart from every other error.
//
//   try { step(batch); }
//   catch (const std::exception& e) { if (!nitro::memory::is_out_of_memory(e)) throw; /* smaller batch */ }
//
// The CUDA caching allocator throws c10::OutOfMemoryError. Near the limit the CUDA libraries run out
// first and report it their own way, as a plain c10::Error or c10::AcceleratorError:
//   "CUDA error: out of memory"                 a kernel launch or a CUDA runtime call
//   "CUDA driver error: out of memory"          a driver call (expandable segments map memory so)
//   CUBLAS_STATUS_ALLOC_FAILED                  cuBLAS's workspace; CUBLAS_STATUS_NOT_INITIALIZED is
//                                               what cublasCreate reports when it cannot allocate
//   CUDNN_STATUS_ALLOC_FAILED*, CUDNN_STATUS_INTERNAL_ERROR*
//                                               cuDNN (cuDNN 7-8 reported a failed allocation as an
//                                               internal error; cuDNN 9 adds sub-codes after the name)
//   CUFFT_ALLOC_FAILED, CUSOLVER_STATUS_ALLOC_FAILED, CUSPARSE_STATUS_ALLOC_FAILED
// and the CPU: std::bad_alloc, the DefaultCPUAllocator's failure, and the budget of
// memory::ScopedCpuTracking (a c10::OutOfMemoryError). Everything else (a shape error, a device
// assert, a NaN check) is not out of memory.
//
// cuDNN autotuning (hw::Settings::cudnn_benchmark) near the limit: it tries each convolution
// algorithm with the workspace it can still get, skips those whose workspace does not fit, and
// keeps its pick per input shape for the rest of the process. A shape first seen near the limit
// (in a batch-size search, or just after a split) may therefore keep a low-workspace, slower
// algorithm. Search with autotuning off, or leave a margin (BatchSizeOptions::margin) so training
// runs with room for the faster algorithms.
#include <nitro/core/config.hpp>
#include <c10/util/Exception.h>

#include <array>
#include <exception>
#include <new>
#include <string_view>

namespace nitro::memory {

namespace detail {
/// The out-of-memory reports of the CUDA libraries and of LibTorch's CPU allocator (see the banner).
inline constexpr std::array<std::string_view, 11> oom_markers = {
    "CUDA error: out of memory",
    "CUDA driver error: out of memory",
    "CUDA out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUBLAS_STATUS_NOT_INITIALIZED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR",
    "CUFFT_ALLOC_FAILED",
    "CUSOLVER_STATUS_ALLOC_FAILED",
    "CUSPARSE_STATUS_ALLOC_FAILED",
    "DefaultCPUAllocator: can't allocate memory",
};
}  // namespace detail

/// Whether `message` is one of the out-of-memory reports listed in the banner.
[[nodiscard]] NITRO_INLINE bool is_out_of_memory_message(std::string_view message) noexcept;

/// Whether `e` reports running out of memory (see the banner): c10::OutOfMemoryError, std::bad_alloc,
/// or a c10::Error whose message is a CUDA library's or the CPU allocator's out-of-memory report.
[[nodiscard]] NITRO_INLINE bool is_out_of_memory(const std::exception& e) noexcept;

/// The message of an error without LibTorch's backtrace, for reports.
[[nodiscard]] NITRO_INLINE std::string_view error_message(const std::exception& e) noexcept;

}  // namespace nitro::memory

#if !NITRO_COMPILED
#include <nitro/memory/oom-inl.hpp>
#endif
