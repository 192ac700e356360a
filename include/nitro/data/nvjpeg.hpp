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

inline std::string status_name(Status s) {
  static constexpr const char* names[] = {"success",           "not initialized",  "invalid parameter",
                                          "bad JPEG",          "JPEG not supported", "allocator failure",
                                          "execution failed",  "architecture mismatch", "internal error",
                                          "implementation not supported", "incomplete bitstream"};
  return s >= 0 && s < static_cast<int>(std::size(names)) ? std::string(names[s]) + " (" + std::to_string(s) + ")"
                                                          : "status " + std::to_string(s);
}
}  // namespace nvj

/// nvJPEG's entry points, from one library file loaded with dlopen. Usable alone (tests load files).
class NvJpegLibrary {
 public:
  explicit NvJpegLibrary(const std::string& library) : path_(library) {
    handle_ = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      const char* e = ::dlerror();
      status_ = "cannot load " + library + " (" + (e != nullptr ? e : "dlopen failed") + ")";
      return;
    }
    std::string missing;
    const auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(::dlsym(handle_, name));
      if (f == nullptr) missing += missing.empty() ? name : std::string(", ") + name;
    };
    sym(get_property, "nvjpegGetProperty");
    sym(create_ex, "nvjpegCreateEx");
    sym(destroy, "nvjpegDestroy");
    sym(state_create, "nvjpegJpegStateCreate");
    sym(state_destroy, "nvjpegJpegStateDestroy");
    sym(stream_create, "nvjpegJpegStreamCreate");
    sym(stream_destroy, "nvjpegJpegStreamDestroy");
    sym(stream_parse_header, "nvjpegJpegStreamParseHeader");
    sym(batched_supported, "nvjpegDecodeBatchedSupported");
    sym(get_image_info, "nvjpegGetImageInfo");
    sym(batched_initialize, "nvjpegDecodeBatchedInitialize");
    sym(decode_batched, "nvjpegDecodeBatched");
    if (!missing.empty()) {
      status_ = library + " is not a usable nvJPEG: it lacks " + missing;
      return;
    }
    int major = 0, minor = 0, patch = 0;
    if (get_property(nvj::major_version, &major) == nvj::success &&
        get_property(nvj::minor_version, &minor) == nvj::success && get_property(nvj::patch_level, &patch) == nvj::success)
      version_ = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
    status_.clear();
  }
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
inline std::filesystem::path torch_site_packages() {
  std::string c10;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        const std::string_view name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        if (name.ends_with("/libc10.so")) {
          *static_cast<std::string*>(out) = std::string(name);
          return 1;
        }
        return 0;
      },
      &c10);
  if (c10.empty()) return {};
  const auto lib = std::filesystem::path(c10).parent_path();  // .../site-packages/torch/lib
  if (lib.filename() != "lib" || lib.parent_path().filename() != "torch") return {};
  return lib.parent_path().parent_path();
}

/// Where nvJPEG is looked for, in order, without NITRO_NVJPEG (the list at the top of this file).
inline std::vector<std::string> nvjpeg_candidates() {
  std::vector<std::string> c = {"libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so",
                                "/usr/local/cuda/lib64/libnvjpeg.so.13", "/usr/local/cuda/lib64/libnvjpeg.so.12",
                                "/usr/local/cuda/lib64/libnvjpeg.so"};
  const auto site = torch_site_packages();
  if (site.empty()) return c;
  for (const char* wheel : {"nvidia/cu13/lib/libnvjpeg.so.13", "nvidia/nvjpeg/lib/libnvjpeg.so.13",
                            "nvidia/nvjpeg/lib/libnvjpeg.so.12"})
    if (std::error_code ec; std::filesystem::exists(site / wheel, ec)) c.push_back((site / wheel).string());
  std::vector<std::string> vision;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(site / "torchvision.libs", ec), end; !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (name.starts_with("libnvjpeg") && name.find(".so") != std::string::npos) vision.push_back(it->path().string());
  }
  std::sort(vision.begin(), vision.end());
  c.insert(c.end(), vision.begin(), vision.end());
  return c;
}

/// The nvJPEG found, or why none was.
struct NvJpegFound {
  std::unique_ptr<NvJpegLibrary> library;
  std::string reason;  // "" when library is ok()
};

