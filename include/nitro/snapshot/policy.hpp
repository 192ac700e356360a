#pragma once
// snapshot::Policy: a TrainingLoop hook policy that writes snapshots (snapshot/snapshot.hpp) every N
// optimizer steps, every T minutes, and on SIGTERM/SIGINT. See the class's comment below.
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>
#include <nitro/core/rank.hpp>
#include <nitro/memory/trial_loops.hpp>
#include <nitro/snapshot/snapshot.hpp>

#include <signal.h>
#include <time.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

namespace nitro::snapshot {

// ---- snapshot::Policy ----------------------------------------------------------------------------------

namespace detail {
// Signals caught, counted (each Policy remembers the count it has acted on, so every live Policy
// sees each signal once, and one made later sees none of the earlier), and the last one's number.
// Lock-free atomics and sigaction/raise: all the handler does is async-signal-safe.
inline std::atomic<std::uint64_t> signals_caught{0};
// The count a stop last acted on: signals past it are waiting for a step boundary.
inline std::atomic<std::uint64_t> signals_acted{0};
inline std::atomic<int> last_signal{0};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free);
// Signals waiting at once that end the process as it would have ended without a Policy: the first two
// are copies a launcher makes (a cluster signals torchrun's agent and the ranks; the agent forwards
// its signal to every rank within milliseconds), the third is a person who means it.
inline constexpr std::uint64_t signals_to_force = 3;
// After a stop on a signal, once no Policy is left, signals are still absorbed for this long (the
// launcher's copies on their way to a rank that is exiting); later ones end the process at once.
inline std::atomic<std::int64_t> late_copies_ns{10'000'000'000};
// The dispositions before the first Policy's (written before the handler is installed).
inline struct ::sigaction previous_term {}, previous_int {};
inline std::atomic<int> live_policies{0};
// snapshot::Run objects, and snapshot::Policy objects with on_signal, alive: one signal must not be two
// stops with two snapshots, so each refuses to be made while the other kind is live.
inline std::atomic<int> live_runs{0}, live_signal_policies{0};
inline std::atomic<std::int64_t> stopped_at_ns{0};  // CLOCK_MONOTONIC of the last stop on a signal; 0: none
static_assert(std::atomic<std::int64_t>::is_always_lock_free);

NITRO_INLINE std::int64_t monotonic_ns() noexcept;

extern "C" inline void on_stop_signal(int signo) {
  last_signal.store(signo, std::memory_order_relaxed);
  const std::uint64_t caught = signals_caught.fetch_add(1, std::memory_order_acq_rel) + 1;
  const std::int64_t stopped = stopped_at_ns.load(std::memory_order_acquire);
  const bool late = live_policies.load(std::memory_order_acquire) == 0 && stopped != 0 &&
                    monotonic_ns() - stopped > late_copies_ns.load(std::memory_order_relaxed);
  if (late || caught - signals_acted.load(std::memory_order_acquire) >= signals_to_force) {
    ::sigaction(SIGTERM, &previous_term, nullptr);
    ::sigaction(SIGINT, &previous_int, nullptr);
    ::raise(signo);  // delivered with the previous disposition once this handler returns
  }
}

// The handlers are installed once for all live Policies and the previous ones put back when the
// last goes, whatever the order in which they go; after a stop on a signal they stay (see late_copies_ns).
struct SignalHandlers {
  std::mutex mutex;
  bool installed = false;
  NITRO_INLINE static SignalHandlers& get();
  NITRO_INLINE void acquire();
  NITRO_INLINE void release();
  // A stop on a signal was acted on: the signals counted so far are handled, and the handlers stay.
  NITRO_INLINE void stopped(std::uint64_t caught);
};

NITRO_INLINE std::string_view signal_name(int signo) noexcept;

// Keeps the new snapshot and the newest keep_last - 1 older ones; never touches newer ones.
NITRO_INLINE void rotate(const std::filesystem::path& directory, const std::filesystem::path& written, int keep_last,
                   bool fsync);

// The directory of a Policy or a Run: created, and a killed writer's temporary files removed.
NITRO_INLINE void prepare_directory(std::string_view who, const std::filesystem::path& directory);
}  // namespace detail

/// A hook policy that writes snapshots of the loop's run into a directory: every N optimizer steps,
/// every T minutes (checked after each optimizer step), and when the process receives SIGTERM or
/// SIGINT (the current step finishes, a snapshot is written, and the step returns with
/// StepResult::stop set and stop_reason "SIGTERM" or "SIGINT": the caller returns, and the job ends
/// with everything saved, as preemptible cluster jobs need). The signal handler only counts the
/// signal. Every live Policy acts on each signal once; the handlers in place before the first Policy
/// are put back when the last one is destroyed, unless a signal stopped the run: then Nitro's stays,
/// absorbing for 10 s more the copies of the signal still on their way (below), and after that hands
/// any signal to the previous disposition (the process ends as it would have). A snapshot that fails
/// to be written (a full disk) makes the step throw, and the signal is acted on again at the next step.
///
/// Repeated signals: a cluster that preempts a job signals every process of it, torchrun's agent
/// included, and the agent forwards its own signal to every rank (2-25 ms later), so a rank often
/// gets the same SIGTERM twice (and a terminal's Ctrl-C reaches ranks through the agent). Two signals
/// waiting for the same step boundary are one stop; a third ends the process as it would have ended
/// without a Policy (the snapshot being written is then simply not there; the previous ones are
/// intact), so that a person pressing Ctrl-C three times is obeyed.
///
/// Several processes (a dist::ProcessGroup made before the first step; core/rank.hpp): a signal
/// rarely reaches every rank at the same step (two nodes are signalled milliseconds apart, or only
/// one rank is), and a rank that stops alone leaves the others waiting in a collective while rank 0
/// may never write. So the ranks decide together: at the last micro-batch of every accumulation
/// window (where every rank holds the same state under dist::DataParallel) each rank's Policy begins
/// a one-element all-reduce of "a signal came here" before the forward, in the background, and reads
/// it at the end of that micro-batch, after the optimizer step. If any rank had a signal, every rank
/// stops at that same step: rank 0 writes the snapshot, and every step returns with StepResult::stop
/// (stop_reason "SIGTERM", or "signal on another rank"). The vote costs one small collective per
/// optimizer step (bench_ddp measures it; on a GPU-only NCCL group it is read one window late, so
/// that reading it never waits for the GPU). Every rank must have the Policy with on_signal.
///
///   using Loop = nitro::TrainingLoop<nitro::amp::Bf16, nitro::snapshot::Policy>;
///   Loop loop{model, optimizer, {.hooks = {{.directory = "runs/a", .every_steps = 1000, .keep_last = 3,
///                                           .sampler = &sampler}}}};
///   if (auto last = nitro::snapshot::latest("runs/a")) nitro::snapshot::load(*last, loop, {.sampler = &sampler});
///   for (...; ...; ...) if (loop.step(batch, loss_fn).stop) return 0;
///
/// Files are named by snapshot::file_name(step, micro-batch). After each new snapshot is safely
/// written, older ones beyond keep_last are removed: only files older than the new one (never the
/// new one, nor a newer one another run left: latest() picks by step, so move those away when you
/// resume from an older snapshot on purpose). One writer per directory: with several processes
/// rank 0 writes, as every rank holds the same parameters and optimizer state under
/// dist::DataParallel (buffers such as BatchNorm's statistics are rank 0's, which DataParallel
/// broadcasts at the start of each accumulation window), and the other ranks' policies only keep
/// time; every rank resumes from rank 0's file (on nodes without a shared file system,
/// dist::fetch_latest_snapshot copies it to each rank first: dist/snapshot.hpp).
class Policy {
 public:
  /// The policy family this belongs to (a hook of TrainingLoop).
  using family = nitro::family::Hook;
  /// Name shown in reports, and the key of its state in snapshots.
  static constexpr std::string_view name = "snapshot";
  /// On: the loop calls its hooks.
  static constexpr bool enabled = true;
  /// Its after_optimizer_step runs after every other hook's (train/hooks.hpp): a snapshot holds their
  /// updates of that step (an ema::Model's average), whatever the order of the loop's types.
  static constexpr bool sees_others_first = true;
  /// Where, when and what to save.
  struct Options {
    /// Where the snapshots go (created if missing).
    std::filesystem::path directory;
    /// Save after every N optimizer steps (0: not by steps).
    std::int64_t every_steps = 0;
    /// Save when T minutes have passed since the last snapshot (0: not by time).
    double every_minutes = 0;
    /// Snapshots kept, >= 1.
    int keep_last = 3;
    /// Save and ask the caller to stop on SIGTERM and SIGINT.
    bool on_signal = true;
    /// Saved with the run (see snapshot::Contents).
    data::ResumableSampler* sampler = nullptr;
    /// The caller's own state, saved with the run (see snapshot::Contents).
    StateDict* extras = nullptr;
    /// fsync each snapshot and its directory before it counts as written (see SaveOptions::fsync).
    bool fsync = true;
  };

