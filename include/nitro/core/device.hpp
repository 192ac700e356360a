#pragma once
// Device tags and moving a batch between devices.
//
//   nitro::Cpu, nitro::Cuda      device tags: templates such as Prefetcher<Cuda> are specialised on them
//   nitro::Auto                  the tag whose device is a value chosen at run time (Prefetcher<Auto>
//                                with {.device = d}); Auto::device() is CUDA when available, else the CPU
//   nitro::concrete_device(d)    `cuda` (the current device) made concrete: `cuda:1`
//   nitro::map_tensors(b, f)     a copy of batch b with f applied to each tensor: the one mechanism
//                                behind to_device, pin_memory and for_each_tensor
//   nitro::to_device(b, dev)     moves every tensor of b (non_blocking and channels_last optional)
//   nitro::pin_memory(b)         page-locks every CPU tensor of b (needs CUDA)
//   nitro::for_each_tensor(b, f) visits every tensor of b
//
// A batch is a tensor, a std::tuple / std::pair / std::vector / std::optional of batches, a
// torch::data::Example (include <torch/data/example.h> to use it: it is heavy, so this header only
// forward-declares it), or a user type with the customization point below (concept nitro::Batch):
//
//   struct MyBatch {
//     at::Tensor image, mask;
//     int id;
//     template <class F>
//     friend MyBatch nitro_map_tensors(const MyBatch& b, F&& f) { return {f(b.image), f(b.mask), b.id}; }
//   };
#include <nitro/core/concepts.hpp>
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include <algorithm>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace nitro {

/// The host. Always available.
struct Cpu {
  static constexpr c10::DeviceType type = c10::DeviceType::CPU;  ///< LibTorch's device type, kCPU.
  static constexpr std::string_view name = "cpu";  ///< Name shown in messages.
  static bool available() noexcept { return true; }  ///< Always true.
  /// The CPU device (the index is ignored).
  static c10::Device device(c10::DeviceIndex = -1) { return c10::Device(type); }
};

/// An NVIDIA GPU through LibTorch's CUDA backend. `available()` is false on a machine without a GPU
/// or with a CPU-only LibTorch; code specialised on Cuda still compiles there.
struct Cuda {
  static constexpr c10::DeviceType type = c10::DeviceType::CUDA;  ///< LibTorch's device type, kCUDA.
  static constexpr std::string_view name = "cuda";  ///< Name shown in messages.
  /// Whether a GPU is usable in this process (torch::cuda::is_available()).
  static bool available() { return torch::cuda::is_available(); }
  /// Index -1 means the current device.
  static c10::Device device(c10::DeviceIndex index = -1) { return c10::Device(type, index); }
};

/// The device chosen at run time, as the program it ports does (`torch::cuda::is_available() ?
/// kCUDA : kCPU`): code specialised on Auto takes a c10::Device value (the CPU, `cuda` or `cuda:N`)
/// and acts, from then on, as its Cpu or Cuda variant would. There is no one kind to name:
/// `type` is COMPILE_TIME_MAX_DEVICE_TYPES, a value no device has, so that code comparing a tag's
/// type with kCPU or kCUDA does not mistake Auto for either; use the device value instead.
///   nitro::Prefetcher<nitro::Auto, decltype(source)> batches{source, {.device = device}};
struct Auto {
  /// COMPILE_TIME_MAX_DEVICE_TYPES: no device's type (see above).
  static constexpr c10::DeviceType type = c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES;
  static constexpr std::string_view name = "auto";  ///< Name shown in messages.
  /// Always true: without a GPU, Auto's device is the CPU.
  static bool available() noexcept { return true; }
  /// The default device: `cuda:index` (index -1: the current GPU) when this build has CUDA
  /// (NITRO_WITH_CUDA) and a GPU is available, else the CPU.
  NITRO_INLINE static c10::Device device(c10::DeviceIndex index = -1);
};

static_assert(DeviceTag<Cpu>);
static_assert(DeviceTag<Cuda>);
static_assert(DeviceTag<Auto>);

/// The concrete device `device` means when the current CUDA device is `current`: a CUDA device
/// without an index (`cuda`, index -1) is `cuda:current`; any other device is itself. The logic of
/// concrete_device(device), apart so it can be tested without a GPU.
[[nodiscard]] NITRO_INLINE c10::Device concrete_device(c10::Device device, c10::DeviceIndex current);

/// The concrete device `device` means now: `cuda` becomes the current CUDA device of this thread
/// (cuda:1 after c10::cuda::set_device(1)); other devices are returned as they are. What keeps a
/// device (the prefetcher, the phase monitor) resolves it once, so its streams, events and memory
/// figures stay on that device whichever becomes current later.
[[nodiscard]] NITRO_INLINE c10::Device concrete_device(c10::Device device);

namespace detail {
/// The CUDA device indices among `devices`, and `current` when it is >= 0: sorted, each once. The
/// generators a search must put back (the model may sit on cuda:1 while cuda:0 is current).
[[nodiscard]] NITRO_INLINE std::vector<c10::DeviceIndex> cuda_indices(const std::vector<c10::Device>& devices,
                                                                c10::DeviceIndex current);
}  // namespace detail

/// Throws nitro::Error naming `what` when device D is not present (never for Cpu and Auto, whose
/// device falls back to the CPU: check Auto's chosen device with the overload below).
/// nitro::require_available<nitro::Cuda>("Prefetcher<Cuda>");
template <DeviceTag D>
void require_available(std::string_view what) {
  NITRO_CHECK(D::available(), what, " needs a ", D::name, " device, but none is available in this process",
              D::type == c10::DeviceType::CUDA
                  ? " (torch::cuda::is_available() is false: no GPU or driver, or a CPU-only LibTorch); "
                    "use the nitro::Cpu variant or run where a GPU is present"
                  : "");
}

/// Throws nitro::Error naming `what` when `device`, a value chosen at run time, cannot be used:
/// a CUDA device in a build without CUDA (NITRO_WITH_CUDA 0) or where no GPU is available, or a
/// device that is neither the CPU nor CUDA. Does not check that index N of `cuda:N` exists.
/// nitro::require_available(device, "nitro::Prefetcher<Auto>");
NITRO_INLINE void require_available(c10::Device device, std::string_view what);

namespace detail {

template <class T>
inline constexpr bool dependent_false = false;

template <class T>
struct is_tuple : std::false_type {};
template <class... Ts>
struct is_tuple<std::tuple<Ts...>> : std::true_type {};
template <class T>
struct is_pair : std::false_type {};
template <class A, class B>
struct is_pair<std::pair<A, B>> : std::true_type {};
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_example : std::false_type {};
template <class D, class T>
struct is_example<torch::data::Example<D, T>> : std::true_type {};

struct MapTensorsFn {
  template <class B, class F>
  B operator()(const B& b, F&& f) const {
    if constexpr (TensorBatch<B>) {
      return f(b);
    } else if constexpr (CustomBatch<B>) {
      return nitro_map_tensors(b, f);
    } else if constexpr (is_tuple<B>::value && Batch<B>) {
      return std::apply([&](const auto&... e) { return B{(*this)(e, f)...}; }, b);
    } else if constexpr (is_pair<B>::value && Batch<B>) {
      return B{(*this)(b.first, f), (*this)(b.second, f)};
    } else if constexpr (is_vector<B>::value && Batch<B>) {
      B out;
      out.reserve(b.size());
      for (const auto& e : b) out.push_back((*this)(e, f));
      return out;
    } else if constexpr (is_optional<B>::value && Batch<B>) {
      return b ? B{(*this)(*b, f)} : B{};
    } else if constexpr (is_example<B>::value && Batch<B>) {
      if constexpr (std::is_void_v<typename B::TargetType>) {
        return B{(*this)(b.data, f)};
      } else {
        return B{(*this)(b.data, f), (*this)(b.target, f)};
      }
    } else {
      static_assert(dependent_false<B>,
                    "nitro: this type is not a batch Nitro can move between devices. Give it the customization "
                    "point `template <class F> friend T nitro_map_tensors(const T& batch, F&& f)` returning a "
                    "copy with f applied to each tensor (see nitro/core/device.hpp), or use a tensor, tuple, "
                    "pair, vector or torch::data::Example");
    }
  }
};

}  // namespace detail

/// A copy of `batch` with `f` (at::Tensor -> at::Tensor) applied to each of its tensors; other
/// members are copied. The customization point for user types is `nitro_map_tensors` (see above).
inline constexpr detail::MapTensorsFn map_tensors{};

namespace detail {
// Visits without building a copy of the batch (no vector, tuple or Example is made); a user type is
// visited through its nitro_map_tensors, which does build one.
struct ForEachTensorFn {
  template <class B, class F>
  void operator()(const B& b, F& f) const {
    if constexpr (TensorBatch<B>) {
      f(static_cast<const at::Tensor&>(b));
    } else if constexpr (CustomBatch<B>) {
      (void)nitro_map_tensors(b, [&f](const at::Tensor& t) {
        f(t);
        return t;
      });
    } else if constexpr (is_tuple<B>::value && Batch<B>) {
      std::apply([&](const auto&... e) { ((*this)(e, f), ...); }, b);
    } else if constexpr (is_pair<B>::value && Batch<B>) {
      (*this)(b.first, f);
      (*this)(b.second, f);
    } else if constexpr (is_vector<B>::value && Batch<B>) {
      for (const auto& e : b) (*this)(e, f);
    } else if constexpr (is_optional<B>::value && Batch<B>) {
      if (b) (*this)(*b, f);
    } else if constexpr (is_example<B>::value && Batch<B>) {
      (*this)(b.data, f);
      if constexpr (!std::is_void_v<typename B::TargetType>) (*this)(b.target, f);
    } else {
      (void)MapTensorsFn{}(b, [](const at::Tensor& t) { return t; });  // its static_assert names the fix
    }
  }
};
}  // namespace detail

/// Calls `f(const at::Tensor&)` on each tensor of `batch`, in map_tensors' order, without copying
/// the batch (a user type with nitro_map_tensors is visited through it).
template <class B, class F>
void for_each_tensor(const B& batch, F&& f) {
  detail::ForEachTensorFn{}(batch, f);
}

/// How to_device copies.
struct TransferOptions {
  /// Asynchronous copy when the source is pinned host memory (or the copy is device to host into pinned memory).
  bool non_blocking = false;
  /// Four-dimensional tensors arrive in channels-last layout (faster convolutions with cuDNN).
  bool channels_last = false;
  /// Copy even when a tensor is already on the device in the wanted layout.
  bool copy = false;
};

/// Moves every tensor of `batch` to `device`.
/// auto gpu_batch = nitro::to_device(example, nitro::Cuda::device(), {.non_blocking = true});
template <class B>
B to_device(const B& batch, c10::Device device, const TransferOptions& options = {}) {
  return map_tensors(batch, [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    std::optional<c10::MemoryFormat> format;
    if (options.channels_last && t.dim() == 4) format = c10::MemoryFormat::ChannelsLast;
    return t.to(t.options().device(device), options.non_blocking, options.copy, format);
  });
}

/// Moves every tensor of `batch` to the current device of kind D (Auto: to Auto::device(), the
/// current GPU when one is available, else the CPU).
template <DeviceTag D, class B>
B to_device(const B& batch, const TransferOptions& options = {}) {
  return to_device(batch, D::device(), options);
}

/// Page-locks every CPU tensor of `batch` (already pinned tensors are kept), so that copies to the
/// GPU can be asynchronous. Throws nitro::Error where no CUDA device is present.
template <class B>
B pin_memory(const B& batch) {
  require_available<Cuda>("nitro::pin_memory");
  return map_tensors(batch, [](const at::Tensor& t) {
    if (!t.defined() || !t.device().is_cpu() || t.is_pinned()) return t;
    return t.pin_memory();
  });
}

}  // namespace nitro

#if !NITRO_COMPILED
#include <nitro/core/device-inl.hpp>
#endif
