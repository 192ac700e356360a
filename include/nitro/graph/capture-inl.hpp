#pragma once
// The definitions of nitro/graph/capture.hpp's non-template functions: included by capture.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/graph/capture.hpp>

namespace nitro::graph::detail {

NITRO_INLINE bool TensorShape::matches(const at::Tensor& t) const {
  return t.scalar_type() == dtype && t.device() == device && t.sizes().equals(sizes) && t.strides().equals(strides);
}

#if NITRO_WITH_CUDA
NITRO_INLINE void Graph::abandon(cudaStream_t stream, c10::DeviceIndex device, c10::MempoolId_t pool) noexcept {
  if (!capture_ended_) {  // else capture_end got that far: reset() releases the pool, once
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t raw = nullptr;
      (void)cudaStreamEndCapture(stream, &raw);  // ends an invalidated capture too
      if (raw != nullptr) (void)cudaGraphDestroy(raw);
    }
    (void)cudaGetLastError();
    // Each may have been done already (capture_end ends the routing first) or never begun: then it
    // throws, and there is nothing to undo.
    quietly([&] { c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool); });
    quietly([&] { at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool); });
    quietly([&] { c10::cuda::CUDACachingAllocator::releasePool(device, pool); });
    quietly([&] { at::getHostAllocator(at::kCUDA)->release_pool(pool); });
  }
  (void)cudaGetLastError();
  // capture_begin put the generators in capture mode; only a capture_end that got that far takes them
  // out (its epilogue is not exported): else every later random draw would throw.
  for (auto& entry : captured_generator_states_) entry.first->capturing_ = false;
  quietly([&] { reset(); });  // forgets the capture id; releases the pool only if capture_end ended the capture
}
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE SideStream::SideStream(const c10::cuda::CUDAStream& current, const c10::cuda::CUDAStream& side) : current_(current), side_(side), guard_(side) {
  at::cuda::CUDAEvent ready;
  ready.record(current_);
  ready.block(side_);
}
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE SideStream::~SideStream() {
  try {
    at::cuda::CUDAEvent done;
    done.record(side_);
    done.block(current_);
  } catch (...) {  // nothing to do: an error here is the device's, the next CUDA call reports it
  }
}
#endif

}  // namespace nitro::graph::detail