  /// Checks the options, creates the directory (rank 0 removes a killed writer's temporary files) and,
  /// with on_signal, installs the signal handlers. Throws nitro::Error when every_steps, every_minutes
  /// or keep_last is out of range, nothing would ever be saved (no every_steps, no every_minutes, no
  /// on_signal), the directory cannot be made, or on_signal is set while a snapshot::Run with on_signal
  /// is live.
  NITRO_INLINE explicit Policy(const Options& options);
  Policy(const Policy&) = delete;
  Policy& operator=(const Policy&) = delete;
  /// Puts the previous signal handlers back when this is the last live Policy (unless a signal stopped the run).
  NITRO_INLINE ~Policy();

  /// Hook (train/hooks.hpp), called by the loop: saves when every_steps or every_minutes says so.
  template <class Loop>
  void after_optimizer_step(Loop& loop, StepResult&) {
    if (memory::detail::trial_loops != nullptr) return;  // a batch-size trial: put back afterwards, never saved
    const bool by_steps = o_.every_steps > 0 && loop.optimizer_steps() % o_.every_steps == 0;
    const bool by_time = o_.every_minutes > 0 && std::chrono::steady_clock::now() - last_time_ >=
                                                     std::chrono::duration<double, std::ratio<60>>(o_.every_minutes);
    if (by_steps || by_time) save_now(loop);
  }

