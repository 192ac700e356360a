#pragma once
// Image files into uint8 tensors: JPEG through libjpeg-turbo's TurboJPEG API, PNG through libpng.
// Link nitro::image (CMake; it adds TurboJPEG and libpng: Debian's libturbojpeg0-dev and libpng-dev).
//
//   namespace img = nitro::image;
//   at::Tensor x = img::read("photo.jpg");                            // uint8 [3, H, W], RGB
//   at::Tensor y = img::decode(bytes, {.layout = img::Layout::hwc});  // [H, W, 3]
//   // Reduced-size decoding (libjpeg's DCT scaling, with PIL's Image.draft's rule): the largest
//   // reduction 1/2, 1/4 or 1/8 that keeps the image (or the crop) at least 224 x 224. Several times faster.
//   at::Tensor small = img::decode(bytes, {.min_height = 224, .min_width = 224});
//   at::Tensor crop = img::decode(bytes, {.crop = img::Window{.top = 10, .left = 20, .height = 300, .width = 200},
//                                         .min_height = 224, .min_width = 224});
//   img::decode_into(bytes, pinned_buffer, options);                  // into a buffer of the caller's
//   std::vector<std::uint8_t> jpeg = img::encode_jpeg(x, {.quality = 90});
//
// What comes out is always RGB, 8 bits a channel, equal to Pillow's `Image.open(f).convert("RGB")`:
//   - JPEG: libjpeg-turbo's accurate integer IDCT and smooth ("fancy") upsampling, as Pillow's;
//     greyscale is repeated into the three channels; CMYK and YCCK (Adobe files store them inverted,
//     as Photoshop writes them and Pillow reads them) become RGB as Pillow's convert does:
//     R = (255 - K) - (C (255 - K) + 127) / 255 with C, K un-inverted (and likewise G, B).
//     Arithmetic-coded files decode where the library was built with arithmetic decoding (Debian's
//     is); 12-bit (and lossless) JPEG is refused (TurboJPEG 2 decodes 8-bit samples only).
//   - PNG: palette looked up, transparency and alpha dropped (not composited: Pillow's convert("RGB")
//     drops it too), grey repeated, 1/2/4-bit grey scaled to 0..255, 16-bit samples reduced to their
//     high byte (value >> 8; Pillow does that for 16-bit colour, while its 16-bit grey "I;16" clips at
//     255 instead), no gamma correction (nor does Pillow), interlaced images de-interlaced.
// Errors are nitro::Errors naming the file (the `name` argument) and the cause: not an image, a
// truncated file, corrupt data (libjpeg's and libpng's own messages, warnings included: a JPEG that
// libjpeg would decode with grey blocks is refused), an unsupported kind, more pixels than
// `max_pixels` (PIL's decompression-bomb limit by default). Nothing aborts.
//
// Threads: any number at once; each thread keeps its own TurboJPEG handles and scratch buffer.
#include <nitro/core/error.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <array>
#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nitro::image {

enum class Format : std::uint8_t { unknown, jpeg, png };
/// [C, H, W] (chw, what convolutions take) or [H, W, C] (hwc, how the files store pixels).
enum class Layout : std::uint8_t { chw, hwc };

/// What the file's header says.
struct Info {
  Format format = Format::unknown;
  std::int64_t height = 0;
  std::int64_t width = 0;
  /// Colour components in the file: 1 grey, 3 colour, 4 CMYK/YCCK (JPEG); PNG: 1 grey, 2 grey and
  /// alpha, 3 colour or palette, 4 colour and alpha.
  int components = 0;
};

/// A rectangle of the full-size image, in its pixels.
struct Window {
  std::int64_t top = 0;
  std::int64_t left = 0;
  std::int64_t height = 0;
  std::int64_t width = 0;
};

struct DecodeOptions {
  Layout layout = Layout::chw;
  /// Only this part of the image (in full-size pixels; inside the image, non-empty). The result is
  /// the window at the decoded scale: rows floor(top / s) to ceil((top + height) / s), likewise columns.
  std::optional<Window> crop = std::nullopt;
  /// JPEG only (a PNG is decoded whole): decode at a reduced size, 1/2, 1/4 or 1/8 (libjpeg's DCT
  /// scaling), the largest reduction s with the image, or the crop, at least s x min_height by
  /// s x min_width: PIL's Image.draft's rule. 0 and 0: full size. The whole image is decoded at that
  /// scale (TurboJPEG 2 has no partial decoding); a crop is then cut from it.
  std::int64_t min_height = 0;
  std::int64_t min_width = 0;
  /// Refuse images of more pixels than this (width x height, before any reduction): a small file can
  /// claim a huge image. The default is where PIL raises DecompressionBombError (2 x MAX_IMAGE_PIXELS).
  std::int64_t max_pixels = 178'956'970;
  /// JPEG: libjpeg-turbo's fast IDCT and simple upsampling (faster; no longer Pillow's pixels).
  bool fast = false;
};

