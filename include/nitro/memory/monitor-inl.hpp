#pragma once
// The definitions of nitro/memory/monitor.hpp's non-template functions: included by monitor.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/memory/monitor.hpp>

namespace nitro::memory::detail {

NITRO_INLINE std::optional<std::int64_t> parse_kib_field(std::string_view text, std::string_view key) {
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

NITRO_INLINE std::optional<std::int64_t> parse_statm_resident_pages(std::string_view text) {
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

NITRO_INLINE CpuMemory parse_cpu_memory(std::string_view status, std::string_view meminfo) {
  CpuMemory m;
  m.resident_bytes = parse_kib_field(status, "VmRSS").value_or(-1);
  m.peak_resident_bytes = parse_kib_field(status, "VmHWM").value_or(-1);
  m.available_bytes = parse_kib_field(meminfo, "MemAvailable").value_or(-1);
  m.total_bytes = parse_kib_field(meminfo, "MemTotal").value_or(-1);
  return m;
}

NITRO_INLINE bool reset_cpu_peak() noexcept {
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

NITRO_INLINE std::string format_bytes(std::int64_t bytes) {
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
NITRO_INLINE c10::DeviceIndex cuda_index(int device) {
  const auto count = static_cast<int>(c10::cuda::device_count());
  NITRO_CHECK(device < count, "nitro::memory: CUDA device ", device, " does not exist (this process sees ", count,
              " device(s)); pass an index in [0, ", count, ") or -1 for the current device");
  return device < 0 ? c10::cuda::current_device() : static_cast<c10::DeviceIndex>(device);
}
#endif

}  // namespace nitro::memory::detail

namespace nitro::memory {

NITRO_INLINE std::int64_t resident_bytes() noexcept {
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

NITRO_INLINE CpuMemory cpu_memory() noexcept {
  // VmRSS and VmHWM are near the top of status, MemTotal and MemAvailable on meminfo's first lines: a
  // text cut at the buffer's size still holds them.
  std::array<char, 4096> status_buffer;
  std::array<char, 1024> meminfo_buffer;
  return detail::parse_cpu_memory(detail::read_small_file("/proc/self/status", status_buffer),
                                  detail::read_small_file("/proc/meminfo", meminfo_buffer));
}

NITRO_INLINE std::optional<CudaMemory> cuda_memory([[maybe_unused]] int device) {
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

NITRO_INLINE MemorySnapshot snapshot(std::optional<int> cuda_device) {
  MemorySnapshot s{cpu_memory(), cuda_memory(cuda_device.value_or(-1)), std::nullopt};
  if (s.cuda) s.gpu_activity = gpu_activity(s.cuda->device);
  return s;
}

NITRO_INLINE void reset_peaks([[maybe_unused]] std::optional<int> cuda_device) {
#if NITRO_WITH_CUDA
  if (Cuda::available()) c10::cuda::CUDACachingAllocator::resetPeakStats(detail::cuda_index(cuda_device.value_or(-1)));
#endif
  (void)detail::reset_cpu_peak();
}

NITRO_INLINE std::string to_string(const GpuActivity& a) {
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

NITRO_INLINE std::string to_string(const MemorySnapshot& s) {
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

NITRO_INLINE PeakScope::PeakScope() : PeakScope(Options{}) {}

NITRO_INLINE PeakScope::PeakScope(Options options) : start_(std::chrono::steady_clock::now()) {
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

NITRO_INLINE void PeakScope::sample() noexcept {
  if (!hwm_exact_) sampled_peak_ = std::max(sampled_peak_, resident_bytes());
}

NITRO_INLINE auto PeakScope::result() const -> Result {
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

}  // namespace nitro::memory