  /// Hook, called by the loop: with several processes, begins the ranks' vote on stopping at the last
  /// micro-batch of each window.
  template <class Loop>
  void on_step_begin(Loop& loop) {
    // Inside a trial of memory::find_max_batch_size the step is put back afterwards: nothing is saved
    // or voted, and a signal waits for the first real step.
    if (!o_.on_signal || memory::detail::trial_loops != nullptr) return;
    // Several processes: the vote on stopping, begun at each window's last micro-batch.
    if (!agreement_ && process_count() > 1) agreement_ = make_agreement();
    if (!agreement_ || loop.pending_micro_batches() + 1 < loop.accumulation_steps()) return;
    agreement_->begin(detail::signals_caught.load(std::memory_order_acquire) != seen_);
  }

  /// Hook, called by the loop: on a signal (here, or on another rank by the vote), saves and sets
  /// result.stop and result.stop_reason. Throws nitro::Error when the snapshot cannot be written.
  template <class Loop>
  void on_step_end(Loop& loop, StepResult& result, std::int64_t) {
    if (memory::detail::trial_loops != nullptr) return;
    if (o_.on_signal) {
      const std::uint64_t caught = detail::signals_caught.load(std::memory_order_acquire);
      if (agreement_) {
        if (agreement_->pending() && agreement_->end()) {
          save_now(loop);  // rank 0 writes; throws on failure there
          result.stop = true;
          result.stop_reason = caught != seen_ ? detail::signal_name(detail::last_signal.load(std::memory_order_relaxed))
                                               : std::string_view("signal on another rank");
          seen_ = caught;
          detail::SignalHandlers::get().stopped(caught);
        }
      } else if (caught != seen_) {
        const int signo = detail::last_signal.load(std::memory_order_relaxed);
        save_now(loop);  // throws on failure: the signal stays unseen, and the next step tries again
        seen_ = caught;
        result.stop = true;
        result.stop_reason = detail::signal_name(signo);
        detail::SignalHandlers::get().stopped(caught);
      }
    }
    ++steps_ended_;
  }

