#pragma once
// What monitor::Phases measured, summarised, and plain advice on what limits the training speed.
//
//   auto s = nitro::monitor::summarize(loop.monitor());       // means, percentiles, samples/s, memory
//   std::fputs(nitro::monitor::format(s).c_str(), stdout);    // a table
//   for (const auto& a : nitro::monitor::bottlenecks(s)) std::printf("%s\n", a.text().c_str());
//
// The advice, each from the figures alone (thresholds in AdviceOptions):
//   data-bound      the host waits for the next batch more than 30% of a step: a Prefetcher, more
//                   loader workers, a Cache in front of the data set. With a data::Pipeline's stats
//                   (summarize(recorder, pipeline.stats())) it names the slowest stage.
//   memory-bound    peak memory above 90% of the device (or of the machine's RAM on the CPU):
//                   activation checkpointing, accumulation with smaller micro-batches, bf16.
//   launch-bound    (GPU) steps shorter than 10 ms and the device found idle at the start of most
//                   steps: it waits for the host to launch kernels; larger batches, CUDA graphs,
//                   fewer small operations (fused optimizers, torch.compile in Python).
//   optimizer-heavy the optimizer takes more than 40% of the compute: a foreach/fused optimizer,
//                   stepping less often with accumulation.
//   compute-bound   none of the above: the model's own arithmetic sets the pace; with
//                   summarize(loop) the advice names only what the loop does not do yet (bf16, a
//                   fused optimizer, channels-last, CUDA graphs) and a larger batch.
//
// summarize(loop) also prints a line from each hook that reports (stability::Guard, memory::Watch).
#include <nitro/core/config.hpp>
#include <nitro/data/stage_stats.hpp>
#include <nitro/monitor/phases.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <concepts>
#include <string>
#include <type_traits>
#include <vector>

namespace nitro::monitor {

/// One phase over the counted steps.
struct PhaseSummary {
  /// Over every counted step.
  double mean_ms = 0;
  /// The median, nearest rank, over the recorder's window (the last steps); p90_ms, p99_ms and max_ms likewise.
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, max_ms = 0;
  /// @var p90_ms
  /// The 90th percentile, nearest rank, over the window.
  /// @var p99_ms
  /// The 99th percentile, nearest rank, over the window.
  /// @var max_ms
  /// The longest over the window.

  /// Mean of this phase over the mean step (host time).
  double share = 0;
};

/// A run's figures.
struct Summary {
  /// The type of the recorder's device.
  c10::DeviceType device = c10::DeviceType::CPU;
  /// Forward, backward and optimizer are device times (CUDA events); else host clock.
  bool device_timed = false;
  /// Steps counted (warm-up excluded).
  std::int64_t steps = 0;
  /// Samples (batch rows) over the counted steps.
  std::int64_t samples = 0;
  /// Host seconds of the counted steps (data wait included).
  double seconds = 0;
  /// Samples per host second over the counted steps.
  double samples_per_s = 0;
  /// Steps per host second over the counted steps.
  double steps_per_s = 0;
  /// Indexed by nitro::Phase.
  std::array<PhaseSummary, phase_count> phases{};
  /// The whole step, host time from the end of the previous one.
  PhaseSummary step{};
  /// GPU: the fraction of steps that began with the device idle. NaN on the CPU.
  double device_idle_fraction = std::numeric_limits<double>::quiet_NaN();
  /// The peak during the run (CUDA: peak allocated by the caching allocator; CPU: peak resident
  /// set of the process). -1: unknown.
  std::int64_t peak_memory_bytes = -1;
  /// What peak_memory_bytes is measured against: device memory (CUDA), the machine's RAM (CPU); -1: unknown.
  std::int64_t memory_limit_bytes = -1;
  /// The reading taken by summarize().
  memory::MemorySnapshot memory{};
  /// A data::Pipeline's stages, when summarize() was given its stats.
  std::optional<data::PipelineStats> pipeline{};
  /// What the loop already does (summarize(loop)), so that the advice names only what it does not.
  struct LoopFacts {
    bool mixed_precision = false;  ///< the loop autocasts: amp::Bf16 or amp::Fp16
    bool fused_optimizer = false;  ///< the optimizer is optim::FusedAdam / FusedAdamW / FusedSGD
    bool graphs = false;           ///< a hook runs whole steps (graph::Capture)
    bool conv = false;             ///< the model has 4-dimensional parameters
    bool channels_last = false;    ///< ... and they are in channels-last layout
  };
  /// What the loop already does, when summarize(loop) made the summary; empty otherwise.
  std::optional<LoopFacts> loop{};
  /// Lines from the loop's hooks that report (stability::Guard, memory::Watch), by summarize(loop).
  std::vector<std::string> notes{};

