// memory/nvml.hpp: NVML loaded at run time. Here (no driver) it is absent and every figure is empty,
// never an error; the loading and reading path runs against a stand-in library with fixed answers.
#include <nitro/memory/monitor.hpp>
#include <nitro/memory/nvml.hpp>

#include "testing.hpp"

#include <unistd.h>

#include <filesystem>

namespace nitro_test_memory_nvml {  // one namespace per file: an area is compiled as one translation unit

namespace {
std::string fake_library() {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "libnitro_fake_nvml.so").string();
}
bool driver_present() { return nitro::memory::nvml_status().empty(); }
}  // namespace

TEST_CASE("nvml: absent here, the figures are empty and nothing throws") {
  if (driver_present()) {
    MESSAGE("an NVIDIA driver is present: the absent case is not what this machine shows");
    return;
  }
  CHECK(nitro::memory::nvml_status().find("libnvidia-ml.so.1") != std::string::npos);
  CHECK_FALSE(nitro::memory::gpu_activity(0).has_value());
  CHECK_FALSE(nitro::memory::gpu_activity(std::string("00000000:3b:00.0")).has_value());
  const auto s = nitro::memory::snapshot();
  CHECK_FALSE(s.gpu_activity.has_value());
  CHECK(nitro::memory::to_string(s).find("gpu busy") == std::string::npos);
}

TEST_CASE("nvml: a loaded library's figures, by PCI bus id, and what a library without NVML's entry points gives") {
  const nitro::memory::detail::Nvml nvml(fake_library().c_str());
  REQUIRE_MESSAGE(nvml.ok(), nvml.status());
  const auto a = nvml.activity("00000000:3b:00.0");
  REQUIRE(a.has_value());
  CHECK(a->gpu_percent == 87);
  CHECK(a->memory_percent == 41);
  CHECK(a->power_w == 251.5);
  CHECK(a->power_limit_w == 700.0);
  CHECK(a->temperature_c == 64);
  CHECK(nitro::memory::to_string(*a) == "gpu busy 87%, memory busy 41%, 251.5 W of 700 W, 64 C");
  CHECK_FALSE(nvml.activity("00000000:99:00.0").has_value());

  const nitro::memory::detail::Nvml wrong("libm.so.6");
  CHECK_FALSE(wrong.ok());
  CHECK(wrong.status().find("lacks an entry point") != std::string::npos);
  CHECK_FALSE(wrong.activity("00000000:3b:00.0").has_value());
  const nitro::memory::detail::Nvml missing("/nonexistent/libnvidia-ml.so.1");
  CHECK(missing.status().find("NVML not loaded") != std::string::npos);
}

}  // namespace nitro_test_memory_nvml
