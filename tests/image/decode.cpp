// nitro::image's decoding and JPEG encoding: pixels against Pillow (tests/image/make_images.py writes the
// files and Pillow's `convert("RGB")` of them, or its `draft` at 1/2, 1/4, 1/8), crops, decode_into, and
// every way a file or an option can be wrong (a nitro::Error naming the file and the cause, no abort).
#include "testing.hpp"
#include "image/image_testing.hpp"

#include <nitro/data/image.hpp>

#include <dlfcn.h>
#include <sys/wait.h>

#include <array>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if __has_include(<jpeglib.h>)
#include <jpeglib.h>  // after <cstdio>: it uses FILE
#define NITRO_TEST_HAS_JPEGLIB 1
#endif

namespace nitro_test_image_decode {  // one namespace per file: an area is compiled as one translation unit

namespace fs = std::filesystem;
namespace img = nitro::image;
using Bytes = std::vector<std::uint8_t>;

namespace {

int exit_code(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void write_all(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

using nitro::test::error_of;
using nitro::test::has;

/// error_of on a thread of its own, with TurboJPEG handles of its own: what a file does to the thread's
/// decompressor (see "a damaged JPEG header leaves the thread's decompressor usable") stays there.
std::string error_on_new_thread(const std::function<void()>& f) {
  std::string e;
  std::thread([&] { e = error_of(f); }).join();
  return e;
}

/// One of Pillow's decodes: `file` decoded (at 1/scale) is ref's height x width x 3 bytes.
struct Ref {
  std::string file, ref;
  std::int64_t height = 0, width = 0;
  int scale = 1;
};

/// The files make_images.py writes, made once a process (a temporary folder removed at exit).
struct Fixtures {
  nitro::test::TempDir dir{"nitro-image-decode", true};
  std::string skipped;  // why there are none: no python with numpy and Pillow
  std::string failed;   // the script failed: its stderr
  std::vector<Ref> refs;
  std::string python = NITRO_TEST_PYTHON;

  Fixtures() {
    if (python.empty() || exit_code("'" + python + "' -c 'import numpy, PIL' >/dev/null 2>&1") != 0) {
      skipped =
          "no python with numpy and Pillow (NITRO_TEST_PYTHON='" + python + "'); pip install numpy pillow into it";
      return;
    }
    const std::string script = std::string(NITRO_SOURCE_DIR) + "/tests/image/make_images.py";
    if (exit_code("'" + python + "' '" + script + "' '" + dir.path.string() + "' >/dev/null 2>'" +
                  (dir / "stderr.txt").string() + "'") != 0) {
      failed = read_all(dir / "stderr.txt");
      return;
    }
    std::ifstream in(dir / "manifest.txt");
    for (Ref r; in >> r.file >> r.ref >> r.height >> r.width >> r.scale;) refs.push_back(r);
  }
  fs::path operator/(const std::string& name) const { return dir / name; }
  Bytes bytes(const std::string& file) const { return img::read_file(dir / file); }
  /// Pillow's pixels, [3, H, W].
  at::Tensor reference(const Ref& r) const {
    const auto raw = read_all(dir / (r.ref + ".rgb"));
    REQUIRE(static_cast<std::int64_t>(raw.size()) == r.height * r.width * 3);
    return torch::from_blob(const_cast<char*>(raw.data()), {r.height, r.width, 3}, torch::kUInt8)
        .permute({2, 0, 1})
        .clone(at::MemoryFormat::Contiguous);  // a copy: `raw` goes
  }
  const Ref& find(const std::string& ref) const {
    for (const auto& r : refs)
      if (r.ref == ref) return r;
    FAIL("no reference " << ref << " in the manifest");
    return refs.front();
  }
};

/// The fixtures, or nullptr (with a MESSAGE) where the test has to skip; a failing script fails the test.
const Fixtures* fixtures() {
  static const auto f = std::make_unique<Fixtures>();
  if (!f->skipped.empty()) {
    MESSAGE("skipped: " << f->skipped);
    return nullptr;
  }
  REQUIRE_MESSAGE(f->failed.empty(), "tests/image/make_images.py failed: " << f->failed);
  REQUIRE(!f->refs.empty());
  return f.get();
}

/// Where the decode differs from Pillow: how many bytes and by how much at most.
std::string difference(const at::Tensor& got, const at::Tensor& want) {
  if (got.sizes() != want.sizes()) {
    std::ostringstream s;
    s << "shape " << got.sizes() << " instead of " << want.sizes();
    return s.str();
  }
  const auto d = (got.to(torch::kInt) - want.to(torch::kInt)).abs();
  return std::to_string(d.gt(0).sum().item<std::int64_t>()) + " bytes differ, by up to " +
         std::to_string(d.max().item<int>());
}

/// The full-size image's rows floor(top / s) .. ceil((top + height) / s), likewise columns: image.hpp's rule.
at::Tensor window_of(const at::Tensor& chw, const img::Window& c, int s) {
  const auto top = c.top / s, left = c.left / s;
  const auto bottom = std::min(chw.size(1), (c.top + c.height + s - 1) / s);
  const auto right = std::min(chw.size(2), (c.left + c.width + s - 1) / s);
  return chw.slice(1, top, bottom).slice(2, left, right);
}

img::DecodeOptions at_scale(const img::Info& info, int s) {
  return {.min_height = info.height / s, .min_width = info.width / s};  // what make_images.py asks Pillow's draft
}

/// The markers of a JPEG up to its first scan: {marker byte, offset of its FF}.
std::vector<std::pair<std::uint8_t, std::size_t>> markers(const Bytes& b) {
  std::vector<std::pair<std::uint8_t, std::size_t>> out;
  std::size_t i = 2;
  while (i + 4 <= b.size() && b[i] == 0xFF) {
    out.emplace_back(b[i + 1], i);
    if (b[i + 1] == 0xDA) break;
    i += 2 + ((static_cast<std::size_t>(b[i + 2]) << 8) | b[i + 3]);
  }
  return out;
}
std::size_t marker_at(const Bytes& b, std::uint8_t m) {
  for (const auto& [marker, at] : markers(b))
    if (marker == m) return at;
  FAIL("no marker FF" << std::hex << int(m));
  return 0;
}
/// The first byte of entropy-coded data (after the first SOS segment).
std::size_t scan_start(const Bytes& b) {
  const auto sos = marker_at(b, 0xDA);
  return sos + 2 + ((static_cast<std::size_t>(b[sos + 2]) << 8) | b[sos + 3]);
}

#ifdef NITRO_TEST_HAS_JPEGLIB
// libjpeg's own compressor, for what TurboJPEG 2 cannot write (arithmetic coding): libjpeg.so.62 opened
// at run time (the library links libjpeg for decoding a region; these calls stay as they were written).
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
};
extern "C" inline void nitro_test_jpeg_error(j_common_ptr c) {
  std::longjmp(reinterpret_cast<JpegError*>(c->err)->jump, 1);
}

struct LibJpeg {
  void* lib = dlopen("libjpeg.so.62", RTLD_NOW | RTLD_LOCAL);
  template <class F>
  F* get(const char* name) const {
    return reinterpret_cast<F*>(dlsym(lib, name));
  }
};

// libjpeg's calls, holding no C++ object (libjpeg's errors longjmp here). 0: done; 1: libjpeg refused.
int libjpeg_compress(const LibJpeg& j, const std::uint8_t* rgb, int h, int w, bool arithmetic, bool progressive,
                     unsigned char** buf, unsigned long* size) {
  jpeg_compress_struct c{};
  JpegError err{};
  c.err = j.get<decltype(jpeg_std_error)>("jpeg_std_error")(&err.mgr);
  err.mgr.error_exit = nitro_test_jpeg_error;
  const auto destroy = j.get<decltype(jpeg_destroy_compress)>("jpeg_destroy_compress");
  if (setjmp(err.jump)) {
    destroy(&c);
    return 1;
  }
  j.get<decltype(jpeg_CreateCompress)>("jpeg_CreateCompress")(&c, JPEG_LIB_VERSION, sizeof c);
  j.get<decltype(jpeg_mem_dest)>("jpeg_mem_dest")(&c, buf, size);
  c.image_width = static_cast<JDIMENSION>(w);
  c.image_height = static_cast<JDIMENSION>(h);
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  j.get<decltype(jpeg_set_defaults)>("jpeg_set_defaults")(&c);
  j.get<decltype(jpeg_set_quality)>("jpeg_set_quality")(&c, 90, TRUE);
  c.arith_code = arithmetic ? TRUE : FALSE;
  if (progressive) j.get<decltype(jpeg_simple_progression)>("jpeg_simple_progression")(&c);
  j.get<decltype(jpeg_start_compress)>("jpeg_start_compress")(&c, TRUE);
  const auto write = j.get<decltype(jpeg_write_scanlines)>("jpeg_write_scanlines");
  for (int y = 0; y < h; ++y) {
    JSAMPROW row = const_cast<std::uint8_t*>(rgb) + static_cast<std::ptrdiff_t>(y) * w * 3;
    write(&c, &row, 1);
  }
  j.get<decltype(jpeg_finish_compress)>("jpeg_finish_compress")(&c);
  destroy(&c);
  return 0;
}

/// A JPEG of the [H, W, 3] uint8 image by libjpeg, quality 90, 4:2:0; empty where libjpeg.so.62 or its
/// arithmetic encoder is missing.
Bytes libjpeg_encode(const at::Tensor& hwc, bool arithmetic, bool progressive) {
  static const LibJpeg j;
  if (j.lib == nullptr) return {};
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int failed = libjpeg_compress(j, hwc.data_ptr<std::uint8_t>(), static_cast<int>(hwc.size(0)),
                                      static_cast<int>(hwc.size(1)), arithmetic, progressive, &buf, &size);
  Bytes out;
  if (failed == 0) out.assign(buf, buf + size);
  std::free(buf);
  return out;
}
#endif

}  // namespace

TEST_CASE("image decode equals Pillow's convert RGB for every JPEG and PNG kind") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  int checked = 0;
  for (const auto& r : fx->refs) {
    if (r.scale != 1 || r.file.starts_with("photo_") || r.file == "ppal_trns.png") continue;  // that one: below
    INFO(r.file);
    const auto bytes = fx->bytes(r.file);
    const auto want = fx->reference(r);
    const auto info = img::probe(bytes, r.file);
    CHECK(info.format == (r.file.ends_with(".jpg") ? img::Format::jpeg : img::Format::png));
    CHECK(info.height == r.height);
    CHECK(info.width == r.width);
    const auto chw = img::decode(bytes, {}, r.file);
    CHECK_MESSAGE(torch::equal(chw, want), difference(chw, want));
    const auto hwc = img::decode(bytes, {.layout = img::Layout::hwc}, r.file);
    CHECK_MESSAGE(torch::equal(hwc, want.permute({1, 2, 0})), difference(hwc.permute({2, 0, 1}), want));
    ++checked;
  }
  CHECK(checked == 30);  // every file make_images.py writes: a missing one is a failure, not a pass

