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
  int device = -1;
  /// Bytes in tensors (torch.cuda.memory_allocated).
  std::int64_t allocated_bytes = -1;
  /// Bytes the caching allocator holds from the driver, in use or cached (torch.cuda.memory_reserved).
  std::int64_t reserved_bytes = -1;
  /// The most allocated_bytes / reserved_bytes have been since the start or the last reset of the peaks.
  std::int64_t peak_allocated_bytes = -1;
  std::int64_t peak_reserved_bytes = -1;
  /// The device's memory (cudaMemGetInfo), counting other processes and the CUDA context. LibTorch
  /// 2.11 and newer; -1 with older ones.
  std::int64_t total_bytes = -1;
  std::int64_t free_bytes = -1;
  /// Allocations that failed even after the allocator emptied its cache.
  std::int64_t num_ooms = -1;
};

struct MemorySnapshot {
  CpuMemory cpu;
  /// Set when LibTorch was built with CUDA and a GPU is present.
  std::optional<CudaMemory> cuda;
  /// That GPU's utilisation, power and temperature from NVML (memory/nvml.hpp); empty without NVML.
  std::optional<GpuActivity> gpu_activity;
};

namespace detail {

/// The value of the line `key: <n> kB` of /proc text (status, meminfo), in bytes; nullopt when no
/// line has exactly that key, or its value is not a number of kB.
/// parse_kib_field("VmRSS:\t  2028 kB\n", "VmRSS") == 2028 * 1024
[[nodiscard]] inline std::optional<std::int64_t> parse_kib_field(std::string_view text, std::string_view key) {
  if (key.empty()) return std::nullopt;
  for (std::size_t at = 0; at < text.size();) {
    const auto end = std::min(text.find('\n', at), text.size());
    const auto line = text.substr(at, end - at);
    at = end + 1;
    if (line.size() <= key.size() || !line.starts_with(key) || line[key.size()] != ':') continue;
    auto rest = line.substr(key.size() + 1);
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
    std::int64_t kib = 0;
    const auto [next, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), kib);
    if (ec != std::errc{} || kib < 0 || kib > std::numeric_limits<std::int64_t>::max() / 1024) return std::nullopt;
    rest.remove_prefix(static_cast<std::size_t>(next - rest.data()));
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
    while (!rest.empty() && (rest.back() == ' ' || rest.back() == '\t' || rest.back() == '\r')) rest.remove_suffix(1);
    if (rest != "kB") return std::nullopt;  // e.g. HugePages_Total, a count
    return kib * 1024;
  }
  return std::nullopt;
}

/// The resident pages of /proc/self/statm text ("size resident shared text lib data dt", in pages).
[[nodiscard]] inline std::optional<std::int64_t> parse_statm_resident_pages(std::string_view text) {
  std::int64_t field[2] = {0, 0};
  const char* p = text.data();
  const char* const end = text.data() + text.size();
  for (auto& f : field) {
    while (p != end && *p == ' ') ++p;
    const auto [next, ec] = std::from_chars(p, end, f);
    if (ec != std::errc{} || f < 0) return std::nullopt;
    p = next;
  }
  return field[1];
}

