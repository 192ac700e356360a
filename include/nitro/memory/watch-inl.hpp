#pragma once
// The definitions of nitro/memory/watch.hpp's non-template functions: included by watch.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/memory/watch.hpp>

namespace nitro::memory {

NITRO_INLINE Watch::Watch(const Options& options, const c10::Device& device) : o_(options), device_(device) {
  NITRO_CHECK(o_.cuda_reserved_bytes >= 0 && o_.rss_bytes >= 0,
              "memory::Watch: thresholds must be >= 0 bytes (0: not watched), got cuda_reserved_bytes ",
              o_.cuda_reserved_bytes, " and rss_bytes ", o_.rss_bytes);
  NITRO_CHECK(o_.cuda_reserved_fraction == 0 || (o_.cuda_reserved_fraction > 0 && o_.cuda_reserved_fraction <= 1),
              "memory::Watch: cuda_reserved_fraction must be in (0, 1] (0: not used), got ", o_.cuda_reserved_fraction);
  NITRO_CHECK(o_.check_every >= 1, "memory::Watch: check_every must be >= 1, got ", o_.check_every);
  NITRO_CHECK(o_.cuda_reserved_bytes > 0 || o_.cuda_reserved_fraction > 0 || o_.rss_bytes > 0,
              "memory::Watch: no threshold is set; give cuda_reserved_bytes, cuda_reserved_fraction or rss_bytes");
}

NITRO_INLINE void Watch::check() {
  ++counts_.checks;
  bool passed = false;
  if (device_.is_cuda() && (o_.cuda_reserved_bytes > 0 || o_.cuda_reserved_fraction > 0)) {
    if (const auto m = cuda_memory(device_.index())) {
      std::int64_t limit = o_.cuda_reserved_bytes > 0 ? o_.cuda_reserved_bytes : INT64_MAX;
      if (o_.cuda_reserved_fraction > 0 && m->total_bytes > 0)
        limit = std::min(limit, static_cast<std::int64_t>(o_.cuda_reserved_fraction * static_cast<double>(m->total_bytes)));
      // Not again while what is left after the last clean-up (tensors in use) is itself above the
      // threshold: only when it has grown by 5% more (emptying the cache synchronises).
      if (m->reserved_bytes > std::max(limit, cuda_floor_ + cuda_floor_ / 20)) {
#if NITRO_WITH_CUDA
        c10::cuda::CUDACachingAllocator::emptyCache();
#endif
        ++counts_.cuda_cache_emptied;
        counts_.last_cuda_reserved_bytes = m->reserved_bytes;
        if (const auto after = cuda_memory(device_.index())) cuda_floor_ = after->reserved_bytes;
        passed = true;
      }
    }
  }
  if (o_.rss_bytes > 0) {
    const auto cpu_now = [&] { return o_.cpu_bytes ? o_.cpu_bytes() : resident_bytes(); };
    const std::int64_t now = cpu_now();
    if (now > std::max(o_.rss_bytes, cpu_floor_ + cpu_floor_ / 20)) {
      ::malloc_trim(0);
      ++counts_.cpu_cleanups;
      counts_.last_cpu_bytes = now;
      passed = true;
      cpu_after_ = true;  // the floor is read after the user's cleanup too
    }
  }
  if (passed && o_.cleanup) {
    ++counts_.cleanup_calls;
    o_.cleanup();
  }
  if (cpu_after_) {
    cpu_floor_ = o_.cpu_bytes ? o_.cpu_bytes() : resident_bytes();
    cpu_after_ = false;
  }
}

NITRO_INLINE std::string Watch::report() const {
  std::string out = "memory watch: " + std::to_string(counts_.checks) + " checks";
  if (counts_.cuda_cache_emptied > 0)
    out += ", CUDA cache emptied " + std::to_string(counts_.cuda_cache_emptied) + " times (last at " +
           detail::format_bytes(counts_.last_cuda_reserved_bytes) + " reserved)";
  if (counts_.cpu_cleanups > 0)
    out += ", CPU over its threshold " + std::to_string(counts_.cpu_cleanups) + " times (last at " +
           detail::format_bytes(counts_.last_cpu_bytes) + "), heap trimmed";
  if (counts_.cleanup_calls > 0) out += ", cleanup called " + std::to_string(counts_.cleanup_calls) + " times";
  if (counts_.cuda_cache_emptied == 0 && counts_.cpu_cleanups == 0) out += ", no threshold passed";
  return out;
}

}  // namespace nitro::memory
