#pragma once
// Per-phase step times recorded by the training loop, as a monitor policy.
//
//   monitor::Off      records nothing, costs nothing (the default of TrainingLoop).
//   monitor::Phases   times each step's phases: waiting for data, forward, backward, optimizer; counts
//                     samples; samples memory every `memory_every` steps. On the CPU with a steady
//                     clock (five clock reads a step). On a GPU the forward, backward and optimizer times
//                     come from CUDA events read lazily: a step's events are read once the device has
//                     passed them, a few steps later, never by waiting, so there is no synchronisation
//                     per step; summary() reads what is left (it waits for the device once).
//
//   using Loop = nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Off, nitro::checkpoint::Off,
//                                    nitro::monitor::Phases>;
//   Loop loop{model, optimizer};
//   for (auto& b : loader) loop.step(b, loss_fn);
//   auto summary = nitro::monitor::summarize(loop.monitor());   // monitor/report.hpp
//
// "Waiting for data" is host time from the end of one step() to the start of the next: the loader's
// next() and anything else the caller does between steps, except what it does inside a pause():
//
//   // two loops in one iteration (a GAN): each one's data wait is the loader's time, not the other's step
//   { auto away = g_loop.monitor().pause(); d_loop.step(real, d_loss); }
//   { auto away = d_loop.monitor().pause(); g_loop.step(fake, g_loss); }
//
// Time inside a pause is left out of the next step's data wait and step time (evaluation, a
// snapshot, another model's step). Samples are the rows of the batch (the size of dimension 0 of
// its first tensor).
#include <nitro/core/config.hpp>
#include <nitro/core/concepts.hpp>
#include <nitro/core/device.hpp>
#include <nitro/core/error.hpp>
#include <nitro/memory/monitor.hpp>

#include <c10/core/Device.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDAEvent.h>  // at::cuda::CUDAEvent (ATen/cuda/CUDAEvent.h adds cuBLAS, cuSPARSE, cuSOLVER)
#include <c10/cuda/CUDAStream.h>
#endif

namespace nitro::monitor {

/// One step as recorded.
struct StepRecord {
  /// Steps since the recorder started, warm-up included (0-based).
  std::int64_t step = 0;
  /// Milliseconds per phase, indexed by nitro::Phase: data (host), forward, backward, optimizer (host
  /// clock on the CPU; device time between CUDA events on a GPU).
  std::array<float, phase_count> phase_ms{};
  /// Host milliseconds from the end of the previous step to the end of this one (data wait included).
  float step_ms = 0;
  /// Rows of the batch (0 when the batch has none).
  std::int32_t samples = 0;
  /// GPU only: the device had finished the previous step when the host began this one (it waited
  /// for the host: launch- or data-bound). Never set for a step after a pause() (the device ran
  /// other work meanwhile).
  bool device_idle = false;
};

/// Running totals over every counted step (warm-up excluded).
struct Totals {
  /// Steps counted.
  std::int64_t steps = 0;
  /// Samples (batch rows) over the counted steps.
  std::int64_t samples = 0;
  /// Milliseconds per phase summed over the counted steps, indexed by nitro::Phase.
  std::array<double, phase_count> phase_ms{};
  /// Host milliseconds summed over the counted steps (StepRecord::step_ms).
  double step_ms = 0;
  /// Steps that began with the device idle (GPU only).
  std::int64_t idle_steps = 0;
  /// Memory readings taken (every `memory_every` steps) and the highest of each figure seen.
  std::int64_t memory_readings = 0;
  /// The highest CUDA caching-allocator bytes allocated seen (-1: never read, or no GPU).
  std::int64_t peak_cuda_allocated_bytes = -1;
  /// The highest CPU resident set size seen, in bytes (-1: never read).
  std::int64_t peak_cpu_resident_bytes = -1;
};

/// monitor::Phases' knobs.
struct PhasesOptions {
  /// The last steps kept for percentiles, >= 1.
  std::int64_t window = 4096;
  /// First steps left out of every figure (allocator warm-up, lazy initialisation), >= 0.
  std::int64_t warmup_steps = 2;
  /// On a GPU, time forward, backward and optimizer with CUDA events (else the host clock, which
  /// then measures launch time, not device time).
  bool device_timing = true;
  /// Counted steps between memory readings (/proc on the CPU, the caching allocator on a GPU);
  /// 0: never during steps (summaries still read memory once).
  std::int64_t memory_every = 100;
};

/// What monitor::Phases keeps: the last `window` steps and the totals. Made by the training loop.
class Recorder {
 public:
  /// The knobs: PhasesOptions.
  using Options = PhasesOptions;
  /// The host clock of the phases on the CPU and of step_ms.
  using Clock = std::chrono::steady_clock;

