#pragma once
// The definitions of nitro/memory/nvml.hpp's non-template functions: included by nvml.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/memory/nvml.hpp>

namespace nitro::memory::detail {

NITRO_INLINE Nvml::Nvml(const char* library) {
  handle_ = ::dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    const char* e = ::dlerror();
    status_ = std::string("NVML not loaded: ") + (e != nullptr ? e : library);
    return;
  }
  const auto sym = [&](auto& f, const char* name) {
    f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(::dlsym(handle_, name));
    return f != nullptr;
  };
  if (!sym(init_, "nvmlInit_v2") || !sym(by_pci_, "nvmlDeviceGetHandleByPciBusId_v2") ||
      !sym(utilization_, "nvmlDeviceGetUtilizationRates") || !sym(power_, "nvmlDeviceGetPowerUsage") ||
      !sym(limit_, "nvmlDeviceGetEnforcedPowerLimit") || !sym(temperature_, "nvmlDeviceGetTemperature")) {
    status_ = std::string("NVML not usable: ") + library + " lacks an entry point Nitro uses";
    return;
  }
  if (const int rc = init_(); rc != 0) {
    status_ = "NVML not usable: nvmlInit_v2 returned " + std::to_string(rc);
    return;
  }
  status_.clear();
}

NITRO_INLINE std::optional<GpuActivity> Nvml::activity(const std::string& pci_bus_id) const {
  if (!ok()) return std::nullopt;
  void* device = nullptr;
  if (by_pci_(pci_bus_id.c_str(), &device) != 0) return std::nullopt;
  GpuActivity a;
  a.pci_bus_id = pci_bus_id;
  Utilization u{};
  if (utilization_(device, &u) == 0) {
    a.gpu_percent = static_cast<int>(u.gpu);
    a.memory_percent = static_cast<int>(u.memory);
  }
  unsigned milliwatts = 0;
  if (power_(device, &milliwatts) == 0) a.power_w = milliwatts / 1000.0;
  if (limit_(device, &milliwatts) == 0) a.power_limit_w = milliwatts / 1000.0;
  unsigned celsius = 0;
  if (temperature_(device, 0 /* NVML_TEMPERATURE_GPU */, &celsius) == 0) a.temperature_c = static_cast<int>(celsius);
  return a;
}

NITRO_INLINE const Nvml& nvml() {
  static const Nvml instance([] {
    const char* path = std::getenv("NITRO_NVML_LIBRARY");
    return path != nullptr && *path != '\0' ? path : "libnvidia-ml.so.1";
  }());
  return instance;
}

}  // namespace nitro::memory::detail

namespace nitro::memory {

NITRO_INLINE std::optional<GpuActivity> gpu_activity(const std::string& pci_bus_id) {
  return detail::nvml().activity(pci_bus_id);
}

NITRO_INLINE std::optional<GpuActivity> gpu_activity(int device) {
#if NITRO_WITH_CUDA
  if (c10::cuda::device_count() == 0) return std::nullopt;
  if (!detail::nvml().ok()) return std::nullopt;
  const auto index = device < 0 ? c10::cuda::current_device() : static_cast<c10::DeviceIndex>(device);
  if (index >= c10::cuda::device_count()) return std::nullopt;
  // The PCI location of cudaDeviceProp (pciDomainID, pciBusID, pciDeviceID), read attribute by attribute.
  int domain = 0, bus_id = 0, device_id = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&domain, cudaDevAttrPciDomainId, index));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&bus_id, cudaDevAttrPciBusId, index));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&device_id, cudaDevAttrPciDeviceId, index));
  char bus[32];
  std::snprintf(bus, sizeof bus, "%08x:%02x:%02x.0", static_cast<unsigned>(domain), static_cast<unsigned>(bus_id),
                static_cast<unsigned>(device_id));
  return detail::nvml().activity(bus);
#else
  (void)device;
  return std::nullopt;
#endif
}

}  // namespace nitro::memory
