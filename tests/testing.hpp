#pragma once
// What every test includes first (and what the precompiled header holds): LibTorch, then doctest.
//
// Order matters: c10 defines a glog-style CHECK macro that aborts the process and counts nothing.
// It is removed here so that CHECK is doctest's; a test that included doctest before LibTorch
// would silently get c10's.
#include <nitro/core/device.hpp>
#include <nitro/io/file.hpp>

#include <torch/torch.h>

#undef CHECK
// c10's enums have an ADL toString returning const char*; doctest's DOUBLE_STRINGIFY (defined for
// every test by CMake) turns that into text.
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

namespace nitro::test {
/// How a failed CHECK prints a LibTorch value: through LibTorch's own operator<<.
template <class T>
struct StreamedByC10 {
  static doctest::String convert(const T& value) {
    std::ostringstream out;
    out << value;
    return out.str().c_str();
  }
};
}  // namespace nitro::test

template <>
struct doctest::StringMaker<c10::Device> : nitro::test::StreamedByC10<c10::Device> {};
template <>
struct doctest::StringMaker<c10::IntArrayRef> : nitro::test::StreamedByC10<c10::IntArrayRef> {};

namespace nitro::test {

/// Decorator of a test case that needs a GPU, whose name starts with "gpu: " (tests/CMakeLists.txt
/// checks that the two go together). Where no GPU is present, main() leaves such cases out and CTest
/// reports them skipped (tests/main.cpp); they are labelled `gpu`, and bench/run_gpu.sh runs
/// `ctest -L gpu`. `skip_anyway` skips it for another reason too (doctest keeps one skip decorator).
///   TEST_CASE("gpu: copies arrive intact" * nitro::test::needs_gpu()) { ... }
inline auto needs_gpu(bool skip_anyway = false) { return doctest::skip(skip_anyway); }

/// GPUs this process sees (0 without CUDA).
inline int gpu_count() { return nitro::Cuda::available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

}  // namespace nitro::test

namespace nitro::test {

/// Removes `p` and everything under it, errors ignored: nitro::io::remove_tree, not
/// std::filesystem::remove_all, which crashes in a program linked with LibTorch (io/file.hpp says why).
inline void remove_tree(const std::filesystem::path& p) {
  std::error_code ignored;
  nitro::io::remove_tree(p, ignored);
}

/// How many mappings of `file` this process holds (/proc/self/maps): a reader that refused a file
/// must leave none behind.
inline int mappings_of(const std::filesystem::path& file) {
  std::ifstream maps("/proc/self/maps");
  const std::string name = std::filesystem::absolute(file).lexically_normal().string();
  int n = 0;
  for (std::string line; std::getline(maps, line);) n += line.size() >= name.size() && line.ends_with(name) ? 1 : 0;
  return n;
}

/// A fresh path `<tmp>/<prefix>-<pid>-<n>` (created as an empty directory if asked), removed with
/// everything in it at scope exit.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix, bool create) {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           (prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    remove_tree(path);
    if (create) std::filesystem::create_directories(path);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() { remove_tree(path); }
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};

}  // namespace nitro::test
