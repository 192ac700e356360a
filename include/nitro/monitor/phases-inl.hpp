#pragma once
// The definitions of nitro/monitor/phases.hpp's non-template functions: included by phases.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/monitor/phases.hpp>

namespace nitro::monitor {

NITRO_INLINE Recorder::Recorder(const Options& options, const c10::Device& device) : o_(options), device_(concrete_device(device)) {
  ::nitro::detail::check_library_version();
  NITRO_CHECK(o_.window >= 1, "monitor::Phases: window must be >= 1 (steps kept for percentiles), got ",
              o_.window);
  NITRO_CHECK(o_.warmup_steps >= 0, "monitor::Phases: warmup_steps must be >= 0, got ", o_.warmup_steps);
  NITRO_CHECK(o_.memory_every >= 0, "monitor::Phases: memory_every must be >= 0 (0: never), got ", o_.memory_every);
  ring_.resize(static_cast<std::size_t>(o_.window));
#if NITRO_WITH_CUDA
  events_ = o_.device_timing && device_.is_cuda();
  if (events_) pool_.resize(kPending);
#endif
}

NITRO_INLINE Recorder::Pause::~Pause() {
  if (r_->pause_epoch_ == epoch_ && --r_->pause_depth_ == 0) r_->end_pause(Clock::now());
}

NITRO_INLINE std::vector<StepRecord> Recorder::window() const {
  std::vector<StepRecord> out;
  const auto n = static_cast<std::size_t>(std::min<std::int64_t>(totals_.steps, o_.window));
  out.reserve(n);
  const auto size = ring_.size();
  for (std::size_t i = 0; i < n; ++i) out.push_back(ring_[(head_ + size - n + i) % size]);
  return out;
}

NITRO_INLINE void Recorder::resolve() {
#if NITRO_WITH_CUDA
  while (pending_count_ > 0) resolve_oldest(/*wait=*/true);
#endif
}

NITRO_INLINE memory::MemorySnapshot Recorder::read_memory() {
  auto snap = memory::snapshot(device_.is_cuda() ? std::optional<int>(device_.index()) : std::nullopt);
  ++totals_.memory_readings;
  totals_.peak_cpu_resident_bytes = std::max(totals_.peak_cpu_resident_bytes, snap.cpu.resident_bytes);
  if (snap.cuda) totals_.peak_cuda_allocated_bytes = std::max(totals_.peak_cuda_allocated_bytes, snap.cuda->peak_allocated_bytes);
  return snap;
}

NITRO_INLINE void Recorder::reset() {
  cancel_pauses();
  resolve();
  totals_ = {};
  head_ = 0;
  next_step_ = 0;
  ended_ = false;
}

NITRO_INLINE auto Recorder::state() -> State {
  resolve();
  return {ring_, head_, totals_, next_step_, ended_};
}

NITRO_INLINE void Recorder::load_state(State s) {
  NITRO_CHECK(s.ring.size() == ring_.size(), "monitor::Recorder::load_state: the state keeps ", s.ring.size(),
              " steps but this recorder keeps ", ring_.size(), " (its window option)");
  cancel_pauses();
  resolve();
  ring_ = std::move(s.ring);
  head_ = s.head;
  totals_ = s.totals;
  next_step_ = s.next_step;
  ended_ = s.ended;
  // Not the saved end: the time since then (a batch-size search) is no step's data wait.
  end_ = Clock::now();
}

NITRO_INLINE bool Recorder::device_timed() const noexcept {
#if NITRO_WITH_CUDA
  return events_;
#else
  return false;
#endif
}

NITRO_INLINE void Recorder::end_pause(Clock::time_point now) noexcept {
  if (ended_) end_ += now - std::max(pause_from_, end_);
}

NITRO_INLINE void Recorder::cancel_pauses() noexcept {
  pause_depth_ = 0;
  ++pause_epoch_;
}

NITRO_INLINE float Recorder::ms(Clock::time_point a, Clock::time_point b) noexcept {
  return std::chrono::duration<float, std::milli>(b - a).count();
}

NITRO_INLINE void Recorder::commit(const StepRecord& r) {
  if (r.step < o_.warmup_steps) return;
  ring_[head_] = r;
  head_ = (head_ + 1) % ring_.size();
  ++totals_.steps;
  totals_.samples += r.samples;
  for (int p = 0; p < phase_count; ++p) totals_.phase_ms[static_cast<std::size_t>(p)] += r.phase_ms[static_cast<std::size_t>(p)];
  totals_.step_ms += r.step_ms;
  totals_.idle_steps += r.device_idle ? 1 : 0;
  if (o_.memory_every > 0 && totals_.steps % o_.memory_every == 0) read_memory();
}

#if NITRO_WITH_CUDA
NITRO_INLINE Recorder::Pending::Pending() {
  for (auto& e : events) e = at::cuda::CUDAEvent(cudaEventDefault);
}
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE void Recorder::begin_events(bool paused) {
  // Read the steps the device has passed; wait only when every slot is taken.
  while (pending_count_ > 0 && resolve_oldest(/*wait=*/false)) {
  }
  if (pending_count_ == kPending) resolve_oldest(/*wait=*/true);
  current_.device_idle = !paused && last_recorded_ != nullptr && last_recorded_->query();
  auto& p = pool_[(pending_first_ + pending_count_) % kPending];
  p.marks = 0;
  p.events[0].record(stream());
}
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE void Recorder::mark_event(Phase phase) {
  auto& p = pool_[(pending_first_ + pending_count_) % kPending];
  if (p.marks < kMarks) {
    p.phases[static_cast<std::size_t>(p.marks)] = phase;
    ++p.marks;
  } else {
    p.phases[kMarks - 1] = phase;  // merged into the last event
  }
  p.events[static_cast<std::size_t>(p.marks)].record(stream());
}
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE void Recorder::end_events() {
  auto& p = pool_[(pending_first_ + pending_count_) % kPending];
  p.record = current_;
  last_recorded_ = &p.events[static_cast<std::size_t>(p.marks)];
  ++pending_count_;
}
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE bool Recorder::resolve_oldest(bool wait) {
  auto& p = pool_[pending_first_];
  auto& last = p.events[static_cast<std::size_t>(p.marks)];
  if (!wait && !last.query()) return false;
  last.synchronize();
  StepRecord r = p.record;
  for (int p_i = 1; p_i < phase_count; ++p_i) r.phase_ms[static_cast<std::size_t>(p_i)] = 0;
  for (int m = 0; m < p.marks; ++m) {
    r.phase_ms[static_cast<std::size_t>(p.phases[static_cast<std::size_t>(m)])] +=
        p.events[static_cast<std::size_t>(m)].elapsed_time(p.events[static_cast<std::size_t>(m + 1)]);
  }
  pending_first_ = (pending_first_ + 1) % kPending;
  --pending_count_;
  commit(r);
  return true;
}
#endif

}  // namespace nitro::monitor