/// CpuMemory from the text of /proc/self/status and /proc/meminfo (either may be empty: -1 figures).
[[nodiscard]] inline CpuMemory parse_cpu_memory(std::string_view status, std::string_view meminfo) {
  CpuMemory m;
  m.resident_bytes = parse_kib_field(status, "VmRSS").value_or(-1);
  m.peak_resident_bytes = parse_kib_field(status, "VmHWM").value_or(-1);
  m.available_bytes = parse_kib_field(meminfo, "MemAvailable").value_or(-1);
  m.total_bytes = parse_kib_field(meminfo, "MemTotal").value_or(-1);
  return m;
}

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
inline bool reset_cpu_peak() noexcept {
#if defined(__linux__)
  const int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = -1;
  do {
    n = ::write(fd, "5", 1);  // 5: CLEAR_REFS_MM_HIWATER_RSS, touches nothing else
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  return n == 1;
#else
  return false;
#endif
}

/// "512.0 MiB", "1.50 GiB", "?" for a negative (unknown) figure.
[[nodiscard]] inline std::string format_bytes(std::int64_t bytes) {
  if (bytes < 0) return "?";
  constexpr double kMiB = 1024.0 * 1024.0;
  constexpr double kGiB = 1024.0 * kMiB;
  std::array<char, 32> out{};
  const auto b = static_cast<double>(bytes);
  if (b >= kGiB) {
    std::snprintf(out.data(), out.size(), "%.2f GiB", b / kGiB);
  } else {
    std::snprintf(out.data(), out.size(), "%.1f MiB", b / kMiB);
  }
  return out.data();
}

#if NITRO_WITH_CUDA
[[nodiscard]] inline c10::DeviceIndex cuda_index(int device) {
  const auto count = static_cast<int>(c10::cuda::device_count());
  NITRO_CHECK(device < count, "nitro::memory: CUDA device ", device, " does not exist (this process sees ", count,
              " device(s)); pass an index in [0, ", count, ") or -1 for the current device");
  return device < 0 ? c10::cuda::current_device() : static_cast<c10::DeviceIndex>(device);
}
#endif

}  // namespace detail

/// The process's resident bytes alone, from /proc/self/statm: the cheapest figure (-1 where unknown).
[[nodiscard]] inline std::int64_t resident_bytes() noexcept {
#if defined(__linux__)
  std::array<char, 256> buffer;
  const auto pages = detail::parse_statm_resident_pages(detail::read_small_file("/proc/self/statm", buffer));
  const auto page_size = ::sysconf(_SC_PAGESIZE);
  if (!pages || page_size <= 0) return -1;
  return *pages * static_cast<std::int64_t>(page_size);
#else
  return -1;
#endif
}

/// The process's and the machine's memory now. Never throws; unknown figures are -1.
/// auto m = nitro::memory::cpu_memory();  // m.resident_bytes, m.peak_resident_bytes, ...
[[nodiscard]] inline CpuMemory cpu_memory() noexcept {
  // VmRSS and VmHWM are near the top of status, MemTotal and MemAvailable on meminfo's first lines: a
  // text cut at the buffer's size still holds them.
  std::array<char, 4096> status_buffer;
  std::array<char, 1024> meminfo_buffer;
  return detail::parse_cpu_memory(detail::read_small_file("/proc/self/status", status_buffer),
                                  detail::read_small_file("/proc/meminfo", meminfo_buffer));
}

/// The caching allocator's figures for CUDA device `device` (-1: the current one); nullopt where
/// LibTorch has no CUDA or no GPU is present. Throws nitro::Error for a device that does not exist.
/// if (auto gpu = nitro::memory::cuda_memory()) std::printf("%lld\n", (long long)gpu->allocated_bytes);
[[nodiscard]] inline std::optional<CudaMemory> cuda_memory([[maybe_unused]] int device = -1) {
#if NITRO_WITH_CUDA
  if (!Cuda::available()) return std::nullopt;
  const auto index = detail::cuda_index(device);
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  constexpr auto all = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  CudaMemory m;
  m.device = index;
  m.allocated_bytes = stats.allocated_bytes[all].current;
  m.peak_allocated_bytes = stats.allocated_bytes[all].peak;
  m.reserved_bytes = stats.reserved_bytes[all].current;
  m.peak_reserved_bytes = stats.reserved_bytes[all].peak;
  m.num_ooms = stats.num_ooms;
#if NITRO_TORCH_VERSION >= 211
  // A virtual call into c10_cuda (cudaMemGetInfo under a device guard): no link to cudart needed here.
  const auto [free, total] = c10::cuda::CUDACachingAllocator::get()->getMemoryInfo(index);
  m.free_bytes = static_cast<std::int64_t>(free);
  m.total_bytes = static_cast<std::int64_t>(total);
#endif
  return m;
#else
  return std::nullopt;
#endif
}

