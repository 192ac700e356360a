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
  int memory_percent = -1;  ///< Share of the last sample period in which device memory was read or written, in percent.
  /// Board power draw and the enforced limit, in watts.
  double power_w = -1;
  double power_limit_w = -1;  ///< The enforced power limit, in watts.
  int temperature_c = -1;     ///< GPU temperature, in degrees Celsius.
};

namespace detail {

/// NVML's few entry points, from a library loaded with dlopen. Usable alone (tests load a stand-in).
class Nvml {
 public:
  NITRO_INLINE explicit Nvml(const char* library);
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;
  ~Nvml() = default;  // never unloaded: other threads may still be inside it at exit

  [[nodiscard]] bool ok() const noexcept { return status_.empty(); }
  [[nodiscard]] const std::string& status() const noexcept { return status_; }

  /// The figures of the GPU at `pci_bus_id`; nullopt when NVML is not loaded or has no such GPU.
  [[nodiscard]] NITRO_INLINE std::optional<GpuActivity> activity(const std::string& pci_bus_id) const;

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
NITRO_INLINE const Nvml& nvml();

}  // namespace detail

/// "" when NVML is loaded and initialised, else the reason it is not (for logs).
[[nodiscard]] inline std::string nvml_status() { return detail::nvml().status(); }

/// NVML's figures for the GPU at a PCI bus id ("0000:3b:00.0"); nullopt without NVML or such a GPU.
[[nodiscard]] NITRO_INLINE std::optional<GpuActivity> gpu_activity(const std::string& pci_bus_id);

/// NVML's figures for CUDA device `device` (-1: the current one); nullopt without NVML, CUDA or a GPU.
[[nodiscard]] NITRO_INLINE std::optional<GpuActivity> gpu_activity(int device = -1);

}  // namespace nitro::memory

#if !NITRO_COMPILED
#include <nitro/memory/nvml-inl.hpp>
#endif