/// The first of `candidates` that loads with every entry point; `override_path` (NITRO_NVJPEG's value),
/// when given, is the only one tried. The reason, when none, says which setting or which places, and
/// what to do.
inline NvJpegFound locate_nvjpeg(const char* override_path, const std::vector<std::string>& candidates) {
  NvJpegFound f;
  if (override_path != nullptr && *override_path != '\0') {
    f.library = std::make_unique<NvJpegLibrary>(override_path);
    if (!f.library->ok())
      f.reason = "nvJPEG not usable: NITRO_NVJPEG=" + std::string(override_path) + ": " + f.library->status() +
                 "; point NITRO_NVJPEG at a libnvjpeg.so.13 (CUDA toolkit or the nvidia-nvjpeg wheel), or unset it";
    return f;
  }
  std::string tried;
  for (const auto& c : candidates) {
    auto lib = std::make_unique<NvJpegLibrary>(c);
    if (lib->ok()) {
      f.library = std::move(lib);
      return f;
    }
    // Not found says nothing; a file that is there but failed (another architecture, entry points
    // missing, its dependencies absent) says why.
    if (lib->status().find("No such file") == std::string::npos) tried += (tried.empty() ? "" : "; ") + lib->status();
  }
  f.reason = "nvJPEG not found (looked for libnvjpeg.so.13, .so.12 and .so through the loader, in "
             "/usr/local/cuda/lib64 and beside LibTorch's wheel" +
             (tried.empty() ? std::string() : ": " + tried) +
             "); install the CUDA toolkit's nvJPEG or the nvidia-nvjpeg wheel, or set NITRO_NVJPEG to its path";
  return f;
}

/// The process's nvJPEG, looked for on first use (NITRO_NVJPEG read then) and never unloaded.
inline const NvJpegFound& nvjpeg() {
  static const NvJpegFound found = locate_nvjpeg(std::getenv("NITRO_NVJPEG"), nvjpeg_candidates());
  return found;
}

/// The file ends with an EOI marker (FF D9), give or take up to 64 bytes of padding after it. A file cut
/// short does not (FF D9 cannot occur in entropy-coded data): it goes to libjpeg-turbo, which says so.
inline bool ends_with_eoi(std::span<const std::uint8_t> b) noexcept {
  const std::size_t from = b.size() > 66 ? b.size() - 66 : 0;
  for (std::size_t i = b.size(); i-- > from + 1;)
    if (b[i - 1] == 0xFF && b[i] == 0xD9) return true;
  return false;
}

}  // namespace detail

/// JPEG decoding with nvJPEG on one CUDA device (the top of this file says what goes where).
class NvJpeg {
 public:
  /// nvJPEG loaded and a CUDA device present.
  [[nodiscard]] static bool available() { return unavailable_reason().empty(); }

  /// "" when available(), else why not: LibTorch without CUDA, no GPU, or nvJPEG not found (and where
  /// it was looked for).
  [[nodiscard]] static std::string unavailable_reason() {
#if NITRO_WITH_CUDA
    const auto& f = detail::nvjpeg();
    if (!f.reason.empty()) return f.reason;
    if (c10::cuda::device_count() == 0) return "no CUDA device (nvJPEG " + library() + " is there)";
    return {};
#else
    return "this LibTorch was built without CUDA";
#endif
  }