/// CPU figures, and those of CUDA device `cuda_device` (default: the current one) where a GPU is present.
/// auto s = nitro::memory::snapshot();
[[nodiscard]] inline MemorySnapshot snapshot(std::optional<int> cuda_device = std::nullopt) {
  MemorySnapshot s{cpu_memory(), cuda_memory(cuda_device.value_or(-1)), std::nullopt};
  if (s.cuda) s.gpu_activity = gpu_activity(s.cuda->device);
  return s;
}

/// Restarts the peaks from what is in use now: CUDA's peak allocated and reserved bytes of CUDA device
/// `cuda_device` (default: the current one; resetPeakStats) and the process's VmHWM (silently kept
/// where /proc/self/clear_refs cannot be written, as in some containers). Both are process-wide.
inline void reset_peaks([[maybe_unused]] std::optional<int> cuda_device = std::nullopt) {
#if NITRO_WITH_CUDA
  if (Cuda::available()) c10::cuda::CUDACachingAllocator::resetPeakStats(detail::cuda_index(cuda_device.value_or(-1)));
#endif
  (void)detail::reset_cpu_peak();
}

/// "gpu busy 87%, memory busy 41%, 251.5 W of 700 W, 64 C" (what NVML said).
[[nodiscard]] inline std::string to_string(const GpuActivity& a) {
  char text[160];
  std::string out = "gpu busy " + (a.gpu_percent >= 0 ? std::to_string(a.gpu_percent) + "%" : std::string("?")) +
                    ", memory busy " + (a.memory_percent >= 0 ? std::to_string(a.memory_percent) + "%" : std::string("?"));
  if (a.power_w >= 0) {
    std::snprintf(text, sizeof text, ", %.1f W", a.power_w);
    out += text;
    if (a.power_limit_w >= 0) {
      std::snprintf(text, sizeof text, " of %.0f W", a.power_limit_w);
      out += text;
    }
  }
  if (a.temperature_c >= 0) out += ", " + std::to_string(a.temperature_c) + " C";
  return out;
}

