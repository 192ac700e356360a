#pragma once
// The definitions of nitro/data/image.hpp's non-template functions: included by image.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/data/image.hpp>

#include <csetjmp>
#include <cstdio>

// libjpeg-turbo's own API, for decoding a region (after <cstdio>: it uses FILE). Header-only, this
// brings jpeglib.h's macros and typedefs (TRUE, EXTERN, boolean, INT32, ...) into the including
// translation unit; with the compiled library (NITRO_COMPILED) they stay in src/image.cpp.
#include <jpeglib.h>
#ifndef LIBJPEG_TURBO_VERSION
#error "nitro/data/image.hpp needs libjpeg-turbo's jpeglib.h (1.5 or later: jpeg_crop_scanline, jpeg_skip_scanlines), not IJG libjpeg's; install libjpeg-turbo (Debian: libjpeg-dev, i.e. libjpeg62-turbo-dev)"
#endif

namespace nitro::image {

NITRO_INLINE Format sniff(std::span<const std::uint8_t> bytes) noexcept {
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) return Format::jpeg;
  static constexpr std::uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), png_sig, 8) == 0) return Format::png;
  return Format::unknown;
}

NITRO_INLINE std::vector<std::uint8_t> read_file(const std::filesystem::path& path) {
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

}  // namespace nitro::image

