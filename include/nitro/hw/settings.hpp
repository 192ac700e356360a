#pragma once
// Process-wide hardware settings, applied for a scope and restored after it.
//
//   nitro::hw::Settings        what to change; every field left empty is left as it is
//   nitro::hw::ScopedSettings  applies Settings, restores the previous values on destruction
//   nitro::hw::current()       the values in force now
//   Settings::fast()           cuDNN autotuning and TF32: the usual choice for training on a GPU
//   Settings::reproducible()   deterministic cuDNN and algorithms, no autotuning, no TF32
//
// nitro::hw::ScopedSettings hw{{.cudnn_benchmark = true, .tf32 = true, .intra_op_threads = 8}};
//
// inter_op_threads is an exception to restoring: LibTorch lets a process set it once, before any
// inter-op parallel work, and never again. ScopedSettings sets it when it differs from the current
// value, throws nitro::Error when LibTorch can no longer change it, and leaves it set on exit.
// cpu_heap_keep_bytes (glibc's malloc thresholds, which glibc cannot report) also stays set on exit.
//
// cpu_affinity and nice (Linux) apply to every thread the process has when the scope begins (LibTorch's
// intra-op pool, loader workers), and threads started later inherit them from their creator; at the
// end each thread gets its own earlier value back (a thread started meanwhile gets the creating
// thread's). A nice value below the current one needs CAP_SYS_NICE or a RLIMIT_NICE that allows it,
// and so does going back down at the end: a value the process could not set, or could not undo, is a
// nitro::Error before anything changes.
//
//   nitro::hw::ScopedSettings pinned{{.cpu_affinity = std::vector<int>{0, 1, 2, 3}, .nice = 5}};
#include <nitro/core/compat.hpp>
#include <nitro/core/config.hpp>
#include <nitro/core/device.hpp>
#include <nitro/core/error.hpp>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__linux__)
#include <dirent.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#endif

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace nitro::hw {

/// What to change. Empty fields are left as they are.
struct Settings {
  /// cuDNN autotuning (`torch.backends.cudnn.benchmark`): faster convolutions for fixed shapes.
  std::optional<bool> cudnn_benchmark;
  /// Deterministic cuDNN algorithms (`torch.backends.cudnn.deterministic`).
  std::optional<bool> cudnn_deterministic;
  /// Deterministic algorithms everywhere (`torch.use_deterministic_algorithms`); an operation with no
  /// deterministic implementation then throws.
  std::optional<bool> deterministic_algorithms;
  /// TF32 in cuBLAS matmuls and cuDNN convolutions on Ampere and newer GPUs.
  std::optional<bool> tf32;
  /// Threads for intra-op parallelism (at::set_num_threads), >= 1.
  std::optional<int> intra_op_threads;
  /// Threads for inter-op parallelism, >= 1; settable once per process (see the top of this file).
  std::optional<int> inter_op_threads;
  /// Cap on the caching allocator of `cuda_device` as a fraction of its memory, in (0, 1].
  std::optional<double> cuda_memory_fraction;
  /// The device `cuda_memory_fraction` applies to; -1 means the current device.
  int cuda_device = -1;
  /// The CPUs the process's threads may run on (Linux), each in [0, configured CPUs), not empty.
  std::optional<std::vector<int>> cpu_affinity;
  /// The scheduling priority (nice value, Linux) of the process's threads, in [-20, 19]; lower is
  /// more CPU. Below the current value needs privilege (see the top of this file).
  std::optional<int> nice;
  /// glibc's heap keeps up to this many freed bytes (its trim threshold; blocks below
  /// min(bytes / 2, 32 MiB) come from the heap, not from mmap), so what a training step frees is
  /// reused by the next instead of being given back to the kernel and faulted in again: about 2000
  /// page faults a step on bench/peers' MLP otherwise (what Lightning's imports avoid by accident).
  /// In [1 MiB, 1 GiB]. glibc cannot report the old values: like inter_op_threads, it stays set on
  /// exit. Without glibc's malloc (another libc, a sanitizer's allocator, jemalloc) it does nothing.
  std::optional<std::int64_t> cpu_heap_keep_bytes;

  /// cuDNN autotuning and TF32 on, and the CPU heap kept (cpu_heap_keep_bytes, 128 MiB).
  NITRO_INLINE static Settings fast();
  /// The CPU heap kept (cpu_heap_keep_bytes, 128 MiB) and nothing else: level::Basic's settings.
  NITRO_INLINE static Settings heap();
  static constexpr std::int64_t kept_heap = std::int64_t{128} << 20;  ///< fast()'s and heap()'s cpu_heap_keep_bytes: 128 MiB.
  /// Deterministic cuDNN and algorithms, no autotuning, no TF32.
  NITRO_INLINE static Settings reproducible();
};

namespace detail {
#if defined(__linux__)
/// The process's threads (Linux task ids), the calling one first.
NITRO_INLINE std::vector<pid_t> process_threads();

NITRO_INLINE std::vector<int> cpus_of(pid_t tid);

NITRO_INLINE bool set_cpus(pid_t tid, const std::vector<int>& cpus);

NITRO_INLINE std::optional<int> nice_of(pid_t tid);

/// Whether this process may lower a thread's nice value to `value` (CAP_SYS_NICE, or RLIMIT_NICE).
NITRO_INLINE bool may_lower_nice_to(int value);
#endif
}  // namespace detail

/// Throws nitro::Error naming the first setting that is out of range, and the range.
NITRO_INLINE void validate(const Settings& s);

/// The values in force now (cuda_memory_fraction where this LibTorch can report it).
NITRO_INLINE Settings current(int cuda_device = -1);

/// Applies Settings on construction and restores what it changed on destruction (in reverse
/// order). Validates everything before changing anything; if applying fails midway, what was
/// already changed is restored before the exception leaves. Not copyable or movable: it is a scope.
class ScopedSettings {
 public:
  /// Applies the fields of `wanted` that are set, remembering the values they replace. Throws
  /// nitro::Error, changing nothing, when a setting is out of range (validate()) or cannot be applied
  /// (inter_op_threads once LibTorch has fixed it, a nice value the process may not set or undo).
  NITRO_INLINE explicit ScopedSettings(const Settings& wanted);
  ScopedSettings(const ScopedSettings&) = delete;
  ScopedSettings& operator=(const ScopedSettings&) = delete;
  ~ScopedSettings() { restore(); }

 private:
  NITRO_INLINE void apply(const Settings& s);

#if defined(__linux__)
  NITRO_INLINE void apply_affinity(const std::vector<int>& cpus);

  NITRO_INLINE void apply_nice(int value);

  NITRO_INLINE static std::string join(const std::vector<int>& v);

  // Each thread's own earlier value; threads started during the scope get the creating thread's.
  NITRO_INLINE void restore_threads() noexcept;
#endif

  NITRO_INLINE void restore() noexcept;

  Settings saved_;  // only the fields this scope changed are set
  std::optional<compat::Tf32State> saved_tf32_;
  bool saved_warn_only_ = false;
  c10::DeviceIndex device_ = 0;
#if defined(__linux__)
  std::vector<std::pair<pid_t, std::vector<int>>> saved_cpus_;  // calling thread first
  std::vector<std::pair<pid_t, int>> saved_nice_;                // calling thread first
#endif
};

}  // namespace nitro::hw

#if !NITRO_COMPILED
#include <nitro/hw/settings-inl.hpp>
#endif
