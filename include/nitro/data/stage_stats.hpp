#pragma once
// What each stage of a data::Pipeline (data/pipeline.hpp) did with its time, and which stage limits
// the pipeline. Plain figures without LibTorch, so the monitor's report (monitor/report.hpp) can
// carry them: `monitor::summarize(loop.monitor(), pipeline.stats())`.
//
// A stage's workers are each, at any moment, busy (running the stage's function), waiting for input
// (the stage before has nothing ready: that one is slower), or waiting for output (the queue after
// it is full: a later stage, or the consumer, is slower). The stage whose workers are busy the
// largest share of their time is the bottleneck; giving it more workers (or cheaper work) is what
// speeds the pipeline up. When the consumer hardly ever waits for the pipeline, the pipeline is not
// what limits the run at all.
#include <nitro/core/config.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace nitro::data {

/// One stage's time, summed over its workers, since the pipeline was made (or reset_stats()).
struct StageStats {
  std::string name;         ///< The stage's name (StageOptions::name, or its default).
  std::size_t workers = 1;  ///< The stage's worker threads.
  /// Capacity of the queue after the stage (items).
  std::size_t queue = 0;
  /// Items the stage finished.
  std::int64_t items = 0;
  double busy_s = 0;  ///< Seconds spent running the stage (its function, or the source's claim and produce).
  /// Waiting for the stage before (for the read stage: for its turn to claim, one worker at a time).
  double wait_input_s = 0;
  /// Waiting for room in the queue after it (for the read stage: for room before claiming).
  double wait_output_s = 0;

  /// Busy share of the workers' time, in [0, 1]; 0 before any time was counted.
  [[nodiscard]] NITRO_INLINE double utilisation() const noexcept;
  /// Mean busy time per item (ms); 0 before any item.
  [[nodiscard]] NITRO_INLINE double ms_per_item() const noexcept;
};

/// A pipeline's stages, in order, and its consumer's waits.
struct PipelineStats {
  std::vector<StageStats> stages;  ///< One entry per stage, the read stage first.
  /// Time the consumer (the training loop, or the prefetcher on top) waited for the next item.
  double consumer_wait_s = 0;
  /// Wall time the figures cover.
  double seconds = 0;
  /// Items handed to the consumer.
  std::int64_t delivered = 0;

  /// The stage that limits the pipeline (highest utilisation); -1 without stages or time.
  [[nodiscard]] NITRO_INLINE std::ptrdiff_t bottleneck() const noexcept;
  /// Share of the covered time the consumer waited, in [0, 1]. The covered time may include idle
  /// time (set-up before the first epoch, a cold start): reset_stats() after a warm-up for a fair share.
  [[nodiscard]] NITRO_INLINE double consumer_wait_share() const noexcept;
  /// The consumer's mean wait per delivered item, in ms (0 before any): what the pipeline adds to a
  /// step, whatever idle time (set-up before the first epoch) the covered time includes. The first
  /// items (the queues still empty) weigh on it: reset_stats() after a warm-up to leave them out.
  [[nodiscard]] NITRO_INLINE double consumer_wait_ms_per_item() const noexcept;

  /// A table: one line per stage, then the bottleneck in words.
  [[nodiscard]] NITRO_INLINE std::string format() const;
};

}  // namespace nitro::data

#if !NITRO_COMPILED
#include <nitro/data/stage_stats-inl.hpp>
#endif
