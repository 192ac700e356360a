#pragma once
// nitro::memory::Watch: a TrainingLoop hook policy that looks at memory every few optimizer steps and
// cleans up when it passes a threshold: the CUDA caching allocator's cache is emptied when the
// reserved bytes pass theirs, freed heap memory goes back to the system (malloc_trim) when the
// process's resident set passes its own, and a cleanup of yours (drop a cache, shrink a pool) runs
// either way. What it did is counted, and the monitor's report (monitor::summarize(loop)) prints it.
//
//   using Loop = nitro::level::with<nitro::level::Advanced, nitro::memory::Watch>;
//   Loop loop{model, optimizer, {.hooks = {nitro::memory::Watch::Options{
//       .cuda_reserved_fraction = 0.9, .rss_bytes = 48ll << 30, .cleanup = [&] { cache.clear(); }}}}};
//
// A check reads the allocator's counters and /proc/self/status (tens of microseconds), never the
// device: no synchronisation. Emptying the CUDA cache does synchronise (cudaFree), which is why it
// happens only past the threshold, and not again until the memory left after the last clean-up (what
// is in use) has grown by 5% beyond it: a threshold below what the run needs does not make every
// check a clean-up. `cpu_bytes` replaces the resident set as the CPU figure (tests
// use the tracking allocator's live bytes, memory/tracking_allocator.hpp).
#include <nitro/core/concepts.hpp>
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>
#include <nitro/memory/monitor.hpp>
#include <nitro/core/step_result.hpp>

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace nitro::memory {

/// The watch's thresholds (0: not watched) and what to do.
struct WatchOptions {
  /// CUDA bytes reserved by the caching allocator (of the loop's device) above which its cache is emptied.
  std::int64_t cuda_reserved_bytes = 0;
  /// The same as a share of the device's memory, in (0, 1]; the lower of the two applies.
  double cuda_reserved_fraction = 0;
  /// Process resident bytes (or cpu_bytes()) above which freed heap memory is returned (malloc_trim).
  std::int64_t rss_bytes = 0;
  /// Optimizer steps between checks, >= 1.
  std::int64_t check_every = 10;
  /// Called after the watch's own clean-up whenever a threshold is passed (e.g. a cache's clear()).
  std::function<void()> cleanup{};
  /// The CPU figure to compare with rss_bytes; empty: the process's resident set.
  std::function<std::int64_t()> cpu_bytes{};
};

/// What the watch did.
struct WatchCounts {
  std::int64_t checks = 0;  ///< Checks made (one every check_every optimizer steps).
  /// Times the CUDA cache was emptied, and the reserved bytes that made it (the last time).
  std::int64_t cuda_cache_emptied = 0;
  std::int64_t last_cuda_reserved_bytes = -1;  ///< The reserved bytes when the cache was last emptied; -1: never.
  /// Times the CPU figure passed rss_bytes, and its value then (the last time).
  std::int64_t cpu_cleanups = 0;
  std::int64_t last_cpu_bytes = -1;  ///< The CPU figure when it last passed rss_bytes; -1: never.
  /// The user's cleanup calls.
  std::int64_t cleanup_calls = 0;
};

/// A hook policy that checks memory every few optimizer steps and cleans up past a threshold (see
/// the top of this header).
class Watch {
 public:
  using family = family::Hook;  ///< The policy family this belongs to (train/hooks.hpp).
  static constexpr std::string_view name = "memory_watch";  ///< Name shown in reports and checked in snapshots.
  static constexpr bool enabled = true;  ///< Always on when listed: the loop calls its hook.
  using Options = WatchOptions;  ///< The thresholds and the cleanup (WatchOptions).

  /// A watch of `device` (the loop's model's). Throws nitro::Error when a threshold is negative,
  /// cuda_reserved_fraction is outside (0, 1] and not 0, check_every < 1, or no threshold is set.
  NITRO_INLINE Watch(const Options& options, const c10::Device& device);

  /// The hook: checks (check()) after every check_every-th optimizer step.
  template <class Loop>
  void after_optimizer_step(Loop&, StepResult&) {
    if (++since_ < o_.check_every) return;
    since_ = 0;
    check();
  }

  /// Checks now (the hook calls it every check_every optimizer steps).
  NITRO_INLINE void check();

  /// What the watch did so far.
  [[nodiscard]] const WatchCounts& counts() const noexcept { return counts_; }

  /// A line for the monitor's report.
  [[nodiscard]] NITRO_INLINE std::string report() const;

 private:
  Options o_;
  c10::Device device_;
  WatchCounts counts_;
  std::int64_t since_ = 0;
  std::int64_t cuda_floor_ = 0, cpu_floor_ = 0;  // what was left after the last clean-up
  bool cpu_after_ = false;
};

}  // namespace nitro::memory

#if !NITRO_COMPILED
#include <nitro/memory/watch-inl.hpp>
#endif