/// One line: "cpu: rss 1.20 GiB (peak 1.31 GiB), available 20.5 GiB of 23.5 GiB | cuda:0: allocated
/// 512.0 MiB (peak 1.00 GiB), reserved 2.00 GiB (peak 2.00 GiB), free 70.1 GiB of 79.2 GiB". Unknown
/// figures print as "?".
[[nodiscard]] inline std::string to_string(const MemorySnapshot& s) {
  using detail::format_bytes;
  std::string out = "cpu: rss " + format_bytes(s.cpu.resident_bytes) + " (peak " +
                    format_bytes(s.cpu.peak_resident_bytes) + "), available " + format_bytes(s.cpu.available_bytes) +
                    " of " + format_bytes(s.cpu.total_bytes);
  if (s.cuda) {
    const auto& g = *s.cuda;
    out += " | cuda:" + std::to_string(g.device) + ": allocated " + format_bytes(g.allocated_bytes) + " (peak " +
           format_bytes(g.peak_allocated_bytes) + "), reserved " + format_bytes(g.reserved_bytes) + " (peak " +
           format_bytes(g.peak_reserved_bytes) + "), free " + format_bytes(g.free_bytes) + " of " +
           format_bytes(g.total_bytes);
    if (g.num_ooms > 0) out += ", " + std::to_string(g.num_ooms) + " OOMs";
  }
  if (s.gpu_activity) out += " | " + to_string(*s.gpu_activity);
  return out;
}

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
  struct Options {
    /// Count the exact peak of CPU tensor bytes allocated in the region (installs a ScopedCpuTracking;
    /// one lock per CPU allocation while it lives).
    bool track_cpu_tensors = false;
    /// The CUDA device whose peaks are measured; default the current one. Ignored without a GPU.
    std::optional<int> cuda_device = std::nullopt;
  };

  struct CudaPeak {
    int device = -1;
    /// Allocated bytes when the scope started.
    std::int64_t start_allocated_bytes = 0;
    /// The most bytes allocated at once in the region (absolute, counts what was live at the start).
    std::int64_t peak_allocated_bytes = 0;
    /// peak_allocated_bytes - start_allocated_bytes: what the region added at its worst.
    std::int64_t peak_allocated_delta_bytes = 0;
    /// The most bytes the caching allocator reserved in the region (absolute).
    std::int64_t peak_reserved_bytes = 0;
  };

  struct Result {
    /// Wall time since construction.
    double seconds = 0;
    /// The process's RSS at the start and the most it reached in the region (absolute, -1 unknown).
    std::int64_t cpu_start_resident_bytes = -1;
    std::int64_t cpu_peak_resident_bytes = -1;
    /// True when cpu_peak_resident_bytes is the kernel's high-water mark; false when it is the largest
    /// of the sampled RSS values, which can miss a short peak between samples.
    bool cpu_peak_resident_exact = false;
    /// The most CPU tensor bytes allocated in the region were live at once, and those live now; with
    /// track_cpu_tensors only.
    std::optional<std::int64_t> cpu_peak_tensor_bytes;
    std::optional<std::int64_t> cpu_live_tensor_bytes;
    /// Set when LibTorch has CUDA and a GPU is present.
    std::optional<CudaPeak> cuda;
  };

  // Two constructors rather than `Options options = {}`: a nested struct's default member initializers
  // cannot be used in a default argument of its enclosing class.
  PeakScope() : PeakScope(Options{}) {}
  explicit PeakScope(Options options) : start_(std::chrono::steady_clock::now()) {
#if NITRO_WITH_CUDA
    if (Cuda::available()) {
      const auto index = detail::cuda_index(options.cuda_device.value_or(-1));
      cuda_device_ = index;
      cuda_start_allocated_ = cuda_memory(index)->allocated_bytes;
      c10::cuda::CUDACachingAllocator::resetPeakStats(index);
    }
#endif
    const bool reset = detail::reset_cpu_peak();
    const auto cpu = cpu_memory();
    cpu_start_resident_ = cpu.resident_bytes;
    sampled_peak_ = cpu.resident_bytes;
    // A high-water mark that stands at the current RSS counts this region's peak from here on, whether
    // the reset worked or the process never had more resident than now.
    hwm_exact_ = cpu.peak_resident_bytes >= 0 && (reset || cpu.peak_resident_bytes == cpu.resident_bytes);
    if (options.track_cpu_tensors) tracking_.emplace();
  }

  PeakScope(const PeakScope&) = delete;
  PeakScope& operator=(const PeakScope&) = delete;

  /// Folds the current RSS into the sampled CPU peak: call it at points of the region likely to be
  /// high where VmHWM could not be reset (costs one read of /proc/self/statm; a no-op otherwise).
  void sample() noexcept {
    if (!hwm_exact_) sampled_peak_ = std::max(sampled_peak_, resident_bytes());
  }

  /// The peaks from construction until now; may be read more than once.
  [[nodiscard]] Result result() const {
    Result r;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    r.cpu_start_resident_bytes = cpu_start_resident_;
    if (hwm_exact_) {
      r.cpu_peak_resident_bytes = cpu_memory().peak_resident_bytes;
      r.cpu_peak_resident_exact = r.cpu_peak_resident_bytes >= 0;
    }
    if (!r.cpu_peak_resident_exact) r.cpu_peak_resident_bytes = std::max(sampled_peak_, resident_bytes());
    if (tracking_) {
      const auto stats = tracking_->stats();
      r.cpu_peak_tensor_bytes = stats.peak_bytes;
      r.cpu_live_tensor_bytes = stats.live_bytes;
    }
#if NITRO_WITH_CUDA
    if (cuda_device_ >= 0) {
      const auto now = cuda_memory(cuda_device_);
      r.cuda = CudaPeak{cuda_device_, cuda_start_allocated_, now->peak_allocated_bytes,
                        now->peak_allocated_bytes - cuda_start_allocated_, now->peak_reserved_bytes};
    }
#endif
    return r;
  }

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
