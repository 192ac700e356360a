#pragma once
// The definitions of nitro/core/error.hpp's non-template functions: included by error.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/core/error.hpp>

