#pragma once
// Image files into uint8 tensors: JPEG through libjpeg-turbo's TurboJPEG API, PNG through libpng.
// Link nitro::image (CMake; it adds libjpeg-turbo's TurboJPEG and libjpeg, and libpng: Debian's
// libturbojpeg0-dev, libjpeg-dev and libpng-dev).
//
//   namespace img = nitro::image;
//   at::Tensor x = img::read("photo.jpg");                            // uint8 [3, H, W], RGB
//   at::Tensor y = img::decode(bytes, {.layout = img::Layout::hwc});  // [H, W, 3]
//   // Reduced-size decoding (libjpeg's DCT scaling, with PIL's Image.draft's rule): the largest
//   // reduction 1/2, 1/4 or 1/8 that keeps the image (or the crop) at least 224 x 224. Several times faster.
//   at::Tensor small = img::decode(bytes, {.min_height = 224, .min_width = 224});
//   // A crop: only its region is decoded (libjpeg's jpeg_skip_scanlines, jpeg_crop_scanline), at the
//   // reduction its own size allows; the pixels are the same window of a whole decode.
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
#include <nitro/core/config.hpp>
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


// NITRO_COMPILED: dist/ and the image headers have their own library (core/config.hpp).
#if NITRO_COMPILED && !defined(NITRO_COMPILED_SOURCE)
extern "C" int nitro_compiled_image_library_is_not_linked__link_nitro_compiled_image() noexcept;
namespace nitro::detail {
[[gnu::used]] inline const int compiled_image_library_linked =
    nitro_compiled_image_library_is_not_linked__link_nitro_compiled_image();
}  // namespace nitro::detail
#endif