  // The components the header reports.
  const auto components = [&](const std::string& file) { return img::probe(fx->bytes(file)).components; };
  CHECK(components("j420.jpg") == 3);
  CHECK(components("jgrey.jpg") == 1);
  CHECK(components("jcmyk.jpg") == 4);
  CHECK(components("pgrey.png") == 1);
  CHECK(components("pla.png") == 2);
  CHECK(components("ppal.png") == 3);
  CHECK(components("prgba.png") == 4);
}

// libpng 1.6's png_set_palette_to_rgb also expands a palette's tRNS into an alpha channel: image.hpp
// strips alpha where a tRNS chunk is present too (the rows came out RGBA and the decode failed,
// "unexpected row size after conversion to RGB", before).
TEST_CASE("image a palette PNG with transparency decodes to its colours as Pillow's convert RGB") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  const auto& r = fx->find("ppal_trns_png");
  const auto want = fx->reference(r);
  CHECK(torch::equal(img::decode(fx->bytes(r.file), {}, r.file), want));
  CHECK(torch::equal(img::decode(fx->bytes(r.file), {.layout = img::Layout::hwc}).permute({2, 0, 1}), want));
}

// TurboJPEG 2.1's tjDecompressHeader3 returns on an error without aborting libjpeg's decompressor:
// the next file on that handle starts in the middle of the last one's header, and every JPEG after
// it fails ("Bogus marker length") on that thread, for good. image.hpp keeps one handle per thread,
// so one damaged file stopped a loader thread decoding. A handle whose header read failed is now
// replaced (tjDestroy, tjInitDecompress).
TEST_CASE("image a damaged JPEG header leaves the thread's decompressor usable") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  const auto good = fx->bytes("j420.jpg");
  auto twelve = good;
  twelve[marker_at(good, 0xC0) + 4] = 12;
  const auto first = [&](std::size_t n) { return Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)); };
  const std::vector<Bytes> bad = {first(marker_at(good, 0xC0) + 6), first(marker_at(good, 0xC4) + 12), twelve};
  std::thread([&] {  // a thread of its own: what this does to its decompressor stays there
    const auto want = img::decode(good);
    for (const auto& b : bad) {
      CHECK(has(error_of([&] { (void)img::decode(b, {}, "bad.jpg"); }), "bad.jpg"));
      const auto e = error_of([&] { CHECK(torch::equal(img::decode(good, {}, "good.jpg"), want)); });
      CHECK_MESSAGE(e == "(no error)", e);
      CHECK(has(error_of([&] { (void)img::probe(b, "bad.jpg"); }), "bad.jpg"));
      CHECK(img::probe(good).width == 333);
    }
  }).join();
}

// A JPEG that ends before its frame header (SOF): TurboJPEG 2.1's tjDecompressHeader3 takes the end
// of the data for an EOI, the file for tables only, and reports success with 0 x 0 pixels. probe()
// then returns that, and decode() says "the header says 0x0 pixels" rather than that the file is cut
// short. jpeg_info refuses a width or height below 1 as a damaged or truncated JPEG.
TEST_CASE("image a JPEG cut before its frame header is refused as damaged or truncated") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  const auto good = fx->bytes("j420.jpg");
  for (const std::size_t n :
       {std::size_t{4}, marker_at(good, 0xE0) + 7, marker_at(good, 0xDB) + 20, marker_at(good, 0xC0)}) {
    INFO("cut at " << n);
    const Bytes cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    const auto e1 = error_on_new_thread([&] { (void)img::probe(cut, "cut.jpg"); });
    CHECK_MESSAGE((has(e1, "cut.jpg") && (has(e1, "truncated") || has(e1, "damaged"))), e1);
    const auto e2 = error_on_new_thread([&] { (void)img::decode(cut, {}, "cut.jpg"); });
    CHECK_MESSAGE((has(e2, "cut.jpg") && (has(e2, "truncated") || has(e2, "damaged"))), e2);
  }
}

