#pragma once
// The library's version: the one place it is written (CMake and conanfile.py read it from here).

#define NITRO_VERSION_MAJOR 0
#define NITRO_VERSION_MINOR 1
#define NITRO_VERSION_PATCH 0

/// NITRO_VERSION as one integer, e.g. 100 for 0.1.0, for `#if NITRO_VERSION >= 200`.
#define NITRO_VERSION (NITRO_VERSION_MAJOR * 10000 + NITRO_VERSION_MINOR * 100 + NITRO_VERSION_PATCH)

namespace nitro {
/// The version as a string, "MAJOR.MINOR.PATCH".
inline constexpr const char* version_string = "0.1.0";
}  // namespace nitro
