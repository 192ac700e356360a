#pragma once
// nitro::monitor::Trace: records optimizer steps K..K+N-1 with LibTorch's profiler (Kineto) and writes
// a Chrome / Perfetto trace: the operators run on the CPU and, on a GPU, the CUDA kernels and copies,
// each step marked "ProfilerStep#<k>" as Python's torch.profiler marks them.
//
//   using Loop = nitro::level::with<nitro::level::Advanced, nitro::monitor::Trace>;
//   Loop loop{model, optimizer, {.hooks = {nitro::monitor::Trace::Options{.path = "trace.json", .start = 10, .steps = 3}}}};
//   // ... train; after step 12 the file is written
//
//   { nitro::monitor::TraceScope trace{"region.json"}; forward_and_backward(); }   // any region of code
//
// Open the file at https://ui.perfetto.dev (Open trace file) or in Chrome at chrome://tracing (Load).
// Profiling costs time while it records (a few microseconds per operator, and CUPTI on a GPU): keep
// N small. Only one profiler can be on in a process at a time: a second one is a nitro::Error.
#include <nitro/core/config.hpp>
#include <nitro/core/concepts.hpp>
#include <nitro/core/error.hpp>
#include <nitro/core/rank.hpp>
#include <nitro/train/hooks.hpp>

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

namespace nitro::monitor {

/// What a trace records.
struct TraceOptions {
  /// The trace file (Chrome trace JSON); its directory must exist.
  std::filesystem::path path = "trace.json";
  /// Tensor shapes of each operator's inputs.
  bool record_shapes = false;
  /// Memory allocated and freed by each operator.
  bool profile_memory = false;
  /// C++/Python stacks of each operator (larger files).
  bool with_stack = false;
  /// Trace (the policy): the first optimizer step recorded (0-based: 0 is the first step), and how many.
  std::int64_t start = 5;
  /// Trace (the policy): how many optimizer steps to record, >= 1.
  std::int64_t steps = 3;
  /// Trace (the policy): record in every process (give each its own path); false: only rank 0.
  bool every_rank = false;
};

/// Records from construction to stop() (or destruction) and writes the trace file then.
class TraceScope {
 public:
  /// Starts recording now, with `options` (start, steps and every_rank are the policy's and unused here).
  /// Throws nitro::Error when the path is empty, its directory does not exist, or another profiler is
  /// recording in this process.
  NITRO_INLINE explicit TraceScope(TraceOptions options);
  /// Starts recording now into `path`, with the other options at their defaults; throws as above.
  NITRO_INLINE explicit TraceScope(std::filesystem::path path);
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
  /// Stops and writes the file if still recording; errors are swallowed (call stop() to see them).
  NITRO_INLINE ~TraceScope();

  /// Stops recording and writes the file (GPU work is waited for first). Idempotent.
  NITRO_INLINE void stop();

  /// Whether it is recording (before stop()).
  [[nodiscard]] bool recording() const noexcept { return on_; }
  /// Events the profiler kept (after stop()).
  [[nodiscard]] std::int64_t events() const noexcept { return events_; }
  /// The trace file.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return o_.path; }

 private:
  TraceOptions o_;
  bool on_ = false;
  std::int64_t events_ = 0;
};

/// The hook policy: records optimizer steps start .. start + steps - 1 of a TrainingLoop.
class Trace {
 public:
  /// The policy family this belongs to (a hook of TrainingLoop).
  using family = family::Hook;
  /// Name shown in reports and messages.
  static constexpr std::string_view name = "trace";
  /// On: the loop calls its hooks.
  static constexpr bool enabled = true;
  /// The knobs: TraceOptions.
  using Options = TraceOptions;

  /// Throws nitro::Error when start < 0 or steps < 1.
  NITRO_INLINE explicit Trace(const Options& options);

  /// Hook, called by the loop: at the first micro-batch of optimizer step `start`, starts recording (in
  /// rank 0 only unless every_rank, and not while another profiler records); marks each recorded step.
  /// Throws nitro::Error when the trace file's directory does not exist.
  template <class Loop>
  void on_step_begin(Loop& loop) {
    if (loop.pending_micro_batches() != 0) return;  // not the first micro-batch of an optimizer step
    const auto step = loop.optimizer_steps();
    if (step == o_.start && !scope_ && !done_) {
      // A trace is a view of the run, never a reason for a step to fail: one process (rank 0) records,
      // and a profiler already on elsewhere (another loop's trace) means this one is not recorded.
      if (!o_.every_rank && !nitro::is_main_process()) {
        done_ = true;
        note_ = "not recorded in this process (rank 0 records)";
        return;
      }
      if (torch::profiler::impl::profilerEnabled()) {
        done_ = true;
        note_ = "not recorded: another profiler was recording at step " + std::to_string(step);
        return;
      }
      scope_.emplace(o_);
    }
    if (scope_ && !mark_) {
      mark_.emplace(at::RecordScope::USER_SCOPE);
      mark_name_ = "ProfilerStep#" + std::to_string(step);
      if (mark_->isActive()) mark_->before(std::string_view(mark_name_));
    }
  }

  /// Hook, called by the loop: ends the step's mark, and after the last step recorded writes the file.
  /// Throws nitro::Error when the file cannot be written.
  template <class Loop>
  void after_optimizer_step(Loop& loop, StepResult&) {
    mark_.reset();  // ends the step's range
    if (scope_ && loop.optimizer_steps() >= o_.start + o_.steps) {
      scope_->stop();
      scope_.reset();
      done_ = true;
    }
  }

  /// The policy is done: the trace was written, or it will not be recorded (report() says why).
  [[nodiscard]] bool done() const noexcept { return done_; }
  /// One line for the monitor's report: where the trace is, or why it was not recorded.
  [[nodiscard]] NITRO_INLINE std::string report() const;

 private:
  Options o_;
  std::optional<TraceScope> scope_;
  std::optional<at::RecordFunction> mark_;
  std::string mark_name_;  // outlives the mark
  std::string note_;       // why nothing was recorded
  bool done_ = false;
};

}  // namespace nitro::monitor

#if !NITRO_COMPILED
#include <nitro/monitor/trace-inl.hpp>
#endif
