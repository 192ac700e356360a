#pragma once
// The definitions of nitro/core/compat_autocast.hpp's non-template functions: included by compat_autocast.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/core/compat_autocast.hpp>

namespace nitro::compat {

NITRO_INLINE void set_autocast_dtype(c10::DeviceType device, c10::ScalarType dtype) {
  at::autocast::set_autocast_dtype(device, dtype);
}

}  // namespace nitro::compat
