#pragma once
// nitro::StateDict: the state of a piece of a training run (a hook policy, a sampler, the user's own
// extras) as named tensors, integers, numbers and strings, which a snapshot (snapshot/snapshot.hpp) saves
// and loads bit for bit. Integers are kept apart from numbers so that a counter above 2^53 survives.
//
//   nitro::StateDict s;
//   s.integers["seen"] = 1234;
//   s.tensors["ema"] = ema.clone();
//   const auto seen = s.integer("seen");   // throws nitro::Error naming the key when it is missing
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

namespace nitro {

/// A piece of a run's state as named tensors, integers, numbers and strings, saved and loaded bit for
/// bit by a snapshot (see the top of this header).
struct StateDict {
  std::map<std::string, at::Tensor, std::less<>> tensors;     ///< Named tensors.
  std::map<std::string, std::int64_t, std::less<>> integers;  ///< Named integers, exact over the whole int64 range.
  std::map<std::string, double, std::less<>> numbers;         ///< Named floating-point numbers.
  std::map<std::string, std::string, std::less<>> strings;    ///< Named strings.

  /// No entry in any of the four maps.
  [[nodiscard]] NITRO_INLINE bool empty() const noexcept;
  /// The value under `key`; nitro::Error naming the key (and `owner`, for the message) when absent.
  [[nodiscard]] NITRO_INLINE const at::Tensor& tensor(std::string_view key, std::string_view owner = "StateDict") const;
  /// The integer under `key`; nitro::Error naming the key (and `owner`) when absent.
  [[nodiscard]] NITRO_INLINE std::int64_t integer(std::string_view key, std::string_view owner = "StateDict") const;
  /// The number under `key`; nitro::Error naming the key (and `owner`) when absent.
  [[nodiscard]] NITRO_INLINE double number(std::string_view key, std::string_view owner = "StateDict") const;
  /// The string under `key`; nitro::Error naming the key (and `owner`) when absent.
  [[nodiscard]] NITRO_INLINE const std::string& string(std::string_view key, std::string_view owner = "StateDict") const;

 private:
  template <class Map>
  static const typename Map::mapped_type& find(const Map& map, std::string_view key, std::string_view owner,
                                               const char* kind) {
    const auto it = map.find(key);
    NITRO_CHECK(it != map.end(), owner, ": the saved state has no ", kind, " \"", key,
                "\"; it was saved by another version or another configuration");
    return it->second;
  }
};

}  // namespace nitro

#if !NITRO_COMPILED
#include <nitro/core/state_dict-inl.hpp>
#endif
