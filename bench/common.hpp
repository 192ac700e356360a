#pragma once
// Shared by the benchmark programs: timing that synchronises the GPU before reading the clock,
// medians, and the RESULT line every benchmark ends with (bench/README.md).
#include <nitro/core/device.hpp>
#include <nitro/io/file.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace nitro::bench {

/// Removes the directory tree `path` when it goes out of scope (nitro::io::remove_tree, errors ignored).
struct ScopedTree {
  explicit ScopedTree(std::filesystem::path p) : path(std::move(p)) {}
  ScopedTree(const ScopedTree&) = delete;
  ScopedTree& operator=(const ScopedTree&) = delete;
  ~ScopedTree() {
    std::error_code ignored;
    nitro::io::remove_tree(path, ignored);
  }
  std::filesystem::path path;
};

/// Waits for queued GPU work (when a GPU is in use), so a clock read after it covers that work.
inline void synchronize() {
#if NITRO_WITH_CUDA
  if (Cuda::available()) c10::cuda::device_synchronize();
#endif
}

/// Seconds taken by f(), GPU work included.
template <class F>
double seconds(F&& f) {
  synchronize();
  const auto start = std::chrono::steady_clock::now();
  f();
  synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Times two steps in alternating blocks (`rounds` rounds of `per_round` steps of each, the one
/// going first alternating), so drift in the machine's speed falls on both alike. Returns each
/// one's step times in seconds.
template <class A, class B>
std::pair<std::vector<double>, std::vector<double>> interleaved(A&& a, B&& b, int rounds, int per_round) {
  std::vector<double> ta, tb;
  for (int r = 0; r < rounds; ++r) {
    for (int order = 0; order < 2; ++order) {
      const bool a_now = (r + order) % 2 == 0;
      for (int i = 0; i < per_round; ++i) {
        if (a_now) ta.push_back(seconds(a));
        else tb.push_back(seconds(b));
      }
    }
  }
  return {std::move(ta), std::move(tb)};
}

/// Prints `RESULT name=value goal<op>goal PASS|MISS`; op is "<=" or ">=".
inline bool result(const std::string& name, double value, const std::string& op, double goal) {
  const bool pass = op == "<=" ? value <= goal : value >= goal;
  std::printf("RESULT %s=%.4g goal%s%g %s\n", name.c_str(), value, op.c_str(), goal, pass ? "PASS" : "MISS");
  std::fflush(stdout);
  return pass;
}

/// The machine, for the table's header.
inline std::string machine() {
  std::string s = std::to_string(std::thread::hardware_concurrency()) + " CPU threads";
  if (Cuda::available()) s += ", CUDA device present";
  return s;
}

}  // namespace nitro::bench