/// The format from the first bytes (JPEG: FF D8 FF; PNG: its 8-byte signature).
[[nodiscard]] inline Format sniff(std::span<const std::uint8_t> bytes) noexcept {
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) return Format::jpeg;
  static constexpr std::uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), png_sig, 8) == 0) return Format::png;
  return Format::unknown;
}

/// The whole file's bytes; a nitro::Error naming the file if it cannot be read.
[[nodiscard]] inline std::vector<std::uint8_t> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  NITRO_CHECK(in.good(), "image: ", path.string(), ": cannot open the file for reading");
  const auto size = static_cast<std::streamoff>(in.tellg());
  NITRO_CHECK(size >= 0, "image: ", path.string(), ": cannot tell the file's size");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  in.seekg(0);
  if (size > 0) in.read(reinterpret_cast<char*>(bytes.data()), size);
  NITRO_CHECK(in.good() || (size == 0), "image: ", path.string(), ": read failed");
  return bytes;
}

namespace detail {

inline std::string who(std::string_view name) { return name.empty() ? std::string("(bytes)") : std::string(name); }

/// One TurboJPEG handle per thread and kind, destroyed with the thread.
struct TjHandle {
  tjhandle h = nullptr;
  explicit TjHandle(bool compress) : h(compress ? tjInitCompress() : tjInitDecompress()) {}
  ~TjHandle() {
    if (h != nullptr) tjDestroy(h);
  }
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
};
inline TjHandle& decompressor_handle() {
  thread_local TjHandle t(false);
  return t;
}
inline tjhandle decompressor() {
  const auto& t = decompressor_handle();
  NITRO_CHECK(t.h != nullptr, "image: TurboJPEG could not make a decompressor (", tjGetErrorStr2(nullptr), ")");
  return t.h;
}
/// A new decompressor for this thread: TurboJPEG 2's tjDecompressHeader3 returns on an error without
/// aborting libjpeg, and every later file on that handle would fail ("Bogus marker length").
inline void renew_decompressor() {
  auto& t = decompressor_handle();
  if (t.h != nullptr) tjDestroy(t.h);
  t.h = tjInitDecompress();
}
inline tjhandle compressor() {
  thread_local TjHandle t(true);
  NITRO_CHECK(t.h != nullptr, "image: TurboJPEG could not make a compressor (", tjGetErrorStr2(nullptr), ")");
  return t.h;
}
/// A per-thread buffer for what is decoded before it is rearranged (CHW, crops, CMYK), lent for one
/// decode: not zero-filled, and given back to the system after a decode that needed more than
/// kScratchKeep bytes (one huge image, or a header that only claims one, must not pin its size for the
/// thread's life).
inline constexpr std::size_t kScratchKeep = std::size_t{64} << 20;
struct Scratch {
  std::unique_ptr<std::uint8_t[]> data;
  std::size_t size = 0;
};
inline Scratch& scratch_slot() {
  thread_local Scratch s;
  return s;
}
class ScratchLease {
 public:
  explicit ScratchLease(std::size_t bytes) {
    auto& s = scratch_slot();
    if (s.size < bytes) {
      s.data.reset();
      s.data.reset(new std::uint8_t[bytes]);  // default-initialised: no pages touched until written
      s.size = bytes;
    }
    data_ = s.data.get();
  }
  ~ScratchLease() {
    auto& s = scratch_slot();
    if (s.size > kScratchKeep) s.data.reset(), s.size = 0;
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  [[nodiscard]] std::uint8_t* data() const noexcept { return data_; }

 private:
  std::uint8_t* data_ = nullptr;
};

/// The largest reduction 1/s (s = 8, 4, 2) with the image at least min_h x min_w at that scale, as
/// PIL's Image.draft picks it: w >= s * min_w and h >= s * min_h.
inline int reduction(std::int64_t h, std::int64_t w, std::int64_t min_h, std::int64_t min_w) {
  if (min_h <= 0 && min_w <= 0) return 1;
  for (int s : {8, 4, 2}) {
    if (h >= s * min_h && w >= s * min_w) return s;
  }
  return 1;
}

inline bool adobe_marker(std::span<const std::uint8_t> b) {
  // Walks the markers before the first scan: APP14 "Adobe" means CMYK is stored inverted.
  std::size_t i = 2;
  while (i + 4 <= b.size()) {
    if (b[i] != 0xFF) return false;
    const std::uint8_t m = b[i + 1];
    if (m == 0xFF) {
      ++i;
      continue;
    }
    if (m == 0xDA || m == 0xD9) return false;  // start of scan, end of image
    const std::size_t len = (static_cast<std::size_t>(b[i + 2]) << 8) | b[i + 3];
    if (m == 0xEE && len >= 7 && i + 9 <= b.size() && std::memcmp(&b[i + 4], "Adobe", 5) == 0) return true;
    i += 2 + len;
  }
  return false;
}

inline void check_pixels(std::int64_t h, std::int64_t w, std::int64_t max_pixels, std::string_view name) {
  NITRO_CHECK(h > 0 && w > 0, "image: ", who(name), ": the header says ", w, "x", h, " pixels");
  NITRO_CHECK(max_pixels > 0, "image: DecodeOptions::max_pixels is ", max_pixels, "; give a positive limit");
  NITRO_CHECK(h * w <= max_pixels, "image: ", who(name), ": ", w, "x", h, " = ", h * w, " pixels is more than max_pixels (",
              max_pixels, "), which guards against decompression bombs; raise DecodeOptions::max_pixels if the file "
              "is trusted");
}

/// Full-size window -> the window at 1/s.
inline Window scaled(const Window& c, int s, std::int64_t sh, std::int64_t sw) {
  const auto top = c.top / s, left = c.left / s;
  const auto bottom = std::min(sh, (c.top + c.height + s - 1) / s), right = std::min(sw, (c.left + c.width + s - 1) / s);
  return {top, left, std::max<std::int64_t>(1, bottom - top), std::max<std::int64_t>(1, right - left)};
}

inline void check_window(const Window& c, std::int64_t h, std::int64_t w, std::string_view name) {
  NITRO_CHECK(c.height > 0 && c.width > 0 && c.top >= 0 && c.left >= 0 && c.top + c.height <= h && c.left + c.width <= w,
              "image: ", who(name), ": the crop (top ", c.top, ", left ", c.left, ", ", c.width, "x", c.height,
              ") is not a non-empty window inside the ", w, "x", h, " image");
}

/// Rows of an RGB HWC image `src` (width sw) into `out` (uint8, contiguous, of the window's shape).
inline void place(const std::uint8_t* src, std::int64_t sw, const Window& win, const at::Tensor& out, Layout layout) {
  auto* dst = out.data_ptr<std::uint8_t>();
  const auto h = win.height, w = win.width;
  if (layout == Layout::hwc) {
    for (std::int64_t y = 0; y < h; ++y)
      std::memcpy(dst + y * w * 3, src + ((win.top + y) * sw + win.left) * 3, static_cast<std::size_t>(w * 3));
    return;
  }
  const auto plane = h * w;
  // The whole image is one run of pixels; a window, one run a row. Unaliased pointers let the compiler
  // vectorise the de-interleaving (about twice as fast as without).
  const bool whole = win.left == 0 && w == sw;
  const auto deinterleave = [](const std::uint8_t* __restrict in, std::uint8_t* __restrict r, std::uint8_t* __restrict g,
                               std::uint8_t* __restrict b, std::int64_t n) {
    for (std::int64_t x = 0; x < n; ++x) {
      r[x] = in[3 * x];
      g[x] = in[3 * x + 1];
      b[x] = in[3 * x + 2];
    }
  };
  if (whole) {
    deinterleave(src + win.top * sw * 3, dst, dst + plane, dst + 2 * plane, plane);
    return;
  }
  for (std::int64_t y = 0; y < h; ++y)
    deinterleave(src + ((win.top + y) * sw + win.left) * 3, dst + y * w, dst + plane + y * w, dst + 2 * plane + y * w, w);
}

// ---- PNG: libpng reports errors by longjmp; the two functions that call into it hold no C++ object.
struct PngSource {
  const std::uint8_t* data;
  std::size_t size;
  std::size_t at;
  char error[256];
};
extern "C" inline void nitro_png_read(png_structp png, png_bytep out, std::size_t n) {
  auto* s = static_cast<PngSource*>(png_get_io_ptr(png));
  if (s->size - s->at < n) png_error(png, "the file ends early (truncated)");
  std::memcpy(out, s->data + s->at, n);
  s->at += n;
}
extern "C" inline void nitro_png_error(png_structp png, png_const_charp message) {
  auto* s = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(s->error, sizeof s->error, "%s", message);
  png_longjmp(png, 1);
}
extern "C" inline void nitro_png_warning(png_structp, png_const_charp) {}

struct PngHeader {
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, color_type = 0;
};
// 0 on success; the error text in s->error otherwise.
inline int png_header(png_structp png, png_infop info, PngHeader* h) {
  if (setjmp(png_jmpbuf(png))) return 1;
  png_read_info(png, info);
  h->width = png_get_image_width(png, info);
  h->height = png_get_image_height(png, info);
  h->bit_depth = png_get_bit_depth(png, info);
  h->color_type = png_get_color_type(png, info);
  return 0;
}
inline int png_pixels(png_structp png, png_infop info, const PngHeader* h, png_bytepp rows, std::size_t row_bytes) {
  if (setjmp(png_jmpbuf(png))) return 1;
  if (h->bit_depth == 16) png_set_strip_16(png);
  if (h->color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (h->color_type == PNG_COLOR_TYPE_GRAY && h->bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  // png_set_palette_to_rgb expands a palette's tRNS into alpha: strip that too.
  if ((h->color_type & PNG_COLOR_MASK_ALPHA) != 0 || png_get_valid(png, info, PNG_INFO_tRNS) != 0)
    png_set_strip_alpha(png);
  if (h->color_type == PNG_COLOR_TYPE_GRAY || h->color_type == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  (void)png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != row_bytes) png_error(png, "unexpected row size after conversion to RGB");
  png_read_image(png, rows);
  return 0;
}

struct PngReadGuard {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngReadGuard() { png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr); }
};

inline Info png_info(std::span<const std::uint8_t> bytes, std::string_view name, PngReadGuard& g, PngSource& src,
                     PngHeader& h) {
  src = {bytes.data(), bytes.size(), 8, {0}};
  g.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, nitro_png_error, nitro_png_warning);
  NITRO_CHECK(g.png != nullptr, "image: ", who(name), ": libpng could not start (out of memory?)");
  g.info = png_create_info_struct(g.png);
  NITRO_CHECK(g.info != nullptr, "image: ", who(name), ": libpng could not start (out of memory?)");
  png_set_read_fn(g.png, &src, nitro_png_read);
  png_set_sig_bytes(g.png, 8);
  png_set_user_limits(g.png, 0x7fffffff, 0x7fffffff);  // our own max_pixels decides
  NITRO_CHECK(png_header(g.png, g.info, &h) == 0, "image: ", who(name), ": damaged PNG (libpng: ", src.error, ")");
  const int comps = h.color_type == PNG_COLOR_TYPE_GRAY         ? 1
                    : h.color_type == PNG_COLOR_TYPE_GRAY_ALPHA ? 2
                    : h.color_type == PNG_COLOR_TYPE_RGB_ALPHA  ? 4
                                                                : 3;
  return {Format::png, static_cast<std::int64_t>(h.height), static_cast<std::int64_t>(h.width), comps};
}

inline Info jpeg_info(std::span<const std::uint8_t> bytes, std::string_view name, int* colorspace = nullptr) {
  int w = 0, h = 0, subsamp = 0, cs = 0;
  const auto handle = decompressor();
  NITRO_CHECK(bytes.size() <= 0xFFFFFFFFull, "image: ", who(name), ": a JPEG over 4 GiB is not supported");
  if (tjDecompressHeader3(handle, bytes.data(), static_cast<unsigned long>(bytes.size()), &w, &h, &subsamp, &cs) != 0) {
    const std::string why = tjGetErrorStr2(handle);
    renew_decompressor();
    throw Error("image: " + who(name) + ": damaged or unsupported JPEG (libjpeg-turbo: " + why + ")");
  }
  // TurboJPEG 2 takes data that ends before the frame header (SOF) for a tables-only file: 0 x 0.
  NITRO_CHECK(w > 0 && h > 0, "image: ", who(name), ": damaged or truncated JPEG (the data ends before the frame header)");
  if (colorspace != nullptr) *colorspace = cs;
  return {Format::jpeg, h, w, cs == TJCS_GRAY ? 1 : (cs == TJCS_CMYK || cs == TJCS_YCCK) ? 4 : 3};
}

/// The output's [h, w] and the reduction, checking the options.
struct Plan {
  Info info;
  int scale = 1;
  Window window;  // at the decoded scale
  std::int64_t scaled_h = 0, scaled_w = 0;
};
inline Plan plan(const Info& info, const DecodeOptions& o, std::string_view name) {
  check_pixels(info.height, info.width, o.max_pixels, name);
  NITRO_CHECK(o.min_height >= 0 && o.min_width >= 0, "image: DecodeOptions::min_height and min_width are sizes (>= 0); got ",
              o.min_height, " and ", o.min_width);
  Plan p{info};
  const Window full{0, 0, info.height, info.width};
  const Window c = o.crop.value_or(full);
  if (o.crop) check_window(c, info.height, info.width, name);
  p.scale = info.format == Format::jpeg ? reduction(c.height, c.width, o.min_height, o.min_width) : 1;
  p.scaled_h = (info.height + p.scale - 1) / p.scale;
  p.scaled_w = (info.width + p.scale - 1) / p.scale;
  p.window = scaled(c, p.scale, p.scaled_h, p.scaled_w);
  return p;
}

inline std::vector<std::int64_t> shape_of(const Window& w, Layout layout) {
  return layout == Layout::chw ? std::vector<std::int64_t>{3, w.height, w.width}
                               : std::vector<std::int64_t>{w.height, w.width, 3};
}

inline void check_out(const at::Tensor& out, const Plan& p, Layout layout, std::string_view name) {
  const auto want = shape_of(p.window, layout);
  NITRO_CHECK(!out.defined() || out.is_contiguous(), "image: ", who(name),
              ": decode_into needs a contiguous tensor (a row of a batch is; a slice of columns or a permuted "
              "view is not); got strides ", out.strides());
  NITRO_CHECK(out.defined() && out.device().is_cpu() && out.scalar_type() == at::kByte && out.sizes().vec() == want,
              "image: ", who(name), ": decode_into needs a contiguous uint8 CPU tensor of shape ", c10::IntArrayRef(want),
              "; got ", out.defined() ? out.sizes() : c10::IntArrayRef{}, " ",
              out.defined() ? std::string(c10::toString(out.scalar_type())) : std::string("(undefined)"));
}

inline void decode_jpeg(std::span<const std::uint8_t> bytes, const Plan& p, int colorspace, const DecodeOptions& o,
                        const at::Tensor& out, std::string_view name) {
  const auto handle = decompressor();
  const int flags = TJFLAG_STOPONWARNING | (o.fast ? (TJFLAG_FASTDCT | TJFLAG_FASTUPSAMPLE) : TJFLAG_ACCURATEDCT);
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  const auto sw = p.scaled_w, sh = p.scaled_h;
  const bool direct = !cmyk && o.layout == Layout::hwc && p.window.height == sh && p.window.width == sw;
  const std::size_t px = static_cast<std::size_t>(sh * sw);
  std::optional<ScratchLease> lease;
  if (!direct) lease.emplace(px * (cmyk ? 4 : 3));
  std::uint8_t* dst = direct ? out.data_ptr<std::uint8_t>() : lease->data();
  if (tjDecompress2(handle, bytes.data(), static_cast<unsigned long>(bytes.size()), dst, static_cast<int>(sw), 0,
                    static_cast<int>(sh), cmyk ? TJPF_CMYK : TJPF_RGB, flags) != 0) {
    const bool warning = tjGetErrorCode(handle) == TJERR_WARNING;
    const std::string why = tjGetErrorStr2(handle);
    renew_decompressor();  // whatever state the failure left, the next file starts afresh
    throw Error("image: " + who(name) + ": " + (warning ? "truncated or corrupt JPEG data" : "JPEG decoding failed") +
                " (libjpeg-turbo: " + why + ")");
  }
  if (direct) return;
  if (cmyk) {
    // In place, 4 -> 3 bytes a pixel (front to back is safe: the write never passes the read).
    const bool inverted = adobe_marker(bytes);
    for (std::size_t i = 0; i < px; ++i) {
      int c = dst[4 * i], m = dst[4 * i + 1], y = dst[4 * i + 2], k = dst[4 * i + 3];
      if (inverted) c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
      const int nk = 255 - k;
      const auto mul = [](int a, int b) {  // Pillow's MULDIV255: round(a * b / 255)
        const int t = a * b + 128;
        return ((t >> 8) + t) >> 8;
      };
      dst[3 * i] = static_cast<std::uint8_t>(std::clamp(nk - mul(c, nk), 0, 255));
      dst[3 * i + 1] = static_cast<std::uint8_t>(std::clamp(nk - mul(m, nk), 0, 255));
      dst[3 * i + 2] = static_cast<std::uint8_t>(std::clamp(nk - mul(y, nk), 0, 255));
    }
  }
  place(dst, sw, p.window, out, o.layout);
}

inline void decode_png(const Plan& p, const DecodeOptions& o, const at::Tensor& out,
                       std::string_view name, PngReadGuard& g, PngSource& src, const PngHeader& h) {
  const auto w = p.scaled_w, hh = p.scaled_h;
  const bool direct = o.layout == Layout::hwc && p.window.height == hh && p.window.width == w;
  const std::size_t row = static_cast<std::size_t>(w) * 3;
  std::optional<ScratchLease> lease;
  if (!direct) lease.emplace(row * static_cast<std::size_t>(hh));
  std::uint8_t* dst = direct ? out.data_ptr<std::uint8_t>() : lease->data();
  std::vector<png_bytep> rows(static_cast<std::size_t>(hh));
  for (std::int64_t y = 0; y < hh; ++y) rows[static_cast<std::size_t>(y)] = dst + static_cast<std::size_t>(y) * row;
  NITRO_CHECK(png_pixels(g.png, g.info, &h, rows.data(), row) == 0, "image: ", who(name),
              ": truncated or corrupt PNG (libpng: ", src.error, ")");
  if (!direct) place(dst, w, p.window, out, o.layout);
}

}  // namespace detail

/// The header's format, size and components, without decoding.
[[nodiscard]] inline Info probe(std::span<const std::uint8_t> bytes, std::string_view name = {}) {
  switch (sniff(bytes)) {
    case Format::jpeg: return detail::jpeg_info(bytes, name);
    case Format::png: {
      detail::PngReadGuard g;
      detail::PngSource src{};
      detail::PngHeader h;
      return detail::png_info(bytes, name, g, src, h);
    }
    default: break;
  }
  throw Error("image: " + detail::who(name) + ": not a JPEG or PNG file (" +
              (bytes.empty() ? std::string("it is empty") : std::string("its first bytes are neither")) + ")");
}

/// The reduction (1, 2, 4 or 8) decode() picks for an image of `info` and these options.
[[nodiscard]] inline int reduction_for(const Info& info, const DecodeOptions& options = {}) {
  return detail::plan(info, options, {}).scale;
}

/// The shape decode() returns for this image and these options.
[[nodiscard]] inline std::vector<std::int64_t> decoded_shape(const Info& info, const DecodeOptions& options = {}) {
  return detail::shape_of(detail::plan(info, options, {}).window, options.layout);
}

/// Decodes into `out`: uint8, contiguous, CPU (pinned or not), of decoded_shape(probe(bytes), options).
inline void decode_into(std::span<const std::uint8_t> bytes, const at::Tensor& out, const DecodeOptions& options = {},
                        std::string_view name = {}) {
  const auto format = sniff(bytes);
  if (format == Format::jpeg) {
    int cs = 0;
    const auto p = detail::plan(detail::jpeg_info(bytes, name, &cs), options, name);
    detail::check_out(out, p, options.layout, name);
    detail::decode_jpeg(bytes, p, cs, options, out, name);
    return;
  }
  if (format == Format::png) {
    detail::PngReadGuard g;
    detail::PngSource src{};
    detail::PngHeader h;
    const auto p = detail::plan(detail::png_info(bytes, name, g, src, h), options, name);
    detail::check_out(out, p, options.layout, name);
    detail::decode_png(p, options, out, name, g, src, h);
    return;
  }
  (void)probe(bytes, name);  // throws the message for a file that is neither
}

/// Decodes a JPEG or PNG file's bytes into a new uint8 tensor ([3, H, W] or [H, W, 3], RGB).
[[nodiscard]] inline at::Tensor decode(std::span<const std::uint8_t> bytes, const DecodeOptions& options = {},
                                       std::string_view name = {}) {
  const auto format = sniff(bytes);
  if (format == Format::jpeg) {
    int cs = 0;
    const auto p = detail::plan(detail::jpeg_info(bytes, name, &cs), options, name);
    auto out = at::empty(detail::shape_of(p.window, options.layout), at::kByte);
    detail::decode_jpeg(bytes, p, cs, options, out, name);
    return out;
  }
  if (format == Format::png) {
    detail::PngReadGuard g;
    detail::PngSource src{};
    detail::PngHeader h;
    const auto p = detail::plan(detail::png_info(bytes, name, g, src, h), options, name);
    auto out = at::empty(detail::shape_of(p.window, options.layout), at::kByte);
    detail::decode_png(p, options, out, name, g, src, h);
    return out;
  }
  (void)probe(bytes, name);  // throws
  return {};
}

/// read_file + decode, errors naming the file.
[[nodiscard]] inline at::Tensor read(const std::filesystem::path& path, const DecodeOptions& options = {}) {
  const auto bytes = read_file(path);
  return decode(bytes, options, path.string());
}

enum class Subsampling : std::uint8_t { s444, s422, s420 };

struct JpegOptions {
  int quality = 90;  ///< 1..100
  Subsampling subsampling = Subsampling::s420;
  Layout layout = Layout::chw;  ///< of the image given
  bool progressive = false;
};

/// A uint8 RGB ([3, H, W] / [H, W, 3]) or grey ([1, H, W] / [H, W, 1]) image as JPEG bytes.
[[nodiscard]] inline std::vector<std::uint8_t> encode_jpeg(const at::Tensor& image, const JpegOptions& o = {}) {
  NITRO_CHECK(o.quality >= 1 && o.quality <= 100, "image::encode_jpeg: quality is ", o.quality, "; give 1 to 100");
  NITRO_CHECK(image.defined() && image.dim() == 3 && image.scalar_type() == at::kByte,
              "image::encode_jpeg: give a uint8 image of 3 dimensions (", o.layout == Layout::chw ? "[C, H, W]" : "[H, W, C]",
              "); got ", image.defined() ? image.sizes() : c10::IntArrayRef{});
  const auto hwc = (o.layout == Layout::chw ? image.permute({1, 2, 0}) : image).cpu().contiguous();
  const auto h = hwc.size(0), w = hwc.size(1), c = hwc.size(2);
  NITRO_CHECK(c == 1 || c == 3, "image::encode_jpeg: ", c, " channels; give 1 (grey) or 3 (RGB)");
  NITRO_CHECK(h > 0 && w > 0 && h <= 65535 && w <= 65535, "image::encode_jpeg: ", w, "x", h,
              " is not a JPEG size (1 to 65535 each way)");
  const int samp = c == 1                                  ? TJSAMP_GRAY
                   : o.subsampling == Subsampling::s444 ? TJSAMP_444
                   : o.subsampling == Subsampling::s422 ? TJSAMP_422
                                                        : TJSAMP_420;
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  // TurboJPEG 2's progressive mode stays in the handle's scan script: the next baseline file written
  // with it is corrupt ("bad Huffman code"). A progressive file gets a handle of its own.
  std::optional<detail::TjHandle> own;
  if (o.progressive) {
    own.emplace(true);
    NITRO_CHECK(own->h != nullptr, "image: TurboJPEG could not make a compressor (", tjGetErrorStr2(nullptr), ")");
  }
  const auto handle = o.progressive ? own->h : detail::compressor();
  const int flags = TJFLAG_ACCURATEDCT | (o.progressive ? TJFLAG_PROGRESSIVE : 0);
  if (tjCompress2(handle, hwc.data_ptr<std::uint8_t>(), static_cast<int>(w), 0, static_cast<int>(h),
                  c == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &size, samp, o.quality, flags) != 0) {
    if (buf != nullptr) tjFree(buf);
    throw Error("image::encode_jpeg: libjpeg-turbo: " + std::string(tjGetErrorStr2(handle)));
  }
  std::vector<std::uint8_t> out(buf, buf + size);
  tjFree(buf);
  return out;
}

}  // namespace nitro::image
