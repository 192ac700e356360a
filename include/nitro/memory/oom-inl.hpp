#pragma once
// The definitions of nitro/memory/oom.hpp's non-template functions: included by oom.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/memory/oom.hpp>

namespace nitro::memory {

NITRO_INLINE bool is_out_of_memory_message(std::string_view message) noexcept {
  for (const auto marker : detail::oom_markers)
    if (message.find(marker) != std::string_view::npos) return true;
  return false;
}

NITRO_INLINE bool is_out_of_memory(const std::exception& e) noexcept {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return true;
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) return is_out_of_memory_message(error->msg());
  return false;
}

NITRO_INLINE std::string_view error_message(const std::exception& e) noexcept {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) return error->what_without_backtrace();
  return e.what();
}

}  // namespace nitro::memory