  /// The summary of phase `p`: phases[p].
  const PhaseSummary& operator[](Phase p) const noexcept { return phases[static_cast<std::size_t>(p)]; }
};

namespace detail {
NITRO_INLINE PhaseSummary phase_summary(std::vector<float>& window, double total_ms, std::int64_t steps);

NITRO_INLINE std::string megabytes(std::int64_t bytes);
}  // namespace detail

/// The figures of everything the recorder has counted. On a GPU it first reads the events still
/// pending (waits for the device once).
NITRO_INLINE Summary summarize(Recorder& recorder);

/// The same, with a data::Pipeline's stage times (pipeline.stats(), or prefetcher.source().stats()),
/// so that the report shows each stage and the advice names the slowest.
NITRO_INLINE Summary summarize(Recorder& recorder, data::PipelineStats pipeline);

/// The summary of a TrainingLoop with a monitor policy: its recorder's figures, what the loop already
/// does (for the advice), and a line from each hook that reports (stability::Guard, memory::Watch).
///   auto s = nitro::monitor::summarize(loop);                    // or summarize(loop, pipeline.stats())
template <class Loop>
  requires requires(Loop& l) {
    l.monitor();
    l.model();
    l.fused_optimizer();
  }
Summary summarize(Loop& loop, std::optional<data::PipelineStats> pipeline = std::nullopt) {
  if constexpr (requires { loop.result().table(); }) {
    // level::Auto (train/autotune.hpp): its winner's summary, and the table of what it tried.
    Summary s = loop.visit([&](auto& winner) { return summarize(winner, pipeline); });
    std::string table = loop.result().table();
    if (!table.empty() && table.back() == '\n') table.pop_back();
    s.notes.push_back(std::move(table));
    return s;
  } else {
    Summary s = summarize(loop.monitor());
    s.pipeline = std::move(pipeline);
    Summary::LoopFacts f;
    f.mixed_precision = Loop::amp_policy::enabled;
    f.fused_optimizer = loop.fused_optimizer();
    // A weight that is both layouts at once (1x1 kernels, one input channel, depthwise) says nothing.
    bool all_channels_last = true;
    for (const auto& p : loop.model().parameters()) {
      if (p.dim() != 4) continue;
      f.conv = true;
      const bool cl = p.is_contiguous(c10::MemoryFormat::ChannelsLast);
      if (cl && p.is_contiguous()) continue;
      all_channels_last = all_channels_last && cl;
    }
    f.channels_last = f.conv && all_channels_last;
    loop.for_each_hook([&](auto& h) {
      using H = std::remove_cvref_t<decltype(h)>;
      if constexpr (requires { H::runs_steps; }) f.graphs = f.graphs || static_cast<bool>(H::runs_steps);
      if constexpr (requires { { h.report() } -> std::convertible_to<std::string>; }) s.notes.push_back(h.report());
    });
    s.loop = f;
    return s;
  }
}

/// A table of the summary, for a terminal or a log.
NITRO_INLINE std::string format(const Summary& s);

/// What limits a run.
enum class Bottleneck { data, memory, launch, optimizer, compute };

/// One finding and what to do about it.
struct Advice {
  /// Which kind of bottleneck this is.
  Bottleneck kind = Bottleneck::compute;
  /// What the figures show, with the numbers.
  std::string finding;
  /// What to try.
  std::string suggestion;
  /// "finding: suggestion", one line.
  std::string text() const { return finding + ": " + suggestion; }
};

/// The thresholds of bottlenecks().
struct AdviceOptions {
  /// Data-bound when the data wait exceeds this share of a step.
  double data_share = 0.30;
  /// Memory-bound when the peak exceeds this share of the limit.
  double memory_share = 0.90;
  /// Launch-bound (GPU) when a step is shorter than this...
  double launch_step_ms = 10.0;
  /// ...and the device was idle at the start of more than this share of the steps.
  double idle_fraction = 0.5;
  /// Optimizer-heavy when the optimizer takes more than this share of forward + backward + optimizer.
  double optimizer_share = 0.40;
};

/// What a compute-bound run can try, leaving out what the loop already does (when summarize(loop) said).
NITRO_INLINE std::string compute_advice(const Summary& s);

/// Plain advice from the figures, most pressing first; one `compute` entry when nothing stands out.
NITRO_INLINE std::vector<Advice> bottlenecks(const Summary& s, const AdviceOptions& o = {});

/// The advice as lines.
NITRO_INLINE std::string format(const std::vector<Advice>& advice);

}  // namespace nitro::monitor

#if !NITRO_COMPILED
#include <nitro/monitor/report-inl.hpp>
#endif
