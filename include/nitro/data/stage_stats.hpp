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
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace nitro::data {

/// One stage's time, summed over its workers, since the pipeline was made (or reset_stats()).
struct StageStats {
  std::string name;
  std::size_t workers = 1;
  /// Capacity of the queue after the stage (items).
  std::size_t queue = 0;
  /// Items the stage finished.
  std::int64_t items = 0;
  double busy_s = 0;
  /// Waiting for the stage before (for the read stage: for its turn to claim, one worker at a time).
  double wait_input_s = 0;
  /// Waiting for room in the queue after it (for the read stage: for room before claiming).
  double wait_output_s = 0;

  /// Busy share of the workers' time, in [0, 1]; 0 before any time was counted.
  [[nodiscard]] double utilisation() const noexcept {
    const double total = busy_s + wait_input_s + wait_output_s;
    return total > 0 ? busy_s / total : 0.0;
  }
  /// Mean busy time per item (ms); 0 before any item.
  [[nodiscard]] double ms_per_item() const noexcept {
    return items > 0 ? 1e3 * busy_s / static_cast<double>(items) : 0.0;
  }
};

/// A pipeline's stages, in order, and its consumer's waits.
struct PipelineStats {
  std::vector<StageStats> stages;
  /// Time the consumer (the training loop, or the prefetcher on top) waited for the next item.
  double consumer_wait_s = 0;
  /// Wall time the figures cover.
  double seconds = 0;
  /// Items handed to the consumer.
  std::int64_t delivered = 0;

  /// The stage that limits the pipeline (highest utilisation); -1 without stages or time.
  [[nodiscard]] std::ptrdiff_t bottleneck() const noexcept {
    std::ptrdiff_t best = -1;
    double best_u = 0;
    for (std::size_t i = 0; i < stages.size(); ++i) {
      if (stages[i].utilisation() > best_u) {
        best_u = stages[i].utilisation();
        best = static_cast<std::ptrdiff_t>(i);
      }
    }
    return best;
  }
  /// Share of the covered time the consumer waited, in [0, 1]. The covered time may include idle
  /// time (set-up before the first epoch, a cold start): reset_stats() after a warm-up for a fair share.
  [[nodiscard]] double consumer_wait_share() const noexcept {
    return seconds > 0 ? consumer_wait_s / seconds : 0.0;
  }
  /// The consumer's mean wait per delivered item, in ms (0 before any): what the pipeline adds to a
  /// step, whatever idle time (set-up before the first epoch) the covered time includes. The first
  /// items (the queues still empty) weigh on it: reset_stats() after a warm-up to leave them out.
  [[nodiscard]] double consumer_wait_ms_per_item() const noexcept {
    return delivered > 0 ? 1e3 * consumer_wait_s / static_cast<double>(delivered) : 0.0;
  }

  /// A table: one line per stage, then the bottleneck in words.
  [[nodiscard]] std::string format() const {
    std::string out;
    char line[256];
    std::snprintf(line, sizeof line, "  %-14s %7s %6s %9s %10s %7s %7s %7s\n", "stage", "workers", "queue", "items",
                  "ms/item", "busy", "wait-in", "wait-out");
    out += line;
    for (const auto& s : stages) {
      const double total = s.busy_s + s.wait_input_s + s.wait_output_s;
      const auto pct = [&](double v) { return total > 0 ? 100.0 * v / total : 0.0; };
      std::snprintf(line, sizeof line, "  %-14s %7zu %6zu %9lld %10.3f %6.0f%% %6.0f%% %7.0f%%\n", s.name.c_str(),
                    s.workers, s.queue, static_cast<long long>(s.items), s.ms_per_item(), pct(s.busy_s),
                    pct(s.wait_input_s), pct(s.wait_output_s));
      out += line;
    }
    std::snprintf(line, sizeof line, "  the consumer waited %.0f%% of %.2f s for the pipeline", 100.0 * consumer_wait_share(),
                  seconds);
    out += line;
    if (delivered > 0) {
      std::snprintf(line, sizeof line, " (%.3f ms per item)", consumer_wait_ms_per_item());
      out += line;
    }
    if (const auto b = bottleneck(); b >= 0) {
      const auto& s = stages[static_cast<std::size_t>(b)];
      // Whether the pipeline holds the step back is the monitor's call (monitor::bottlenecks compares
      // the wait per item with the step's data wait); a table only names the busiest stage.
      std::snprintf(line, sizeof line, "; its busiest stage is '%s' (busy %.0f%% of its %zu worker(s)' time)",
                    s.name.c_str(), 100.0 * s.utilisation(), s.workers);
      out += line;
    }
    out += "\n";
    return out;
  }
};

}  // namespace nitro::data
