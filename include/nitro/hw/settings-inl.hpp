#pragma once
// The definitions of nitro/hw/settings.hpp's non-template functions: included by settings.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/hw/settings.hpp>

namespace nitro::hw {

NITRO_INLINE Settings Settings::fast() {
  Settings s;
  s.cudnn_benchmark = true;
  s.tf32 = true;
  s.cpu_heap_keep_bytes = kept_heap;
  return s;
}

NITRO_INLINE Settings Settings::heap() {
  Settings s;
  s.cpu_heap_keep_bytes = kept_heap;
  return s;
}

NITRO_INLINE Settings Settings::reproducible() {
  Settings s;
  s.cudnn_benchmark = false;
  s.cudnn_deterministic = true;
  s.deterministic_algorithms = true;
  s.tf32 = false;
  return s;
}

}  // namespace nitro::hw

namespace nitro::hw::detail {

#if defined(__linux__)
NITRO_INLINE std::vector<pid_t> process_threads() {
  const auto self = static_cast<pid_t>(::syscall(SYS_gettid));
  std::vector<pid_t> out{self};
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      const auto tid = static_cast<pid_t>(std::strtol(e->d_name, nullptr, 10));
      if (tid != self) out.push_back(tid);
    }
    ::closedir(d);
  }
  return out;
}
#endif

#if defined(__linux__)
NITRO_INLINE std::vector<int> cpus_of(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (::sched_getaffinity(tid, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}
#endif

#if defined(__linux__)
NITRO_INLINE bool set_cpus(pid_t tid, const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  return ::sched_setaffinity(tid, sizeof set, &set) == 0;
}
#endif

#if defined(__linux__)
NITRO_INLINE std::optional<int> nice_of(pid_t tid) {
  errno = 0;
  const int v = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  if (v == -1 && errno != 0) return std::nullopt;
  return v;
}
#endif

#if defined(__linux__)
NITRO_INLINE bool may_lower_nice_to(int value) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NICE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
      value >= 20 - static_cast<long>(lim.rlim_cur))
    return true;
  if (lim.rlim_cur == RLIM_INFINITY) return true;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      const auto caps = std::stoull(line.substr(7), nullptr, 16);
      return (caps >> 23) & 1u;  // CAP_SYS_NICE
    }
  }
  return false;
}
#endif

}  // namespace nitro::hw::detail

