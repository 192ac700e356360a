#pragma once
// Memory figures of the process and of the GPU, at a point (snapshot) or over a region (PeakScope).
//
//   auto s = nitro::memory::snapshot();                       // CPU always; CUDA when a GPU is present
//   std::puts(nitro::memory::to_string(s).c_str());           // "cpu: rss 1.20 GiB (peak ...) | cuda:0: ..."
//   { nitro::memory::PeakScope peak; train_step(); auto r = peak.result(); }  // peaks inside the region
//
//   nitro::memory::cpu_memory()    process RSS and its high-water mark, the machine's available and total
//   nitro::memory::cuda_memory()   the CUDA caching allocator's figures for a device, and the device's free/total
//   nitro::memory::snapshot()      both at once (the GPU: the current one, or the one named; a model on
//                                  cuda:1 passes 1)
//   nitro::memory::reset_peaks()   restarts the CPU high-water mark and the CUDA peaks from what is in use now
//   nitro::memory::PeakScope       records the start, resets the peaks, reports what the region peaked at
//
// CPU figures come from Linux's /proc (VmRSS and VmHWM of /proc/self/status, MemAvailable and MemTotal
// of /proc/meminfo); where a file cannot be read (another OS, a restricted sandbox) the figures are -1,
// nothing throws. The parsers are pure functions in `detail` and take the text, so they are testable.
// A snapshot costs two small /proc reads (tens of microseconds): cheap, but not for every kernel launch.
//
// Resetting the CPU high-water mark writes "5" to /proc/self/clear_refs (Linux 4.0 and newer). Some
// containers refuse the write; that is tolerated silently, and PeakScope then measures the CPU peak by
// sampling the RSS instead (see PeakScope::sample). The reset is process-wide, as is CUDA's
// resetPeakStats: two PeakScopes that overlap reset each other's peaks, so do not nest them.
#include <nitro/core/config.hpp>
#include <nitro/core/compat.hpp>  // NITRO_TORCH_VERSION, NITRO_WITH_CUDA
#include <nitro/core/device.hpp>
#include <nitro/core/error.hpp>
#include <nitro/memory/nvml.hpp>
#include <nitro/memory/tracking_allocator.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#if defined(__linux__)
#include <cerrno>
#include <fcntl.h>
#include <unistd.h>
#endif

