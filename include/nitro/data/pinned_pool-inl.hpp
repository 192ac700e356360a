#pragma once
// The definitions of nitro/data/pinned_pool.hpp's non-template functions: included by pinned_pool.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/data/pinned_pool.hpp>

namespace nitro {

#if NITRO_WITH_CUDA
NITRO_INLINE at::Tensor PinnedPool::pinned_copy(const at::Tensor& t) {
  at::Tensor pinned = at::empty(t.sizes(), t.options().pinned_memory(true));
  pinned.copy_(t);
  return pinned;
}
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE std::size_t PinnedPool::allocated() const {
  const auto start = start_.load();
  if (start < 0) return 0;  // nothing staged yet (and no CUDA call made: a CPU-only machine never gets here)
  const auto now = host_allocs();
  return now > start ? static_cast<std::size_t>(now - start) : 0;
}
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE std::size_t PinnedPool::reused() const {
  const auto a = allocated(), s = staged();
  return s > a ? s - a : 0;
}
#endif

}  // namespace nitro