TEST_CASE("image reduced-size JPEG decoding equals Pillow's draft at 1/2 1/4 and 1/8") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  int checked = 0;
  for (const auto& r : fx->refs) {
    if (r.scale == 1 || r.file.starts_with("photo_")) continue;
    INFO(r.file << " at 1/" << r.scale);
    const auto bytes = fx->bytes(r.file);
    const auto info = img::probe(bytes);
    auto o = at_scale(info, r.scale);
    CHECK(img::reduction_for(info, o) == r.scale);
    CHECK(img::decoded_shape(info, o) == std::vector<std::int64_t>{3, r.height, r.width});
    const auto want = fx->reference(r);
    const auto got = img::decode(bytes, o, r.file);
    CHECK_MESSAGE(torch::equal(got, want), difference(got, want));
    o.layout = img::Layout::hwc;
    CHECK(img::decoded_shape(info, o) == std::vector<std::int64_t>{r.height, r.width, 3});
    CHECK(torch::equal(img::decode(bytes, o, r.file).permute({2, 0, 1}), want));
    ++checked;
  }
  CHECK(checked == 24);
}

TEST_CASE("image real photographs decode as Pillow decodes them, full size and reduced") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  int checked = 0;
  for (const auto& r : fx->refs) {
    if (!r.file.starts_with("photo_")) continue;
    INFO(r.file << " at 1/" << r.scale);
    const auto bytes = fx->bytes(r.file);
    const auto info = img::probe(bytes);
    const auto o = r.scale == 1 ? img::DecodeOptions{} : at_scale(info, r.scale);
    CHECK(img::reduction_for(info, o) == r.scale);
    const auto want = fx->reference(r);
    const auto got = img::decode(bytes, o, r.file);
    CHECK_MESSAGE(torch::equal(got, want), difference(got, want));
    ++checked;
  }
  if (checked == 0) {
    MESSAGE("skipped: no scikit-image data folder next to " << fx->python);
    return;
  }
  // Four photographs as PNG, as JPEG and that JPEG at three reductions; scikit-image's two JPEGs.
  CHECK(checked == 4 * 5 + 2 * 2);
}

TEST_CASE("image reduction_for and decoded_shape follow the documented rule") {
  const img::Info jpeg{img::Format::jpeg, 217, 333, 3};
  const auto scale = [&](std::int64_t h, std::int64_t w) {
    return img::reduction_for(jpeg, {.min_height = h, .min_width = w});
  };
  CHECK(scale(0, 0) == 1);
  CHECK(scale(224, 224) == 1);  // 217 rows are already fewer
  CHECK(scale(100, 100) == 2);  // 109 x 167 at 1/2; 55 rows at 1/4
  CHECK(scale(50, 50) == 4);    // 55 x 84 at 1/4; 28 rows at 1/8
  // PIL's draft rule: the largest s with 217 >= s x min_height and 333 >= s x min_width.
  CHECK(scale(27, 41) == 8);  // 216 <= 217, 328 <= 333
  CHECK(scale(28, 42) == 4);  // 224 > 217: not 1/8, although ceil(217 / 8) x ceil(333 / 8) is 28 x 42
  CHECK(scale(27, 42) == 4);  // 336 > 333
  CHECK(scale(28, 0) == 4);
  CHECK(scale(0, 100) == 2);
  CHECK(img::decoded_shape(jpeg, {.min_height = 28, .min_width = 42}) == std::vector<std::int64_t>{3, 55, 84});
  // What Pillow's draft('RGB', (224, 224)) picks (its rule: s <= min(W // 224, H // 224)), from the
  // outside review: 447 stays whole (not 1/2 to 224), 895 is 1/2 (not 1/4), 896 is 1/4.
  for (const auto& [side, want] : std::vector<std::pair<std::int64_t, int>>{{447, 1}, {448, 2}, {895, 2}, {896, 4}, {1791, 4}, {1792, 8}})
    CHECK(img::reduction_for({img::Format::jpeg, side, side, 3}, {.min_height = 224, .min_width = 224}) == want);
  CHECK(img::decoded_shape(jpeg, {.layout = img::Layout::hwc, .min_height = 100}) ==
        std::vector<std::int64_t>{109, 167, 3});

  // A crop: the reduction is the crop's, the shape the window's at that scale.
  const img::Window c{.top = 10, .left = 20, .height = 100, .width = 60};
  CHECK(img::decoded_shape(jpeg, {.crop = c}) == std::vector<std::int64_t>{3, 100, 60});
  CHECK(img::reduction_for(jpeg, {.crop = c, .min_height = 25, .min_width = 15}) == 4);
  CHECK(img::reduction_for(jpeg, {.crop = c, .min_height = 26, .min_width = 15}) == 2);
  // rows 10 / 4 = 2 to ceil(110 / 4) = 28, columns 20 / 4 = 5 to ceil(80 / 4) = 20
  CHECK(img::decoded_shape(jpeg, {.crop = c, .min_height = 25, .min_width = 15}) ==
        std::vector<std::int64_t>{3, 26, 15});

  // A PNG is decoded whole: no reduction.
  const img::Info png{img::Format::png, 217, 333, 3};
  CHECK(img::reduction_for(png, {.min_height = 28, .min_width = 42}) == 1);
  CHECK(img::decoded_shape(png, {.min_height = 28, .min_width = 42}) == std::vector<std::int64_t>{3, 217, 333});
}

TEST_CASE("image crops are windows of the whole decode at every scale and in both layouts") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  const std::vector<img::Window> windows = {
      {.top = 0, .left = 0, .height = 217, .width = 333},   // all of it
      {.top = 10, .left = 20, .height = 100, .width = 60},  //
      {.top = 0, .left = 0, .height = 1, .width = 1},       // one pixel
      {.top = 216, .left = 332, .height = 1, .width = 1},   // the last pixel
      {.top = 13, .left = 7, .height = 203, .width = 325},  // odd offsets, one short of both edges
      {.top = 101, .left = 3, .height = 116, .width = 330}, // to the bottom and right edges
  };
  for (const std::string file : {"j420.jpg", "jprog.jpg", "jgrey.jpg", "jcmyk.jpg", "prgb.png", "padam7.png"}) {
    const auto bytes = fx->bytes(file);
    const auto info = img::probe(bytes);
    const auto whole = img::decode(bytes);
    for (auto c : windows) {
      if (c.top + c.height > info.height || c.left + c.width > info.width) {  // the small PNGs: shrink it
        c = {.top = c.top % info.height, .left = c.left % info.width, .height = 1, .width = 1};
        c.height = info.height - c.top;
        c.width = info.width - c.left;
      }
      INFO(file << " crop top " << c.top << " left " << c.left << " " << c.width << "x" << c.height);
      const auto got = img::decode(bytes, {.crop = c}, file);
      CHECK(torch::equal(got, window_of(whole, c, 1)));
      CHECK(torch::equal(img::decode(bytes, {.layout = img::Layout::hwc, .crop = c}).permute({2, 0, 1}), got));
    }
  }
  // Reduced: the crop's own size decides the scale; the result is the window of Pillow's draft.
  for (const std::string name : {"j420", "jprog", "jgrey", "jcmyk"}) {
    const auto bytes = fx->bytes(name + ".jpg");
    for (const int s : {2, 4, 8}) {
      const auto draft = fx->reference(fx->find(name + ".d" + std::to_string(s)));
      for (const auto& c : windows) {
        INFO(name << " at 1/" << s << " crop top " << c.top << " left " << c.left << " " << c.width << "x" << c.height);
        const img::DecodeOptions o{.crop = c, .min_height = (c.height + s - 1) / s, .min_width = (c.width + s - 1) / s};
        if (img::reduction_for(img::probe(bytes), o) != s) continue;  // a 1-pixel crop is 1/8 whatever it asks
        const auto got = img::decode(bytes, o);
        const auto want = window_of(draft, c, s);
        CHECK_MESSAGE(torch::equal(got, want), difference(got, want));
        auto hwc = o;
        hwc.layout = img::Layout::hwc;
        CHECK(torch::equal(img::decode(bytes, hwc).permute({2, 0, 1}), want));
      }
    }
  }
}

