#include <nitro/hw/settings.hpp>

#include <ATen/Parallel.h>
#if NITRO_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>
#endif
#include "testing.hpp"

#include <cmath>
#include <future>
#include <limits>
#include <string>

#if defined(__linux__)
#include "child.hpp"
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <atomic>
#include <thread>
#endif

namespace nitro_test_hw_settings {  // one namespace per file: an area is compiled as one translation unit

namespace {

std::string error_of(const nitro::hw::Settings& s) {
  try {
    nitro::hw::ScopedSettings scope{s};
  } catch (const nitro::Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct Snapshot {
  bool benchmark = at::globalContext().benchmarkCuDNN();
  bool deterministic = at::globalContext().deterministicCuDNN();
  bool algorithms = at::globalContext().deterministicAlgorithms();
  nitro::compat::Tf32State tf32 = nitro::compat::tf32_state();
  int threads = at::get_num_threads();
  bool operator==(const Snapshot& o) const {
    return benchmark == o.benchmark && deterministic == o.deterministic && algorithms == o.algorithms &&
           tf32.matmul == o.tf32.matmul && tf32.conv == o.tf32.conv && threads == o.threads;
  }
};

}  // namespace

TEST_CASE("bad settings name the setting and the allowed range") {
  CHECK(contains(error_of({.intra_op_threads = -2}), "intra_op_threads must be >= 1, got -2"));
  CHECK(contains(error_of({.intra_op_threads = 0}), "intra_op_threads must be >= 1"));
  CHECK(contains(error_of({.inter_op_threads = -1}), "inter_op_threads must be >= 1, got -1"));
  for (double f : {0.0, -0.5, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(f);
    CHECK(contains(error_of({.cuda_memory_fraction = f}), "cuda_memory_fraction must be in (0, 1]"));
  }
  if (!nitro::Cuda::available()) {
    CHECK(contains(error_of({.cuda_memory_fraction = 0.5}), "needs a cuda device"));
  }
}

TEST_CASE("a rejected Settings changes nothing") {
  const Snapshot before;
  CHECK_THROWS_AS(nitro::hw::ScopedSettings({.cudnn_benchmark = !before.benchmark, .tf32 = true,
                                             .intra_op_threads = 1, .cuda_memory_fraction = 2.0}),
                  nitro::Error);
  CHECK(Snapshot{} == before);
}

TEST_CASE("ScopedSettings applies every setting and restores each on exit, nested too") {
  const Snapshot before;
  const int threads = before.threads == 1 ? 2 : 1;
  {
    nitro::hw::ScopedSettings outer{{.cudnn_benchmark = !before.benchmark,
                                     .cudnn_deterministic = !before.deterministic,
                                     .deterministic_algorithms = !before.algorithms,
                                     .tf32 = !nitro::compat::tf32_enabled(),
                                     .intra_op_threads = threads}};
    CHECK(at::globalContext().benchmarkCuDNN() == !before.benchmark);
    CHECK(at::globalContext().deterministicCuDNN() == !before.deterministic);
    CHECK(at::globalContext().deterministicAlgorithms() == !before.algorithms);
    CHECK(at::get_num_threads() == threads);
    const Snapshot inside;
    {
      nitro::hw::ScopedSettings inner{nitro::hw::Settings::fast()};
      CHECK(at::globalContext().benchmarkCuDNN());
      CHECK(nitro::compat::tf32_enabled());
      CHECK(at::globalContext().deterministicCuDNN() == !before.deterministic);  // untouched field
    }
    CHECK(Snapshot{} == inside);
  }
  CHECK(Snapshot{} == before);
}

TEST_CASE("current() reports what is in force and the presets say what they set") {
  nitro::hw::ScopedSettings scope{nitro::hw::Settings::reproducible()};
  const auto now = nitro::hw::current();
  CHECK(now.cudnn_benchmark == false);
  CHECK(now.cudnn_deterministic == true);
  CHECK(now.deterministic_algorithms == true);
  CHECK(now.tf32 == false);
  CHECK(now.intra_op_threads == at::get_num_threads());
  CHECK(now.inter_op_threads == static_cast<int>(at::get_num_interop_threads()));
}

TEST_CASE("inter-op threads: the same value is a no-op, a change after parallel work is refused with the reason") {
  // Start LibTorch's inter-op pool, after which it can no longer be resized.
  std::promise<void> ran;
  at::launch([&] { ran.set_value(); });
  ran.get_future().wait();
  const int now = static_cast<int>(at::get_num_interop_threads());
  CHECK_NOTHROW(nitro::hw::ScopedSettings({.inter_op_threads = now}));
  const auto message = error_of({.inter_op_threads = now + 1});
  CHECK(contains(message, "inter_op_threads can no longer be changed"));
  CHECK(contains(message, "once per process"));
  CHECK(static_cast<int>(at::get_num_interop_threads()) == now);
}

TEST_CASE("gpu: cuda_memory_fraction caps the caching allocator for the scope" * nitro::test::needs_gpu()) {
#if NITRO_WITH_CUDA
  const auto device = c10::cuda::current_device();
  const auto before = nitro::compat::cuda_memory_fraction(device);
  {
    nitro::hw::ScopedSettings scope{{.cuda_memory_fraction = 0.25}};
    if (before) CHECK(*nitro::compat::cuda_memory_fraction(device) == doctest::Approx(0.25));
    // An allocation above a quarter of the device is refused by the allocator while the cap holds.
    size_t free_bytes = 0, total_bytes = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const auto too_big = static_cast<std::int64_t>(static_cast<double>(total_bytes) * 0.3);
    CHECK_THROWS(torch::empty({too_big}, torch::dtype(torch::kUInt8).device(torch::kCUDA)));
  }
  if (before) CHECK(*nitro::compat::cuda_memory_fraction(device) == doctest::Approx(*before));
#endif
}

#if defined(__linux__)



namespace {
std::vector<int> cpus_of_thread(pid_t tid) { return nitro::hw::detail::cpus_of(tid); }
int nice_of_thread(pid_t tid) { return nitro::hw::detail::nice_of(tid).value_or(-99); }
pid_t this_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }
}  // namespace

TEST_CASE("cpu_affinity and nice apply to every thread of the process and are restored at scope exit") {
  const auto all = cpus_of_thread(0);
  REQUIRE_FALSE(all.empty());
  const int before_nice = nice_of_thread(this_tid());
  // A second thread that exists before the scope: it must be changed and restored too.
  std::atomic<pid_t> other{0};
  std::atomic<bool> done{false};
  std::thread t([&] {
    other = this_tid();
    while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (other == 0) std::this_thread::yield();
  const int target = before_nice + 3 <= 19 ? before_nice + 3 : 19;
  {
    nitro::hw::ScopedSettings scope{{.cpu_affinity = std::vector<int>{all.front()}, .nice = target}};
    CHECK(cpus_of_thread(0) == std::vector<int>{all.front()});
    CHECK(cpus_of_thread(other) == std::vector<int>{all.front()});
    CHECK(nice_of_thread(this_tid()) == target);
    CHECK(nice_of_thread(other) == target);
    const auto now = nitro::hw::current();
    CHECK(now.cpu_affinity == std::optional<std::vector<int>>(std::vector<int>{all.front()}));
    CHECK(now.nice == std::optional<int>(target));
    // A thread started inside the scope inherits both.
    std::vector<int> inner_cpus;
    int inner_nice = -99;
    std::thread([&] {
      inner_cpus = cpus_of_thread(0);
      inner_nice = nice_of_thread(this_tid());
    }).join();
    CHECK(inner_cpus == std::vector<int>{all.front()});
    CHECK(inner_nice == target);
  }
  CHECK(cpus_of_thread(0) == all);
  CHECK(cpus_of_thread(other) == all);
  CHECK(nice_of_thread(this_tid()) == before_nice);
  CHECK(nice_of_thread(other) == before_nice);
  done = true;
  t.join();
}

TEST_CASE("cpu_affinity and nice out of range are refused before anything changes") {
  const auto all = cpus_of_thread(0);
  const long configured = ::sysconf(_SC_NPROCESSORS_CONF);
  CHECK(contains(error_of({.cpu_affinity = std::vector<int>{}}), "cpu_affinity is empty"));
  CHECK(contains(error_of({.cpu_affinity = std::vector<int>{static_cast<int>(configured)}}),
                 "this machine's CPUs are 0.."));
  CHECK(contains(error_of({.cpu_affinity = std::vector<int>{-1}}), "names CPU -1"));
  CHECK(contains(error_of({.nice = 20}), "nice must be in [-20, 19], got 20"));
  CHECK(contains(error_of({.nice = -21}), "nice must be in [-20, 19]"));
  // A valid field and an invalid one: nothing changed.
  CHECK_THROWS_AS(nitro::hw::ScopedSettings({.intra_op_threads = 0, .cpu_affinity = std::vector<int>{all.front()}}),
                  nitro::Error);
  CHECK(cpus_of_thread(0) == all);
}

// Run as an unprivileged user (nobody): a negative nice, and a raise it could not undo, are refused
// with what to do; the nice value is unchanged.
NITRO_TEST_CHILD(unprivileged_nice) {
  if (::setgid(65534) != 0 || ::setuid(65534) != 0) return 3;  // could not drop privileges
  const int before = ::getpriority(PRIO_PROCESS, 0);
  rlimit lim{};
  ::getrlimit(RLIMIT_NICE, &lim);
  if (lim.rlim_cur != 0) return 4;  // the test assumes the default limit
  int failures = 0;
  try {
    nitro::hw::ScopedSettings s{{.nice = before - 5}};
    ++failures;
  } catch (const nitro::Error& e) {
    if (std::string(e.what()).find("may not lower a nice value") == std::string::npos) ++failures;
  }
  try {
    nitro::hw::ScopedSettings s{{.nice = before + 2}};
    ++failures;
  } catch (const nitro::Error& e) {
    if (std::string(e.what()).find("could not be undone") == std::string::npos) ++failures;
  }
  if (::getpriority(PRIO_PROCESS, 0) != before) ++failures;
  return failures == 0 ? 0 : 10 + failures;
}

TEST_CASE("without privilege, a lower nice (or one that could not be undone) is a clear error") {
  if (::geteuid() != 0) {
    MESSAGE("not root: the child cannot switch to user nobody; skipped");
    return;
  }
  CHECK(nitro::test::run_child("unprivileged_nice", {}) == 0);
}

// What a training step does to glibc's heap: many 1 MiB blocks (an MLP's gradients) freed together
// at the top of the heap, then allocated and written again. Exit code: the minor page faults of
// rounds 5 to 24, in hundreds (at most 250). With "keep", Settings::heap() first.
NITRO_TEST_CHILD(heap_faults) {
  if (!args.empty() && args[0] == "keep") {
    nitro::hw::ScopedSettings heap{nitro::hw::Settings::heap()};  // glibc's thresholds stay set after the scope
  }
  const auto faults = [] {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return static_cast<long>(u.ru_minflt);
  };
  long before = 0;
  for (int round = 0; round < 25; ++round) {
    if (round == 5) before = faults();
    std::vector<at::Tensor> grads;
    for (int i = 0; i < 16; ++i) grads.push_back(at::empty({1 << 18}, at::kFloat).fill_(1.0f));  // 1 MiB each
  }
  return static_cast<int>(std::min<long>((faults() - before) / 100, 250));
}

TEST_CASE("cpu_heap_keep_bytes keeps the heap: a step's freed memory is reused without page faults") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  MESSAGE("a sanitizer's allocator replaces glibc's malloc here: the page faults are not glibc's; skipped");
#else
  // Fresh processes: glibc's thresholds depend on the process's history.
  const int plain = nitro::test::run_child("heap_faults", {"plain"});
  const int kept = nitro::test::run_child("heap_faults", {"keep"});
  CHECK(plain >= 10);  // >= 1000 faults: 16 MiB given back and faulted in again each round
  CHECK(kept == 0);    // < 100 faults
#endif
  CHECK(nitro::hw::Settings::heap().cpu_heap_keep_bytes == std::int64_t{128} << 20);
  CHECK(nitro::hw::Settings::fast().cpu_heap_keep_bytes == std::int64_t{128} << 20);
  CHECK(error_of({.cpu_heap_keep_bytes = 1000}).find("cpu_heap_keep_bytes must be in [1 MiB, 1 GiB]") !=
        std::string::npos);
}
#endif

}  // namespace nitro_test_hw_settings
