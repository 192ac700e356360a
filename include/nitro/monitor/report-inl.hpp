#pragma once
// The definitions of nitro/monitor/report.hpp's non-template functions: included by report.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/monitor/report.hpp>

namespace nitro::monitor::detail {

NITRO_INLINE PhaseSummary phase_summary(std::vector<float>& window, double total_ms, std::int64_t steps) {
  PhaseSummary s;
  s.mean_ms = steps > 0 ? total_ms / static_cast<double>(steps) : 0.0;
  if (window.empty()) return s;
  std::sort(window.begin(), window.end());
  const auto rank = [&](double q) {  // nearest rank: the smallest value with at least q of the values <= it
    const auto n = static_cast<double>(window.size());
    const auto i = static_cast<std::size_t>(std::max(1.0, std::ceil(q * n))) - 1;
    return static_cast<double>(window[std::min(i, window.size() - 1)]);
  };
  s.p50_ms = rank(0.50);
  s.p90_ms = rank(0.90);
  s.p99_ms = rank(0.99);
  s.max_ms = static_cast<double>(window.back());
  return s;
}

NITRO_INLINE std::string megabytes(std::int64_t bytes) {
  if (bytes < 0) return "unknown";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  return buf;
}

}  // namespace nitro::monitor::detail

namespace nitro::monitor {

NITRO_INLINE Summary summarize(Recorder& recorder) {
  recorder.resolve();
  Summary s;
  s.device = recorder.device_type();
  s.device_timed = recorder.device_timed();
  s.memory = recorder.read_memory();
  const Totals& t = recorder.totals();
  s.steps = t.steps;
  s.samples = t.samples;
  s.seconds = t.step_ms / 1000.0;
  s.samples_per_s = s.seconds > 0 ? static_cast<double>(t.samples) / s.seconds : 0.0;
  s.steps_per_s = s.seconds > 0 ? static_cast<double>(t.steps) / s.seconds : 0.0;

  const auto records = recorder.window();
  std::vector<float> values;
  values.reserve(records.size());
  for (int p = 0; p < phase_count; ++p) {
    values.clear();
    for (const auto& r : records) values.push_back(r.phase_ms[static_cast<std::size_t>(p)]);
    s.phases[static_cast<std::size_t>(p)] = detail::phase_summary(values, t.phase_ms[static_cast<std::size_t>(p)], t.steps);
  }
  values.clear();
  for (const auto& r : records) values.push_back(r.step_ms);
  s.step = detail::phase_summary(values, t.step_ms, t.steps);
  s.step.share = 1.0;
  for (auto& p : s.phases) p.share = s.step.mean_ms > 0 ? p.mean_ms / s.step.mean_ms : 0.0;

  if (s.device == c10::DeviceType::CUDA) {
    s.device_idle_fraction = t.steps > 0 ? static_cast<double>(t.idle_steps) / static_cast<double>(t.steps) : 0.0;
    if (s.memory.cuda) {
      s.peak_memory_bytes = std::max(t.peak_cuda_allocated_bytes, s.memory.cuda->peak_allocated_bytes);
      s.memory_limit_bytes = s.memory.cuda->total_bytes;
    }
  } else {
    s.peak_memory_bytes = std::max(t.peak_cpu_resident_bytes,
                                   std::max(s.memory.cpu.peak_resident_bytes, s.memory.cpu.resident_bytes));
    s.memory_limit_bytes = s.memory.cpu.total_bytes;
  }
  return s;
}

NITRO_INLINE Summary summarize(Recorder& recorder, data::PipelineStats pipeline) {
  Summary s = summarize(recorder);
  s.pipeline = std::move(pipeline);
  return s;
}

NITRO_INLINE std::string format(const Summary& s) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%lld steps, %lld samples in %.2f s: %.1f samples/s, %.2f steps/s (%s%s)\n",
                static_cast<long long>(s.steps), static_cast<long long>(s.samples), s.seconds, s.samples_per_s,
                s.steps_per_s, c10::DeviceTypeName(s.device, /*lower_case=*/true).c_str(),
                s.device_timed ? ", device times from CUDA events" : ", host clock");
  out += line;
  std::snprintf(line, sizeof line, "%-10s %9s %9s %9s %9s %9s %7s\n", "phase", "mean ms", "p50 ms", "p90 ms", "p99 ms",
                "max ms", "share");
  out += line;
  static constexpr std::array<const char*, phase_count> names{"data", "forward", "backward", "optimizer"};
  const auto row = [&](const char* name, const PhaseSummary& p) {
    std::snprintf(line, sizeof line, "%-10s %9.3f %9.3f %9.3f %9.3f %9.3f %6.1f%%\n", name, p.mean_ms, p.p50_ms, p.p90_ms,
                  p.p99_ms, p.max_ms, 100.0 * p.share);
    out += line;
  };
  for (int p = 0; p < phase_count; ++p) row(names[static_cast<std::size_t>(p)], s.phases[static_cast<std::size_t>(p)]);
  row("step", s.step);
  std::snprintf(line, sizeof line, "peak memory %s of %s (%s)", detail::megabytes(s.peak_memory_bytes).c_str(),
                detail::megabytes(s.memory_limit_bytes).c_str(),
                s.device == c10::DeviceType::CUDA ? "CUDA caching allocator, peak allocated" : "process peak resident set");
  out += line;
  if (!std::isnan(s.device_idle_fraction)) {
    std::snprintf(line, sizeof line, "; device idle at %.0f%% of step starts", 100.0 * s.device_idle_fraction);
    out += line;
  }
  out += "\n";
  if (s.memory.gpu_activity) out += memory::to_string(*s.memory.gpu_activity) + " (NVML, at the summary)\n";
  for (const auto& note : s.notes) out += note + "\n";
  if (s.pipeline) out += "data pipeline:\n" + s.pipeline->format();
  return out;
}