TEST_CASE("image decode_into fills the caller's tensor and refuses one of the wrong kind") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  for (const std::string file : {"j420.jpg", "jcmyk.jpg", "prgba.png"}) {
    INFO(file);
    const auto bytes = fx->bytes(file);
    const auto info = img::probe(bytes);
    for (const auto layout : {img::Layout::chw, img::Layout::hwc}) {
      for (const std::int64_t min : {0, 30}) {
        const img::DecodeOptions o{.layout = layout,
                                   .crop = img::Window{.top = 3, .left = 4, .height = info.height - 5, .width = 20},
                                   .min_height = min};
        auto out = torch::full(img::decoded_shape(info, o), 7, torch::kUInt8);
        img::decode_into(bytes, out, o, file);
        CHECK(torch::equal(out, img::decode(bytes, o)));
        img::DecodeOptions whole{.layout = layout, .min_width = min};
        out = torch::full(img::decoded_shape(info, whole), 7, torch::kUInt8);
        img::decode_into(bytes, out, whole, file);
        CHECK(torch::equal(out, img::decode(bytes, whole)));
      }
    }
    const auto shape = img::decoded_shape(info);
    const auto refused = [&](const at::Tensor& out) {
      const auto e = error_of([&] { img::decode_into(bytes, out, {}, "into/" + file); });
      CHECK_MESSAGE(has(e, "into/" + file), e);
      CHECK_MESSAGE((has(e, "decode_into needs a contiguous uint8 CPU tensor of shape") ||
                     (!out.is_contiguous() && has(e, "decode_into needs a contiguous tensor"))),
                    e);
    };
    refused(torch::empty({shape[0], shape[1] + 1, shape[2]}, torch::kUInt8));
    refused(torch::empty({shape[1], shape[2], shape[0]}, torch::kUInt8));  // hwc, chw asked for
    refused(torch::empty(shape, torch::kFloat));
    refused(torch::empty({shape[0], shape[2], shape[1]}, torch::kUInt8).transpose(1, 2));  // right shape, strided
    refused(at::Tensor{});
  }
}

TEST_CASE("image errors: empty bytes, not an image, a missing file") {
  const auto e1 = error_of([] { (void)img::decode(Bytes{}, {}, "empty.jpg"); });
  CHECK_MESSAGE((has(e1, "empty.jpg") && has(e1, "not a JPEG or PNG file") && has(e1, "it is empty")), e1);
  const Bytes text = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'};
  const auto e2 = error_of([&] { (void)img::decode(text, {}, "words.png"); });
  CHECK_MESSAGE((has(e2, "words.png") && has(e2, "not a JPEG or PNG file")), e2);
  CHECK(has(error_of([&] { (void)img::probe(text, "words.png"); }), "words.png"));
  CHECK(has(error_of([&] { img::decode_into(text, torch::empty({3, 1, 1}, torch::kUInt8), {}, "w.png"); }), "w.png"));
  const auto e3 = error_of([&] { (void)img::decode(text); });
  CHECK_MESSAGE(has(e3, "(bytes)"), e3);  // no name given

  nitro::test::TempDir dir("nitro-image-missing", true);
  const auto missing = dir / "no such photo.jpg";
  const auto e4 = error_of([&] { (void)img::read(missing); });
  CHECK_MESSAGE((has(e4, missing.string()) && has(e4, "cannot open")), e4);
  write_all(dir / "empty.png", {});
  const auto e5 = error_of([&] { (void)img::read(dir / "empty.png"); });
  CHECK_MESSAGE((has(e5, (dir / "empty.png").string()) && has(e5, "it is empty")), e5);
}

TEST_CASE("image read names the file in its errors and decodes as decode does") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  CHECK(torch::equal(img::read(*fx / "j420.jpg"), img::decode(fx->bytes("j420.jpg"))));
  CHECK(torch::equal(img::read(*fx / "ppal.png", {.layout = img::Layout::hwc}),
                     img::decode(fx->bytes("ppal.png"), {.layout = img::Layout::hwc})));
  const auto e = error_of([&] { (void)img::read(*fx / "bad_crc_ihdr.png"); });
  CHECK_MESSAGE(has(e, (*fx / "bad_crc_ihdr.png").string()), e);
}

TEST_CASE("image errors: truncated and corrupt JPEG files") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  const auto good = fx->bytes("j420.jpg");
  const auto scan = scan_start(good);
  const std::vector<std::pair<std::string, std::size_t>> cuts = {
      {"inside SOI", 2},
      {"after SOI", 4},
      {"inside APP0", marker_at(good, 0xE0) + 7},
      {"inside DQT", marker_at(good, 0xDB) + 20},
      {"inside SOF0", marker_at(good, 0xC0) + 6},
      {"inside DHT", marker_at(good, 0xC4) + 12},
      {"inside SOS", marker_at(good, 0xDA) + 5},
      {"at the scan", scan},
      {"early in the scan", scan + 100},
      {"halfway", good.size() / 2},
      {"without EOI", good.size() - 2},
      {"inside EOI", good.size() - 1},
  };
  for (const auto& [where, n] : cuts) {
    INFO("cut " << where << " at " << n << " of " << good.size());
    const Bytes cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    const auto e = error_on_new_thread([&] { (void)img::decode(cut, {}, "cut.jpg"); });
    CHECK_MESSAGE(has(e, "image: cut.jpg: "), e);
    CHECK_MESSAGE((has(e, "truncated") || has(e, "damaged") || has(e, "not a JPEG or PNG")), e);
    // Reduced-size decoding reads the same data.
    const auto reduced = [&] { (void)img::decode(cut, {.min_height = 20, .min_width = 20}, "cut.jpg"); };
    CHECK(has(error_on_new_thread(reduced), "cut.jpg"));
  }
  // Damaged scans: libjpeg would decode them with grey or shifted blocks (as Pillow does); a warning
  // is an error here.
  const auto corrupt = [&](const std::string& what, const Bytes& b) {
    INFO(what);
    const auto e = error_on_new_thread([&] { (void)img::decode(b, {}, "corrupt.jpg"); });
    CHECK_MESSAGE((has(e, "image: corrupt.jpg: truncated or corrupt JPEG data (libjpeg-turbo: Corrupt JPEG data")), e);
  };
  auto flipped = good;
  for (std::size_t i = scan + 200; i < scan + 232; ++i) flipped[i] ^= 0xFF;
  corrupt("32 bytes inverted", flipped);
  auto marker = good;
  marker[scan + 300] = 0xFF;
  marker[scan + 301] = 0xD3;  // a restart marker where there are none
  corrupt("a stray RST3", marker);
  auto rst = fx->bytes("jrst.jpg");
  for (std::size_t i = scan_start(rst); i + 1 < rst.size(); ++i) {
    if (rst[i] == 0xFF && rst[i + 1] == 0xD2) {
      rst[i + 1] = 0xD5;  // RST5 where RST2 belongs
      break;
    }
  }
  corrupt("restart markers out of order", rst);
  auto trailing = good;  // bytes after EOI are not looked at (Pillow ignores them too)
  trailing.insert(trailing.end(), {'x', 'y', 'z'});
  CHECK(torch::equal(img::decode(trailing), img::decode(good)));
}

