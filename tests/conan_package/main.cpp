#include <nitro/core/error.hpp>
#include <nitro/version.hpp>

#include <cstdio>

int main() {
  try {
    NITRO_CHECK(NITRO_VERSION_MAJOR < 0, "checked");
    return 1;
  } catch (const nitro::Error&) {
  }
  std::printf("nitro test_package: version %d.%d.%d\n", NITRO_VERSION_MAJOR, NITRO_VERSION_MINOR, NITRO_VERSION_PATCH);
  return 0;
}
