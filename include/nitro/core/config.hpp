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

// NITRO_COMPILED: 1 when the code that does not depend on template parameters, and the predefined
// types (level::Basic, Advanced, Ultra, Max, the common Prefetchers and Caches), are compiled once
// into Nitro's library instead of into every translation unit that includes a header. CMake: link
// nitro::compiled (nitro::compiled_dist, nitro::compiled_image where you would link nitro::dist,
// nitro::image), which defines it; Conan: the option compiled=True. Without it (the default) Nitro is
// header-only, and copying include/ is all it takes. Every translation unit of a program is built
// the same way: the two modes do not mix. The definitions live in the `-inl.hpp` header beside each
// header, which the header includes when NITRO_COMPILED is 0 and the library compiles (src/).
#ifndef NITRO_COMPILED
#define NITRO_COMPILED 0
#endif
#if NITRO_COMPILED
#define NITRO_INLINE
#else
#define NITRO_INLINE inline
#endif

// A program built with NITRO_COMPILED that does not link Nitro's library fails to link, and among
// the undefined symbols the linker names is one that says what to link. The call also tells the library which headers
// the program was built with (nitro::detail::check_library_version, core/error.hpp).
#if NITRO_COMPILED && !defined(NITRO_COMPILED_SOURCE)
#include <nitro/version.hpp>
extern "C" int nitro_compiled_library_is_not_linked__link_nitro_compiled(int headers_version) noexcept;
namespace nitro::detail {
[[gnu::used]] inline const int compiled_library_linked =
    nitro_compiled_library_is_not_linked__link_nitro_compiled(NITRO_VERSION);
}  // namespace nitro::detail
#endif
