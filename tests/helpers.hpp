#pragma once
// Shared by the tests.
#include <nitro/core/device.hpp>

#include <doctest/doctest.h>

namespace nitro::test {

/// Decorator for a test case that needs a GPU: skipped, and said so, where none is present.
///   TEST_CASE("copies arrive intact" * nitro::test::needs_gpu()) { ... }
inline auto needs_gpu() { return doctest::skip(!nitro::Cuda::available()); }

}  // namespace nitro::test
