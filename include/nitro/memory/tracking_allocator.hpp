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
//
// With a byte budget, an allocation that would take the live bytes over it throws
// c10::OutOfMemoryError, as the CUDA caching allocator does when the device is full: memory work (the
// batch-size finder, accumulate::Adaptive) runs and is tested on the CPU as it would on a GPU.
//
//   nitro::memory::ScopedCpuTracking track{{.budget_bytes = 64_MiB}};
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nitro::memory {

/// A TrackingAllocator's counts, in bytes and allocations, since it was made (peak: since reset_peak()).
struct AllocationStats {
  /// Bytes allocated and not yet freed.
  std::int64_t live_bytes = 0;
  /// The most live_bytes has been since creation or reset_peak().
  std::int64_t peak_bytes = 0;
  /// Bytes allocated in all (freed or not).
  std::int64_t allocated_bytes = 0;
  std::int64_t allocations = 0;  ///< Allocations made (refused ones not counted).
  std::int64_t frees = 0;        ///< Blocks freed.
  /// Allocations refused because they would have gone over the budget.
  std::int64_t refused = 0;
};

/// What a TrackingAllocator counts against.
struct TrackingOptions {
  /// Live bytes allowed at once; an allocation over it throws c10::OutOfMemoryError. 0: no budget.
  std::int64_t budget_bytes = 0;
};

/// Wraps another allocator and counts its allocations. Thread-safe; the counters outlive the
/// allocator, so memory it handed out may be freed after it is gone.
///
/// LibTorch needs "simple" data pointers from a CPU allocator (context == data, for raw_allocate),
/// so the bookkeeping of each live block sits in a process-wide table keyed by its address, behind
/// a mutex: one lock per allocation and per free. A measuring tool, not for the training hot path.
class TrackingAllocator final : public c10::Allocator {
 public:
  /// Counts what `base` (not owned; it must outlive every block) allocates. Throws nitro::Error when
  /// base is null or options.budget_bytes is negative.
  NITRO_INLINE explicit TrackingAllocator(c10::Allocator* base, TrackingOptions options = {});

  /// Allocates `bytes` from the base allocator and counts them. Throws c10::OutOfMemoryError when
  /// they would take the live bytes over the budget (the allocation is then counted as refused).
  NITRO_INLINE c10::DataPtr allocate(std::size_t bytes) override;

  /// The deleter of the blocks it hands out (context == data, as LibTorch's raw_allocate needs).
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  /// Copies `count` bytes (memcpy, as LibTorch's default).
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  /// The counts now.
  NITRO_INLINE AllocationStats stats() const noexcept;
  /// Starts a new peak from what is live now.
  void reset_peak() noexcept { counters_->peak.store(counters_->live.load()); }
  /// Live bytes allowed from now on (0: no budget). Lowering it below what is live refuses the
  /// next allocation, frees nothing.
  NITRO_INLINE void set_budget(std::int64_t bytes);
  /// Live bytes allowed (0: no budget).
  std::int64_t budget() const noexcept { return counters_->budget.load(); }
  /// The allocator wrapped.
  c10::Allocator* base() const noexcept { return base_; }

 private:
  struct Counters {
    std::atomic<std::int64_t> live{0}, peak{0}, allocated{0}, allocations{0}, frees{0}, refused{0}, budget{0};
  };

  [[noreturn, gnu::cold, gnu::noinline]] static void refuse(std::int64_t bytes, std::int64_t live, std::int64_t budget) {
    C10_THROW_ERROR(OutOfMemoryError,
                    c10::str("nitro::memory::TrackingAllocator: out of memory: tried to allocate ", bytes,
                             " bytes with ", live, " bytes live of a budget of ", budget,
                             " bytes (a CPU byte budget set by ScopedCpuTracking or set_budget)"));
  }
  struct Block {
    void* context = nullptr;  // the wrapped allocator's, freed with its deleter
    c10::DeleterFnPtr deleter = nullptr;
    std::int64_t bytes = 0;
    std::shared_ptr<Counters> counters;
    std::unique_ptr<Block> below;  // the wrapped tracker's block of the same memory, if it is one
  };
  struct Table {
    std::mutex mutex;
    std::unordered_map<void*, Block> blocks;
  };
  NITRO_INLINE static Table& table();
  NITRO_INLINE static void release(void* data);

  c10::Allocator* base_;
  std::shared_ptr<Counters> counters_;
};

/// Installs a TrackingAllocator as LibTorch's CPU allocator for a scope, then puts back the one that
/// was there. Scopes nest (the inner one counts what the outer one also counts).
///
/// While a scope is open, every thread's CPU allocations go through it (they count in its figures
/// and against its budget). Its allocator outlives the scope: another thread may have read the
/// allocator in force just before the scope ended and still be allocating through it, so it is
/// retired (kept, a few bytes) rather than destroyed.
class ScopedCpuTracking {
 public:
  /// Installs a TrackingAllocator over the CPU allocator in force. Throws nitro::Error when
  /// options.budget_bytes is negative.
  NITRO_INLINE explicit ScopedCpuTracking(TrackingOptions options = {});
  ScopedCpuTracking(const ScopedCpuTracking&) = delete;
  ScopedCpuTracking& operator=(const ScopedCpuTracking&) = delete;
  ~ScopedCpuTracking() { c10::SetCPUAllocator(previous_, kPriority); }

  /// The counts of the scope's allocator now.
  AllocationStats stats() const noexcept { return tracker_->stats(); }
  /// Starts a new peak from what is live now.
  void reset_peak() noexcept { tracker_->reset_peak(); }
  /// See TrackingAllocator::set_budget.
  void set_budget(std::int64_t bytes) { tracker_->set_budget(bytes); }
  /// Live bytes allowed (0: no budget).
  std::int64_t budget() const noexcept { return tracker_->budget(); }

 private:
  // SetCPUAllocator ignores a lower priority than the one in force; the highest always applies.
  static constexpr std::uint8_t kPriority = 255;
  // Every scope's allocator, kept for the life of the process (reachable, so not a leak to LSan).
  NITRO_INLINE static TrackingAllocator* retire(std::unique_ptr<TrackingAllocator> tracker);
  c10::Allocator* previous_;
  TrackingAllocator* tracker_;
};

}  // namespace nitro::memory

#if !NITRO_COMPILED
#include <nitro/memory/tracking_allocator-inl.hpp>
#endif
