#pragma once
// The definitions of nitro/cache/cache.hpp's non-template functions: included by cache.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/cache/cache.hpp>

namespace nitro {

NITRO_INLINE double CacheStats::hit_ratio() const noexcept {
  const auto n = hits + misses;
  return n ? static_cast<double>(hits) / static_cast<double>(n) : 0.0;
}

NITRO_INLINE CacheStats& CacheStats::operator+=(const CacheStats& o) noexcept {
  hits += o.hits, misses += o.misses, admissions += o.admissions, rejections += o.rejections;
  evictions += o.evictions, bytes += o.bytes, entries += o.entries;
  return *this;
}

}  // namespace nitro
