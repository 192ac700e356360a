// Nitro's compiled library (NITRO_COMPILED, nitro::compiled): the non-template code of core/, io/, hw/
// and memory/, and what tells a program that its headers and this library belong together.
#include <nitro/core/compat-inl.hpp>
#include <nitro/core/compat_autocast-inl.hpp>
#include <nitro/core/device-inl.hpp>
#include <nitro/core/error-inl.hpp>
#include <nitro/core/rank-inl.hpp>
#include <nitro/core/state_dict-inl.hpp>
#include <nitro/hw/settings-inl.hpp>
#include <nitro/io/file-inl.hpp>
#include <nitro/memory/batch_size-inl.hpp>
#include <nitro/memory/monitor-inl.hpp>
#include <nitro/memory/nvml-inl.hpp>
#include <nitro/memory/oom-inl.hpp>
#include <nitro/memory/tracking_allocator-inl.hpp>
#include <nitro/memory/trial_loops-inl.hpp>
#include <nitro/memory/watch-inl.hpp>

#include <nitro/core/error.hpp>
#include <nitro/version.hpp>

#include <atomic>
#include <exception>
#include <string>

namespace {
// The NITRO_VERSION of the headers the program was built with, as its translation units say when the
// program starts (core/config.hpp); 0 until then.
std::atomic<int> headers_version{0};
// Whether a translation unit of the program was built with NITRO_THROW_ON_CONTRACT_VIOLATION.
std::atomic<bool> contract_violation_throws{false};

std::string version_text(int v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}
}  // namespace

extern "C" int nitro_compiled_library_is_not_linked__link_nitro_compiled(int version) noexcept {
  headers_version.store(version, std::memory_order_relaxed);
  return 0;
}

namespace nitro::detail {
void throw_on_contract_violation() noexcept { contract_violation_throws.store(true, std::memory_order_relaxed); }

void library_contract_violation(const char* kind, const char* cond, const char* file, int line) {
  if (contract_violation_throws.load(std::memory_order_relaxed)) contract_violation(kind, cond, file, line);
  std::terminate();
}

void check_library_version() {
  const int headers = headers_version.load(std::memory_order_relaxed);
  NITRO_CHECK(headers == 0 || headers == NITRO_VERSION, "nitro: this program was built with the headers of Nitro ",
              version_text(headers), " but links the compiled library of Nitro ", version_text(NITRO_VERSION),
              " (nitro::compiled); build both from the same Nitro, or build the program header-only (without "
              "NITRO_COMPILED)");
}
}  // namespace nitro::detail