TEST_CASE("image errors: damaged PNG files") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  const auto good = fx->bytes("prgb.png");
  // PNG chunks: signature 8, IHDR 8 + 13 + 4 = 25, then the others; the IDAT's data is what is left.
  for (const std::size_t n : {std::size_t{5}, std::size_t{8}, std::size_t{12}, std::size_t{20}, std::size_t{33},
                              std::size_t{40}, good.size() / 2, good.size() - 20}) {
    INFO("cut at " << n << " of " << good.size());
    const Bytes cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    const auto e = error_of([&] { (void)img::decode(cut, {}, "cut.png"); });
    CHECK_MESSAGE(has(e, "image: cut.png: "), e);
    CHECK_MESSAGE((has(e, "truncated") || has(e, "not a JPEG or PNG")), e);
  }
  const auto damaged = [&](const std::string& file, const std::string& cause) {
    INFO(file);
    const auto e = error_of([&] { (void)img::decode(fx->bytes(file), {}, file); });
    CHECK_MESSAGE((has(e, "image: " + file + ": ") && has(e, cause)), e);
  };
  damaged("bad_crc_ihdr.png", "IHDR: CRC error");
  damaged("bad_block_idat.png", "invalid block type");
  damaged("short_idat.png", "Not enough image data");
  auto idat_crc = good;  // a byte of IDAT data changed, its CRC not
  idat_crc[good.size() - 12 - 10] ^= 0x10;
  const auto e = error_of([&] { (void)img::decode(idat_crc, {}, "crc.png"); });
  CHECK_MESSAGE((has(e, "crc.png") && has(e, "CRC error")), e);
}

TEST_CASE("image errors: 12-bit and arithmetic-coded JPEG") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  const auto good = fx->bytes("j420.jpg");
  const auto sof = marker_at(good, 0xC0);
  auto twelve = good;
  twelve[sof + 4] = 12;  // the precision byte
  const auto e1 = error_on_new_thread([&] { (void)img::decode(twelve, {}, "twelve.jpg"); });
  CHECK_MESSAGE((has(e1, "twelve.jpg") && has(e1, "Unsupported JPEG data precision 12")), e1);
  twelve[sof + 1] = 0xC1;  // extended sequential, where 12 bits are legal
  const auto e2 = error_on_new_thread([&] { (void)img::decode(twelve, {}, "twelve.jpg"); });
  CHECK_MESSAGE((has(e2, "twelve.jpg") && has(e2, "Unsupported JPEG data precision 12")), e2);
  CHECK(has(error_on_new_thread([&] { (void)img::probe(twelve, "twelve.jpg"); }), "precision"));

  // Lossless (SOF3) is refused too.
  auto lossless = good;
  lossless[sof + 1] = 0xC3;
  const auto e3 = error_on_new_thread([&] { (void)img::decode(lossless, {}, "lossless.jpg"); });
  CHECK_MESSAGE((has(e3, "image: lossless.jpg: ") && has(e3, "Unsupported JPEG process: SOF type 0xc3")), e3);

  // Huffman-coded data under an arithmetic SOF9: decoded as arithmetic code, it is nonsense, and
  // libjpeg warns of the bytes left over (a real arithmetic-coded file: the next case).
  auto arith = good;
  arith[sof + 1] = 0xC9;
  const auto e4 = error_on_new_thread([&] { (void)img::decode(arith, {}, "arith.jpg"); });
  CHECK_MESSAGE((has(e4, "image: arith.jpg: truncated or corrupt JPEG data") && has(e4, "extraneous bytes")), e4);
}

TEST_CASE("image arithmetic-coded JPEG decodes to the pixels of the same coefficients Huffman-coded") {
#ifndef NITRO_TEST_HAS_JPEGLIB
  MESSAGE("skipped: no jpeglib.h to write an arithmetic-coded JPEG with");
#else
  // Entropy coding is lossless: the same image, quality and sampling give the same coefficients, so
  // the same pixels, whichever way they are coded (sequential or progressive).
  const auto y = torch::arange(75, torch::kFloat).view({75, 1}), x = torch::arange(101, torch::kFloat).view({1, 101});
  const auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto hwc = torch::stack({128 + 100 * torch::sin(x / 7) * torch::cos(y / 5), (x * 2 + y).expand({75, 101}),
                                 ((x + y) / 8).floor().remainder(2).expand({75, 101}) * 255},
                                2)
                       .add(torch::randn({75, 101, 3}, gen) * 10)
                       .round()
                       .clamp(0, 255)
                       .to(torch::kUInt8)
                       .contiguous();
  const auto huffman = libjpeg_encode(hwc, false, false);
  if (huffman.empty()) {
    MESSAGE("skipped: libjpeg.so.62 cannot be opened");
    return;
  }
  const auto arithmetic = libjpeg_encode(hwc, true, false);
  const auto progressive = libjpeg_encode(hwc, true, true);
  if (arithmetic.empty()) {
    MESSAGE("skipped: this libjpeg has no arithmetic encoder");
    return;
  }
  CHECK(marker_at(arithmetic, 0xC9) > 0);  // SOF9: sequential, arithmetic
  CHECK(marker_at(progressive, 0xCA) > 0);  // SOF10: progressive, arithmetic
  const auto want = img::decode(huffman);
  // libjpeg's Huffman-coded file is TurboJPEG's at the same settings (the same library underneath).
  CHECK(torch::equal(img::decode(img::encode_jpeg(hwc, {.quality = 90, .layout = img::Layout::hwc})), want));
  CHECK(torch::equal(img::decode(arithmetic, {}, "arith.jpg"), want));
  CHECK(torch::equal(img::decode(progressive, {}, "arith-progressive.jpg"), want));
  for (const std::int64_t min : {38, 19, 10}) {  // 1/2, 1/4, 1/8
    INFO("min " << min);
    const img::DecodeOptions o{.min_height = min, .min_width = min};
    const auto small = img::decode(huffman, o);
    CHECK(torch::equal(img::decode(arithmetic, o), small));
    CHECK(torch::equal(img::decode(progressive, o), small));
  }
#endif
}

