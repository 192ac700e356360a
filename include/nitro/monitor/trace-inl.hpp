#pragma once
// The definitions of nitro/monitor/trace.hpp's non-template functions: included by trace.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/monitor/trace.hpp>

namespace nitro::monitor {

NITRO_INLINE TraceScope::TraceScope(TraceOptions options) : o_(std::move(options)) {
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

NITRO_INLINE TraceScope::TraceScope(std::filesystem::path path) : TraceScope(TraceOptions{.path = std::move(path)}) {}

NITRO_INLINE TraceScope::~TraceScope() {
  try {
    stop();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; call stop() to see errors
  }
}

NITRO_INLINE void TraceScope::stop() {
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

NITRO_INLINE Trace::Trace(const Options& options) : o_(options) {
  NITRO_CHECK(o_.start >= 0, "monitor::Trace: start must be >= 0 (the first optimizer step recorded), got ", o_.start);
  NITRO_CHECK(o_.steps >= 1, "monitor::Trace: steps must be >= 1, got ", o_.steps);
}

NITRO_INLINE std::string Trace::report() const {
  if (!note_.empty()) return "trace: " + note_;
  return done_ ? "trace: steps " + std::to_string(o_.start) + ".." + std::to_string(o_.start + o_.steps - 1) +
                     " in " + o_.path.string() + " (open at https://ui.perfetto.dev)"
               : "trace: not written yet (steps " + std::to_string(o_.start) + ".." +
                     std::to_string(o_.start + o_.steps - 1) + ")";
}

}  // namespace nitro::monitor