  /// The nvJPEG file in use and its version, "" when none was found.
  [[nodiscard]] static std::string library() {
    const auto& f = detail::nvjpeg();
    if (!f.reason.empty()) return {};
    const auto& v = f.library->version();
    return f.library->path() + (v.empty() ? std::string() : " (nvJPEG " + v + ")");
  }

#if NITRO_WITH_CUDA
  /// A decoder on `device` (a CUDA device; no index: the current one). A nitro::Error saying why when
  /// nvJPEG is not available().
  explicit NvJpeg(c10::Device device = c10::Device(c10::kCUDA)) : device_(device) {
    const auto reason = unavailable_reason();
    NITRO_CHECK(reason.empty(), "image::NvJpeg: ", reason, "; image::decode_on falls back to the CPU by itself");
    NITRO_CHECK(device_.is_cuda(), "image::NvJpeg: give a CUDA device; got ", device_.str());
    if (!device_.has_index()) device_ = c10::Device(c10::kCUDA, c10::cuda::current_device());
    NITRO_CHECK(device_.index() < c10::cuda::device_count(), "image::NvJpeg: ", device_.str(), " is not there (",
                static_cast<int>(c10::cuda::device_count()), " CUDA devices)");
    lib_ = detail::nvjpeg().library.get();
    const c10::cuda::CUDAGuard guard(device_);
    // The hardware decoder where the GPU has one; flags the library refuses are dropped one by one.
    constexpr unsigned all_flags = detail::nvj::flag_bitstream_strict | detail::nvj::flag_upsampling_with_interpolation;
    detail::nvj::Status st = -1;
    for (const int backend : {detail::nvj::backend_hardware, detail::nvj::backend_gpu_hybrid, detail::nvj::backend_default}) {
      for (const unsigned flags : {all_flags, detail::nvj::flag_bitstream_strict, 0u}) {
        st = lib_->create_ex(backend, nullptr, nullptr, flags, &handle_);
        if (st == detail::nvj::success) {
          hardware_ = backend == detail::nvj::backend_hardware;
          flags_ = flags;
          break;
        }
        handle_ = nullptr;
        if (st == detail::nvj::arch_mismatch) break;  // this backend is not on this GPU: next backend
      }
      if (handle_ != nullptr) break;
    }
    NITRO_CHECK(handle_ != nullptr, "image::NvJpeg: nvjpegCreateEx failed on ", device_.str(), ": ",
                detail::nvj::status_name(st), " (", library(), ")");
    if (const auto s = lib_->state_create(handle_, &state_); s != detail::nvj::success) {
      release();
      throw Error("image::NvJpeg: nvjpegJpegStateCreate failed: " + detail::nvj::status_name(s));
    }
    if (const auto s = lib_->stream_create(handle_, &parsed_); s != detail::nvj::success) {
      release();
      throw Error("image::NvJpeg: nvjpegJpegStreamCreate failed: " + detail::nvj::status_name(s));
    }
  }
  NvJpeg(const NvJpeg&) = delete;
  NvJpeg& operator=(const NvJpeg&) = delete;
  NvJpeg(NvJpeg&& o) noexcept { swap(o); }
  NvJpeg& operator=(NvJpeg&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  ~NvJpeg() { release(); }

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
  [[nodiscard]] std::vector<at::Tensor> decode(const std::vector<std::span<const std::uint8_t>>& jpegs,
                                               std::optional<c10::cuda::CUDAStream> stream = std::nullopt) {
    const c10::cuda::CUDAGuard guard(device_);
    const auto s = stream.value_or(c10::cuda::getCurrentCUDAStream(device_.index()));
    NITRO_CHECK(s.device() == device_, "image::NvJpeg::decode: the stream is on ", s.device().str(),
                ", this decoder on ", device_.str());
    const c10::cuda::CUDAStreamGuard on_stream(s);  // the outputs are allocated for (and on) this stream
    const std::size_t n = jpegs.size();
    std::vector<at::Tensor> out(n);
    std::vector<std::size_t> gpu, cpu;
    std::vector<detail::nvj::Image> images(n);
    for (std::size_t k = 0; k < n; ++k) {
      if (auto shape = gpu_shape(jpegs[k], k)) {
        out[k] = at::empty({3, shape->first, shape->second}, at::TensorOptions().dtype(at::kByte).device(device_));
        auto* p = out[k].data_ptr<std::uint8_t>();
        const auto plane = static_cast<std::size_t>(shape->first * shape->second);
        for (std::size_t c = 0; c < 3; ++c) {
          images[k].channel[c] = p + c * plane;
          images[k].pitch[c] = static_cast<std::size_t>(shape->second);
        }
        images[k].channel[3] = nullptr;
        images[k].pitch[3] = 0;
        gpu.push_back(k);
      } else {
        cpu.push_back(k);
      }
    }
    if (!gpu.empty() && run(jpegs, images, gpu, s) != detail::nvj::success) {
      // Which one: each alone; a file nvJPEG cannot decode goes to libjpeg-turbo, which decodes it or says why.
      for (const auto k : gpu)
        if (run(jpegs, images, {k}, s) != detail::nvj::success) {
          out[k] = at::Tensor();
          cpu.push_back(k);
        }
    }
    last_on_cpu_ = cpu.size();
    for (const auto k : cpu) out[k] = image::decode(jpegs[k], {}, "jpegs[" + std::to_string(k) + "]").to(device_);
    return out;
  }

 private:
  /// [H, W] when nvJPEG is to decode the file, nullopt when the CPU path is.
  std::optional<std::pair<std::int64_t, std::int64_t>> gpu_shape(std::span<const std::uint8_t> b, std::size_t k) {
    if (image::sniff(b) != Format::jpeg || !detail::ends_with_eoi(b)) return std::nullopt;
    int components = 0, subsampling = 0, w[4] = {}, h[4] = {};
    if (lib_->get_image_info(handle_, b.data(), b.size(), &components, &subsampling, w, h) != detail::nvj::success)
      return std::nullopt;
    if (!(components == 1 || (components == 3 && subsampling != detail::nvj::css_unknown)) || w[0] <= 0 || h[0] <= 0)
      return std::nullopt;
    detail::check_pixels(h[0], w[0], DecodeOptions{}.max_pixels, "jpegs[" + std::to_string(k) + "]");
    if (hardware_) {  // the engines take baseline files only (not progressive ones, nor some subsamplings)
      int unsupported = 1;
      if (lib_->stream_parse_header(handle_, b.data(), b.size(), parsed_) != detail::nvj::success ||
          lib_->batched_supported(handle_, parsed_, &unsupported) != detail::nvj::success || unsupported != 0)
        return std::nullopt;
    }
    return std::pair<std::int64_t, std::int64_t>{h[0], w[0]};
  }

  /// nvjpegDecodeBatched of jpegs[which] into images[which] on `s`.
  detail::nvj::Status run(const std::vector<std::span<const std::uint8_t>>& jpegs, std::vector<detail::nvj::Image>& images,
                          const std::vector<std::size_t>& which, const c10::cuda::CUDAStream& s) {
    const int m = static_cast<int>(which.size());
    if (batch_ != m) {
      if (const auto st = lib_->batched_initialize(handle_, state_, m, 1, detail::nvj::output_rgb);
          st != detail::nvj::success)
        return st;
      batch_ = m;
    }
    std::vector<const unsigned char*> data(which.size());
    std::vector<std::size_t> lengths(which.size());
    std::vector<detail::nvj::Image> dst(which.size());
    for (std::size_t i = 0; i < which.size(); ++i) {
      data[i] = jpegs[which[i]].data();
      lengths[i] = jpegs[which[i]].size();
      dst[i] = images[which[i]];
    }
    const auto st = lib_->decode_batched(handle_, state_, data.data(), lengths.data(), dst.data(), s.stream());
    if (st != detail::nvj::success) batch_ = 0;  // a failed batch needs nvjpegDecodeBatchedInitialize again
    return st;
  }

  void release() noexcept {
    if (lib_ == nullptr) return;
    if (parsed_ != nullptr) lib_->stream_destroy(parsed_);
    if (state_ != nullptr) lib_->state_destroy(state_);
    if (handle_ != nullptr) lib_->destroy(handle_);
    parsed_ = nullptr;
    state_ = nullptr;
    handle_ = nullptr;
  }
  void swap(NvJpeg& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(lib_, o.lib_);
    std::swap(handle_, o.handle_);
    std::swap(state_, o.state_);
    std::swap(parsed_, o.parsed_);
    std::swap(batch_, o.batch_);
    std::swap(last_on_cpu_, o.last_on_cpu_);
    std::swap(hardware_, o.hardware_);
    std::swap(flags_, o.flags_);
  }

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
[[nodiscard]] inline std::vector<at::Tensor> decode_on(c10::Device device,
                                                       const std::vector<std::span<const std::uint8_t>>& jpegs) {
  const auto on_cpu = [&](std::optional<c10::Device> to) {
    std::vector<at::Tensor> out;
    out.reserve(jpegs.size());
    for (std::size_t k = 0; k < jpegs.size(); ++k) {
      auto t = image::decode(jpegs[k], {}, "jpegs[" + std::to_string(k) + "]");
      out.push_back(to ? t.to(*to) : std::move(t));
    }
    return out;
  };
  if (device.is_cpu()) return on_cpu(std::nullopt);
  NITRO_CHECK(device.is_cuda(), "image::decode_on: give a CPU or CUDA device; got ", device.str());
  const auto reason = NvJpeg::unavailable_reason();
  static std::once_flag said;
#if NITRO_WITH_CUDA
  NITRO_CHECK(c10::cuda::device_count() > 0, "image::decode_on: ", device.str(),
              " asked for, but this process sees no CUDA device");
  if (reason.empty()) {
    if (!device.has_index()) device = c10::Device(c10::kCUDA, c10::cuda::current_device());
    thread_local std::map<int, NvJpeg> decoders;
    auto it = decoders.find(device.index());
    if (it == decoders.end()) it = decoders.emplace(device.index(), NvJpeg(device)).first;
    std::call_once(said, [&] {
      std::fprintf(stderr, "nitro: image::decode_on: JPEGs decoded on the GPU by nvJPEG (%s, %s)\n",
                   NvJpeg::library().c_str(), it->second.hardware() ? "hardware decoder" : "CUDA kernels");
    });
    return it->second.decode(jpegs);
  }
#endif
  std::call_once(said, [&] {
    std::fprintf(stderr, "nitro: image::decode_on: JPEGs decoded on the CPU (libjpeg-turbo) and copied to %s: %s\n",
                 device.str().c_str(), reason.c_str());
  });
  return on_cpu(device);
}

}  // namespace nitro::image
