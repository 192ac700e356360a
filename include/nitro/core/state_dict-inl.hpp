#pragma once
// The definitions of nitro/core/state_dict.hpp's non-template functions: included by state_dict.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/core/state_dict.hpp>

namespace nitro {

NITRO_INLINE bool StateDict::empty() const noexcept {
  return tensors.empty() && integers.empty() && numbers.empty() && strings.empty();
}

NITRO_INLINE const at::Tensor& StateDict::tensor(std::string_view key, std::string_view owner) const {
  return find(tensors, key, owner, "tensor");
}

NITRO_INLINE std::int64_t StateDict::integer(std::string_view key, std::string_view owner) const {
  return find(integers, key, owner, "integer");
}

NITRO_INLINE double StateDict::number(std::string_view key, std::string_view owner) const {
  return find(numbers, key, owner, "number");
}

NITRO_INLINE const std::string& StateDict::string(std::string_view key, std::string_view owner) const {
  return find(strings, key, owner, "string");
}

}  // namespace nitro
