// Out of memory in every form LibTorch reports it, and nothing else.
#include <nitro/core/error.hpp>
#include <nitro/memory/oom.hpp>

#include "testing.hpp"

#include <new>
#include <stdexcept>
#include <string>

namespace nitro_test_memory_oom {  // one namespace per file: an area is compiled as one translation unit

namespace {
c10::Error error(const std::string& message) { return c10::Error(message); }
}  // namespace

TEST_CASE("is_out_of_memory: the allocator's error, the CUDA libraries' reports and the CPU's") {
  CHECK(nitro::memory::is_out_of_memory(c10::OutOfMemoryError({"f", "file", 1}, "CUDA out of memory. Tried to allocate 2.00 GiB")));
  CHECK(nitro::memory::is_out_of_memory(std::bad_alloc{}));
  // What cuBLAS, cuDNN and the CUDA runtime report near the limit, as LibTorch words it.
  for (const char* message :
       {"CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR",
        "cuDNN Frontend error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
        "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call",
        "cuFFT error: CUFFT_ALLOC_FAILED",
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes."}) {
    CAPTURE(message);
    CHECK(nitro::memory::is_out_of_memory(error(message)));
    CHECK(nitro::memory::is_out_of_memory_message(message));
  }
  CHECK(nitro::memory::is_out_of_memory(c10::AcceleratorError({"f", "file", 1}, 2, "CUDA error: out of memory")));
}

TEST_CASE("is_out_of_memory: a shape error, a device assert or a nitro::Error is not out of memory") {
  CHECK_FALSE(nitro::memory::is_out_of_memory(error("mat1 and mat2 shapes cannot be multiplied (4x3 and 4x3)")));
  CHECK_FALSE(nitro::memory::is_out_of_memory(error("CUDA error: device-side assert triggered")));
  CHECK_FALSE(nitro::memory::is_out_of_memory(
      c10::AcceleratorError({"f", "file", 1}, 700, "CUDA error: an illegal memory access was encountered")));
  CHECK_FALSE(nitro::memory::is_out_of_memory(nitro::Error("find_max_batch_size: min must be >= 1")));
  CHECK_FALSE(nitro::memory::is_out_of_memory(std::runtime_error("out of paper")));
  CHECK(nitro::memory::error_message(error("first line\nsecond")) == std::string("first line\nsecond"));
}

}  // namespace nitro_test_memory_oom