TEST_CASE("image errors: a header claiming a huge image and max_pixels") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  // A 100000 x 100000 PNG of 100 bytes: refused before anything is allocated.
  const auto huge = fx->bytes("huge.png");
  CHECK(img::probe(huge).height == 100000);
  const auto e1 = error_of([&] { (void)img::decode(huge, {}, "huge.png"); });
  CHECK_MESSAGE((has(e1, "huge.png") && has(e1, "100000x100000 = 10000000000 pixels is more than max_pixels")), e1);
  CHECK(has(error_of([&] { (void)img::decoded_shape(img::probe(huge)); }), "max_pixels"));
  // A JPEG whose SOF says 65000 x 65000.
  auto big = fx->bytes("j420.jpg");
  const auto sof = marker_at(big, 0xC0);
  for (const std::size_t i : {sof + 5, sof + 7}) {
    big[i] = static_cast<std::uint8_t>(65000 >> 8);
    big[i + 1] = static_cast<std::uint8_t>(65000 & 0xFF);
  }
  CHECK(img::probe(big).width == 65000);
  const auto e2 = error_of([&] { (void)img::decode(big, {.min_height = 224, .min_width = 224}, "big.jpg"); });
  CHECK_MESSAGE((has(e2, "big.jpg") && has(e2, "65000x65000 = 4225000000 pixels is more than max_pixels")), e2);
  // A lower limit; it counts the full-size pixels, whatever the reduction.
  const auto good = fx->bytes("j420.jpg");
  CHECK(img::decode(good, {.max_pixels = 217 * 333}).size(1) == 217);
  CHECK(has(error_of([&] { (void)img::decode(good, {.max_pixels = 217 * 333 - 1}, "j.jpg"); }), "max_pixels (72260)"));
  CHECK(has(error_of([&] { (void)img::decode(good, {.min_height = 28, .max_pixels = 217 * 333 - 1}); }),
            "more than max_pixels"));
  CHECK(has(error_of([&] { (void)img::decode(fx->bytes("prgb.png"), {.max_pixels = 23 * 37 - 1}, "p.png"); }),
            "p.png: 37x23 = 851 pixels is more than max_pixels (850)"));
  CHECK(has(error_of([&] { (void)img::decode(good, {.max_pixels = 0}); }), "give a positive limit"));
}

TEST_CASE("image errors: bad options") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  for (const std::string file : {"j420.jpg", "prgb.png"}) {
    INFO(file);
    const auto bytes = fx->bytes(file);
    const auto info = img::probe(bytes);
    const auto h = info.height, w = info.width;
    const auto refused = [&](const img::DecodeOptions& o, const std::string& what) {
      const auto e = error_of([&] { (void)img::decode(bytes, o, "opt/" + file); });
      CHECK_MESSAGE((has(e, what)), e);
      CHECK(has(error_of([&] { (void)img::decoded_shape(info, o); }), what));
      CHECK(has(error_of([&] { (void)img::reduction_for(info, o); }), what));
      CHECK(has(error_of([&] { img::decode_into(bytes, torch::empty({3, h, w}, torch::kUInt8), o, "x"); }), what));
    };
    const std::string outside = "is not a non-empty window inside the " + std::to_string(w) + "x" + std::to_string(h);
    refused({.min_height = -1}, "min_height and min_width are sizes");
    refused({.min_width = -224}, "min_height and min_width are sizes");
    refused({.crop = img::Window{.top = 0, .left = 0, .height = h + 1, .width = w}}, outside);
    refused({.crop = img::Window{.top = 1, .left = 0, .height = h, .width = w}}, outside);
    refused({.crop = img::Window{.top = 0, .left = w, .height = 1, .width = 1}}, outside);
    refused({.crop = img::Window{.top = -1, .left = 0, .height = 2, .width = 2}}, outside);
    refused({.crop = img::Window{.top = 0, .left = 0, .height = 0, .width = 5}}, outside);
    refused({.crop = img::Window{.top = 0, .left = 0, .height = 5, .width = 0}}, outside);
    refused({.crop = img::Window{}}, outside);
    CHECK(has(error_of([&] { (void)img::decode(bytes, {.crop = img::Window{}}, "opt/" + file); }), "opt/" + file));
  }
}

TEST_CASE("image encode_jpeg round trips and Pillow reads what it writes") {
  // Smooth shading: at quality 100 without subsampling only rounding is lost.
  const auto y = torch::arange(48, torch::kFloat).view({48, 1}), x = torch::arange(64, torch::kFloat).view({1, 64});
  const auto image = torch::stack({(x * 4).expand({48, 64}), (y * 5).expand({48, 64}),
                                   128 + 100 * torch::sin(x / 9) * torch::cos(y / 7)})
                         .round()
                         .clamp(0, 255)
                         .to(torch::kUInt8);
  const auto rgb = img::encode_jpeg(image, {.quality = 100, .subsampling = img::Subsampling::s444});
  CHECK(img::sniff(rgb) == img::Format::jpeg);
  const auto info = img::probe(rgb);
  CHECK((info.height == 48 && info.width == 64 && info.components == 3));
  const auto back = img::decode(rgb);
  const auto diff = (back.to(torch::kInt) - image.to(torch::kInt)).abs();
  CHECK(diff.max().item<int>() <= 5);  // rounding in the DCT and the colour conversion, both ways
  CHECK(diff.to(torch::kFloat).mean().item<float>() < 0.5);
  // The same pixels given [H, W, C] make the same file.
  CHECK(img::encode_jpeg(image.permute({1, 2, 0}).contiguous(),
                         {.quality = 100, .subsampling = img::Subsampling::s444, .layout = img::Layout::hwc}) == rgb);
  CHECK(img::encode_jpeg(image.permute({1, 2, 0}), {.quality = 100, .subsampling = img::Subsampling::s444,
                                                    .layout = img::Layout::hwc}) == rgb);  // strided
  // Grey, one channel: a 1-component file, repeated into 3 channels by decode.
  const auto grey = image.slice(0, 0, 1);
  const auto g = img::encode_jpeg(grey, {.quality = 100});
  CHECK(img::probe(g).components == 1);
  const auto gback = img::decode(g);
  CHECK((torch::equal(gback[0], gback[1]) && torch::equal(gback[0], gback[2])));
  CHECK((gback.slice(0, 0, 1).to(torch::kInt) - grey.to(torch::kInt)).abs().max().item<int>() <= 1);
  // Progressive and 4:2:0: a SOF2 and 2x2-sampled luma.
  const auto prog = img::encode_jpeg(image, {.quality = 75, .progressive = true});
  CHECK(marker_at(prog, 0xC2) > 0);
  CHECK(prog[marker_at(prog, 0xC2) + 11] == 0x22);  // component 1's sampling factors
  CHECK(img::decode(prog).sizes() == image.sizes());
  const auto s422 = img::encode_jpeg(image, {.subsampling = img::Subsampling::s422});
  CHECK(s422[marker_at(s422, 0xC0) + 11] == 0x21);
  CHECK(rgb[marker_at(rgb, 0xC0) + 11] == 0x11);

  // What it refuses.
  const auto refused = [](const at::Tensor& t, const img::JpegOptions& o, const std::string& what) {
    const auto e = error_of([&] { (void)img::encode_jpeg(t, o); });
    CHECK_MESSAGE(has(e, "image::encode_jpeg: " + what), e);
  };
  refused(image, {.quality = 0}, "quality is 0; give 1 to 100");
  refused(image, {.quality = 101}, "quality is 101");
  refused(image.to(torch::kFloat), {}, "give a uint8 image of 3 dimensions ([C, H, W])");
  refused(image[0], {}, "give a uint8 image of 3 dimensions");
  refused(at::Tensor{}, {}, "give a uint8 image of 3 dimensions");
  refused(image.slice(0, 0, 2), {}, "2 channels; give 1 (grey) or 3 (RGB)");
  refused(torch::zeros({4, 8, 8}, torch::kUInt8), {}, "4 channels");
  refused(image, {.layout = img::Layout::hwc}, "64 channels");  // [C, H, W] given as [H, W, C]
  refused(torch::zeros({3, 0, 8}, torch::kUInt8), {}, "8x0 is not a JPEG size");
  refused(torch::zeros({1, 1, 70000}, torch::kUInt8), {}, "70000x1 is not a JPEG size");

  // Pillow opens what encode_jpeg wrote: size, mode, and the very pixels decode gives.
  const std::string python = NITRO_TEST_PYTHON;
  if (python.empty() || exit_code("'" + python + "' -c 'import PIL' >/dev/null 2>&1") != 0) {
    MESSAGE("skipped the Pillow half: no python with Pillow (NITRO_TEST_PYTHON='" << python << "')");
    return;
  }
  nitro::test::TempDir dir("nitro-image-encode", true);
  write_all(dir / "rgb.jpg", rgb);
  write_all(dir / "grey.jpg", g);
  write_all(dir / "prog.jpg", prog);
  {
    std::ofstream script(dir / "open.py");
    script << "import sys\nfrom PIL import Image\n"
              "for name in sys.argv[2:]:\n"
              "    with Image.open(sys.argv[1] + '/' + name + '.jpg') as im:\n"
              "        print(name, im.size[0], im.size[1], im.mode)\n"
              "        open(sys.argv[1] + '/' + name + '.rgb', 'wb').write(im.convert('RGB').tobytes())\n";
  }
  REQUIRE(exit_code("'" + python + "' '" + (dir / "open.py").string() + "' '" + dir.path.string() +
                    "' rgb grey prog > '" + (dir / "out.txt").string() + "'") == 0);
  CHECK(read_all(dir / "out.txt") == "rgb 64 48 RGB\ngrey 64 48 L\nprog 64 48 RGB\n");
  for (const std::string name : {"rgb", "grey", "prog"}) {
    INFO(name);
    const auto raw = read_all(dir / (name + ".rgb"));
    REQUIRE(raw.size() == 48 * 64 * 3);
    const auto pillow = torch::from_blob(const_cast<char*>(raw.data()), {48, 64, 3}, torch::kUInt8).permute({2, 0, 1});
    CHECK(torch::equal(img::read(dir / (name + ".jpg")), pillow));
  }
}

