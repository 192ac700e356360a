#include <nitro/core/compat.hpp>
#include <nitro/core/compat_autocast.hpp>

#include "testing.hpp"

#include <string>

namespace nitro_test_core_compat {  // one namespace per file: an area is compiled as one translation unit

TEST_CASE("NITRO_TORCH_VERSION agrees with the Torch package CMake found") {
  // NITRO_TEST_TORCH_VERSION is Torch_VERSION from TorchConfigVersion.cmake, e.g. "2.11.0".
  const std::string package = NITRO_TEST_TORCH_VERSION;
  const auto dot = package.find('.');
  REQUIRE(dot != std::string::npos);
  const int major = std::stoi(package.substr(0, dot));
  const int minor = std::stoi(package.substr(dot + 1));
  CHECK(NITRO_TORCH_VERSION == major * 100 + minor);
  CHECK(std::string(TORCH_VERSION).rfind(package.substr(0, package.rfind('.')), 0) == 0);
}

TEST_CASE("autocast wrappers drive LibTorch's autocast on the CPU") {
  const bool was_enabled = nitro::compat::autocast_enabled(c10::DeviceType::CPU);
  const auto was_dtype = nitro::compat::autocast_dtype(c10::DeviceType::CPU);
  const auto a = torch::randn({4, 4});
  CHECK(torch::mm(a, a).scalar_type() == torch::kFloat);

  nitro::compat::set_autocast_dtype(c10::DeviceType::CPU, torch::kBFloat16);
  nitro::compat::set_autocast_enabled(c10::DeviceType::CPU, true);
  nitro::compat::autocast_increment_nesting();
  CHECK(nitro::compat::autocast_enabled(c10::DeviceType::CPU));
  CHECK(at::autocast::is_autocast_enabled(c10::DeviceType::CPU));
  CHECK(torch::mm(a, a).scalar_type() == torch::kBFloat16);  // matmul really ran in bf16
  CHECK(nitro::compat::autocast_decrement_nesting() == 0);
  nitro::compat::autocast_clear_cache();

  nitro::compat::set_autocast_enabled(c10::DeviceType::CPU, was_enabled);
  nitro::compat::set_autocast_dtype(c10::DeviceType::CPU, was_dtype);
  CHECK(torch::mm(a, a).scalar_type() == torch::kFloat);
}

TEST_CASE("TF32 state is saved and restored exactly") {
  const auto before = nitro::compat::tf32_state();
  nitro::compat::set_tf32(true);
  CHECK(nitro::compat::tf32_enabled());
  nitro::compat::set_tf32(false);
  CHECK_FALSE(nitro::compat::tf32_enabled());
  nitro::compat::restore_tf32(before);
  const auto after = nitro::compat::tf32_state();
  CHECK(after.matmul == before.matmul);
  CHECK(after.conv == before.conv);
}

}  // namespace nitro_test_core_compat