namespace nitro::hw {

NITRO_INLINE void validate(const Settings& s) {
  if (s.cpu_affinity) {
#if defined(__linux__)
    const long configured = ::sysconf(_SC_NPROCESSORS_CONF);
    NITRO_CHECK(!s.cpu_affinity->empty(), "hw::Settings: cpu_affinity is empty; give the CPUs to run on, e.g. {0, 1}");
    for (int c : *s.cpu_affinity)
      NITRO_CHECK(c >= 0 && c < configured && c < CPU_SETSIZE, "hw::Settings: cpu_affinity names CPU ", c,
                  ", but this machine's CPUs are 0..", configured - 1);
#else
    nitro::detail::fail("hw::Settings: cpu_affinity is supported on Linux only");
#endif
  }
  if (s.nice) {
#if defined(__linux__)
    NITRO_CHECK(*s.nice >= -20 && *s.nice <= 19, "hw::Settings: nice must be in [-20, 19], got ", *s.nice);
#else
    nitro::detail::fail("hw::Settings: nice is supported on Linux only");
#endif
  }
  if (s.cpu_heap_keep_bytes)
    NITRO_CHECK(*s.cpu_heap_keep_bytes >= (std::int64_t{1} << 20) && *s.cpu_heap_keep_bytes <= (std::int64_t{1} << 30),
                "hw::Settings: cpu_heap_keep_bytes must be in [1 MiB, 1 GiB], got ", *s.cpu_heap_keep_bytes);
  if (s.intra_op_threads)
    NITRO_CHECK(*s.intra_op_threads >= 1, "hw::Settings: intra_op_threads must be >= 1, got ", *s.intra_op_threads);
  if (s.inter_op_threads)
    NITRO_CHECK(*s.inter_op_threads >= 1, "hw::Settings: inter_op_threads must be >= 1, got ", *s.inter_op_threads);
  if (s.cuda_memory_fraction) {
    const double f = *s.cuda_memory_fraction;
    NITRO_CHECK(std::isfinite(f) && f > 0.0 && f <= 1.0,
                "hw::Settings: cuda_memory_fraction must be in (0, 1], got ", f);
    NITRO_CHECK(s.cuda_device >= -1, "hw::Settings: cuda_device must be -1 (current) or a device index, got ",
                s.cuda_device);
    require_available<Cuda>("hw::Settings::cuda_memory_fraction");
#if NITRO_WITH_CUDA
    NITRO_CHECK(s.cuda_device < static_cast<int>(c10::cuda::device_count()), "hw::Settings: cuda_device ",
                s.cuda_device, " does not exist; this process sees ", static_cast<int>(c10::cuda::device_count()),
                " CUDA device(s)");
#endif
  }
}

NITRO_INLINE Settings current(int cuda_device) {
  const auto& ctx = at::globalContext();
  Settings s;
  s.cudnn_benchmark = ctx.benchmarkCuDNN();
  s.cudnn_deterministic = ctx.deterministicCuDNN();
  s.deterministic_algorithms = ctx.deterministicAlgorithms();
  s.tf32 = compat::tf32_enabled();
  s.intra_op_threads = at::get_num_threads();
  s.inter_op_threads = static_cast<int>(at::get_num_interop_threads());
  s.cuda_device = cuda_device;
#if defined(__linux__)
  s.cpu_affinity = detail::cpus_of(0);
  s.nice = detail::nice_of(static_cast<pid_t>(::syscall(SYS_gettid)));
#endif
#if NITRO_WITH_CUDA
  if (Cuda::available()) {
    const auto index = cuda_device < 0 ? c10::cuda::current_device() : static_cast<c10::DeviceIndex>(cuda_device);
    s.cuda_memory_fraction = compat::cuda_memory_fraction(index);
  }
#endif
  return s;
}

NITRO_INLINE ScopedSettings::ScopedSettings(const Settings& wanted) {
  validate(wanted);
  try {
    apply(wanted);
  } catch (...) {
    restore();
    throw;
  }
}

NITRO_INLINE void ScopedSettings::apply(const Settings& s) {
  auto& ctx = at::globalContext();
  if (s.cudnn_benchmark) {
    saved_.cudnn_benchmark = ctx.benchmarkCuDNN();
    ctx.setBenchmarkCuDNN(*s.cudnn_benchmark);
  }
  if (s.cudnn_deterministic) {
    saved_.cudnn_deterministic = ctx.deterministicCuDNN();
    ctx.setDeterministicCuDNN(*s.cudnn_deterministic);
  }
  if (s.deterministic_algorithms) {
    saved_.deterministic_algorithms = ctx.deterministicAlgorithms();
    saved_warn_only_ = ctx.deterministicAlgorithmsWarnOnly();
    ctx.setDeterministicAlgorithms(*s.deterministic_algorithms, false);
  }
  if (s.tf32) {
    saved_tf32_ = compat::tf32_state();
    compat::set_tf32(*s.tf32);
  }
  if (s.intra_op_threads) {
    saved_.intra_op_threads = at::get_num_threads();
    at::set_num_threads(*s.intra_op_threads);
  }
  if (s.inter_op_threads && static_cast<std::size_t>(*s.inter_op_threads) != at::get_num_interop_threads()) {
    try {
      at::set_num_interop_threads(*s.inter_op_threads);
    } catch (const c10::Error&) {
      nitro::detail::fail("hw::Settings: inter_op_threads can no longer be changed (now ", at::get_num_interop_threads(),
                   "): LibTorch allows it once per process, before any inter-op parallel work; "
                   "apply it at the start of main()");
    }
  }
#if defined(__GLIBC__)
  if (s.cpu_heap_keep_bytes) {
    // A malloc that is not glibc's (a sanitizer's, jemalloc) refuses or ignores mallopt: nothing to keep.
    const auto keep = *s.cpu_heap_keep_bytes;
    const auto mmap_from = std::min<std::int64_t>(keep / 2, std::int64_t{32} << 20);
    (void)::mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_from));
    (void)::mallopt(M_TRIM_THRESHOLD, static_cast<int>(keep));
  }
#endif
#if defined(__linux__)
  if (s.cpu_affinity) apply_affinity(*s.cpu_affinity);
  if (s.nice) apply_nice(*s.nice);
#endif
#if NITRO_WITH_CUDA
  if (s.cuda_memory_fraction) {
    device_ = s.cuda_device < 0 ? c10::cuda::current_device() : static_cast<c10::DeviceIndex>(s.cuda_device);
    // Where LibTorch cannot report the old fraction, the default (no cap) is what we restore.
    saved_.cuda_memory_fraction = compat::cuda_memory_fraction(device_).value_or(1.0);
    compat::set_cuda_memory_fraction(*s.cuda_memory_fraction, device_);
  }
#endif
}