  /// `device` is where the model is; a CUDA device without an index means the current one, resolved
  /// now (events and memory figures are then always of that device, whatever is current later).
  NITRO_INLINE explicit Recorder(const Options& options = Options{}, const c10::Device& device = c10::Device(c10::kCPU));

  /// Called by the loop at the start of each step (see nitro::PhaseRecorder): the data wait ends.
  void begin_step() {
    const auto t = Clock::now();
    if (pause_depth_ > 0) [[unlikely]] {
      end_pause(t);
      cancel_pauses();
    }
    // After a pause the device ran other work (another loop's step): finding it idle says nothing
    // about this loop's launches or data.
    [[maybe_unused]] const bool paused = paused_since_end_;
    paused_since_end_ = false;
    current_ = StepRecord{};
    current_.step = next_step_;
    current_.phase_ms[static_cast<int>(Phase::data)] = ended_ ? ms(end_, t) : 0.0f;
    begin_ = last_ = t;
#if NITRO_WITH_CUDA
    if (events_) begin_events(paused);
#endif
  }
  /// Called by the loop when a phase ends (forward, backward, optimizer; see nitro::PhaseRecorder): its
  /// time is added to that phase.
  void mark(Phase phase) {
    const auto t = Clock::now();
    current_.phase_ms[static_cast<int>(phase)] += ms(last_, t);
    last_ = t;
#if NITRO_WITH_CUDA
    if (events_) mark_event(phase);
#endif
  }
  /// Called by the loop at the end of a step with the batch's rows (negative counts as 0).
  void end_step(std::int64_t samples) {
    current_.samples = static_cast<std::int32_t>(samples > 0 ? samples : 0);
    current_.step_ms = ms(ended_ ? end_ : begin_, last_);
    end_ = last_;
    ended_ = true;
    ++next_step_;
#if NITRO_WITH_CUDA
    if (events_) {
      end_events();
      return;
    }
#endif
    commit(current_);
  }

  /// Leaves out of the next step's data wait and step time what happens between steps while the
  /// returned object lives (another loop's step, evaluation, a save). Pauses may nest or overlap: the
  /// time counted out is the time any of them was open. A step of this recorder begun while one is
  /// open ends them all (the time paused before it is still left out); so do reset() and load_state().
  class Pause {
   public:
    /// Opens a pause of `r` (see Recorder::pause).
    explicit Pause(Recorder& r) noexcept : r_(&r), epoch_(r.pause_epoch_) {
      if (r.pause_depth_++ == 0) r.pause_from_ = Clock::now();
      r.paused_since_end_ = true;
    }
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;
    NITRO_INLINE ~Pause();

   private:
    Recorder* r_;
    std::uint64_t epoch_;
  };
  /// Opens a pause that lasts as long as the returned object (see Pause).
  [[nodiscard]] Pause pause() noexcept { return Pause(*this); }

  /// Every counted step so far. On a GPU, steps whose events the device has not passed yet are not
  /// in it; resolve() adds them.
  const Totals& totals() const noexcept { return totals_; }
  /// The last min(window, counted steps) steps, oldest first (call resolve() first on a GPU).
  NITRO_INLINE std::vector<StepRecord> window() const;
  /// GPU: waits for the device to pass every recorded step and adds them to the figures. Nothing
  /// to do on the CPU.
  NITRO_INLINE void resolve();
  /// Reads memory now (the CPU's, and the model's GPU's) and folds it into the peaks.
  NITRO_INLINE memory::MemorySnapshot read_memory();
  /// Forgets every step (the next step counts as the first: warm-up again).
  NITRO_INLINE void reset();