  /// Writes a snapshot now (also from outside a step), rotates, and returns its path.
  template <class Loop>
  std::filesystem::path save_now(Loop& loop) {
    const std::int64_t step = loop.optimizer_steps(), micro = loop.pending_micro_batches();
    std::filesystem::path file = o_.directory / file_name(step, micro);
    // Saved already in this very step (by steps, then on a signal): the state has not changed since.
    const std::array<std::int64_t, 3> key{step, micro, steps_ended_};
    // With several processes rank 0 writes (every rank holds the same state); the others name the file.
    if (key != saved_at_ && nitro::is_main_process()) {
      snapshot::save(file, loop, {.sampler = o_.sampler, .extras = o_.extras}, {.fsync = o_.fsync});
      ++written_;
      saved_at_ = key;
      rotate(file);
    }
    last_ = file;
    last_time_ = std::chrono::steady_clock::now();
    return file;
  }

  /// The last snapshot this policy wrote, if any (on a rank other than 0: the one rank 0 wrote then).
  [[nodiscard]] const std::optional<std::filesystem::path>& last_snapshot() const noexcept { return last_; }
  /// Snapshots written so far.
  [[nodiscard]] std::int64_t snapshots_written() const noexcept { return written_; }
  /// The options the policy was made with.
  [[nodiscard]] const Options& options() const noexcept { return o_; }

 private:
  void rotate(const std::filesystem::path& written) { detail::rotate(o_.directory, written, o_.keep_last, o_.fsync); }

  Options o_;
  std::optional<std::filesystem::path> last_;
  std::array<std::int64_t, 3> saved_at_{-1, -1, -1};
  std::int64_t steps_ended_ = 0;
  std::int64_t written_ = 0;
  std::uint64_t seen_ = 0;
  std::unique_ptr<Agreement> agreement_;  // the ranks' vote on stopping (several processes only)
  std::chrono::steady_clock::time_point last_time_ = std::chrono::steady_clock::now();
};

// ---- snapshot::Run ---------------------------------------------------------------------------------

/// Snapshots of a run that trains several loops (a GAN's generator and discriminator, a teacher and
/// a student, actor and critic): one file for all of them (snapshot::Named), taken where the caller
/// says, at the end of an iteration of its outer loop, after everything the iteration does (its
/// samples drawn, its logs), so that a resumed run continues exactly; signals are seen once for the
/// whole run, whichever loop's step they arrived in.
///
///   nitro::snapshot::Run run{{.directory = "runs/gan", .every = 500, .sampler = &sampler, .extras = &extras},
///                            {{"generator", g_loop}, {"discriminator", d_loop}}};
///   run.resume();                         // the newest good snapshot, if any: iteration() continues from it
///   while (...) {
///     d_loop.step(real, d_loss);  g_loop.step(fake, g_loss);  ...
///     if (run.end_iteration().stop) return 0;   // saves every 500 iterations, and on SIGTERM / SIGINT
///   }
///
/// end_iteration() counts the iteration (the count is the snapshot's step and names its file), writes
/// a snapshot every `every` iterations or `every_minutes`, and on SIGTERM or SIGINT writes one and
/// returns stop. Signals are handled as snapshot::Policy handles them (its comment: copies of one
/// signal are one stop, a third signal ends the process); a Run and a snapshot::Policy with on_signal
/// are never live together (the second one made throws nitro::Error). With several processes (dist::ProcessGroup) the ranks vote at
/// each end_iteration() on a vote begun at the previous one (one small collective per iteration,
/// never waited for in the iteration it was begun), so all stop after the same iteration, and rank 0
/// writes.
class Run {
 public:
  /// Where, when and what to save.
  struct Options {
    /// Where the snapshots go (created if missing).
    std::filesystem::path directory;
    /// Save after every N iterations (0: not by count).
    std::int64_t every = 0;
    /// Save when T minutes have passed since the last snapshot (0: not by time).
    double every_minutes = 0;
    /// Snapshots kept, >= 1.
    int keep_last = 3;
    /// Save and return stop on SIGTERM and SIGINT.
    bool on_signal = true;
    /// Saved with the run (see snapshot::Contents).
    data::ResumableSampler* sampler = nullptr;
    /// The caller's own state, saved with the run (see snapshot::Contents).
    StateDict* extras = nullptr;
    /// fsync each snapshot and its directory before it counts as written (see SaveOptions::fsync).
    bool fsync = true;
  };
  /// What end_iteration() says.
  struct IterationEnd {
    /// A signal came (here or on another rank): the snapshot is written; return from the program.
    bool stop = false;
    /// Why it stops: "SIGTERM", "SIGINT" or "signal on another rank"; empty when it does not.
    std::string_view stop_reason{};
    /// The snapshot written at this iteration's end, if one was.
    std::optional<std::filesystem::path> saved;
  };

