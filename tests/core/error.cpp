#include <nitro/core/error.hpp>

#include "testing.hpp"

#include <string>

namespace nitro_test_core_error {  // one namespace per file: an area is compiled as one translation unit

namespace {
int half_of_even(int x) {
  NITRO_EXPECTS(x % 2 == 0);
  const int h = x / 2;
  NITRO_ENSURES(h * 2 == x);
  return h;
}
}  // namespace

TEST_CASE("NITRO_CHECK throws nitro::Error with the parts streamed together") {
  CHECK_NOTHROW(NITRO_CHECK(1 + 1 == 2, "never built"));
  try {
    NITRO_CHECK(2 < 1, "option x must be in [", 0, ", ", 1.5, "], got ", std::string("seven"));
    FAIL("NITRO_CHECK did not throw");
  } catch (const nitro::Error& e) {
    CHECK(std::string(e.what()) == "option x must be in [0, 1.5], got seven");
  }
  // A user's mistake is a std::runtime_error, so generic handlers catch it too.
  CHECK_THROWS_AS(NITRO_CHECK(false, "x"), std::runtime_error);
}

TEST_CASE("contracts throw nitro::ContractViolation in tests, naming the condition") {
  CHECK(half_of_even(8) == 4);
  try {
    half_of_even(3);
    FAIL("NITRO_EXPECTS did not throw");
  } catch (const nitro::ContractViolation& e) {
    const std::string what = e.what();
    CHECK(what.find("precondition violated: x % 2 == 0") != std::string::npos);
    CHECK(what.find("error.cpp") != std::string::npos);
  }
  // A broken contract is a bug, not a user's mistake: it is not a nitro::Error.
  CHECK_THROWS_AS(half_of_even(5), std::logic_error);
}

}  // namespace nitro_test_core_error
