#pragma once
// Build configuration decided in one place.
//
// NITRO_WITH_CUDA: 1 when the LibTorch Nitro builds on was built with CUDA, so that headers using
// CUDA APIs (streams, events, the caching allocator) compile and link. CMake's nitro::nitro target
// defines it from the Torch package it found (cmake/nitroTorchCuda.cmake). Without CMake (headers
// copied into a project), it is inferred from the headers on the include path; define it to 0 or 1
// yourself to override. Code tests it with `#if NITRO_WITH_CUDA`, never `#ifdef`.
#ifndef NITRO_WITH_CUDA
#if __has_include(<c10/cuda/CUDAStream.h>) && __has_include(<cuda_runtime_api.h>)
#define NITRO_WITH_CUDA 1
#else
#define NITRO_WITH_CUDA 0
#endif
#endif

#if defined(__CUDACC__) || defined(__NVCC__)
#define NITRO_HOST_DEVICE __host__ __device__
#else
#define NITRO_HOST_DEVICE
#endif
