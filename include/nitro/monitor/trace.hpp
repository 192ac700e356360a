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
  std::int64_t steps = 3;
  /// Trace (the policy): record in every process (give each its own path); false: only rank 0.
  bool every_rank = false;
};

/// Records from construction to stop() (or destruction) and writes the trace file then.
class TraceScope {
 public:
  explicit TraceScope(TraceOptions options) : o_(std::move(options)) {
    NITRO_CHECK(!o_.path.empty(), "monitor::TraceScope: the path is empty; name the trace file, e.g. \"trace.json\"");
    const auto dir = o_.path.has_parent_path() ? o_.path.parent_path() : std::filesystem::path(".");
    NITRO_CHECK(std::filesystem::is_directory(dir), "monitor::TraceScope: the directory of '", o_.path.string(),
                "' does not exist; create it first");
    NITRO_CHECK(!torch::profiler::impl::profilerEnabled(),
                "monitor::TraceScope: a profiler is already recording in this process; stop it first (one at a time)");
    using torch::profiler::impl::ActivityType;
    std::set<ActivityType> activities{ActivityType::CPU};
    if (torch::cuda::is_available()) activities.insert(ActivityType::CUDA);
    const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO, o_.record_shapes,
                                                       o_.profile_memory, o_.with_stack);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    on_ = true;
  }
  explicit TraceScope(std::filesystem::path path) : TraceScope(TraceOptions{.path = std::move(path)}) {}
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
  ~TraceScope() {
    try {
      stop();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; call stop() to see errors
    }
  }

  /// Stops recording and writes the file (GPU work is waited for first). Idempotent.
  void stop() {
    if (!on_) return;
    on_ = false;
    if (torch::cuda::is_available()) torch::cuda::synchronize();
    auto result = torch::autograd::profiler::disableProfiler();
    NITRO_CHECK(result != nullptr, "monitor::TraceScope: the profiler returned no result");
    events_ = static_cast<std::int64_t>(result->events().size());
    result->save(o_.path.string());
    NITRO_CHECK(std::filesystem::exists(o_.path), "monitor::TraceScope: the trace was not written to '",
                o_.path.string(), "'; check that the directory is writable");
  }

  [[nodiscard]] bool recording() const noexcept { return on_; }
  /// Events the profiler kept (after stop()).
  [[nodiscard]] std::int64_t events() const noexcept { return events_; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return o_.path; }

 private:
  TraceOptions o_;
  bool on_ = false;
  std::int64_t events_ = 0;
};

/// The hook policy: records optimizer steps start .. start + steps - 1 of a TrainingLoop.
class Trace {
 public:
  using family = family::Hook;
  static constexpr std::string_view name = "trace";
  static constexpr bool enabled = true;
  using Options = TraceOptions;

  explicit Trace(const Options& options) : o_(options) {
    NITRO_CHECK(o_.start >= 0, "monitor::Trace: start must be >= 0 (the first optimizer step recorded), got ", o_.start);
    NITRO_CHECK(o_.steps >= 1, "monitor::Trace: steps must be >= 1, got ", o_.steps);
  }

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

  template <class Loop>
  void after_optimizer_step(Loop& loop, StepResult&) {
    mark_.reset();  // ends the step's range
    if (scope_ && loop.optimizer_steps() >= o_.start + o_.steps) {
      scope_->stop();
      scope_.reset();
      done_ = true;
    }
  }

  /// The trace was written.
  [[nodiscard]] bool done() const noexcept { return done_; }
  [[nodiscard]] std::string report() const {
    if (!note_.empty()) return "trace: " + note_;
    return done_ ? "trace: steps " + std::to_string(o_.start) + ".." + std::to_string(o_.start + o_.steps - 1) +
                       " in " + o_.path.string() + " (open at https://ui.perfetto.dev)"
                 : "trace: not written yet (steps " + std::to_string(o_.start) + ".." +
                       std::to_string(o_.start + o_.steps - 1) + ")";
  }

 private:
  Options o_;
  std::optional<TraceScope> scope_;
  std::optional<at::RecordFunction> mark_;
  std::string mark_name_;  // outlives the mark
  std::string note_;       // why nothing was recorded
  bool done_ = false;
};

}  // namespace nitro::monitor
