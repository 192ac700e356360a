#pragma once
// nitro::PinnedPool: stages a prefetcher's CPU tensors in page-locked memory (what an asynchronous
// host-to-device copy needs), from LibTorch's caching host allocator. CUDA builds only
// (NITRO_WITH_CUDA).
//
// LibTorch's allocator already does what a pool of pinned buffers is for: a freed block is reused
// only once the events recorded on it have completed, and at::native::copy_kernel_cuda records one
// for every non-blocking copy from such a block (at::getHostAllocator(kCUDA)->record_event), so a
// staging tensor may be dropped as soon as its copy is queued. It allocates outside its free lists'
// locks, keeps per-size free lists (rounded up to powers of two), and is what PyTorch's DataLoader
// uses for pin_memory. Nitro's earlier pool kept a second cache of such blocks on top of it (also
// rounded to powers of two, its mutex held while LibTorch allocated); it is gone. Which one is faster
// was not measured (no GPU was lent to the session that chose): bench_prefetch's GPU rows and the
// prefetcher's GPU tests measure this one against raw pinned copies.
#include <nitro/core/config.hpp>
#include <nitro/core/device.hpp>

#if NITRO_WITH_CUDA
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAEvent.h>  // at::cuda::CUDAEvent (ATen/cuda/CUDAEvent.h adds cuBLAS, cuSPARSE, cuSOLVER)
#include <ATen/ops/empty.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace nitro {

/// Stages a batch's CPU tensors in pinned memory from LibTorch's caching host allocator, and counts
/// how often that allocator had to allocate (see the top of this header). CUDA builds only.
class PinnedPool {
 public:
  /// A pinned tensor of `t`'s shape and dtype (contiguous) holding a copy of `t`.
  NITRO_INLINE static at::Tensor pinned_copy(const at::Tensor& t);

  /// A copy of `batch` whose CPU tensors live in pinned memory, those already pinned included (their
  /// owner may refill them while the copy from the staged one is in flight). Drop the staged tensors
  /// once their non-blocking copies are queued: LibTorch reuses the memory after the copies end.
  template <Batch B>
  B stage(const B& batch) {
    return map_tensors(batch, [&](const at::Tensor& t) -> at::Tensor {
      if (!t.defined() || !t.device().is_cpu()) return t;
      if (staged_.fetch_add(1, std::memory_order_relaxed) == 0) start_.store(host_allocs());  // first use
      return pinned_copy(t);
    });
  }

  /// Tensors staged by this pool.
  [[nodiscard]] std::size_t staged() const noexcept { return staged_.load(std::memory_order_relaxed); }
  /// Pinned blocks LibTorch's allocator had to allocate (cudaHostAlloc) since this pool first staged,
  /// in the whole process: in a steady state with one prefetcher, at most its window of batches'
  /// worth, then none.
  [[nodiscard]] NITRO_INLINE std::size_t allocated() const;
  /// Staged tensors served from blocks LibTorch had already (an estimate from process-wide counts).
  [[nodiscard]] NITRO_INLINE std::size_t reused() const;

 private:
  static std::int64_t host_allocs() { return at::getHostAllocator(at::kCUDA)->get_stats().num_host_alloc; }

  std::atomic<std::int64_t> start_{-1};  // host allocations when the first tensor was staged
  std::atomic<std::size_t> staged_{0};
};

}  // namespace nitro
#endif

#if !NITRO_COMPILED
#include <nitro/data/pinned_pool-inl.hpp>
#endif