TEST_CASE("image decodes on several threads at once") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  const std::vector<std::string> files = {"j420.jpg", "jcmyk.jpg", "jprog.jpg", "padam7.png"};
  std::vector<Bytes> bytes;
  std::vector<at::Tensor> want;
  for (const auto& f : files) {
    bytes.push_back(fx->bytes(f));
    want.push_back(img::decode(bytes.back(), {.min_height = 50, .min_width = 50}));
  }
  std::vector<int> same(files.size() * 2, 0);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < same.size(); ++t) {
    threads.emplace_back([&, t] {
      const auto i = t % files.size();
      int ok = 1;
      for (int k = 0; k < 20; ++k)
        ok &= torch::equal(img::decode(bytes[i], {.min_height = 50, .min_width = 50}), want[i]) ? 1 : 0;
      same[t] = ok;
    });
  }
  for (auto& t : threads) t.join();
  for (const int ok : same) CHECK(ok == 1);
}

// TurboJPEG 2's progressive mode stayed in the thread's compressor: a baseline file written after a
// progressive one on the same thread was corrupt ("bad Huffman code"). Each progressive file now gets
// a handle of its own.
TEST_CASE("image encode_jpeg after a progressive encode on the same thread still writes a good baseline file") {
  std::thread([] {
    const auto y = at::arange(250, at::kFloat).view({1, 250, 1}), x = at::arange(333, at::kFloat).view({1, 1, 333});
    const auto image = at::cat({(x * 0.6 + y * 0.3).expand({1, 250, 333}), (at::sin(x / 9) * 80 + 120).expand({1, 250, 333}),
                                (at::cos(y / 7) * 60 + 100).expand({1, 250, 333})},
                               0)
                           .clamp(0, 255)
                           .to(at::kByte);
    const auto before = img::encode_jpeg(image, {.quality = 75});
    const auto progressive = img::encode_jpeg(image, {.quality = 75, .progressive = true});
    const auto after = img::encode_jpeg(image, {.quality = 75});
    CHECK(after == before);
    CHECK(torch::equal(img::decode(after), img::decode(before)));
    CHECK(torch::equal(img::decode(progressive), img::decode(before)));
  }).join();
}

// From the outside review: the thread's scratch buffer grew to the largest image (or the largest
// header a damaged file claimed) and kept that size for the thread's life. It is now given back after
// a decode that needed more than kScratchKeep bytes.
TEST_CASE("image a decode of a large image gives its scratch memory back, a small one keeps it") {
  std::thread([] {
    namespace d = img::detail;
    const auto big = img::encode_jpeg(at::full({3, 4000, 6000}, 90, at::kByte), {.quality = 50});  // 72 MB as RGB
    const auto small = img::encode_jpeg(at::full({3, 40, 60}, 90, at::kByte), {.quality = 50});
    (void)img::decode(small);  // CHW: through the scratch buffer
    CHECK(d::scratch_slot().size == std::size_t{40} * 60 * 3);
    const auto x = img::decode(big);
    CHECK(x.sizes() == c10::IntArrayRef{3, 4000, 6000});
    CHECK(d::scratch_slot().size == 0);
    CHECK(d::scratch_slot().data == nullptr);
    (void)img::decode(small);
    CHECK(d::scratch_slot().size == std::size_t{40} * 60 * 3);
  }).join();
}