namespace nitro::image::detail {

NITRO_INLINE TjHandle::TjHandle(bool compress) : h(compress ? tjInitCompress() : tjInitDecompress()) {}

NITRO_INLINE TjHandle::~TjHandle() {
  if (h != nullptr) tjDestroy(h);
}

NITRO_INLINE TjHandle& decompressor_handle() {
  thread_local TjHandle t(false);
  return t;
}

NITRO_INLINE tjhandle decompressor() {
  const auto& t = decompressor_handle();
  NITRO_CHECK(t.h != nullptr, "image: TurboJPEG could not make a decompressor (", tjGetErrorStr2(nullptr), ")");
  return t.h;
}

NITRO_INLINE void renew_decompressor() {
  auto& t = decompressor_handle();
  if (t.h != nullptr) tjDestroy(t.h);
  t.h = tjInitDecompress();
}

NITRO_INLINE tjhandle compressor() {
  thread_local TjHandle t(true);
  NITRO_CHECK(t.h != nullptr, "image: TurboJPEG could not make a compressor (", tjGetErrorStr2(nullptr), ")");
  return t.h;
}

NITRO_INLINE Scratch& scratch_slot() {
  thread_local Scratch s;
  return s;
}

NITRO_INLINE ScratchLease::ScratchLease(std::size_t bytes) {
  auto& s = scratch_slot();
  if (s.size < bytes) {
    s.data.reset();
    s.data.reset(new std::uint8_t[bytes]);  // default-initialised: no pages touched until written
    s.size = bytes;
  }
  data_ = s.data.get();
}

NITRO_INLINE ScratchLease::~ScratchLease() {
  auto& s = scratch_slot();
  if (s.size > kScratchKeep) s.data.reset(), s.size = 0;
}

NITRO_INLINE int reduction(std::int64_t h, std::int64_t w, std::int64_t min_h, std::int64_t min_w) {
  if (min_h <= 0 && min_w <= 0) return 1;
  for (int s : {8, 4, 2}) {
    if (h >= s * min_h && w >= s * min_w) return s;
  }
  return 1;
}

NITRO_INLINE bool adobe_marker(std::span<const std::uint8_t> b) {
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

NITRO_INLINE void check_pixels(std::int64_t h, std::int64_t w, std::int64_t max_pixels, std::string_view name) {
  NITRO_CHECK(h > 0 && w > 0, "image: ", who(name), ": the header says ", w, "x", h, " pixels");
  NITRO_CHECK(max_pixels > 0, "image: DecodeOptions::max_pixels is ", max_pixels, "; give a positive limit");
  NITRO_CHECK(h * w <= max_pixels, "image: ", who(name), ": ", w, "x", h, " = ", h * w, " pixels is more than max_pixels (",
              max_pixels, "), which guards against decompression bombs; raise DecodeOptions::max_pixels if the file "
              "is trusted");
}

NITRO_INLINE Window scaled(const Window& c, int s, std::int64_t sh, std::int64_t sw) {
  const auto top = c.top / s, left = c.left / s;
  const auto bottom = std::min(sh, (c.top + c.height + s - 1) / s), right = std::min(sw, (c.left + c.width + s - 1) / s);
  return {top, left, std::max<std::int64_t>(1, bottom - top), std::max<std::int64_t>(1, right - left)};
}

NITRO_INLINE void check_window(const Window& c, std::int64_t h, std::int64_t w, std::string_view name) {
  NITRO_CHECK(c.height > 0 && c.width > 0 && c.top >= 0 && c.left >= 0 && c.top + c.height <= h && c.left + c.width <= w,
              "image: ", who(name), ": the crop (top ", c.top, ", left ", c.left, ", ", c.width, "x", c.height,
              ") is not a non-empty window inside the ", w, "x", h, " image");
}

NITRO_INLINE void place(const std::uint8_t* src, std::int64_t sw, const Window& win, const at::Tensor& out, Layout layout) {
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

NITRO_INLINE int png_header(png_structp png, png_infop info, PngHeader* h) {
  if (setjmp(png_jmpbuf(png))) return 1;
  png_read_info(png, info);
  h->width = png_get_image_width(png, info);
  h->height = png_get_image_height(png, info);
  h->bit_depth = png_get_bit_depth(png, info);
  h->color_type = png_get_color_type(png, info);
  return 0;
}

NITRO_INLINE int png_pixels(png_structp png, png_infop info, const PngHeader* h, png_bytepp rows, std::size_t row_bytes) {
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

NITRO_INLINE Info png_info(std::span<const std::uint8_t> bytes, std::string_view name, PngReadGuard& g, PngSource& src, PngHeader& h) {
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

NITRO_INLINE Info jpeg_info(std::span<const std::uint8_t> bytes, std::string_view name, int* colorspace) {
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

NITRO_INLINE Plan plan(const Info& info, const DecodeOptions& o, std::string_view name) {
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

NITRO_INLINE std::vector<std::int64_t> shape_of(const Window& w, Layout layout) {
  return layout == Layout::chw ? std::vector<std::int64_t>{3, w.height, w.width}
                               : std::vector<std::int64_t>{w.height, w.width, 3};
}

NITRO_INLINE void check_out(const at::Tensor& out, const Plan& p, Layout layout, std::string_view name) {
  const auto want = shape_of(p.window, layout);
  NITRO_CHECK(!out.defined() || out.is_contiguous(), "image: ", who(name),
              ": decode_into needs a contiguous tensor (a row of a batch is; a slice of columns or a permuted "
              "view is not); got strides ", out.strides());
  NITRO_CHECK(out.defined() && out.device().is_cpu() && out.scalar_type() == at::kByte && out.sizes().vec() == want,
              "image: ", who(name), ": decode_into needs a contiguous uint8 CPU tensor of shape ", c10::IntArrayRef(want),
              "; got ", out.defined() ? out.sizes() : c10::IntArrayRef{}, " ",
              out.defined() ? std::string(c10::toString(out.scalar_type())) : std::string("(undefined)"));
}

NITRO_INLINE void decode_jpeg(std::span<const std::uint8_t> bytes, const Plan& p, int colorspace, const DecodeOptions& o, const at::Tensor& out, std::string_view name) {
  if (o.partial && (p.window.height < p.scaled_h || p.window.width < p.scaled_w)) {
    decode_jpeg_region(bytes, p, colorspace, o, out, name);
    return;
  }
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
  if (cmyk) cmyk_to_rgb(dst, px, adobe_marker(bytes));
  place(dst, sw, p.window, out, o.layout);
}

NITRO_INLINE void cmyk_to_rgb(std::uint8_t* dst, std::size_t count, bool inverted) noexcept {
  // In place, 4 -> 3 bytes a pixel (front to back is safe: the write never passes the read).
  for (std::size_t i = 0; i < count; ++i) {
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

// ---- a JPEG's region through libjpeg: its errors longjmp; the function that calls it holds no C++
// object (the caller owns the decompressor and the buffers).
struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  int warning;
  char message[JMSG_LENGTH_MAX];
};
extern "C" inline void nitro_jpeg_error_exit(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegErrors*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}
// A warning (level -1: corrupt data libjpeg would decode with grey blocks, data ending early) stops
// the decode, as TurboJPEG's TJFLAG_STOPONWARNING does on the whole-image path; trace messages
// (levels >= 0) are ignored.
extern "C" inline void nitro_jpeg_emit_message(j_common_ptr c, int level) {
  if (level >= 0) return;
  auto* e = reinterpret_cast<JpegErrors*>(c->err);
  e->warning = 1;
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

struct JpegRegionJob {
  const std::uint8_t* data;
  std::size_t size;
  int scale;
  int fast;
  int cmyk;
  int inverted;  // CMYK stored inverted (Adobe)
  JDIMENSION full_h, full_w;  // the image at 1/scale
  JDIMENSION top, left, height, width;  // the window at 1/scale
  std::uint8_t* row;  // full_w x 4 bytes
  std::uint8_t* dst;  // the output: height x width x 3 (hwc) or 3 planes (chw)
  int chw;
};

struct JpegDecompressor {
  jpeg_decompress_struct cinfo{};
  JpegErrors errors{};
  bool created = false;
  JpegDecompressor() = default;
  JpegDecompressor(const JpegDecompressor&) = delete;
  JpegDecompressor& operator=(const JpegDecompressor&) = delete;
  ~JpegDecompressor() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

// 0: done; 1: libjpeg stopped (d->errors says why); 2: libjpeg's output is not the planned size.
NITRO_INLINE int jpeg_region_rows(JpegDecompressor* d, const JpegRegionJob* j) {
  jpeg_decompress_struct* c = &d->cinfo;
  c->err = jpeg_std_error(&d->errors.mgr);
  d->errors.mgr.error_exit = nitro_jpeg_error_exit;
  d->errors.mgr.emit_message = nitro_jpeg_emit_message;
  if (setjmp(d->errors.jump)) return 1;
  jpeg_create_decompress(c);
  d->created = true;
  jpeg_mem_src(c, j->data, static_cast<unsigned long>(j->size));
  (void)jpeg_read_header(c, static_cast<boolean>(1));  // TRUE
  // TurboJPEG's settings for TJPF_RGB / TJPF_CMYK and its flags (turbojpeg.c, setDecompDefaults).
  c->out_color_space = j->cmyk != 0 ? JCS_CMYK : JCS_EXT_RGB;
  c->scale_num = 1;
  c->scale_denom = static_cast<unsigned int>(j->scale);
  c->dct_method = j->fast != 0 ? JDCT_IFAST : JDCT_ISLOW;
  c->do_fancy_upsampling = static_cast<boolean>(j->fast == 0);
  (void)jpeg_start_decompress(c);
  const int channels = j->cmyk != 0 ? 4 : 3;
  if (c->output_width != j->full_w || c->output_height != j->full_h || c->output_components != channels) return 2;
  // One pixel more on each side where the image has it: libjpeg's smooth upsampling repeats a
  // region's first and last chroma samples at its edges, where a whole decode blends in the next.
  // libjpeg moves the left edge further left, to an iMCU boundary. At least 3 pixels wide where the
  // image has them: a region of 2 at column 0 gives a chroma width of 1, for which libjpeg's upsampler
  // falls back to repeating samples (a 1-pixel crop at column 0 of a 4:2:0 file differed by up to 37).
  JDIMENSION x = j->left > 0 ? j->left - 1 : 0;
  JDIMENSION w = std::min(j->full_w, std::max(j->left + j->width + 1, x + 3)) - x;
  if (x > 0 || w < j->full_w) jpeg_crop_scanline(c, &x, &w);
  if (j->top > 0 && jpeg_skip_scanlines(c, j->top) != j->top) return 2;
  const JDIMENSION shift = (j->left - x) * static_cast<JDIMENSION>(channels);
  const std::size_t plane = static_cast<std::size_t>(j->height) * j->width;
  for (JDIMENSION y = 0; y < j->height; ++y) {
    JSAMPROW row = j->row;
    if (jpeg_read_scanlines(c, &row, 1) != 1) return 2;
    std::uint8_t* px = j->row + shift;
    if (j->cmyk != 0) cmyk_to_rgb(px, j->width, j->inverted != 0);
    if (j->chw == 0) {
      std::memcpy(j->dst + static_cast<std::size_t>(y) * j->width * 3, px, static_cast<std::size_t>(j->width) * 3);
    } else {
      std::uint8_t* __restrict r = j->dst + static_cast<std::size_t>(y) * j->width;
      std::uint8_t* __restrict g = r + plane;
      std::uint8_t* __restrict b = g + plane;
      const std::uint8_t* __restrict in = px;
      for (JDIMENSION k = 0; k < j->width; ++k) {
        r[k] = in[3 * k];
        g[k] = in[3 * k + 1];
        b[k] = in[3 * k + 2];
      }
    }
  }
  // To the last row: read on to the end of the data, as a whole decode does (a file cut short there
  // is refused alike). Above it: the rest is never decoded.
  if (c->output_scanline == c->output_height) (void)jpeg_finish_decompress(c);
  else jpeg_abort_decompress(c);
  return 0;
}

NITRO_INLINE void decode_jpeg_region(std::span<const std::uint8_t> bytes, const Plan& p, int colorspace,
                                     const DecodeOptions& o, const at::Tensor& out, std::string_view name) {
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  ScratchLease row(static_cast<std::size_t>(p.scaled_w) * 4);
  const auto u = [](std::int64_t v) { return static_cast<JDIMENSION>(v); };
  const JpegRegionJob job{bytes.data(), bytes.size(), p.scale, o.fast ? 1 : 0, cmyk ? 1 : 0,
                          cmyk && adobe_marker(bytes) ? 1 : 0, u(p.scaled_h), u(p.scaled_w), u(p.window.top),
                          u(p.window.left), u(p.window.height), u(p.window.width), row.data(),
                          out.data_ptr<std::uint8_t>(), o.layout == Layout::chw ? 1 : 0};
  JpegDecompressor d;
  const int status = jpeg_region_rows(&d, &job);
  if (status == 1) {
    throw Error("image: " + who(name) + ": " +
                (d.errors.warning != 0 ? "truncated or corrupt JPEG data" : "JPEG decoding failed") + " (libjpeg-turbo: " +
                d.errors.message + ")");
  }
  NITRO_CHECK(status == 0, "image: ", who(name), ": libjpeg's decoder of a region gave ", d.cinfo.output_width, "x",
              d.cinfo.output_height, " pixels of ", d.cinfo.output_components, " components where ", p.scaled_w, "x",
              p.scaled_h, " of ", cmyk ? 4 : 3, " were planned at 1/", p.scale, " (a bug: please report it with the file)");
}

NITRO_INLINE void decode_png(const Plan& p, const DecodeOptions& o, const at::Tensor& out, std::string_view name, PngReadGuard& g, PngSource& src, const PngHeader& h) {
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

}  // namespace nitro::image::detail

namespace nitro::image {

NITRO_INLINE Info probe(std::span<const std::uint8_t> bytes, std::string_view name) {
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

NITRO_INLINE int reduction_for(const Info& info, const DecodeOptions& options) {
  return detail::plan(info, options, {}).scale;
}

NITRO_INLINE std::vector<std::int64_t> decoded_shape(const Info& info, const DecodeOptions& options) {
  return detail::shape_of(detail::plan(info, options, {}).window, options.layout);
}

NITRO_INLINE void decode_into(std::span<const std::uint8_t> bytes, const at::Tensor& out, const DecodeOptions& options, std::string_view name) {
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

NITRO_INLINE at::Tensor decode(std::span<const std::uint8_t> bytes, const DecodeOptions& options, std::string_view name) {
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

NITRO_INLINE at::Tensor read(const std::filesystem::path& path, const DecodeOptions& options) {
  const auto bytes = read_file(path);
  return decode(bytes, options, path.string());
}

NITRO_INLINE std::vector<std::uint8_t> encode_jpeg(const at::Tensor& image, const JpegOptions& o) {
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
