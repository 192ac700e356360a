#pragma once
// The definitions of nitro/memory/tracking_allocator.hpp's non-template functions: included by tracking_allocator.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/memory/tracking_allocator.hpp>

namespace nitro::memory {

NITRO_INLINE TrackingAllocator::TrackingAllocator(c10::Allocator* base, TrackingOptions options) : base_(base), counters_(std::make_shared<Counters>()) {
  NITRO_CHECK(base_ != nullptr, "TrackingAllocator: the allocator to wrap is null");
  set_budget(options.budget_bytes);
}

NITRO_INLINE c10::DataPtr TrackingAllocator::allocate(std::size_t bytes) {
  const auto n = static_cast<std::int64_t>(bytes);
  // Reserve first, so concurrent allocations cannot pass the budget together.
  const auto live = counters_->live.fetch_add(n, std::memory_order_relaxed) + n;
  const auto budget = counters_->budget.load(std::memory_order_relaxed);
  if (budget > 0 && live > budget && n > 0) [[unlikely]] {
    counters_->live.fetch_sub(n, std::memory_order_relaxed);
    counters_->refused.fetch_add(1, std::memory_order_relaxed);
    refuse(n, live - n, budget);
  }
  c10::DataPtr inner;
  try {
    inner = base_->allocate(bytes);
  } catch (...) {
    counters_->live.fetch_sub(n, std::memory_order_relaxed);
    throw;
  }
  void* data = inner.get();
  if (data == nullptr) {  // empty: nothing to count
    counters_->live.fetch_sub(n, std::memory_order_relaxed);
    return inner;
  }
  const auto device = inner.device();
  const auto deleter = inner.get_deleter();
  void* context = inner.release_context();
  {
    auto& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    // A tracker wrapping another (nested scopes): the outer one registered this block first; it
    // is kept under this one's, and put back when this one's deleter has counted the free.
    auto& slot = t.blocks[data];
    auto below = slot.counters ? std::make_unique<Block>(std::move(slot)) : nullptr;
    slot = Block{context, deleter, n, counters_, std::move(below)};
  }
  auto peak = counters_->peak.load(std::memory_order_relaxed);
  while (live > peak && !counters_->peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
  counters_->allocated.fetch_add(n, std::memory_order_relaxed);
  counters_->allocations.fetch_add(1, std::memory_order_relaxed);
  return {data, data, &release, device};
}

NITRO_INLINE AllocationStats TrackingAllocator::stats() const noexcept {
  return {counters_->live.load(),        counters_->peak.load(),  counters_->allocated.load(),
          counters_->allocations.load(), counters_->frees.load(), counters_->refused.load()};
}

NITRO_INLINE void TrackingAllocator::set_budget(std::int64_t bytes) {
  NITRO_CHECK(bytes >= 0, "TrackingAllocator: budget_bytes must be >= 0 (0 means no budget), got ", bytes);
  counters_->budget.store(bytes);
}

NITRO_INLINE auto TrackingAllocator::table() -> Table& {
  static auto* t = new Table;  // never destroyed: blocks may be freed during static destruction
  return *t;
}

NITRO_INLINE void TrackingAllocator::release(void* data) {
  Block block;
  {
    auto& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    const auto it = t.blocks.find(data);
    if (it == t.blocks.end()) return;  // not ours: cannot happen, and never worth a crash
    block = std::move(it->second);
    if (block.below) it->second = std::move(*block.below);  // for the wrapped tracker's deleter
    else t.blocks.erase(it);
  }
  block.counters->live.fetch_sub(block.bytes, std::memory_order_relaxed);
  block.counters->frees.fetch_add(1, std::memory_order_relaxed);
  if (block.deleter != nullptr) block.deleter(block.context);
}

NITRO_INLINE ScopedCpuTracking::ScopedCpuTracking(TrackingOptions options) : previous_(c10::GetCPUAllocator()), tracker_(retire(std::make_unique<TrackingAllocator>(previous_, options))) {
  c10::SetCPUAllocator(tracker_, kPriority);
}

NITRO_INLINE TrackingAllocator* ScopedCpuTracking::retire(std::unique_ptr<TrackingAllocator> tracker) {
  static auto* mutex = new std::mutex;
  static auto* kept = new std::vector<std::unique_ptr<TrackingAllocator>>;
  std::lock_guard<std::mutex> lock(*mutex);
  kept->push_back(std::move(tracker));
  return kept->back().get();
}

}  // namespace nitro::memory