#if NITRO_WITH_CUDA
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace nitro::memory {

/// The process's and the machine's memory, in bytes; -1 where it could not be read.
struct CpuMemory {
  /// Resident set size of this process (/proc/self/status VmRSS).
  std::int64_t resident_bytes = -1;
  /// The most resident_bytes has been since the process started or the last reset_peaks() (VmHWM).
  std::int64_t peak_resident_bytes = -1;
  /// Memory the machine can give new allocations without swapping (/proc/meminfo MemAvailable).
  std::int64_t available_bytes = -1;
  /// The machine's usable RAM (/proc/meminfo MemTotal).
  std::int64_t total_bytes = -1;
};

/// One CUDA device as the caching allocator sees it, in bytes (-1 where unknown).
struct CudaMemory {
  int device = -1;  ///< The CUDA device index these figures are of.
  /// Bytes in tensors (torch.cuda.memory_allocated).
  std::int64_t allocated_bytes = -1;
  /// Bytes the caching allocator holds from the driver, in use or cached (torch.cuda.memory_reserved).
  std::int64_t reserved_bytes = -1;
  /// The most allocated_bytes / reserved_bytes have been since the start or the last reset of the peaks.
  std::int64_t peak_allocated_bytes = -1;
  std::int64_t peak_reserved_bytes = -1;  ///< The most reserved_bytes has been (see peak_allocated_bytes).
  /// The device's memory (cudaMemGetInfo), counting other processes and the CUDA context. LibTorch
  /// 2.11 and newer; -1 with older ones.
  std::int64_t total_bytes = -1;
  std::int64_t free_bytes = -1;  ///< The device's free memory (cudaMemGetInfo); -1 before LibTorch 2.11.
  /// Allocations that failed even after the allocator emptied its cache.
  std::int64_t num_ooms = -1;
};

/// The process's and the machine's memory, and one GPU's, at one moment (snapshot()).
struct MemorySnapshot {
  CpuMemory cpu;  ///< The process's and the machine's memory.
  /// Set when LibTorch was built with CUDA and a GPU is present.
  std::optional<CudaMemory> cuda;
  /// That GPU's utilisation, power and temperature from NVML (memory/nvml.hpp); empty without NVML.
  std::optional<GpuActivity> gpu_activity;
};

namespace detail {

/// The value of the line `key: <n> kB` of /proc text (status, meminfo), in bytes; nullopt when no
/// line has exactly that key, or its value is not a number of kB.
/// parse_kib_field("VmRSS:\t  2028 kB\n", "VmRSS") == 2028 * 1024
[[nodiscard]] NITRO_INLINE std::optional<std::int64_t> parse_kib_field(std::string_view text, std::string_view key);

/// The resident pages of /proc/self/statm text ("size resident shared text lib data dt", in pages).
[[nodiscard]] NITRO_INLINE std::optional<std::int64_t> parse_statm_resident_pages(std::string_view text);

/// CpuMemory from the text of /proc/self/status and /proc/meminfo (either may be empty: -1 figures).
[[nodiscard]] NITRO_INLINE CpuMemory parse_cpu_memory(std::string_view status, std::string_view meminfo);

/// Reads a small file (a /proc file) into `buffer` with plain read(2), no allocation; the text read,
/// cut at the buffer's size, or empty where the file cannot be read.
template <std::size_t N>
[[nodiscard]] std::string_view read_small_file(const char* path, std::array<char, N>& buffer) noexcept {
#if defined(__linux__)
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::size_t size = 0;
  while (size < buffer.size()) {
    const auto n = ::read(fd, buffer.data() + size, buffer.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    size += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return {buffer.data(), size};
#else
  (void)path;
  (void)buffer;
  return {};
#endif
}

/// Restarts the process's VmHWM from its current RSS; false where the kernel or the sandbox refuses.
NITRO_INLINE bool reset_cpu_peak() noexcept;

/// "512.0 MiB", "1.50 GiB", "?" for a negative (unknown) figure.
[[nodiscard]] NITRO_INLINE std::string format_bytes(std::int64_t bytes);

#if NITRO_WITH_CUDA
[[nodiscard]] NITRO_INLINE c10::DeviceIndex cuda_index(int device);
#endif

}  // namespace detail

/// The process's resident bytes alone, from /proc/self/statm: the cheapest figure (-1 where unknown).
[[nodiscard]] NITRO_INLINE std::int64_t resident_bytes() noexcept;

/// The process's and the machine's memory now. Never throws; unknown figures are -1.
/// auto m = nitro::memory::cpu_memory();  // m.resident_bytes, m.peak_resident_bytes, ...
[[nodiscard]] NITRO_INLINE CpuMemory cpu_memory() noexcept;

/// The caching allocator's figures for CUDA device `device` (-1: the current one); nullopt where
/// LibTorch has no CUDA or no GPU is present. Throws nitro::Error for a device that does not exist.
/// if (auto gpu = nitro::memory::cuda_memory()) std::printf("%lld\n", (long long)gpu->allocated_bytes);
[[nodiscard]] NITRO_INLINE std::optional<CudaMemory> cuda_memory([[maybe_unused]] int device = -1);

/// CPU figures, and those of CUDA device `cuda_device` (default: the current one) where a GPU is present.
/// auto s = nitro::memory::snapshot();
[[nodiscard]] NITRO_INLINE MemorySnapshot snapshot(std::optional<int> cuda_device = std::nullopt);

/// Restarts the peaks from what is in use now: CUDA's peak allocated and reserved bytes of CUDA device
/// `cuda_device` (default: the current one; resetPeakStats) and the process's VmHWM (silently kept
/// where /proc/self/clear_refs cannot be written, as in some containers). Both are process-wide.
NITRO_INLINE void reset_peaks([[maybe_unused]] std::optional<int> cuda_device = std::nullopt);

/// "gpu busy 87%, memory busy 41%, 251.5 W of 700 W, 64 C" (what NVML said).
[[nodiscard]] NITRO_INLINE std::string to_string(const GpuActivity& a);

/// One line: "cpu: rss 1.20 GiB (peak 1.31 GiB), available 20.5 GiB of 23.5 GiB | cuda:0: allocated
/// 512.0 MiB (peak 1.00 GiB), reserved 2.00 GiB (peak 2.00 GiB), free 70.1 GiB of 79.2 GiB". Unknown
/// figures print as "?".
[[nodiscard]] NITRO_INLINE std::string to_string(const MemorySnapshot& s);

/// The peaks of a region of code: construct it at the start, read result() at the end.
///
///   nitro::memory::PeakScope peak{{.track_cpu_tensors = true}};
///   auto loss = step(batch);
///   auto r = peak.result();  // r.cuda->peak_allocated_delta_bytes, r.cpu_peak_tensor_bytes, r.seconds
///
/// On construction it records the current figures and resets the peaks (see reset_peaks: process-wide,
/// so PeakScopes must not overlap). The CPU resident peak is VmHWM when it could be reset (or already
/// stood at the current RSS); otherwise it is the largest RSS seen by sample() and result(), a lower
/// bound (`cpu_peak_resident_exact` says which). With `track_cpu_tensors` it also installs a
/// ScopedCpuTracking for its lifetime, which counts exactly the CPU tensor bytes allocated in the region.
/// Not thread-safe: construct, sample and read it from one thread (the region itself may use many).
class PeakScope {
 public:
  /// What a PeakScope measures besides the defaults.
  struct Options {
    /// Count the exact peak of CPU tensor bytes allocated in the region (installs a ScopedCpuTracking;
    /// one lock per CPU allocation while it lives).
    bool track_cpu_tensors = false;
    /// The CUDA device whose peaks are measured; default the current one. Ignored without a GPU.
    std::optional<int> cuda_device = std::nullopt;
  };

  /// The CUDA figures of a region, in bytes.
  struct CudaPeak {
    int device = -1;  ///< The CUDA device index measured.
    /// Allocated bytes when the scope started.
    std::int64_t start_allocated_bytes = 0;
    /// The most bytes allocated at once in the region (absolute, counts what was live at the start).
    std::int64_t peak_allocated_bytes = 0;
    /// peak_allocated_bytes - start_allocated_bytes: what the region added at its worst.
    std::int64_t peak_allocated_delta_bytes = 0;
    /// The most bytes the caching allocator reserved in the region (absolute).
    std::int64_t peak_reserved_bytes = 0;
  };

  /// The peaks of the region so far.
  struct Result {
    /// Wall time since construction.
    double seconds = 0;
    /// The process's RSS at the start and the most it reached in the region (absolute, -1 unknown).
    std::int64_t cpu_start_resident_bytes = -1;
    std::int64_t cpu_peak_resident_bytes = -1;  ///< The most RSS reached in the region (see cpu_peak_resident_exact).
    /// True when cpu_peak_resident_bytes is the kernel's high-water mark; false when it is the largest
    /// of the sampled RSS values, which can miss a short peak between samples.
    bool cpu_peak_resident_exact = false;
    /// The most CPU tensor bytes allocated in the region were live at once, and those live now; with
    /// track_cpu_tensors only.
    std::optional<std::int64_t> cpu_peak_tensor_bytes;
    std::optional<std::int64_t> cpu_live_tensor_bytes;  ///< CPU tensor bytes allocated in the region and live now (track_cpu_tensors only).
    /// Set when LibTorch has CUDA and a GPU is present.
    std::optional<CudaPeak> cuda;
  };

  // Two constructors rather than `Options options = {}`: a nested struct's default member initializers
  // cannot be used in a default argument of its enclosing class.
  /// Starts measuring with the default Options; see below.
  NITRO_INLINE PeakScope();
  /// Records the current figures and resets the peaks (process-wide). Throws nitro::Error when
  /// cuda_device names a device that does not exist.
  NITRO_INLINE explicit PeakScope(Options options);

  PeakScope(const PeakScope&) = delete;
  PeakScope& operator=(const PeakScope&) = delete;

  /// Folds the current RSS into the sampled CPU peak: call it at points of the region likely to be
  /// high where VmHWM could not be reset (costs one read of /proc/self/statm; a no-op otherwise).
  NITRO_INLINE void sample() noexcept;

  /// The peaks from construction until now; may be read more than once.
  [[nodiscard]] NITRO_INLINE Result result() const;

 private:
  std::chrono::steady_clock::time_point start_;
  std::int64_t cpu_start_resident_ = -1;
  std::int64_t sampled_peak_ = -1;
  bool hwm_exact_ = false;
  std::optional<ScopedCpuTracking> tracking_;
#if NITRO_WITH_CUDA
  int cuda_device_ = -1;  // -1: no GPU measured
  std::int64_t cuda_start_allocated_ = 0;
#endif
};

}  // namespace nitro::memory

#if !NITRO_COMPILED
#include <nitro/memory/monitor-inl.hpp>
#endif
