#include <nitro/memory/tracking_allocator.hpp>

#include "testing.hpp"

#include <atomic>
#include <thread>

namespace nitro_test_memory_tracking_allocator {  // one namespace per file: an area is compiled as one translation unit

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

TEST_CASE("a byte budget refuses an allocation over it with c10::OutOfMemoryError and counts nothing for it") {
  nitro::memory::ScopedCpuTracking track{{.budget_bytes = 10000}};
  const auto a = torch::empty({2000}, torch::kFloat);  // 8000 bytes
  CHECK_THROWS_WITH_AS(torch::empty({1000}, torch::kFloat), doctest::Contains("out of memory"), c10::OutOfMemoryError);
  CHECK(track.stats().live_bytes == 8000);
  CHECK(track.stats().refused == 1);
  const auto b = torch::empty({500}, torch::kFloat);  // 2000 bytes: exactly at the budget
  CHECK(track.stats().live_bytes == 10000);
  track.set_budget(0);  // no budget
  const auto c = torch::empty({1000}, torch::kFloat);
  CHECK(track.stats().live_bytes == 14000);
  CHECK_THROWS_AS(track.set_budget(-1), nitro::Error);
}

TEST_CASE("the out-of-memory error of a budget keeps its type through autograd's backward") {
  auto w = torch::randn({256, 256}, torch::requires_grad());
  const auto x = torch::randn({512, 256});
  nitro::memory::ScopedCpuTracking track;
  auto loss = torch::relu(x.matmul(w)).matmul(w).sum();
  track.set_budget(track.stats().live_bytes + 4096);  // backward needs far more
  CHECK_THROWS_AS(loss.backward(), c10::OutOfMemoryError);
}

TEST_CASE("nested scopes both count a block and free it once, whichever scope ends first") {
  nitro::memory::ScopedCpuTracking outer;
  at::Tensor kept;
  {
    nitro::memory::ScopedCpuTracking inner;
    auto freed_inside = torch::empty({1024}, torch::kFloat);  // 4096 bytes
    kept = torch::empty({2048}, torch::kFloat);                 // 8192 bytes, freed after the inner scope
    CHECK(inner.stats().live_bytes == 4096 + 8192);
    CHECK(outer.stats().live_bytes == 4096 + 8192);
    freed_inside.reset();
    CHECK(inner.stats().live_bytes == 8192);
    CHECK(outer.stats().live_bytes == 8192);  // each tracker counted the free (before the fix: outer kept it)
  }
  kept.reset();
  CHECK(outer.stats().live_bytes == 0);
  CHECK(outer.stats().frees == 2);
  // Memory really returned: many nested rounds of a large tensor keep the outer live count at 0.
  for (int i = 0; i < 50; ++i) {
    nitro::memory::ScopedCpuTracking inner;
    (void)torch::empty({64 << 20}, torch::kByte);
  }
  CHECK(outer.stats().live_bytes == 0);
}

TEST_CASE("scopes opened and closed while another thread allocates: every block is freed where it was counted") {
  // Under ASan this caught a scope's allocator used by the other thread after the scope had destroyed it.
  std::atomic<bool> stop{false};
  std::thread other([&] {
    while (!stop.load()) {
      auto t = at::empty({256}, at::kFloat);
      (void)t;
    }
  });
  nitro::memory::ScopedCpuTracking outer;
  for (int i = 0; i < 2000; ++i) {
    nitro::memory::ScopedCpuTracking scope;
    (void)at::empty({64}, at::kFloat);
  }
  stop = true;
  other.join();
  CHECK(outer.stats().live_bytes == 0);
  CHECK(outer.stats().allocations == outer.stats().frees);
}

}  // namespace nitro_test_memory_tracking_allocator