#if defined(__linux__)
NITRO_INLINE void ScopedSettings::apply_affinity(const std::vector<int>& cpus) {
  const auto threads = detail::process_threads();
  for (pid_t t : threads) saved_cpus_.emplace_back(t, detail::cpus_of(t));
  for (pid_t t : threads) {
    if (detail::set_cpus(t, cpus)) continue;
    const int error = errno;
    if (error == ESRCH) continue;  // the thread ended meanwhile
    nitro::detail::fail("hw::Settings: cpu_affinity {", join(cpus), "} could not be set (", std::strerror(error),
                 "); give CPUs this process may use (now {", join(saved_cpus_.front().second), "})");
  }
  auto wanted = cpus;
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  const auto now = detail::cpus_of(0);
  NITRO_CHECK(now == wanted, "hw::Settings: cpu_affinity {", join(cpus), "} is not allowed here: the process "
              "may use only {", join(now), "} of them (a cgroup or taskset limits it); give CPUs among those");
}
#endif

#if defined(__linux__)
NITRO_INLINE void ScopedSettings::apply_nice(int value) {
  const auto threads = detail::process_threads();
  std::vector<std::pair<pid_t, int>> before;
  for (pid_t t : threads)
    if (auto v = detail::nice_of(t)) before.emplace_back(t, *v);
  int lowest = value, highest = value;
  for (const auto& [t, v] : before) {
    lowest = std::min(lowest, v);
    highest = std::max(highest, v);
  }
  bool lowers = false, raises = false;
  for (const auto& [t, v] : before) {
    lowers = lowers || value < v;
    raises = raises || value > v;
  }
  if (lowers)
    NITRO_CHECK(detail::may_lower_nice_to(value), "hw::Settings: nice ", value, " is below a thread's current ",
                highest, " and this process may not lower a nice value (it needs CAP_SYS_NICE, or RLIMIT_NICE >= ",
                20 - value, "); give a value >= ", highest);
  if (raises)
    NITRO_CHECK(detail::may_lower_nice_to(lowest), "hw::Settings: nice ", value, " could not be undone at the "
                "end of the scope: going back to ", lowest, " needs CAP_SYS_NICE or RLIMIT_NICE >= ", 20 - lowest,
                "; set it once for the whole run (setpriority, or start the program with `nice -n ", value, "`)");
  saved_nice_ = before;
  for (const auto& [t, v] : before) {
    if (::setpriority(PRIO_PROCESS, static_cast<id_t>(t), value) == 0 || errno == ESRCH) continue;
    nitro::detail::fail("hw::Settings: nice ", value, " could not be set (", std::strerror(errno), ")");
  }
}
#endif

#if defined(__linux__)
NITRO_INLINE std::string ScopedSettings::join(const std::vector<int>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out;
}
#endif

#if defined(__linux__)
NITRO_INLINE void ScopedSettings::restore_threads() noexcept {
  if (saved_cpus_.empty() && saved_nice_.empty()) return;
  try {
    const auto threads = detail::process_threads();
    const auto value_for = [&](const auto& saved, pid_t t) {
      for (const auto& [tid, v] : saved)
        if (tid == t) return v;
      return saved.front().second;
    };
    for (pid_t t : threads) {
      if (!saved_nice_.empty()) ::setpriority(PRIO_PROCESS, static_cast<id_t>(t), value_for(saved_nice_, t));
      if (!saved_cpus_.empty()) detail::set_cpus(t, value_for(saved_cpus_, t));
    }
  } catch (...) {  // NOLINT(bugprone-empty-catch): restoring must not throw; allocation failure only
  }
  saved_cpus_.clear();
  saved_nice_.clear();
}
#endif

NITRO_INLINE void ScopedSettings::restore() noexcept {
  auto& ctx = at::globalContext();
#if NITRO_WITH_CUDA
  if (saved_.cuda_memory_fraction) compat::set_cuda_memory_fraction(*saved_.cuda_memory_fraction, device_);
#endif
  if (saved_.intra_op_threads) at::set_num_threads(*saved_.intra_op_threads);
  if (saved_tf32_) compat::restore_tf32(*saved_tf32_);
  if (saved_.deterministic_algorithms) ctx.setDeterministicAlgorithms(*saved_.deterministic_algorithms, saved_warn_only_);
  if (saved_.cudnn_deterministic) ctx.setDeterministicCuDNN(*saved_.cudnn_deterministic);
  if (saved_.cudnn_benchmark) ctx.setBenchmarkCuDNN(*saved_.cudnn_benchmark);
#if defined(__linux__)
  restore_threads();
#endif
  saved_ = {};
  saved_tf32_.reset();
}

}  // namespace nitro::hw
