// libnitro_peer_tracking.so: Nitro's CPU tensor tracking (memory/tracking_allocator.hpp) behind a C
// interface, so that the Python peers (bench/peers/peer_torch.py, through ctypes) measure their CPU
// peak memory with the very counter the C++ side uses. It links the LibTorch of the Python process
// (the wheel's libc10.so, found through its rpath), so installing the tracker swaps the CPU allocator
// of that process's torch.
//
//   nitro_peer_tracking_begin();   // from here on every CPU tensor allocation is counted
//   ... steps ...
//   long long peak = nitro_peer_tracking_end();   // most bytes live at once since begin
#include <nitro/memory/tracking_allocator.hpp>

#include <memory>

namespace {
std::unique_ptr<nitro::memory::ScopedCpuTracking> scope;
}

extern "C" {

__attribute__((visibility("default"))) int nitro_peer_tracking_begin() {
  if (scope) return 1;
  scope = std::make_unique<nitro::memory::ScopedCpuTracking>();
  return 0;
}

__attribute__((visibility("default"))) long long nitro_peer_tracking_end() {
  if (!scope) return -1;
  const auto peak = scope->stats().peak_bytes;
  scope.reset();
  return peak;
}

}  // extern "C"
