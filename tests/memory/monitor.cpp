#include <nitro/memory/monitor.hpp>

#include "testing.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>

namespace nitro_test_memory_monitor {  // one namespace per file: an area is compiled as one translation unit

namespace {

constexpr std::int64_t kKiB = 1024;
constexpr std::int64_t kMiB = 1024 * kKiB;

// Shortened from a real /proc/self/status and /proc/meminfo (Linux 6.x).
constexpr std::string_view kStatus =
    "Name:\ttest_memory\n"
    "Umask:\t0022\n"
    "State:\tR (running)\n"
    "Pid:\t4242\n"
    "VmPeak:\t  815732 kB\n"
    "VmSize:\t  815700 kB\n"
    "VmLck:\t       0 kB\n"
    "VmHWM:\t  123456 kB\n"
    "VmRSS:\t   98765 kB\n"
    "RssAnon:\t   70000 kB\n"
    "Threads:\t3\n"
    "voluntary_ctxt_switches:\t12\n";

constexpr std::string_view kMeminfo =
    "MemTotal:       24684084 kB\n"
    "MemFree:        18739732 kB\n"
    "MemAvailable:   21561100 kB\n"
    "Buffers:          123456 kB\n"
    "HugePages_Total:       0\n"
    "Hugepagesize:       2048 kB";  // no final newline

}  // namespace

TEST_CASE("parse_kib_field gives the exact bytes of a kB field of proc text") {
  using nitro::memory::detail::parse_kib_field;
  CHECK(parse_kib_field(kStatus, "VmRSS") == 98765 * kKiB);
  CHECK(parse_kib_field(kStatus, "VmHWM") == 123456 * kKiB);
  CHECK(parse_kib_field(kStatus, "VmLck") == 0);
  CHECK(parse_kib_field(kMeminfo, "MemTotal") == 24684084 * kKiB);
  CHECK(parse_kib_field(kMeminfo, "MemAvailable") == 21561100 * kKiB);
  CHECK(parse_kib_field(kMeminfo, "Hugepagesize") == 2048 * kKiB);  // the last line without a newline
}

TEST_CASE("parse_kib_field matches whole keys only and refuses what is not a size in kB") {
  using nitro::memory::detail::parse_kib_field;
  CHECK(parse_kib_field(kStatus, "VmRS") == std::nullopt);         // a prefix of VmRSS
  CHECK(parse_kib_field(kStatus, "Anon") == std::nullopt);         // a suffix of RssAnon
  CHECK(parse_kib_field(kStatus, "Threads") == std::nullopt);      // a count
  CHECK(parse_kib_field(kMeminfo, "HugePages_Total") == std::nullopt);
  CHECK(parse_kib_field(kMeminfo, "SwapTotal") == std::nullopt);   // absent
  CHECK(parse_kib_field(kStatus, "") == std::nullopt);
  CHECK(parse_kib_field("", "VmRSS") == std::nullopt);
  CHECK(parse_kib_field("VmRSS:\tlots kB\n", "VmRSS") == std::nullopt);
  CHECK(parse_kib_field("VmRSS:\t-5 kB\n", "VmRSS") == std::nullopt);
  CHECK(parse_kib_field("VmRSS:\t99999999999999999999 kB\n", "VmRSS") == std::nullopt);  // overflows
  CHECK(parse_kib_field("VmRSS:\t12 MB\n", "VmRSS") == std::nullopt);
  CHECK(parse_kib_field("VmRSS: 12 kB\r\n", "VmRSS") == 12 * kKiB);
  CHECK(parse_kib_field("VmRSS:12kB", "VmRSS") == 12 * kKiB);
}

TEST_CASE("parse_cpu_memory fills each figure from its field and leaves -1 for what is missing") {
  const auto m = nitro::memory::detail::parse_cpu_memory(kStatus, kMeminfo);
  CHECK(m.resident_bytes == 98765 * kKiB);
  CHECK(m.peak_resident_bytes == 123456 * kKiB);
  CHECK(m.available_bytes == 21561100 * kKiB);
  CHECK(m.total_bytes == 24684084 * kKiB);
  const auto none = nitro::memory::detail::parse_cpu_memory("", "");
  CHECK(none.resident_bytes == -1);
  CHECK(none.peak_resident_bytes == -1);
  CHECK(none.available_bytes == -1);
  CHECK(none.total_bytes == -1);
}

TEST_CASE("parse_statm_resident_pages reads the second field of statm") {
  using nitro::memory::detail::parse_statm_resident_pages;
  CHECK(parse_statm_resident_pages("203933 24691 6150 1 0 19327 0\n") == 24691);
  CHECK(parse_statm_resident_pages("765 440") == 440);
  CHECK(parse_statm_resident_pages("765") == std::nullopt);
  CHECK(parse_statm_resident_pages("") == std::nullopt);
  CHECK(parse_statm_resident_pages("x 1 2") == std::nullopt);
}

TEST_CASE("a missing proc file reads as empty text") {
  std::array<char, 64> buffer;
  CHECK(nitro::memory::detail::read_small_file("/proc/self/no-such-file", buffer).empty());
}

TEST_CASE("to_string prints a one-line summary in MiB and GiB") {
  using nitro::memory::detail::format_bytes;
  CHECK(format_bytes(-1) == "?");
  CHECK(format_bytes(0) == "0.0 MiB");
  CHECK(format_bytes(512 * kMiB) == "512.0 MiB");
  CHECK(format_bytes(1536 * kMiB) == "1.50 GiB");

  nitro::memory::MemorySnapshot s;
  s.cpu = {.resident_bytes = 1536 * kMiB, .peak_resident_bytes = 2048 * kMiB, .available_bytes = 20 * 1024 * kMiB,
           .total_bytes = -1};
  CHECK(nitro::memory::to_string(s) == "cpu: rss 1.50 GiB (peak 2.00 GiB), available 20.00 GiB of ?");
  s.cuda = nitro::memory::CudaMemory{.device = 1,
                                     .allocated_bytes = 64 * kMiB,
                                     .reserved_bytes = 96 * kMiB,
                                     .peak_allocated_bytes = 128 * kMiB,
                                     .peak_reserved_bytes = 160 * kMiB,
                                     .total_bytes = 80 * 1024 * kMiB,
                                     .free_bytes = 79 * 1024 * kMiB,
                                     .num_ooms = 2};
  const auto line = nitro::memory::to_string(s);
  CHECK(line ==
        "cpu: rss 1.50 GiB (peak 2.00 GiB), available 20.00 GiB of ? | cuda:1: allocated 64.0 MiB (peak 128.0 MiB), "
        "reserved 96.0 MiB (peak 160.0 MiB), free 79.00 GiB of 80.00 GiB, 2 OOMs");
  CHECK(line.find('\n') == std::string::npos);
}

TEST_CASE("a snapshot of this process is plausible") {
  const auto s = nitro::memory::snapshot();
  INFO(nitro::memory::to_string(s));
  CHECK(s.cpu.resident_bytes > 0);
  CHECK(s.cpu.peak_resident_bytes >= s.cpu.resident_bytes);
  CHECK(s.cpu.available_bytes > 0);
  CHECK(s.cpu.available_bytes <= s.cpu.total_bytes);
  CHECK(s.cuda.has_value() == nitro::Cuda::available());
  // statm and status count the same pages.
  const auto statm = nitro::memory::resident_bytes();
  CHECK(statm > 0);
  CHECK(std::abs(statm - nitro::memory::cpu_memory().resident_bytes) < 8 * kMiB);
}

TEST_CASE("touching a 64 MiB tensor raises the resident bytes by about 64 MiB") {
  const auto before = nitro::memory::cpu_memory();
  const auto before_statm = nitro::memory::resident_bytes();
  auto t = torch::ones({16 * kMiB}, torch::kFloat);  // 64 MiB, every page written
  const auto after = nitro::memory::cpu_memory();
  const auto after_statm = nitro::memory::resident_bytes();
  INFO("before ", before.resident_bytes, " after ", after.resident_bytes);
  CHECK(after.resident_bytes - before.resident_bytes >= 60 * kMiB);
  CHECK(after_statm - before_statm >= 60 * kMiB);
  CHECK(after.peak_resident_bytes >= after.resident_bytes);
  CHECK(t.sum().item<double>() == static_cast<double>(16 * kMiB));
}

TEST_CASE("PeakScope with track_cpu_tensors reports exactly the tensor bytes of its region") {
  auto* const allocator = c10::GetCPUAllocator();
  const auto outside = torch::empty({1 << 16}, torch::kFloat);  // allocated before: not counted
  {
    nitro::memory::PeakScope peak{{.track_cpu_tensors = true}};
    {
      const auto a = torch::empty({1000}, torch::kFloat);     // 4000 bytes
      const auto b = torch::empty({10, 10}, torch::kDouble);  // 800 bytes, both alive: 4800
      CHECK(peak.result().cpu_peak_tensor_bytes == 4800);
    }
    const auto c = torch::empty({1000}, torch::kByte);  // 1000 bytes alone: the peak stays
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto r = peak.result();
    CHECK(r.cpu_peak_tensor_bytes == 4800);
    CHECK(r.seconds >= 0.02);
    CHECK(r.seconds < 60);
    CHECK(r.cpu_start_resident_bytes > 0);
    CHECK(r.cpu_peak_resident_bytes >= r.cpu_start_resident_bytes);
    CHECK(r.cuda.has_value() == nitro::Cuda::available());
  }
  CHECK(c10::GetCPUAllocator() == allocator);  // the tracking allocator is gone with the scope
  nitro::memory::PeakScope untracked;
  const auto d = torch::empty({10}, torch::kFloat);
  CHECK(untracked.result().cpu_peak_tensor_bytes == std::nullopt);
  CHECK(c10::GetCPUAllocator() == allocator);
}

TEST_CASE("PeakScope sees a resident peak that is gone by the end of its region") {
  nitro::memory::PeakScope peak;
  {
    const auto t = torch::ones({16 * kMiB}, torch::kFloat);  // 64 MiB
    peak.sample();  // what the peak is where VmHWM could not be reset
  }
  const auto r = peak.result();
  INFO("start ", r.cpu_start_resident_bytes, " peak ", r.cpu_peak_resident_bytes, " exact ", r.cpu_peak_resident_exact);
  CHECK(r.cpu_peak_resident_bytes - r.cpu_start_resident_bytes >= 60 * kMiB);
  if (!r.cpu_peak_resident_exact) MESSAGE("VmHWM could not be reset here: the CPU peak was sampled");
}

TEST_CASE("reset_peaks restarts the resident high-water mark where the kernel allows it") {
  // Deterministic whatever other processes do: only this test's own mapping raises the figures, and
  // what the kernel may take from the process meanwhile (file pages under memory pressure) can only
  // lower them, which every check below tolerates. (It once compared the peak with the RSS read after
  // the reset, which a reclaim in between made fail under load.)
  constexpr std::size_t kBlock = 64 * kMiB;
  void* block = ::mmap(nullptr, kBlock, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(block != MAP_FAILED);
  std::memset(block, 1, kBlock);  // resident now
  const auto high = nitro::memory::cpu_memory();
  REQUIRE(high.peak_resident_bytes >= high.resident_bytes);
  REQUIRE(::munmap(block, kBlock) == 0);  // and gone from the resident set at once
  const auto before = nitro::memory::resident_bytes();
  CHECK_NOTHROW(nitro::memory::reset_peaks());
  const auto after = nitro::memory::cpu_memory();
  if (nitro::memory::detail::reset_cpu_peak()) {
    // Restarted from the resident set of the moment, not the 64 MiB higher mark before it.
    CHECK(after.peak_resident_bytes <= before + 4 * kMiB);
    CHECK(after.peak_resident_bytes < high.peak_resident_bytes - 32 * kMiB);
  } else {
    MESSAGE("/proc/self/clear_refs cannot be written here: VmHWM is kept");
    CHECK(after.peak_resident_bytes >= high.peak_resident_bytes);
  }
}

TEST_CASE("a CPU snapshot costs tens of microseconds") {
  std::vector<double> us;
  for (int i = 0; i < 101; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto m = nitro::memory::cpu_memory();
    const auto t1 = std::chrono::steady_clock::now();
    REQUIRE(m.resident_bytes > 0);
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::nth_element(us.begin(), us.begin() + 50, us.end());
  MESSAGE("cpu_memory() median ", us[50], " us");
  CHECK(us[50] < 500.0);  // about 20 us on a quiet machine; loose for shared and sanitized builds
}

TEST_CASE("without a GPU there is no CUDA part" * doctest::skip(nitro::Cuda::available())) {
  CHECK(nitro::memory::cuda_memory() == std::nullopt);
  CHECK(nitro::memory::cuda_memory(0) == std::nullopt);
  CHECK(nitro::memory::snapshot(0).cuda == std::nullopt);
  CHECK(nitro::memory::PeakScope{}.result().cuda == std::nullopt);
  CHECK(nitro::memory::to_string(nitro::memory::snapshot()).find("cuda") == std::string::npos);
}

TEST_CASE("gpu: cuda_memory and PeakScope follow a tensor allocated on the GPU" * nitro::test::needs_gpu()) {
  const auto warm = torch::zeros({1}, torch::kCUDA);  // the CUDA context exists before measuring
  const auto before = nitro::memory::cuda_memory();
  REQUIRE(before.has_value());
  CHECK(before->device >= 0);
  CHECK(before->total_bytes > 0);
  CHECK(before->free_bytes <= before->total_bytes);
  CHECK(before->num_ooms >= 0);
  CHECK(before->reserved_bytes >= before->allocated_bytes);
  CHECK_THROWS_AS((void)nitro::memory::cuda_memory(1000), nitro::Error);

  constexpr std::int64_t bytes = 64 * kMiB;
  nitro::memory::PeakScope peak;
  {
    const auto t = torch::ones({bytes / 4}, torch::dtype(torch::kFloat).device(torch::kCUDA));
    const auto during = nitro::memory::cuda_memory();
    REQUIRE(during.has_value());
    INFO(nitro::memory::to_string(nitro::memory::snapshot()));
    CHECK(during->allocated_bytes - before->allocated_bytes >= bytes);
    CHECK(during->reserved_bytes >= during->allocated_bytes);
    CHECK(during->peak_allocated_bytes >= during->allocated_bytes);
  }
  const auto r = peak.result();
  REQUIRE(r.cuda.has_value());
  CHECK(r.cuda->start_allocated_bytes == before->allocated_bytes);
  CHECK(r.cuda->peak_allocated_delta_bytes >= bytes);
  CHECK(r.cuda->peak_allocated_delta_bytes < bytes + 2 * kMiB);  // the caching allocator rounds to 512 bytes
  CHECK(r.cuda->peak_allocated_bytes == r.cuda->start_allocated_bytes + r.cuda->peak_allocated_delta_bytes);
  CHECK(r.cuda->peak_reserved_bytes >= r.cuda->peak_allocated_bytes);
  // Freed again, and a new scope starts its peak from what is allocated now.
  CHECK(nitro::memory::cuda_memory()->allocated_bytes == before->allocated_bytes);
  nitro::memory::PeakScope again;
  CHECK(again.result().cuda->peak_allocated_delta_bytes == 0);
  nitro::memory::reset_peaks();
  CHECK(nitro::memory::cuda_memory()->peak_allocated_bytes == nitro::memory::cuda_memory()->allocated_bytes);
}

}  // namespace nitro_test_memory_monitor
