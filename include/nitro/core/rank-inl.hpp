#pragma once
// The definitions of nitro/core/rank.hpp's non-template functions: included by rank.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/core/rank.hpp>

namespace nitro::detail {

NITRO_INLINE void set_agreement_factory(std::function<std::unique_ptr<Agreement>()> f) {
  std::lock_guard lock(agreement_mutex);
  agreement_factory = std::move(f);
}

}  // namespace nitro::detail

namespace nitro {

NITRO_INLINE std::unique_ptr<Agreement> make_agreement() {
  std::lock_guard lock(detail::agreement_mutex);
  return process_count() > 1 && detail::agreement_factory ? detail::agreement_factory() : nullptr;
}

}  // namespace nitro
