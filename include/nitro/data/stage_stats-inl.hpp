#pragma once
// The definitions of nitro/data/stage_stats.hpp's non-template functions: included by stage_stats.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/data/stage_stats.hpp>

namespace nitro::data {

NITRO_INLINE double StageStats::utilisation() const noexcept {
  const double total = busy_s + wait_input_s + wait_output_s;
  return total > 0 ? busy_s / total : 0.0;
}

NITRO_INLINE double StageStats::ms_per_item() const noexcept {
  return items > 0 ? 1e3 * busy_s / static_cast<double>(items) : 0.0;
}

NITRO_INLINE std::ptrdiff_t PipelineStats::bottleneck() const noexcept {
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

NITRO_INLINE double PipelineStats::consumer_wait_share() const noexcept {
  return seconds > 0 ? consumer_wait_s / seconds : 0.0;
}

NITRO_INLINE double PipelineStats::consumer_wait_ms_per_item() const noexcept {
  return delivered > 0 ? 1e3 * consumer_wait_s / static_cast<double>(delivered) : 0.0;
}

NITRO_INLINE std::string PipelineStats::format() const {
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

}  // namespace nitro::data
