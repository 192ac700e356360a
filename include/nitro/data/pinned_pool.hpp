#pragma once
// nitro::PinnedPool: page-locked host buffers reused across batches, so a prefetcher stages each batch
// in pinned memory (what an asynchronous host-to-device copy needs) without a pinned allocation per
// batch in the steady state. A buffer given back with an event is reused only once the event has
// completed, i.e. once the copy that read it is done. CUDA builds only (NITRO_WITH_CUDA).
#include <nitro/core/config.hpp>
#include <nitro/core/device.hpp>

#if NITRO_WITH_CUDA
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/ops/empty.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace nitro {

class PinnedPool {
 public:
  /// A pinned byte buffer of at least `bytes` (sizes are rounded up to powers of two, so buffers of
  /// similar batches are shared): a free one whose last copy has completed, else a new one.
  at::Tensor acquire(std::size_t bytes) {
    const std::size_t size = std::bit_ceil(std::max<std::size_t>(bytes, 512));
    std::lock_guard guard(mutex_);
    auto& free = free_[size];
    for (auto it = free.begin(); it != free.end(); ++it) {
      if (!it->done || it->done->query()) {
        at::Tensor buffer = std::move(it->buffer);
        free.erase(it);
        ++reused_;
        return buffer;
      }
    }
    ++allocated_;
    return at::empty({static_cast<std::int64_t>(size)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  }

  /// Gives buffers back; they become reusable when `done` (recorded after the copies that read
  /// them) has completed.
  void release(std::vector<at::Tensor> buffers, std::shared_ptr<at::cuda::CUDAEvent> done) {
    std::lock_guard guard(mutex_);
    for (auto& b : buffers) free_[static_cast<std::size_t>(b.numel())].push_back({std::move(b), done});
  }

  /// A copy of `batch` whose CPU tensors live in pinned buffers of this pool, those already pinned
  /// included (their owner may refill them while the copy from the pool's buffer is in flight); the
  /// buffers used are appended to `used` (release them once the copies from them are queued and an
  /// event recorded).
  template <Batch B>
  B stage(const B& batch, std::vector<at::Tensor>& used) {
    return map_tensors(batch, [&](const at::Tensor& t) -> at::Tensor {
      if (!t.defined() || !t.device().is_cpu()) return t;
      const auto bytes = static_cast<std::size_t>(t.numel()) * t.element_size();
      at::Tensor buffer = acquire(bytes);
      used.push_back(buffer);
      at::Tensor view = buffer.narrow(0, 0, static_cast<std::int64_t>(bytes)).view(t.scalar_type()).view(t.sizes());
      view.copy_(t);
      return view;
    });
  }

  /// Pinned buffers made, and acquisitions served by reuse (for tests: the steady state makes none).
  [[nodiscard]] std::size_t allocated() const {
    std::lock_guard guard(mutex_);
    return allocated_;
  }
  [[nodiscard]] std::size_t reused() const {
    std::lock_guard guard(mutex_);
    return reused_;
  }

 private:
  struct Free {
    at::Tensor buffer;
    std::shared_ptr<at::cuda::CUDAEvent> done;
  };
  mutable std::mutex mutex_;
  std::map<std::size_t, std::vector<Free>> free_;
  std::size_t allocated_ = 0, reused_ = 0;
};

}  // namespace nitro
#endif