  /// What the recorder has counted, to put back later (memory::find_max_batch_size keeps its trial
  /// steps out of the figures this way). Reading it resolves pending GPU steps first.
  struct State {
    /// The ring of the last steps, Options::window entries long.
    std::vector<StepRecord> ring;
    /// Where the next step goes in the ring.
    std::size_t head = 0;
    /// The totals.
    Totals totals;
    /// The index the next step gets.
    std::int64_t next_step = 0;
    /// Whether a step has ended (so the next one has a data wait).
    bool ended = false;
  };
  /// The counts now (resolving pending GPU steps first: it may wait for the device).
  NITRO_INLINE State state();
  /// Puts back a state(); open pauses end. Throws nitro::Error when the state keeps another window size.
  NITRO_INLINE void load_state(State s);

  /// The options the recorder was made with.
  const Options& options() const noexcept { return o_; }
  /// The type of device() (CPU or CUDA).
  c10::DeviceType device_type() const noexcept { return device_.type(); }
  /// The device whose events and memory the recorder reads (a concrete index on a GPU).
  c10::Device device() const noexcept { return device_; }
  /// Whether forward/backward/optimizer are device times (CUDA events).
  NITRO_INLINE bool device_timed() const noexcept;

 private:
  // The time paused since the later of the pause's start and the last step's end is not data wait:
  // the reference point of the next step's data wait and step time moves by it (never past now).
  NITRO_INLINE void end_pause(Clock::time_point now) noexcept;
  // Open pauses count for nothing more (their objects, when they go, change nothing).
  NITRO_INLINE void cancel_pauses() noexcept;

  NITRO_INLINE static float ms(Clock::time_point a, Clock::time_point b) noexcept;

  NITRO_INLINE void commit(const StepRecord& r);

#if NITRO_WITH_CUDA
  // A step's events: one at its start, one after each mark, up to kMarks (later marks merge into
  // the last phase's time).
  static constexpr int kMarks = 15;
  static constexpr std::size_t kPending = 64;
  struct Pending {
    std::array<at::cuda::CUDAEvent, kMarks + 1> events;
    std::array<Phase, kMarks> phases{};
    int marks = 0;
    StepRecord record;
    NITRO_INLINE Pending();
  };

  NITRO_INLINE void begin_events(bool paused);
  // The stream the model's work goes to: the current stream of the model's device (not of the
  // current device, which may be another).
  c10::cuda::CUDAStream stream() const { return c10::cuda::getCurrentCUDAStream(device_.index()); }
  NITRO_INLINE void mark_event(Phase phase);
  NITRO_INLINE void end_events();
  // Folds the oldest pending step in once the device has passed it; false when it has not (and
  // `wait` is false).
  NITRO_INLINE bool resolve_oldest(bool wait);

  bool events_ = false;
  std::vector<Pending> pool_;
  std::size_t pending_first_ = 0, pending_count_ = 0;
  const at::cuda::CUDAEvent* last_recorded_ = nullptr;
#endif

  Options o_;
  c10::Device device_;
  std::vector<StepRecord> ring_;
  std::size_t head_ = 0;
  Totals totals_;
  StepRecord current_;
  Clock::time_point begin_{}, last_{}, end_{};
  bool ended_ = false;
  int pause_depth_ = 0;             // Pause objects open
  std::uint64_t pause_epoch_ = 0;   // moves on when open pauses are cancelled
  Clock::time_point pause_from_{};  // when the outermost open pause began
  bool paused_since_end_ = false;   // a pause began since the last step began (GPU: device_idle unknown)
  std::int64_t next_step_ = 0;
};

/// The monitor policy that times phases (see the banner).
struct Phases {
  /// The policy family this belongs to.
  using family = nitro::family::Monitor;
  /// Name shown in reports and messages.
  static constexpr std::string_view name = "phases";
  /// On: the loop calls the recorder.
  static constexpr bool enabled = true;
  /// The knobs: PhasesOptions.
  using Options = PhasesOptions;
  /// What the loop owns and calls: monitor::Recorder (loop.monitor()).
  using Recorder = monitor::Recorder;
};

static_assert(MonitorPolicy<Phases>);

}  // namespace nitro::monitor

#if !NITRO_COMPILED
#include <nitro/monitor/phases-inl.hpp>
#endif