namespace nitro::image {

/// An encoded image's format, as sniff() and probe() tell it (unknown: neither JPEG nor PNG).
enum class Format : std::uint8_t { unknown, jpeg, png };
/// [C, H, W] (chw, what convolutions take) or [H, W, C] (hwc, how the files store pixels).
enum class Layout : std::uint8_t { chw, hwc };

/// What the file's header says.
struct Info {
  Format format = Format::unknown;  ///< JPEG or PNG.
  std::int64_t height = 0;          ///< Full-size height in pixels.
  std::int64_t width = 0;           ///< Full-size width in pixels.
  /// Colour components in the file: 1 grey, 3 colour, 4 CMYK/YCCK (JPEG); PNG: 1 grey, 2 grey and
  /// alpha, 3 colour or palette, 4 colour and alpha.
  int components = 0;
};

/// A rectangle of the full-size image, in its pixels.
struct Window {
  std::int64_t top = 0;     ///< First row.
  std::int64_t left = 0;    ///< First column.
  std::int64_t height = 0;  ///< Rows (>= 1 for a crop).
  std::int64_t width = 0;   ///< Columns (>= 1 for a crop).
};

/// How decode() and decode_into() decode: layout, crop, reduced size, size limit, speed.
struct DecodeOptions {
  Layout layout = Layout::chw;  ///< The result's layout: [3, H, W] (chw) or [H, W, 3] (hwc).
  /// Only this part of the image (in full-size pixels; inside the image, non-empty). The result is
  /// the window at the decoded scale: rows floor(top / s) to ceil((top + height) / s), likewise columns.
  std::optional<Window> crop = std::nullopt;
  /// JPEG only (a PNG is decoded whole): decode at a reduced size, 1/2, 1/4 or 1/8 (libjpeg's DCT
  /// scaling), the largest reduction s with the image, or the crop, at least s x min_height by
  /// s x min_width: PIL's Image.draft's rule. 0 and 0: full size. With a crop, only the crop's region
  /// is decoded at that scale (see `partial`).
  std::int64_t min_height = 0;
  std::int64_t min_width = 0;  ///< The least width the reduction keeps (see min_height); both 0: full size.
  /// Refuse images of more pixels than this (width x height, before any reduction): a small file can
  /// claim a huge image. The default is where PIL raises DecompressionBombError (2 x MAX_IMAGE_PIXELS).
  std::int64_t max_pixels = 178'956'970;
  /// JPEG: libjpeg-turbo's fast IDCT and simple upsampling (faster; no longer Pillow's pixels).
  bool fast = false;
  /// JPEG with a crop: decode only the crop's region, as DALI's and nvImageCodec's region decoding do
  /// (libjpeg-turbo's jpeg_skip_scanlines and jpeg_crop_scanline): the rows above it are entropy-decoded
  /// only, the rows below it not at all, the columns outside it (but for up to one iMCU, 8 to 16
  /// pixels, on its left and one pixel on its right) neither transformed, upsampled nor converted. The
  /// pixels are those of the same window of a whole decode: the region reaches a pixel past the crop on
  /// both sides where the image has one, so that the chroma upsampling at the region's edge (which
  /// repeats the edge sample instead of blending in its neighbour) lands outside the crop. Data after
  /// the crop's last row is not read: a file damaged or cut short only below the crop decodes (a whole
  /// decode refuses it). false: decode the whole image at the scale, then cut the crop from it.
  bool partial = true;
};

/// The format from the first bytes (JPEG: FF D8 FF; PNG: its 8-byte signature).
[[nodiscard]] NITRO_INLINE Format sniff(std::span<const std::uint8_t> bytes) noexcept;

/// The whole file's bytes; a nitro::Error naming the file if it cannot be read.
[[nodiscard]] NITRO_INLINE std::vector<std::uint8_t> read_file(const std::filesystem::path& path);

namespace detail {

inline std::string who(std::string_view name) { return name.empty() ? std::string("(bytes)") : std::string(name); }

/// One TurboJPEG handle per thread and kind, destroyed with the thread.
struct TjHandle {
  tjhandle h = nullptr;
  NITRO_INLINE explicit TjHandle(bool compress);
  NITRO_INLINE ~TjHandle();
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
};
NITRO_INLINE TjHandle& decompressor_handle();
NITRO_INLINE tjhandle decompressor();
/// A new decompressor for this thread: TurboJPEG 2's tjDecompressHeader3 returns on an error without
/// aborting libjpeg, and every later file on that handle would fail ("Bogus marker length").
NITRO_INLINE void renew_decompressor();
NITRO_INLINE tjhandle compressor();
/// A per-thread buffer for what is decoded before it is rearranged (CHW, crops, CMYK), lent for one
/// decode: not zero-filled, and given back to the system after a decode that needed more than
/// kScratchKeep bytes (one huge image, or a header that only claims one, must not pin its size for the
/// thread's life).
inline constexpr std::size_t kScratchKeep = std::size_t{64} << 20;
struct Scratch {
  std::unique_ptr<std::uint8_t[]> data;
  std::size_t size = 0;
};
NITRO_INLINE Scratch& scratch_slot();
class ScratchLease {
 public:
  NITRO_INLINE explicit ScratchLease(std::size_t bytes);
  NITRO_INLINE ~ScratchLease();
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  [[nodiscard]] std::uint8_t* data() const noexcept { return data_; }