NITRO_INLINE std::string compute_advice(const Summary& s) {
  std::string out = "the model's arithmetic sets the pace; ";
  if (!s.loop) {
    return out + "mixed precision (level::Advanced) on a GPU with bf16, or a larger batch if memory allows";
  }
  const auto& f = *s.loop;
  const bool gpu = s.device == c10::DeviceType::CUDA;
  std::vector<std::string> tries;
  if (!f.mixed_precision) tries.push_back(gpu ? "bf16 mixed precision (level::Advanced)"
                                              : "bf16 mixed precision (level::Advanced) if this CPU has bf16 units (AVX-512 BF16, AMX)");
  if (!f.fused_optimizer) tries.push_back("a fused optimizer (optim::FusedAdamW, FusedAdam, FusedSGD)");
  if (gpu && f.conv && !f.channels_last) tries.push_back("channels-last (to_channels_last(model), channels_last batches)");
  if (gpu && !f.graphs && s.step.mean_ms < 50) tries.push_back("CUDA graphs (level::Max)");
  tries.push_back("a larger batch if memory allows (memory::find_max_batch_size)");
  out += "try ";
  for (std::size_t i = 0; i < tries.size(); ++i) out += (i == 0 ? "" : i + 1 == tries.size() ? ", or " : ", ") + tries[i];
  return out;
}

