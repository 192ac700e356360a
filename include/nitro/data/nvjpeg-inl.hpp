#pragma once
// The definitions of nitro/data/nvjpeg.hpp's non-template functions: included by nvjpeg.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/data/nvjpeg.hpp>

namespace nitro::image::detail::nvj {

NITRO_INLINE std::string status_name(Status s) {
  static constexpr const char* names[] = {"success",           "not initialized",  "invalid parameter",
                                          "bad JPEG",          "JPEG not supported", "allocator failure",
                                          "execution failed",  "architecture mismatch", "internal error",
                                          "implementation not supported", "incomplete bitstream"};
  return s >= 0 && s < static_cast<int>(std::size(names)) ? std::string(names[s]) + " (" + std::to_string(s) + ")"
                                                          : "status " + std::to_string(s);
}

}  // namespace nitro::image::detail::nvj

namespace nitro::image::detail {

NITRO_INLINE NvJpegLibrary::NvJpegLibrary(const std::string& library) : path_(library) {
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

NITRO_INLINE std::filesystem::path torch_site_packages() {
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

NITRO_INLINE std::vector<std::string> nvjpeg_candidates() {
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

NITRO_INLINE NvJpegFound locate_nvjpeg(const char* override_path, const std::vector<std::string>& candidates) {
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

NITRO_INLINE const NvJpegFound& nvjpeg() {
  static const NvJpegFound found = locate_nvjpeg(std::getenv("NITRO_NVJPEG"), nvjpeg_candidates());
  return found;
}

NITRO_INLINE bool ends_with_eoi(std::span<const std::uint8_t> b) noexcept {
  const std::size_t from = b.size() > 66 ? b.size() - 66 : 0;
  for (std::size_t i = b.size(); i-- > from + 1;)
    if (b[i - 1] == 0xFF && b[i] == 0xD9) return true;
  return false;
}

}  // namespace nitro::image::detail

namespace nitro::image {

NITRO_INLINE std::string NvJpeg::unavailable_reason() {
#if NITRO_WITH_CUDA
  const auto& f = detail::nvjpeg();
  if (!f.reason.empty()) return f.reason;
  if (c10::cuda::device_count() == 0) return "no CUDA device (nvJPEG " + library() + " is there)";
  return {};
#else
  return "this LibTorch was built without CUDA";
#endif
}

NITRO_INLINE std::string NvJpeg::library() {
  const auto& f = detail::nvjpeg();
  if (!f.reason.empty()) return {};
  const auto& v = f.library->version();
  return f.library->path() + (v.empty() ? std::string() : " (nvJPEG " + v + ")");
}

#if NITRO_WITH_CUDA
NITRO_INLINE NvJpeg::NvJpeg(c10::Device device) : device_(device) {
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
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE NvJpeg& NvJpeg::operator=(NvJpeg&& o) noexcept {
  if (this != &o) {
    release();
    swap(o);
  }
  return *this;
}
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE std::vector<at::Tensor> NvJpeg::decode(const std::vector<std::span<const std::uint8_t>>& jpegs, std::optional<c10::cuda::CUDAStream> stream) {
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
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE std::optional<std::pair<std::int64_t, std::int64_t>> NvJpeg::gpu_shape(std::span<const std::uint8_t> b, std::size_t k) {
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
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE detail::nvj::Status NvJpeg::run(const std::vector<std::span<const std::uint8_t>>& jpegs, std::vector<detail::nvj::Image>& images, const std::vector<std::size_t>& which, const c10::cuda::CUDAStream& s) {
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
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE void NvJpeg::release() noexcept {
  if (lib_ == nullptr) return;
  if (parsed_ != nullptr) lib_->stream_destroy(parsed_);
  if (state_ != nullptr) lib_->state_destroy(state_);
  if (handle_ != nullptr) lib_->destroy(handle_);
  parsed_ = nullptr;
  state_ = nullptr;
  handle_ = nullptr;
}
#endif

#if NITRO_WITH_CUDA
NITRO_INLINE void NvJpeg::swap(NvJpeg& o) noexcept {
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
#endif

NITRO_INLINE std::vector<at::Tensor> decode_on(c10::Device device, const std::vector<std::span<const std::uint8_t>>& jpegs) {
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
