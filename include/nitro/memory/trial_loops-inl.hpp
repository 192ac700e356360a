#pragma once
// The definitions of nitro/memory/trial_loops.hpp's non-template functions: included by trial_loops.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/memory/trial_loops.hpp>

namespace nitro::memory::detail {

NITRO_INLINE TrialScope::TrialScope(const TrialLoops& loops) noexcept : previous_(trial_loops) { trial_loops = &loops; }

}  // namespace nitro::memory::detail