NITRO_INLINE std::vector<Advice> bottlenecks(const Summary& s, const AdviceOptions& o) {
  std::vector<Advice> out;
  char buf[320];
  if (s.steps == 0) {
    out.push_back({Bottleneck::compute, "no steps were counted",
                   "train for more steps than monitor::Phases' warmup_steps before asking"});
    return out;
  }
  const auto& data = s[Phase::data];
  if (data.share > o.data_share) {
    std::snprintf(buf, sizeof buf, "data-bound: the step waits %.1f ms for data, %.0f%% of a %.1f ms step",
                  data.mean_ms, 100.0 * data.share, s.step.mean_ms);
    const auto slowest = s.pipeline ? s.pipeline->bottleneck() : -1;
    // Per item, not over the pipeline's life (which may include set-up before the first epoch): the
    // pipeline is to blame when the consumer waited for it most of the step's data wait.
    const double pipeline_wait_ms = s.pipeline ? s.pipeline->consumer_wait_ms_per_item() : 0.0;
    if (slowest >= 0 && s.pipeline->delivered > 0 && pipeline_wait_ms < 0.5 * data.mean_ms) {
      // The pipeline had each item ready when asked: the wait is after it.
      std::string finding = buf;
      std::snprintf(buf, sizeof buf, "; the pipeline keeps up (its consumer waited %.2f ms per item for it)",
                    pipeline_wait_ms);
      out.push_back({Bottleneck::data, finding + buf,
                     "the wait is between the pipeline and the step: if a prefetcher reads the pipeline, lighten its "
                     "transform (or run it on the GPU's copy stream) and raise its depth"});
    } else if (slowest >= 0) {
      const auto& stage = s.pipeline->stages[static_cast<std::size_t>(slowest)];
      std::string finding = buf;
      std::snprintf(buf, sizeof buf, "; the pipeline's slowest stage is '%s' (busy %.0f%% of its %zu worker(s)' time, "
                    "%.2f ms per item)", stage.name.c_str(), 100.0 * stage.utilisation(), stage.workers,
                    stage.ms_per_item());
      out.push_back({Bottleneck::data, finding + buf,
                     "give stage '" + stage.name + "' more workers (data::StageOptions::workers) or less work per item "
                     "(a nitro::Cache before it, cheaper decoding), or move its work to the GPU (the prefetcher's "
                     "transform)"});
    } else {
      out.push_back({Bottleneck::data, buf,
                     "load ahead with nitro::Prefetcher (prefetch<Device>(source, {.depth, .workers})), add loader "
                     "workers, or put a nitro::Cache in front of the data set so later epochs read from memory"});
    }
  }
  if (s.peak_memory_bytes > 0 && s.memory_limit_bytes > 0 &&
      static_cast<double>(s.peak_memory_bytes) > o.memory_share * static_cast<double>(s.memory_limit_bytes)) {
    std::snprintf(buf, sizeof buf, "memory-bound: peak %s is %.0f%% of %s", detail::megabytes(s.peak_memory_bytes).c_str(),
                  100.0 * static_cast<double>(s.peak_memory_bytes) / static_cast<double>(s.memory_limit_bytes),
                  detail::megabytes(s.memory_limit_bytes).c_str());
    out.push_back({Bottleneck::memory, buf,
                   "recompute activations (checkpoint::Sqrt), use smaller micro-batches with accumulation "
                   "(accumulate::Fixed or Adaptive), or bf16 (level::Advanced)"});
  }
  if (s.device == c10::DeviceType::CUDA && s.step.mean_ms < o.launch_step_ms &&
      s.device_idle_fraction > o.idle_fraction && data.share <= o.data_share) {
    std::snprintf(buf, sizeof buf,
                  "launch-bound: %.2f ms steps and the GPU idle at the start of %.0f%% of them: it waits for the host",
                  s.step.mean_ms, 100.0 * s.device_idle_fraction);
    out.push_back({Bottleneck::launch, buf,
                   "give the GPU more work per launch: a larger batch (memory::find_max_batch_size), fewer small "
                   "operations (foreach/fused optimizers), CUDA graphs"});
  }
  const double compute = s[Phase::forward].mean_ms + s[Phase::backward].mean_ms + s[Phase::optimizer].mean_ms;
  if (compute > 0 && s[Phase::optimizer].mean_ms / compute > o.optimizer_share) {
    std::snprintf(buf, sizeof buf, "optimizer-heavy: the optimizer takes %.0f%% of forward + backward + optimizer",
                  100.0 * s[Phase::optimizer].mean_ms / compute);
    out.push_back({Bottleneck::optimizer, buf,
                   "use a foreach or fused optimizer, or step less often with gradient accumulation"});
  }
  if (out.empty()) {
    std::snprintf(buf, sizeof buf, "compute-bound: forward %.0f%%, backward %.0f%%, optimizer %.0f%%, data %.0f%% of a step",
                  100.0 * s[Phase::forward].share, 100.0 * s[Phase::backward].share, 100.0 * s[Phase::optimizer].share,
                  100.0 * data.share);
    out.push_back({Bottleneck::compute, buf, compute_advice(s)});
  }
  return out;
}

NITRO_INLINE std::string format(const std::vector<Advice>& advice) {
  std::string out;
  for (const auto& a : advice) out += "  - " + a.text() + "\n";
  return out;
}

}  // namespace nitro::monitor