  /// Snapshots of `loops` (see snapshot::Named) into options.directory. Throws nitro::Error when every,
  /// every_minutes or keep_last is out of range, nothing would ever be saved, no loop is given, two
  /// loops share a name, a model or an optimizer, the directory cannot be made, or on_signal is set
  /// while a snapshot::Policy with on_signal is live.
  NITRO_INLINE Run(const Options& options, std::vector<Named> loops);
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
  /// Puts the previous signal handlers back when nothing else needs them (unless a signal stopped the run).
  NITRO_INLINE ~Run();

  /// Loads the newest snapshot of the directory that checks (snapshot::latest), if any: every loop,
  /// the sampler, the extras, the generators, and the iteration count. Returns its file; nothing (and
  /// nothing changed) when the directory has none.
  NITRO_INLINE std::optional<std::filesystem::path> resume();

  /// The end of one iteration of the outer loop (see the class's comment).
  [[nodiscard]] NITRO_INLINE IterationEnd end_iteration();

  /// Writes a snapshot of the run now (rank 0; other ranks name the file), rotates, returns its path.
  NITRO_INLINE std::filesystem::path save_now();

  /// Iterations ended so far (those of the run resumed from included).
  [[nodiscard]] std::int64_t iteration() const noexcept { return iteration_; }
  /// The last snapshot written or resumed from, if any.
  [[nodiscard]] const std::optional<std::filesystem::path>& last_snapshot() const noexcept { return last_; }
  /// Snapshots this object wrote.
  [[nodiscard]] std::int64_t snapshots_written() const noexcept { return written_; }
  /// The options the run was made with.
  [[nodiscard]] const Options& options() const noexcept { return o_; }
  /// The loops saved, in the order given.
  [[nodiscard]] const std::vector<Named>& loops() const noexcept { return loops_; }

 private:
  Options o_;
  std::vector<Named> loops_;
  std::int64_t iteration_ = 0;
  std::int64_t saved_at_ = -1;
  std::int64_t written_ = 0;
  std::optional<std::filesystem::path> last_;
  std::uint64_t seen_ = 0;
  std::unique_ptr<Agreement> agreement_;
  std::chrono::steady_clock::time_point last_time_ = std::chrono::steady_clock::now();
};

}  // namespace nitro::snapshot

#if !NITRO_COMPILED
#include <nitro/snapshot/policy-inl.hpp>
#endif
