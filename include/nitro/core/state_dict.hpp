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

struct StateDict {
  std::map<std::string, at::Tensor, std::less<>> tensors;
  std::map<std::string, std::int64_t, std::less<>> integers;
  std::map<std::string, double, std::less<>> numbers;
  std::map<std::string, std::string, std::less<>> strings;

  [[nodiscard]] NITRO_INLINE bool empty() const noexcept;
  /// The value under `key`; nitro::Error naming the key (and `owner`, for the message) when absent.
  [[nodiscard]] NITRO_INLINE const at::Tensor& tensor(std::string_view key, std::string_view owner = "StateDict") const;
  [[nodiscard]] NITRO_INLINE std::int64_t integer(std::string_view key, std::string_view owner = "StateDict") const;
  [[nodiscard]] NITRO_INLINE double number(std::string_view key, std::string_view owner = "StateDict") const;
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
