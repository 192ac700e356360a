#pragma once
// The definitions of nitro/core/device.hpp's non-template functions: included by device.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/core/device.hpp>

namespace nitro {

NITRO_INLINE c10::Device Auto::device(c10::DeviceIndex index) {
#if NITRO_WITH_CUDA
  if (Cuda::available()) return Cuda::device(index);
#endif
  (void)index;
  return Cpu::device();
}

NITRO_INLINE c10::Device concrete_device(c10::Device device, c10::DeviceIndex current) {
  if (device.is_cuda() && !device.has_index()) return c10::Device(c10::DeviceType::CUDA, current);
  return device;
}

NITRO_INLINE c10::Device concrete_device(c10::Device device) {
  if (!device.is_cuda() || device.has_index()) return device;
  // Through c10's device guard registry, so that this header needs no CUDA header.
  return concrete_device(device, c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index());
}

}  // namespace nitro

namespace nitro::detail {

NITRO_INLINE std::vector<c10::DeviceIndex> cuda_indices(const std::vector<c10::Device>& devices, c10::DeviceIndex current) {
  std::vector<c10::DeviceIndex> out;
  if (current >= 0) out.push_back(current);
  for (const auto& d : devices)
    if (d.is_cuda() && d.has_index()) out.push_back(d.index());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace nitro::detail

namespace nitro {

NITRO_INLINE void require_available(c10::Device device, std::string_view what) {
  NITRO_CHECK(device.is_cpu() || device.is_cuda(), what, ": device is ", device,
              "; give the CPU or a CUDA device (cuda, cuda:N)");
  if (!device.is_cuda()) return;
  NITRO_CHECK(NITRO_WITH_CUDA, what, ": device is ", device,
              ", but Nitro was built without CUDA (NITRO_WITH_CUDA is 0: a CPU-only LibTorch, or defined so); "
              "give the CPU, or build against a LibTorch with CUDA");
  NITRO_CHECK(Cuda::available(), what, ": device is ", device,
              ", but no CUDA device is available in this process (torch::cuda::is_available() is false: no GPU "
              "or driver); give the CPU, e.g. nitro::Auto::device(), which is the CPU there");
}

}  // namespace nitro
