#pragma once
// Exact CPU tensor memory figures: a wrapper of LibTorch's CPU allocator that counts live and peak
// bytes, installable for a scope. It makes memory work measurable and testable without a GPU.
//
//   nitro::memory::ScopedCpuTracking track;          // every CPU tensor allocated from here on is counted
//   auto y = model->forward(x);
//   std::printf("peak %lld bytes\n", static_cast<long long>(track.stats().peak_bytes));
//
// Counts what goes through c10::GetCPUAllocator() (CPU tensors); pinned host memory and GPU memory
// are not counted here. Allocations made before the scope and freed inside it are not subtracted.
#include <nitro/core/error.hpp>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

namespace nitro::memory {

struct AllocationStats {
  /// Bytes allocated and not yet freed.
  std::int64_t live_bytes = 0;
  /// The most live_bytes has been since creation or reset_peak().
  std::int64_t peak_bytes = 0;
  /// Bytes allocated in all (freed or not).
  std::int64_t allocated_bytes = 0;
  std::int64_t allocations = 0;
  std::int64_t frees = 0;
};

/// Wraps another allocator and counts its allocations. Thread-safe; the counters outlive the
/// allocator, so memory it handed out may be freed after it is gone.
class TrackingAllocator final : public c10::Allocator {
 public:
  explicit TrackingAllocator(c10::Allocator* base) : base_(base), counters_(std::make_shared<Counters>()) {
    NITRO_CHECK(base_ != nullptr, "TrackingAllocator: the allocator to wrap is null");
  }

  c10::DataPtr allocate(std::size_t bytes) override {
    auto inner = base_->allocate(bytes);
    const auto n = static_cast<std::int64_t>(bytes);
    const auto live = counters_->live.fetch_add(n, std::memory_order_relaxed) + n;
    auto peak = counters_->peak.load(std::memory_order_relaxed);
    while (live > peak && !counters_->peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
    counters_->allocated.fetch_add(n, std::memory_order_relaxed);
    counters_->allocations.fetch_add(1, std::memory_order_relaxed);
    void* data = inner.get();
    const auto device = inner.device();
    auto* context = new Context{std::move(inner), n, counters_};
    return {data, context, &release, device};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  AllocationStats stats() const noexcept {
    return {counters_->live.load(), counters_->peak.load(), counters_->allocated.load(), counters_->allocations.load(),
            counters_->frees.load()};
  }
  /// Starts a new peak from what is live now.
  void reset_peak() noexcept { counters_->peak.store(counters_->live.load()); }
  c10::Allocator* base() const noexcept { return base_; }

 private:
  struct Counters {
    std::atomic<std::int64_t> live{0}, peak{0}, allocated{0}, allocations{0}, frees{0};
  };
  struct Context {
    c10::DataPtr inner;  // freeing the context frees the memory through the wrapped allocator
    std::int64_t bytes;
    std::shared_ptr<Counters> counters;
  };
  static void release(void* p) {
    auto* context = static_cast<Context*>(p);
    context->counters->live.fetch_sub(context->bytes, std::memory_order_relaxed);
    context->counters->frees.fetch_add(1, std::memory_order_relaxed);
    delete context;
  }

  c10::Allocator* base_;
  std::shared_ptr<Counters> counters_;
};

/// Installs a TrackingAllocator as LibTorch's CPU allocator for a scope, then puts back the one that
/// was there. Scopes nest (the inner one counts what the outer one also counts).
class ScopedCpuTracking {
 public:
  ScopedCpuTracking() : previous_(c10::GetCPUAllocator()), tracker_(previous_) {
    c10::SetCPUAllocator(&tracker_, kPriority);
  }
  ScopedCpuTracking(const ScopedCpuTracking&) = delete;
  ScopedCpuTracking& operator=(const ScopedCpuTracking&) = delete;
  ~ScopedCpuTracking() { c10::SetCPUAllocator(previous_, kPriority); }

  AllocationStats stats() const noexcept { return tracker_.stats(); }
  void reset_peak() noexcept { tracker_.reset_peak(); }

 private:
  // SetCPUAllocator ignores a lower priority than the one in force; the highest always applies.
  static constexpr std::uint8_t kPriority = 255;
  c10::Allocator* previous_;
  TrackingAllocator tracker_;
};

}  // namespace nitro::memory
