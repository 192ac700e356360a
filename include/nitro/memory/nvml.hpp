#pragma once
// GPU utilisation, power and temperature from NVML, loaded at run time: no link-time dependency on
// the driver's library, and where it is absent (no driver, a CPU machine) the figures are simply not
// there, never an error.
//
//   if (auto a = nitro::memory::gpu_activity(0)) std::printf("busy %d%%, %.0f W\n", a->gpu_percent, a->power_w);
//   nitro::memory::nvml_status()   // "" when NVML is loaded, else why not
//
// The library is `libnvidia-ml.so.1` (the NVIDIA driver's), or the path in NITRO_NVML_LIBRARY. It is
// loaded (dlopen) and initialised once per process, on the first call, and never unloaded. A CUDA
// device is found in NVML by its PCI bus id, so CUDA_VISIBLE_DEVICES and CUDA's device order do not
// mix up devices. memory::snapshot() fills MemorySnapshot::gpu_activity with it.
#include <nitro/core/config.hpp>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>

#if NITRO_WITH_CUDA
// Not ATen/cuda/CUDAContextLight.h: it includes cuBLAS's, cuSPARSE's and cuSOLVER's headers.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cuda_runtime_api.h>
#endif

namespace nitro::memory {

/// One GPU as NVML sees it; -1 where NVML did not say.
struct GpuActivity {
  /// NVML's "domain:bus:device.function" of the GPU.
  std::string pci_bus_id;
  /// Share of the last sample period in which a kernel ran, and in which device memory was read or written.
  int gpu_percent = -1;
  int memory_percent = -1;
  /// Board power draw and the enforced limit, in watts.
  double power_w = -1;
  double power_limit_w = -1;
  int temperature_c = -1;
};

namespace detail {

/// NVML's few entry points, from a library loaded with dlopen. Usable alone (tests load a stand-in).
class Nvml {
 public:
  explicit Nvml(const char* library) {
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
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;
  ~Nvml() = default;  // never unloaded: other threads may still be inside it at exit

  [[nodiscard]] bool ok() const noexcept { return status_.empty(); }
  [[nodiscard]] const std::string& status() const noexcept { return status_; }

  /// The figures of the GPU at `pci_bus_id`; nullopt when NVML is not loaded or has no such GPU.
  [[nodiscard]] std::optional<GpuActivity> activity(const std::string& pci_bus_id) const {
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

 private:
  struct Utilization {  // nvmlUtilization_t
    unsigned gpu, memory;
  };
  void* handle_ = nullptr;
  std::string status_ = "NVML not loaded";
  int (*init_)() = nullptr;
  int (*by_pci_)(const char*, void**) = nullptr;
  int (*utilization_)(void*, Utilization*) = nullptr;
  int (*power_)(void*, unsigned*) = nullptr;
  int (*limit_)(void*, unsigned*) = nullptr;
  int (*temperature_)(void*, int, unsigned*) = nullptr;
};

/// The process's NVML: NITRO_NVML_LIBRARY, else libnvidia-ml.so.1; loaded on first use.
inline const Nvml& nvml() {
  static const Nvml instance([] {
    const char* path = std::getenv("NITRO_NVML_LIBRARY");
    return path != nullptr && *path != '\0' ? path : "libnvidia-ml.so.1";
  }());
  return instance;
}

}  // namespace detail

/// "" when NVML is loaded and initialised, else the reason it is not (for logs).
[[nodiscard]] inline std::string nvml_status() { return detail::nvml().status(); }

/// NVML's figures for the GPU at a PCI bus id ("0000:3b:00.0"); nullopt without NVML or such a GPU.
[[nodiscard]] inline std::optional<GpuActivity> gpu_activity(const std::string& pci_bus_id) {
  return detail::nvml().activity(pci_bus_id);
}

/// NVML's figures for CUDA device `device` (-1: the current one); nullopt without NVML, CUDA or a GPU.
[[nodiscard]] inline std::optional<GpuActivity> gpu_activity(int device = -1) {
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