// A crop decodes only its region (DecodeOptions::partial, libjpeg's jpeg_skip_scanlines and
// jpeg_crop_scanline): the same pixels as the window of a whole decode at the same scale, which the
// tests above hold to Pillow's. The places where a region could differ, and are checked here: its
// left edge, which libjpeg moves to an iMCU boundary (8 or 16 pixels at full size, fewer when scaled),
// and its right edge, where smooth chroma upsampling repeats the region's last sample instead of
// blending in the next (the region reaches one pixel past the crop where the image has one, so that
// this lands outside it); the first rows after skipped ones (context rows of 4:2:0's vertical
// upsampling); the DCT scales; the fast IDCT with merged upsampling; progressive files and restart
// markers; grey, 4:4:4, 4:2:2, 4:2:0 and CMYK; files narrower than an iMCU.
TEST_CASE("image a crop's region decoded alone equals the same window of a whole decode: every kind, scale and edge") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  std::vector<std::string> files = {"j420.jpg", "j444.jpg",  "j422.jpg",     "jprog.jpg",      "jrst.jpg",  "jgrey.jpg",
                                    "jcmyk.jpg", "jq100.jpg", "j17x9.jpg", "j31x7_422.jpg", "j17x9_grey.jpg"};
  for (const auto& r : fx->refs)
    if (r.file.starts_with("photo_") && r.file.ends_with(".jpg") && r.scale == 1) files.push_back(r.file);
  std::mt19937 rng(5);
  std::map<int, int> checked;  // by scale
  int compared = 0;
  for (const auto& file : files) {
    const auto bytes = fx->bytes(file);
    const auto info = img::probe(bytes);
    const auto H = info.height, W = info.width;
    // Edges on both sides of iMCU boundaries (8 and 16 pixels at full size, 1 to 8 when scaled), the
    // image's own edges, and random windows (only those for the photographs: their decodes are slower).
    const bool photo = file.starts_with("photo_");
    const std::vector<std::int64_t> cuts =
        photo ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{0, 1, 7, 8, 9, 15, 16, 17, 33};
    std::vector<img::Window> windows;
    for (const auto a : cuts)
      for (const auto b : cuts) {
        if (a + 1 < W && b + 1 < H) windows.push_back({.top = b, .left = a, .height = H - b - (a % 5), .width = W - a - (b % 7)});
        if (a < W && b < H) windows.push_back({.top = H - 1 - b, .left = W - 1 - a, .height = b + 1, .width = a + 1});
      }
    // Thin windows at column 0 (a region 2 pixels wide there has a chroma width of 1 in 4:2:0, which
    // libjpeg upsamples otherwise), four in a row so that each meets every scale.
    for (const std::int64_t t : {1, 7, 15, 17})
      if (t < H && W >= 2)
        for (int repeat = 0; repeat < 4; ++repeat) {
          windows.push_back({.top = t, .left = 0, .height = 1, .width = 1});
          windows.push_back({.top = t, .left = 0, .height = std::min<std::int64_t>(5, H - t), .width = 2});
        }
    for (int k = 0; k < (photo ? 12 : 30); ++k) {
      const auto top = static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(H));
      const auto left = static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(W));
      windows.push_back({.top = top, .left = left, .height = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(H - top)),
                         .width = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(W - left))});
    }
    for (std::size_t k = 0; k < windows.size(); ++k) {
      const auto& c = windows[k];
      if (c.height < 1 || c.width < 1 || c.top + c.height > H || c.left + c.width > W) continue;
      // One scale a window, in turn (the first of 1, 2, 4, 8 from k's turn on that the window allows).
      for (std::size_t turn = 0; turn < 4; ++turn) {
        const int s = std::array{1, 2, 4, 8}[(k + turn) % 4];
        const img::DecodeOptions at_s{.crop = c,
                                      .min_height = s == 1 ? 0 : std::max<std::int64_t>(1, c.height / s),
                                      .min_width = s == 1 ? 0 : std::max<std::int64_t>(1, c.width / s)};
        if (img::reduction_for(info, at_s) != s) continue;
        for (const bool fast : {false, true}) {
          if (fast && k % 2 == 1) continue;  // the fast IDCT and merged upsampling on every other window
          auto o = at_s;
          o.fast = fast;
          if (k % 3 != 0) o.layout = img::Layout::hwc;
          INFO(file << " at 1/" << s << (fast ? " fast" : "") << " crop top " << c.top << " left " << c.left << " "
                    << c.width << "x" << c.height);
          const auto region = img::decode(bytes, o, file);
          auto whole = o;
          whole.partial = false;
          const auto want = img::decode(bytes, whole, file);
          CHECK_MESSAGE(torch::equal(region, want), difference(region, want));
          ++checked[s];
          ++compared;
        }
        break;
      }
    }
  }
  // Every scale is reached (a miss would pass for want of cases), and the files are all there.
  for (const int s : {1, 2, 4, 8}) CHECK(checked[s] > 100);
  CHECK(files.size() >= 11);
  CHECK(compared > 1000);
  // partial = false is the whole decode, then cut: Pillow's window (the case above, for the record).
  const auto bytes = fx->bytes("j420.jpg");
  const img::Window c{.top = 13, .left = 17, .height = 150, .width = 200};
  CHECK(torch::equal(img::decode(bytes, {.crop = c}), window_of(fx->reference(fx->find("j420_jpg")), c, 1)));
}

TEST_CASE("image a crop above where a JPEG is damaged or cut short decodes, the whole image or a crop reaching it does not") {
  const auto* fx = fixtures();
  if (fx == nullptr) return;
  const auto good = fx->bytes("j420.jpg");  // 333 x 217, 4:2:0, baseline: rows come in iMCU rows of 16
  const auto info = img::probe(good);
  const auto cut_at = [&](std::size_t n) { return Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)); };
  const img::Window top_rows{.top = 3, .left = 40, .height = 20, .width = 100};
  const img::Window to_bottom{.top = info.height - 20, .left = 40, .height = 20, .width = 100};
  for (const auto& [what, bad] : std::vector<std::pair<std::string, Bytes>>{{"cut at 3/4", cut_at(good.size() * 3 / 4)},
                                                                            {"without EOI", cut_at(good.size() - 2)}}) {
    INFO(what);
    // The data that the crop's rows need is all there: the crop decodes, to the good file's pixels.
    CHECK(torch::equal(img::decode(bad, {.crop = top_rows}, "cut.jpg"), img::decode(good, {.crop = top_rows})));
    // A crop to the last row reads on to the end of the data, as a whole decode does: both refuse it.
    for (const auto& o : {img::DecodeOptions{.crop = to_bottom}, img::DecodeOptions{.crop = top_rows, .partial = false},
                          img::DecodeOptions{}}) {
      const auto e = error_on_new_thread([&] { (void)img::decode(bad, o, "cut.jpg"); });
      CHECK_MESSAGE(has(e, "image: cut.jpg: truncated or corrupt JPEG data (libjpeg-turbo: "), e);
    }
  }
  // Damage inside the crop's rows (or in the rows skipped above it, which are entropy-decoded) is
  // refused as a whole decode refuses it, with libjpeg's warning.
  auto flipped = good;
  const auto scan = scan_start(good);
  for (std::size_t i = scan + 200; i < scan + 232; ++i) flipped[i] ^= 0xFF;
  for (const auto& c : {top_rows, img::Window{.top = 40, .left = 0, .height = 30, .width = 30}}) {
    const auto e = error_on_new_thread([&] { (void)img::decode(flipped, {.crop = c}, "corrupt.jpg"); });
    CHECK_MESSAGE(has(e, "image: corrupt.jpg: truncated or corrupt JPEG data (libjpeg-turbo: Corrupt JPEG data"), e);
  }
  // A progressive file is read whole before its first row (all its scans): cut short, every crop fails.
  const auto prog = fx->bytes("jprog.jpg");
  const Bytes prog_cut(prog.begin(), prog.begin() + static_cast<std::ptrdiff_t>(prog.size() * 3 / 4));
  CHECK(has(error_on_new_thread([&] { (void)img::decode(prog_cut, {.crop = top_rows}, "p.jpg"); }), "image: p.jpg: "));
  // After a failure the thread decodes the next file as before.
  std::thread([&] {
    CHECK(has(error_of([&] { (void)img::decode(flipped, {.crop = top_rows}); }), "Corrupt JPEG data"));
    CHECK(torch::equal(img::decode(good, {.crop = top_rows}), img::decode(good, {.crop = top_rows, .partial = false})));
    CHECK(torch::equal(img::decode(good), window_of(fx->reference(fx->find("j420_jpg")), {0, 0, 217, 333}, 1)));
  }).join();
}

}  // namespace nitro_test_image_decode
