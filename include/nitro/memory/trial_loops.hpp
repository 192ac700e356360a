#pragma once
// Which TrainingLoops a trial of memory::find_max_batch_size may step, on the thread running it: the
// loops the finder was given and puts back after every trial, none for the form without a loop. The
// finder sets it around each trial (TrialScope); TrainingLoop::step and flush() read it, one
// thread-local load when no search runs, and throw nitro::Error for a loop the finder would leave
// changed. Loops are known by address: memory/ does not include train/.
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>

#include <cstddef>

namespace nitro::memory::detail {

/// The loops the running trial's finder puts back; `count` 0 for find_max_batch_size(trial, options).
struct TrialLoops {
  const void* const* loops = nullptr;
  std::size_t count = 0;
};

/// The innermost running trial's loops on this thread; null outside every trial. Other threads (a
/// prefetcher's workers) never see a trial of this one.
inline thread_local constinit const TrialLoops* trial_loops = nullptr;

/// Marks this thread as running a trial for a scope; the previous mark comes back on every exit. In
/// a trial of a finder run inside another's trial, the inner finder's loops decide: it is the one
/// that puts back after each of its trials.
class TrialScope {
 public:
  NITRO_INLINE explicit TrialScope(const TrialLoops& loops) noexcept;
  TrialScope(const TrialScope&) = delete;
  TrialScope& operator=(const TrialScope&) = delete;
  ~TrialScope() { trial_loops = previous_; }

 private:
  const TrialLoops* previous_;
};

/// TrainingLoop::step and flush() inside a trial (trial_loops not null): throws nitro::Error, before
/// the loop changes, unless the trial's finder was given `loop`. `what` is "step" or "flush".
[[gnu::cold, gnu::noinline]] inline void check_trial_step(const void* loop, const char* what) {
  const TrialLoops& allowed = *trial_loops;
  for (std::size_t i = 0; i < allowed.count; ++i)
    if (allowed.loops[i] == loop) return;
  if (allowed.count == 0) {
    ::nitro::detail::fail(
        "TrainingLoop::", what, " inside a trial of find_max_batch_size(trial, options), which was not given the "
        "loop: the trials would change the loop's step counters, accumulation window, loss scale and monitor's "
        "figures, which that form cannot put back, so training after the search would differ from training "
        "without it. Give the finder the loop: find_max_batch_size(loop, trial, options) puts the loop, its model "
        "and its optimizer back after every trial (memory/batch_size.hpp)");
  }
  ::nitro::detail::fail(
      "TrainingLoop::", what, " inside a trial of find_max_batch_size(loop, trial, options) on a TrainingLoop the "
      "finder was not given: it puts back only its own loops, so this one's step counters, accumulation window, "
      "loss scale and monitor's figures, and its model and optimizer, would be left as the trials changed them. "
      "Give the finder every loop the trial steps: find_max_batch_size(std::tie(loop_a, loop_b), trial, options)");
}

}  // namespace nitro::memory::detail

#if !NITRO_COMPILED
#include <nitro/memory/trial_loops-inl.hpp>
#endif
