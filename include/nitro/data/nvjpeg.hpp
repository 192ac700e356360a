#pragma once
// JPEG decoding on the GPU with NVIDIA's nvJPEG, loaded at run time, and the CPU path where it is not there.
//
//   namespace img = nitro::image;
//   if (img::NvJpeg::available()) {
//     img::NvJpeg gpu(torch::Device(torch::kCUDA, 0));          // one per thread; owns nvJPEG's handle and state
//     std::vector<at::Tensor> x = gpu.decode(files);            // uint8 [3, H, W] each, on cuda:0
//     std::vector<at::Tensor> y = gpu.decode(files, stream);    // queued on `stream` (the prefetcher's)
//   }
//   std::vector<at::Tensor> z = img::decode_on(device, files);  // nvJPEG where it can, else image::decode
//   img::NvJpeg::unavailable_reason()                           // "" when usable, else why not
//
// The library: libnvjpeg from the CUDA toolkit or a Python wheel, found at run time (dlopen), so that
// Nitro neither links it nor needs nvjpeg.h. Searched, first that loads with every entry point wins:
//   1. the path in NITRO_NVJPEG, alone (a missing file there is the reason given, nothing else is tried);
//   2. libnvjpeg.so.13, libnvjpeg.so.12, libnvjpeg.so through the loader's own search (LD_LIBRARY_PATH,
//      ld.so.cache), then in /usr/local/cuda/lib64;
//   3. beside the LibTorch this process runs with, when it is a Python wheel's (torch/lib/libc10.so in
//      site-packages): the wheels nvidia/cu13/lib (nvidia-nvjpeg for CUDA 13), nvidia/nvjpeg/lib
//      (nvidia-nvjpeg-cu12) and torchvision.libs/libnvjpeg*.so* (the copy torchvision ships).
// nvJPEG 12 and 13 keep the C functions and values used here, and carry their own CUDA runtime.
//
// What NvJpeg::decode does with a batch (any mix of files image::decode takes):
//   - baseline and progressive JPEGs of 1 or 3 components are decoded together with nvjpegDecodeBatched
//     into planar RGB, straight into uint8 CUDA tensors from LibTorch's caching allocator, on the given
//     stream (default: the device's current stream). The A100/H100 hardware decoder is used where the
//     GPU has one (files it cannot take, e.g. progressive ones, then go to the CPU path), else nvJPEG's
//     GPU-assisted Huffman decoding (CPU Huffman decoding for batches under 50).
//   - the rest goes through image::decode on the calling thread and is copied to the device on the
//     stream: CMYK/YCCK JPEGs, PNGs, files not ending with an EOI marker (truncated files: libjpeg-turbo
//     then says so), files whose header nvJPEG refuses, and any file nvJPEG fails to decode. So a file is
//     an error exactly when image::decode refuses it: a nitro::Error naming it, "jpegs[k]".
//   - the pixels are nvJPEG's, not libjpeg-turbo's: its IDCT rounds differently and, unless the library
//     takes the interpolation flag (asked for), it upsamples chroma by repetition where libjpeg-turbo
//     interpolates ("fancy"). Expect a mean difference under 1 and isolated pixels off by a few levels
//     at sharp colour edges (tests/image/nvjpeg.cpp measures it). CMYK and PNG files, decoded on the CPU,
//     are image::decode's exactly. EXIF orientation is ignored on both paths (as Pillow's open()).
//   - nvJPEG accepts some corrupt entropy-coded data that libjpeg-turbo refuses (it is asked to be
//     strict, NVJPEG_FLAGS_BITSTREAM_STRICT, where it takes the flag): such a file decodes to grey or
//     garbled blocks on the GPU instead of an error.
// The outputs belong to the given stream (allocated while it is current): a consumer on another stream
// waits for it (an event) and calls record_stream, as Prefetcher<Cuda> does with its copy stream.
// Threads: an NvJpeg is used by one thread at a time; decode_on keeps one per thread and device.
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>
#include <nitro/data/image.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#if NITRO_WITH_CUDA
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace nitro::image {

namespace detail {

/// The part of nvjpeg.h Nitro uses (its values are the C ABI of nvJPEG 11 to 13).
namespace nvj {
using Status = int;  // nvjpegStatus_t: 0 success, else one of status_name's
inline constexpr Status success = 0;
inline constexpr Status arch_mismatch = 7;  // no such backend on this GPU (the hardware decoder)
using Handle = struct nvjpegHandle*;
using State = struct nvjpegJpegState*;
using Stream = struct nvjpegJpegStream*;  // a parsed bitstream (nvjpegJpegStream_t), not a CUDA stream
using CudaStream = void*;                 // cudaStream_t
struct Image {                            // nvjpegImage_t
  unsigned char* channel[4];
  std::size_t pitch[4];
};
inline constexpr int backend_default = 0;     // nvjpegBackend_t
inline constexpr int backend_gpu_hybrid = 2;  // Huffman decoding on the GPU for batches over 50
inline constexpr int backend_hardware = 3;    // the A100/H100 JPEG engines
inline constexpr int output_rgb = 3;          // nvjpegOutputFormat_t: planar RGB (NVJPEG_OUTPUT_RGBI is 5)
inline constexpr int css_unknown = -1;        // nvjpegChromaSubsampling_t
inline constexpr unsigned flag_bitstream_strict = 1u << 2;
inline constexpr unsigned flag_upsampling_with_interpolation = 1u << 5;
inline constexpr int major_version = 0, minor_version = 1, patch_level = 2;  // libraryPropertyType

NITRO_INLINE std::string status_name(Status s);
}  // namespace nvj

/// nvJPEG's entry points, from one library file loaded with dlopen. Usable alone (tests load files).
class NvJpegLibrary {
 public:
  NITRO_INLINE explicit NvJpegLibrary(const std::string& library);
  NvJpegLibrary(const NvJpegLibrary&) = delete;
  NvJpegLibrary& operator=(const NvJpegLibrary&) = delete;
  ~NvJpegLibrary() = default;  // never unloaded: decoders may outlive whoever loaded it

  [[nodiscard]] bool ok() const noexcept { return status_.empty(); }
  /// "" when every entry point is there, else why not.
  [[nodiscard]] const std::string& status() const noexcept { return status_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// "13.0.1" (nvjpegGetProperty), "" if it did not say.
  [[nodiscard]] const std::string& version() const noexcept { return version_; }

  nvj::Status (*get_property)(int, int*) = nullptr;
  nvj::Status (*create_ex)(int backend, void* dev_allocator, void* pinned_allocator, unsigned flags,
                           nvj::Handle*) = nullptr;
  nvj::Status (*destroy)(nvj::Handle) = nullptr;
  nvj::Status (*state_create)(nvj::Handle, nvj::State*) = nullptr;
  nvj::Status (*state_destroy)(nvj::State) = nullptr;
  nvj::Status (*stream_create)(nvj::Handle, nvj::Stream*) = nullptr;
  nvj::Status (*stream_destroy)(nvj::Stream) = nullptr;
  nvj::Status (*stream_parse_header)(nvj::Handle, const unsigned char*, std::size_t, nvj::Stream) = nullptr;
  nvj::Status (*batched_supported)(nvj::Handle, nvj::Stream, int* is_supported) = nullptr;  // 0: supported
  nvj::Status (*get_image_info)(nvj::Handle, const unsigned char*, std::size_t, int* components, int* subsampling,
                                int* widths, int* heights) = nullptr;
  nvj::Status (*batched_initialize)(nvj::Handle, nvj::State, int batch_size, int max_cpu_threads,
                                    int output_format) = nullptr;
  nvj::Status (*decode_batched)(nvj::Handle, nvj::State, const unsigned char* const* data, const std::size_t* lengths,
                                nvj::Image* destinations, nvj::CudaStream) = nullptr;

 private:
  void* handle_ = nullptr;
  std::string path_;
  std::string status_ = "not loaded";
  std::string version_;
};

/// The site-packages directory of the LibTorch wheel loaded in this process ("" if it is not a wheel's).
NITRO_INLINE std::filesystem::path torch_site_packages();

/// Where nvJPEG is looked for, in order, without NITRO_NVJPEG (the list at the top of this file).
NITRO_INLINE std::vector<std::string> nvjpeg_candidates();

/// The nvJPEG found, or why none was.
struct NvJpegFound {
  std::unique_ptr<NvJpegLibrary> library;
  std::string reason;  // "" when library is ok()
};

/// The first of `candidates` that loads with every entry point; `override_path` (NITRO_NVJPEG's value),
/// when given, is the only one tried. The reason, when none, says which setting or which places, and
/// what to do.
NITRO_INLINE NvJpegFound locate_nvjpeg(const char* override_path, const std::vector<std::string>& candidates);

/// The process's nvJPEG, looked for on first use (NITRO_NVJPEG read then) and never unloaded.
NITRO_INLINE const NvJpegFound& nvjpeg();

/// The file ends with an EOI marker (FF D9), give or take up to 64 bytes of padding after it. A file cut
/// short does not (FF D9 cannot occur in entropy-coded data): it goes to libjpeg-turbo, which says so.
NITRO_INLINE bool ends_with_eoi(std::span<const std::uint8_t> b) noexcept;

}  // namespace detail

/// JPEG decoding with nvJPEG on one CUDA device (the top of this file says what goes where).
class NvJpeg {
 public:
  /// nvJPEG loaded and a CUDA device present.
  [[nodiscard]] static bool available() { return unavailable_reason().empty(); }

  /// "" when available(), else why not: LibTorch without CUDA, no GPU, or nvJPEG not found (and where
  /// it was looked for).
  [[nodiscard]] NITRO_INLINE static std::string unavailable_reason();

  /// The nvJPEG file in use and its version, "" when none was found.
  [[nodiscard]] NITRO_INLINE static std::string library();

#if NITRO_WITH_CUDA
  /// A decoder on `device` (a CUDA device; no index: the current one). A nitro::Error saying why when
  /// nvJPEG is not available(), or when `device` is not a CUDA device that exists.
  NITRO_INLINE explicit NvJpeg(c10::Device device = c10::Device(c10::kCUDA));
  NvJpeg(const NvJpeg&) = delete;
  NvJpeg& operator=(const NvJpeg&) = delete;
  /// Takes over `o`'s decoder; `o` is left without one.
  NvJpeg(NvJpeg&& o) noexcept { swap(o); }
  /// Releases this decoder and takes over `o`'s; `o` is left without one.
  NITRO_INLINE NvJpeg& operator=(NvJpeg&& o) noexcept;
  ~NvJpeg() { release(); }

  /// The CUDA device decoded on (with its index).
  [[nodiscard]] c10::Device device() const noexcept { return device_; }
  /// The GPU's JPEG engines decode (A100, H100), rather than CUDA kernels.
  [[nodiscard]] bool hardware() const noexcept { return hardware_; }
  /// The nvjpegCreateEx flags the library took (bitstream strict 4, upsampling with interpolation 32).
  [[nodiscard]] unsigned flags() const noexcept { return flags_; }

  /// How many files of the last decode() went to the CPU path (the top of this file says which).
  [[nodiscard]] std::size_t last_on_cpu() const noexcept { return last_on_cpu_; }

  /// Decodes each file into a uint8 CUDA tensor [3, H, W] (RGB), queued on `stream` (default: the
  /// device's current stream); read them after that stream's work (synchronize it, or wait on an event).
  /// A file neither nvJPEG nor image::decode can decode is a nitro::Error naming it "jpegs[k]".
  /// The bytes are read during the call only.
  [[nodiscard]] NITRO_INLINE std::vector<at::Tensor> decode(const std::vector<std::span<const std::uint8_t>>& jpegs,
                                               std::optional<c10::cuda::CUDAStream> stream = std::nullopt);

 private:
  /// [H, W] when nvJPEG is to decode the file, nullopt when the CPU path is.
  NITRO_INLINE std::optional<std::pair<std::int64_t, std::int64_t>> gpu_shape(std::span<const std::uint8_t> b, std::size_t k);

  /// nvjpegDecodeBatched of jpegs[which] into images[which] on `s`.
  NITRO_INLINE detail::nvj::Status run(const std::vector<std::span<const std::uint8_t>>& jpegs, std::vector<detail::nvj::Image>& images,
                          const std::vector<std::size_t>& which, const c10::cuda::CUDAStream& s);

  NITRO_INLINE void release() noexcept;
  NITRO_INLINE void swap(NvJpeg& o) noexcept;

  c10::Device device_{c10::kCUDA};
  const detail::NvJpegLibrary* lib_ = nullptr;
  detail::nvj::Handle handle_ = nullptr;
  detail::nvj::State state_ = nullptr;
  detail::nvj::Stream parsed_ = nullptr;
  std::size_t last_on_cpu_ = 0;
  int batch_ = 0;  // the batch size nvjpegDecodeBatchedInitialize was last given
  bool hardware_ = false;
  unsigned flags_ = 0;
#endif
};

/// Decodes each file (JPEG or PNG) into a uint8 [3, H, W] tensor on `device`: on a CUDA device with
/// NvJpeg where available() (one decoder per thread and device, kept), else with image::decode on the
/// calling thread and copied there. Which of the two is said once per process on stderr. Errors are
/// image::decode's, naming the file "jpegs[k]".
[[nodiscard]] NITRO_INLINE std::vector<at::Tensor> decode_on(c10::Device device,
                                                       const std::vector<std::span<const std::uint8_t>>& jpegs);

}  // namespace nitro::image

#if !NITRO_COMPILED
#include <nitro/data/nvjpeg-inl.hpp>
#endif
