#pragma once
// The definitions of nitro/snapshot/policy.hpp's non-template functions: included by policy.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/snapshot/policy.hpp>

namespace nitro::snapshot::detail {

NITRO_INLINE std::int64_t monotonic_ns() noexcept {  // clock_gettime: async-signal-safe
  struct ::timespec t {};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

NITRO_INLINE SignalHandlers& SignalHandlers::get() {
  static SignalHandlers handlers;
  return handlers;
}

NITRO_INLINE void SignalHandlers::acquire() {
  std::lock_guard lock(mutex);
  if (live_policies.fetch_add(1, std::memory_order_acq_rel) > 0 || installed) return;
  struct ::sigaction action {};
  action.sa_handler = &on_stop_signal;
  ::sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, nullptr, &previous_term);
  ::sigaction(SIGINT, nullptr, &previous_int);
  stopped_at_ns.store(0, std::memory_order_release);
  // Signals counted before (a Policy gone without acting on them) are no part of this count.
  signals_acted.store(signals_caught.load(std::memory_order_acquire), std::memory_order_release);
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGINT, &action, nullptr);
  installed = true;
}

NITRO_INLINE void SignalHandlers::release() {
  std::lock_guard lock(mutex);
  if (live_policies.fetch_sub(1, std::memory_order_acq_rel) > 1 || stopped_at_ns.load(std::memory_order_acquire) != 0) return;
  ::sigaction(SIGTERM, &previous_term, nullptr);
  ::sigaction(SIGINT, &previous_int, nullptr);
  installed = false;
}

NITRO_INLINE void SignalHandlers::stopped(std::uint64_t caught) {
  std::uint64_t acted = signals_acted.load(std::memory_order_acquire);
  while (acted < caught && !signals_acted.compare_exchange_weak(acted, caught, std::memory_order_acq_rel)) {
  }
  stopped_at_ns.store(monotonic_ns(), std::memory_order_release);
}

NITRO_INLINE std::string_view signal_name(int signo) noexcept {
  return signo == SIGTERM ? "SIGTERM" : signo == SIGINT ? "SIGINT" : "signal";
}

NITRO_INLINE void rotate(const std::filesystem::path& directory, const std::filesystem::path& written, int keep_last, bool fsync) {
  const auto mine = snapshot_name_numbers(written.filename().string());
  int kept = 1;
  bool removed = false;
  for (const auto& f : list(directory)) {
    const auto numbers = snapshot_name_numbers(f.filename().string());
    if (!mine || !numbers || *numbers >= *mine) continue;
    if (kept < keep_last) {
      ++kept;
      continue;
    }
    std::error_code ec;
    removed = std::filesystem::remove(f, ec) || removed;
  }
  if (removed && fsync) io::sync_directory(directory);
}

NITRO_INLINE void prepare_directory(std::string_view who, const std::filesystem::path& directory) {
  NITRO_CHECK(!directory.empty(), "snapshot::", who, ": directory is empty; give the snapshots' directory, e.g. "
                                  "{.directory = \"runs/a\", .every_steps = 1000}");
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  NITRO_CHECK(std::filesystem::is_directory(directory), "snapshot::", who, ": cannot create the directory ",
              directory.string(), ": ", ec ? ec.message() : "a file of that name is in the way",
              "; give a writable directory");
  // One writer per directory (rank 0 of several processes): a killed run's leftovers.
  if (nitro::is_main_process()) remove_temporary_files(directory);
}

}  // namespace nitro::snapshot::detail

