// libFuzzer target over the JPEG and PNG decoders (data/image.hpp): any bytes through probe() and then
// three decodes of the same bytes: the whole image, a reduced-size (draft) decode, and a crop window
// (itself at a reduced size for some inputs). A damaged input must end in nitro::Error; anything else
// (a crash, a sanitizer report, a leak, another exception, a result of a shape other than
// decoded_shape()'s) is a finding.
//
// The last 4 bytes of the input choose the options (the decoders ignore bytes after a JPEG's EOI or a
// PNG's last IDAT, so the seeds in corpus/image_decode/ are image files with 4 such bytes appended):
//   t[0]  bit 0 layout hwc (else chw), bit 1 fast (JPEG's fast IDCT and upsampling), bit 2 decode_into
//         (else decode), bit 3 the crop also at a reduced size, bit 4 a crop one pixel past the image
//         (refused), bit 5 max_pixels below the image's size (refused)
//   t[1]  the draft's min_height (low 4 bits) and min_width (high 4 bits), 1..16 each
//   t[2]  t[3]  the crop's top and left; its height and width from both
// max_pixels is 4 Mi pixels otherwise (not the default 179 M: a 16 KB file may claim an image of that
// size, and its decode's buffers would make every such input an out-of-memory report).
#include <nitro/data/image.hpp>

#include <ATen/ops/empty.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

namespace {

namespace img = nitro::image;

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "image_decode: %s\n", what);
  std::abort();
}

void decode_checked(std::span<const std::uint8_t> bytes, const img::Info& info, const img::DecodeOptions& o,
                    bool into) {
  std::vector<std::int64_t> want;
  try {
    want = img::decoded_shape(info, o);
  } catch (const nitro::Error&) {
    // The same options are refused by the decode below (a window outside the image, too many pixels).
  }
  at::Tensor out;
  if (into && !want.empty()) {
    out = at::empty(want, at::kByte);
    img::decode_into(bytes, out, o);
  } else {
    out = img::decode(bytes, o);
  }
  // decode() refuses what decoded_shape() refuses: a result here has decoded_shape()'s shape.
  if (want.empty()) finding("decode succeeded where decoded_shape refused the options");
  if (out.sizes().vec() != want) finding("the decoded shape is not decoded_shape()'s");
  if (!out.is_contiguous() || out.scalar_type() != at::kByte) finding("the result is not a contiguous uint8 tensor");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  std::uint8_t t[4] = {};
  if (size >= 4)
    for (int i = 0; i < 4; ++i) t[i] = data[size - 4 + i];
  img::Info info;
  try {
    info = img::probe(bytes);
  } catch (const nitro::Error&) {
    return 0;  // not a JPEG or PNG, or a damaged header: decode says the same (checked on the way)
  }
  if (info.height <= 0 || info.width <= 0) finding("probe succeeded with an empty image");
  img::DecodeOptions base;
  base.layout = (t[0] & 1) != 0 ? img::Layout::hwc : img::Layout::chw;
  base.fast = (t[0] & 2) != 0;
  base.max_pixels = std::int64_t{1} << 22;
  if ((t[0] & 32) != 0 && info.height * info.width > 1) base.max_pixels = info.height * info.width - 1;
  const bool into = (t[0] & 4) != 0;
  const std::int64_t min_h = 1 + (t[1] & 15), min_w = 1 + (t[1] >> 4);

  // 1. Whole, at full size.
  try {
    decode_checked(bytes, info, base, into);
  } catch (const nitro::Error&) {
  }
  // 2. Reduced size (JPEG; a PNG is decoded whole whatever these say).
  try {
    img::DecodeOptions o = base;
    o.min_height = min_h;
    o.min_width = min_w;
    decode_checked(bytes, info, o, into);
  } catch (const nitro::Error&) {
  }
  // 3. A crop window inside the image (one pixel past it with t[0] bit 4), at full or reduced size.
  if (info.height <= (std::int64_t{1} << 30) && info.width <= (std::int64_t{1} << 30)) {
    try {
      img::DecodeOptions o = base;
      img::Window w;
      w.top = t[2] % info.height;
      w.left = t[3] % info.width;
      w.height = 1 + (t[2] * 7 + t[3]) % (info.height - w.top);
      w.width = 1 + (t[3] * 5 + t[2]) % (info.width - w.left);
      if ((t[0] & 16) != 0) ((t[2] & 1) != 0 ? w.height : w.width) += 1;
      o.crop = w;
      if ((t[0] & 8) != 0) {
        o.min_height = min_h;
        o.min_width = min_w;
      }
      decode_checked(bytes, info, o, into);
    } catch (const nitro::Error&) {
    }
  }
  return 0;
}