 private:
  std::uint8_t* data_ = nullptr;
};

/// The largest reduction 1/s (s = 8, 4, 2) with the image at least min_h x min_w at that scale, as
/// PIL's Image.draft picks it: w >= s * min_w and h >= s * min_h.
NITRO_INLINE int reduction(std::int64_t h, std::int64_t w, std::int64_t min_h, std::int64_t min_w);

NITRO_INLINE bool adobe_marker(std::span<const std::uint8_t> b);

NITRO_INLINE void check_pixels(std::int64_t h, std::int64_t w, std::int64_t max_pixels, std::string_view name);

/// Full-size window -> the window at 1/s.
NITRO_INLINE Window scaled(const Window& c, int s, std::int64_t sh, std::int64_t sw);

NITRO_INLINE void check_window(const Window& c, std::int64_t h, std::int64_t w, std::string_view name);

/// Rows of an RGB HWC image `src` (width sw) into `out` (uint8, contiguous, of the window's shape).
NITRO_INLINE void place(const std::uint8_t* src, std::int64_t sw, const Window& win, const at::Tensor& out, Layout layout);

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
NITRO_INLINE int png_header(png_structp png, png_infop info, PngHeader* h);
NITRO_INLINE int png_pixels(png_structp png, png_infop info, const PngHeader* h, png_bytepp rows, std::size_t row_bytes);

struct PngReadGuard {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngReadGuard() { png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr); }
};

NITRO_INLINE Info png_info(std::span<const std::uint8_t> bytes, std::string_view name, PngReadGuard& g, PngSource& src,
                     PngHeader& h);

NITRO_INLINE Info jpeg_info(std::span<const std::uint8_t> bytes, std::string_view name, int* colorspace = nullptr);

/// The output's [h, w] and the reduction, checking the options.
struct Plan {
  Info info;
  int scale = 1;
  Window window;  // at the decoded scale
  std::int64_t scaled_h = 0, scaled_w = 0;
};
NITRO_INLINE Plan plan(const Info& info, const DecodeOptions& o, std::string_view name);

NITRO_INLINE std::vector<std::int64_t> shape_of(const Window& w, Layout layout);

NITRO_INLINE void check_out(const at::Tensor& out, const Plan& p, Layout layout, std::string_view name);

NITRO_INLINE void decode_jpeg(std::span<const std::uint8_t> bytes, const Plan& p, int colorspace, const DecodeOptions& o,
                        const at::Tensor& out, std::string_view name);

/// CMYK (4 bytes a pixel, inverted where the file has Adobe's marker) to RGB in place, 3 bytes a pixel,
/// as Pillow's convert("RGB").
NITRO_INLINE void cmyk_to_rgb(std::uint8_t* pixels, std::size_t count, bool inverted) noexcept;

/// The region of p.window only, through libjpeg's own API (TurboJPEG 2 cannot crop): decode_jpeg's
/// path for a crop smaller than the image with DecodeOptions::partial.
NITRO_INLINE void decode_jpeg_region(std::span<const std::uint8_t> bytes, const Plan& p, int colorspace,
                                     const DecodeOptions& o, const at::Tensor& out, std::string_view name);

NITRO_INLINE void decode_png(const Plan& p, const DecodeOptions& o, const at::Tensor& out,
                       std::string_view name, PngReadGuard& g, PngSource& src, const PngHeader& h);

}  // namespace detail

/// The header's format, size and components, without decoding.
[[nodiscard]] NITRO_INLINE Info probe(std::span<const std::uint8_t> bytes, std::string_view name = {});

/// The reduction (1, 2, 4 or 8) decode() picks for an image of `info` and these options.
[[nodiscard]] NITRO_INLINE int reduction_for(const Info& info, const DecodeOptions& options = {});

/// The shape decode() returns for this image and these options.
[[nodiscard]] NITRO_INLINE std::vector<std::int64_t> decoded_shape(const Info& info, const DecodeOptions& options = {});

/// Decodes into `out`: uint8, contiguous, CPU (pinned or not), of decoded_shape(probe(bytes), options).
NITRO_INLINE void decode_into(std::span<const std::uint8_t> bytes, const at::Tensor& out, const DecodeOptions& options = {},
                        std::string_view name = {});

/// Decodes a JPEG or PNG file's bytes into a new uint8 tensor ([3, H, W] or [H, W, 3], RGB).
[[nodiscard]] NITRO_INLINE at::Tensor decode(std::span<const std::uint8_t> bytes, const DecodeOptions& options = {},
                                       std::string_view name = {});

/// read_file + decode, errors naming the file.
[[nodiscard]] NITRO_INLINE at::Tensor read(const std::filesystem::path& path, const DecodeOptions& options = {});

/// JPEG chroma subsampling: 4:4:4 (none), 4:2:2 (half the columns), 4:2:0 (half the columns and rows).
enum class Subsampling : std::uint8_t { s444, s422, s420 };

/// How encode_jpeg() encodes.
struct JpegOptions {
  int quality = 90;  ///< 1..100
  Subsampling subsampling = Subsampling::s420;  ///< Chroma subsampling of colour images (grey ones have none).
  Layout layout = Layout::chw;  ///< of the image given
  bool progressive = false;     ///< Write a progressive JPEG instead of a baseline one.
};

/// A uint8 RGB ([3, H, W] / [H, W, 3]) or grey ([1, H, W] / [H, W, 1]) image as JPEG bytes.
[[nodiscard]] NITRO_INLINE std::vector<std::uint8_t> encode_jpeg(const at::Tensor& image, const JpegOptions& o = {});

}  // namespace nitro::image

#if !NITRO_COMPILED
#include <nitro/data/image-inl.hpp>
#endif
