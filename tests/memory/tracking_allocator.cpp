#include <nitro/memory/tracking_allocator.hpp>

#include "testing.hpp"

TEST_CASE("the tracking allocator counts exactly the bytes of the tensors allocated in its scope") {
  nitro::memory::ScopedCpuTracking track;
  CHECK(track.stats().live_bytes == 0);
  {
    const auto a = torch::empty({1000}, torch::kFloat);   // 4000 bytes
    const auto b = torch::empty({10, 10}, torch::kDouble);  // 800 bytes
    CHECK(track.stats().live_bytes == 4800);
    CHECK(track.stats().allocations == 2);
    {
      const auto c = torch::empty({256}, torch::kByte);  // 256 bytes
      CHECK(track.stats().live_bytes == 5056);
    }
    CHECK(track.stats().live_bytes == 4800);
    CHECK(track.stats().peak_bytes == 5056);
  }
  const auto s = track.stats();
  CHECK(s.live_bytes == 0);
  CHECK(s.peak_bytes == 5056);
  CHECK(s.allocated_bytes == 5056);
  CHECK(s.frees == 3);
  track.reset_peak();
  CHECK(track.stats().peak_bytes == 0);
  const auto d = torch::empty({4}, torch::kFloat);
  { const auto e = torch::empty({4}, torch::kFloat); }
  CHECK(track.stats().live_bytes == 16);
  CHECK(track.stats().peak_bytes == 32);
}

TEST_CASE("scopes restore the previous allocator, and memory freed after the scope is handled") {
  auto* before = c10::GetCPUAllocator();
  at::Tensor survivor;
  {
    nitro::memory::ScopedCpuTracking track;
    CHECK(c10::GetCPUAllocator() != before);
    survivor = torch::zeros({64});
  }
  CHECK(c10::GetCPUAllocator() == before);
  survivor = at::Tensor{};  // freed through the tracker's context after the tracker is gone
  CHECK_FALSE(survivor.defined());
}