namespace nitro::snapshot {

NITRO_INLINE Policy::Policy(const Options& options) : o_(options) {
  NITRO_CHECK(o_.every_steps >= 0, "snapshot::Policy: every_steps must be >= 0 (0: off), got ", o_.every_steps);
  NITRO_CHECK(std::isfinite(o_.every_minutes) && o_.every_minutes >= 0,
              "snapshot::Policy: every_minutes must be >= 0 (0: off), got ", o_.every_minutes);
  NITRO_CHECK(o_.keep_last >= 1, "snapshot::Policy: keep_last must be >= 1, got ", o_.keep_last);
  NITRO_CHECK(o_.every_steps > 0 || o_.every_minutes > 0 || o_.on_signal,
              "snapshot::Policy: nothing would ever be saved; set every_steps, every_minutes or on_signal");
  NITRO_CHECK(!o_.on_signal || detail::live_runs.load(std::memory_order_acquire) == 0,
              "snapshot::Policy: a snapshot::Run is live in this process and acts on SIGTERM/SIGINT for the whole "
              "run; give this Policy on_signal = false (it may still save every N steps or T minutes)");
  detail::prepare_directory("Policy", o_.directory);
  if (o_.on_signal) {
    seen_ = detail::signals_caught.load(std::memory_order_acquire);
    detail::SignalHandlers::get().acquire();
    detail::live_signal_policies.fetch_add(1, std::memory_order_acq_rel);
  }
}

NITRO_INLINE Policy::~Policy() {
  if (o_.on_signal) {
    detail::live_signal_policies.fetch_sub(1, std::memory_order_acq_rel);
    detail::SignalHandlers::get().release();
  }
}

NITRO_INLINE Run::Run(const Options& options, std::vector<Named> loops) : o_(options), loops_(std::move(loops)) {
  NITRO_CHECK(o_.every >= 0, "snapshot::Run: every must be >= 0 (0: off), got ", o_.every);
  NITRO_CHECK(std::isfinite(o_.every_minutes) && o_.every_minutes >= 0,
              "snapshot::Run: every_minutes must be >= 0 (0: off), got ", o_.every_minutes);
  NITRO_CHECK(o_.keep_last >= 1, "snapshot::Run: keep_last must be >= 1, got ", o_.keep_last);
  NITRO_CHECK(o_.every > 0 || o_.every_minutes > 0 || o_.on_signal,
              "snapshot::Run: nothing would ever be saved; set every, every_minutes or on_signal");
  (void)detail::NamedUnits("Run", o_.directory, loops_);  // names and objects checked once, here
  NITRO_CHECK(!o_.on_signal || detail::live_signal_policies.load(std::memory_order_acquire) == 0,
              "snapshot::Run: a snapshot::Policy with on_signal is live in this process; one signal would stop the "
              "run twice with two snapshots. Give the loops' Policy on_signal = false (or drop it: the Run saves "
              "every loop), or give the Run on_signal = false");
  detail::prepare_directory("Run", o_.directory);
  if (o_.on_signal) {
    seen_ = detail::signals_caught.load(std::memory_order_acquire);
    detail::SignalHandlers::get().acquire();
    detail::live_runs.fetch_add(1, std::memory_order_acq_rel);
  }
}

NITRO_INLINE Run::~Run() {
  if (o_.on_signal) {
    detail::live_runs.fetch_sub(1, std::memory_order_acq_rel);
    detail::SignalHandlers::get().release();
  }
}

NITRO_INLINE std::optional<std::filesystem::path> Run::resume() {
  auto file = latest(o_.directory);
  if (!file) return std::nullopt;
  const Manifest m = load(*file, loops_, {.sampler = o_.sampler, .extras = o_.extras});
  iteration_ = m.step;
  saved_at_ = m.step;
  last_ = file;
  last_time_ = std::chrono::steady_clock::now();
  return file;
}

NITRO_INLINE auto Run::end_iteration() -> IterationEnd {
  ++iteration_;
  IterationEnd end;
  const bool by_count = o_.every > 0 && iteration_ % o_.every == 0;
  const bool by_time = o_.every_minutes > 0 && std::chrono::steady_clock::now() - last_time_ >=
                                                   std::chrono::duration<double, std::ratio<60>>(o_.every_minutes);
  if (by_count || by_time) end.saved = save_now();
  if (!o_.on_signal) return end;
  const std::uint64_t caught = detail::signals_caught.load(std::memory_order_acquire);
  if (!agreement_ && process_count() > 1) agreement_ = make_agreement();
  bool stop = false;
  if (agreement_) {
    stop = agreement_->pending() && agreement_->end();
    if (!stop) agreement_->begin(caught != seen_);
  } else {
    stop = caught != seen_;
  }
  if (stop) {
    const int signo = detail::last_signal.load(std::memory_order_relaxed);
    end.saved = save_now();  // throws on failure: the signal stays unseen, and the next iteration tries again
    end.stop = true;
    end.stop_reason = caught != seen_ ? detail::signal_name(signo) : std::string_view("signal on another rank");
    seen_ = caught;
    detail::SignalHandlers::get().stopped(caught);
  }
  return end;
}

NITRO_INLINE std::filesystem::path Run::save_now() {
  std::filesystem::path file = o_.directory / file_name(iteration_, 0);
  if (saved_at_ != iteration_ && nitro::is_main_process()) {
    save(file, loops_, {.sampler = o_.sampler, .extras = o_.extras}, {.fsync = o_.fsync, .step = iteration_});
    ++written_;
    saved_at_ = iteration_;
    detail::rotate(o_.directory, file, o_.keep_last, o_.fsync);
  }
  last_ = file;
  last_time_ = std::chrono::steady_clock::now();
  return file;
}

}  // namespace nitro::snapshot
