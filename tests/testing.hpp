#pragma once
// What every test includes first (and what the precompiled header holds): LibTorch, then doctest.
//
// Order matters: c10 defines a glog-style CHECK macro that aborts the process and counts nothing.
// It is removed here so that CHECK is doctest's; a test that included doctest before LibTorch
// would silently get c10's.
#include <nitro/core/device.hpp>

#include <torch/torch.h>

#undef CHECK
// c10's enums have an ADL toString returning const char*; doctest's DOUBLE_STRINGIFY (defined for
// every test by CMake) turns that into text.
#include <doctest/doctest.h>

#include <sstream>

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

/// Decorator for a test case that needs a GPU: skipped, and reported as skipped, where none is present.
///   TEST_CASE("copies arrive intact" * nitro::test::needs_gpu()) { ... }
inline auto needs_gpu() { return doctest::skip(!nitro::Cuda::available()); }

}  // namespace nitro::test
