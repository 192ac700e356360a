// nitro_pack: makes a record file (data::RecordWriter, include/nitro/data/record_file.hpp), or a
// packed file of encoded images (data::PackedWriter, include/nitro/data/packed.hpp).
//
//   nitro_pack --synthetic N --out FILE [--size S] [--noise X] [--seed K] [--chunk C]
//       N SyntheticImages samples of 3xSxS as uint8 (x * 40 + 128, clamped) with int64 labels
//   nitro_pack --tensors DIR --out FILE [--chunk C]
//       every DIR/*.pt written by torch::save (C++) of one image tensor, in name order; the label is the
//       number after the last '_' in the name (img_000123_7.pt -> 7); every image must have the first
//       one's shape; its dtype is kept
//   nitro_pack --images DIR --out FILE [--resize N] [--quality Q] [--chunk C]
//       an ImageFolder tree as torchvision's datasets.ImageFolder reads it (data::ImageFolder): the classes are DIR's
//       subfolders in sorted order (label = the class's index), and each class's files with one of
//       torchvision's IMG_EXTENSIONS (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, any case), found
//       recursively (folder by folder, folders sorted by path, files sorted by name). Only JPEG and PNG
//       are packed (what Nitro decodes): any other file with such an extension is an error naming it.
//       Each record's name is the file's path relative to DIR.
//   nitro_pack --yolo DIR --out FILE [--resize N] [--quality Q] [--chunk C]
//       an Ultralytics detection set as data::YoloDataset reads it: every .jpg, .jpeg and .png under
//       DIR/images (recursively, sorted by path), its boxes in DIR/labels/<the same relative path>.txt, a
//       line `class cx cy w h` per box (normalised to [0, 1]; blank lines skipped). A missing label file
//       means no boxes; a malformed line is an error naming file:line. Names are relative to DIR/images.
//   Without --resize and --quality the files' bytes are stored unchanged. With either, each image is
//   decoded, its longer side brought down to N if larger (aspect kept; bilinear with antialiasing, as
//   torchvision's resize), and re-encoded as JPEG at quality Q (default 90): FFCV's writer's
//   max_resolution and jpeg_quality. Normalised boxes are unchanged by a resize.
//   The image modes need nitro::image (TurboJPEG, libjpeg and libpng: NITRO_IMAGE=1).
#include <nitro/data/record_file.hpp>
#include <nitro/data/synthetic.hpp>
#if NITRO_IMAGE
#include <nitro/data/image.hpp>
#include <nitro/data/image_folder.hpp>
#include <nitro/data/packed.hpp>

#include <ATen/ops/_upsample_bilinear2d_aa.h>
#endif

#include <torch/serialize.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace fs = std::filesystem;

#if NITRO_IMAGE
namespace {

struct Packing {
  int64_t resize = 0;   // 0: keep the size
  int quality = 90;
  bool reencode = false;
  uint64_t bytes_in = 0, bytes_out = 0;
};

/// The longer side brought down to n (if larger), aspect kept: bilinear with antialiasing, rounded.
at::Tensor resize_longer(const at::Tensor& x, int64_t n) {
  const int64_t h = x.size(1), w = x.size(2), longer = std::max(h, w);
  if (longer <= n) return x;
  const auto scaled = [&](int64_t s) { return std::max<int64_t>(1, (2 * s * n + longer) / (2 * longer)); };
  const int64_t nh = h == longer ? n : scaled(h), nw = w == longer ? n : scaled(w);
  const auto y = at::_upsample_bilinear2d_aa(x.unsqueeze(0).to(at::kFloat), {nh, nw}, false);
  return y.squeeze(0).round().clamp(0, 255).to(at::kByte);
}

/// The bytes to store for one image file: as they are, or decoded, resized and re-encoded as JPEG.
std::vector<std::uint8_t> image_bytes(const fs::path& file, Packing& p) {
  namespace img = nitro::image;
  auto bytes = img::read_file(file);
  p.bytes_in += bytes.size();
  NITRO_CHECK(img::sniff(bytes) != img::Format::unknown, "nitro_pack: ", file.string(),
              ": not a JPEG or PNG file (the only formats Nitro decodes); convert it or move it out of the tree");
  (void)img::probe(bytes, file.string());  // a damaged header: an error now, not at training time
  if (p.reencode) {
    auto x = img::decode(bytes, {}, file.string());
    if (p.resize > 0) x = resize_longer(x, p.resize);
    bytes = img::encode_jpeg(x, {.quality = p.quality});
  }
  p.bytes_out += bytes.size();
  return bytes;
}

void print_summary(const char* what, size_t n, const std::string& from, const Packing& p, const std::string& out) {
  std::printf("nitro_pack: %zu images%s from %s: %llu bytes in, %llu bytes out -> %s\n", n, what, from.c_str(),
              static_cast<unsigned long long>(p.bytes_in), static_cast<unsigned long long>(p.bytes_out), out.c_str());
}

}  // namespace
#endif

int main(int argc, char** argv) try {
  std::string out, dir, images, yolo;
  int64_t synthetic = -1, size = 224, chunk = 256, resize = 0, quality = 0;
  double noise = 8.0;
  uint64_t seed = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--out") out = v;
    else if (a == "--synthetic") synthetic = std::atoll(v.c_str());
    else if (a == "--tensors") dir = v;
    else if (a == "--size") size = std::atoll(v.c_str());
    else if (a == "--noise") noise = std::atof(v.c_str());
    else if (a == "--seed") seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (a == "--chunk") chunk = std::atoll(v.c_str());
    else if (a == "--images") images = v;
    else if (a == "--yolo") yolo = v;
    else if (a == "--resize") resize = std::atoll(v.c_str());
    else if (a == "--quality") quality = std::atoll(v.c_str());
    else throw nitro::Error("nitro_pack: unknown option " + a);
  }
  const int modes = (synthetic >= 0) + !dir.empty() + !images.empty() + !yolo.empty();
  NITRO_CHECK(!out.empty() && modes == 1 && argc % 2 == 1,
              "usage: nitro_pack --synthetic N --out FILE [--size S] [--noise X] [--seed K] [--chunk C]\n"
              "       nitro_pack --tensors DIR --out FILE [--chunk C]\n"
              "       nitro_pack --images DIR --out FILE [--resize N] [--quality Q] [--chunk C]\n"
              "       nitro_pack --yolo DIR --out FILE [--resize N] [--quality Q] [--chunk C]");
  if (!images.empty() || !yolo.empty()) {
#if NITRO_IMAGE
    namespace data = nitro::data;
    NITRO_CHECK(resize >= 0 && quality >= 0 && quality <= 100, "nitro_pack: --resize takes a size >= 1 and --quality 1 to 100");
    Packing p{.resize = resize, .quality = quality > 0 ? static_cast<int>(quality) : 90,
              .reencode = resize > 0 || quality > 0};
    if (!images.empty()) {
      const data::ImageFolder folder(images);  // torchvision's classes, order and extensions
      const auto n = *folder.size();
      const auto skip = folder.root().size() + 1;  // names relative to DIR
      data::PackedWriter w(out, {.chunk_records = chunk, .kind = data::PackedKind::classification});
      for (size_t i = 0; i < n; ++i) w.write(image_bytes(folder.path(i), p), folder.label(i), folder.path(i).substr(skip));
      w.close();
      print_summary((" in " + std::to_string(folder.classes().size()) + " classes").c_str(), n, images, p, out);
    } else {
      const fs::path root(yolo);
      NITRO_CHECK(fs::is_directory(root / "images"), "nitro_pack: --yolo ", yolo,
                  " has no images/ folder (Ultralytics layout: DIR/images/..., DIR/labels/... .txt)");
      const data::YoloDataset set(root);  // labels read (and checked, file:line) first
      const auto skip = (root / "images").string().size() + 1;  // names relative to DIR/images
      data::PackedWriter w(out, {.chunk_records = chunk, .kind = data::PackedKind::detection});
      for (size_t i = 0; i < set.size(); ++i) w.write(image_bytes(set.path(i), p), set.boxes(i), set.path(i).substr(skip));
      w.close();
      print_summary("", set.size(), yolo, p, out);
    }
    return 0;
#else
    throw nitro::Error("nitro_pack: --images and --yolo need nitro::image (TurboJPEG, libjpeg and libpng); this nitro_pack "
                       "was built without them (install libturbojpeg0-dev libjpeg-dev libpng-dev and reconfigure)");
#endif
  }
  if (synthetic >= 0) {
    nitro::data::SyntheticImages set({.size = synthetic, .height = size, .width = size, .noise = noise, .seed = seed});
    nitro::data::RecordWriter w(out, {{"image", at::kByte, {3, size, size}}, {"label", at::kLong, {}}},
                                {.chunk_records = chunk});
    for (int64_t i = 0; i < synthetic; ++i) {
      auto e = set.get(static_cast<size_t>(i));
      w.write({(e.data * 40 + 128).clamp(0, 255).to(at::kByte), e.target});
    }
    w.close();
    std::printf("nitro_pack: %lld synthetic images of 3x%lldx%lld -> %s\n", static_cast<long long>(synthetic),
                static_cast<long long>(size), static_cast<long long>(size), out.c_str());
    return 0;
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".pt") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  NITRO_CHECK(!files.empty(), "nitro_pack: no *.pt file in ", dir);
  std::optional<nitro::data::RecordWriter> w;
  for (const auto& f : files) {
    at::Tensor image;
    torch::load(image, f.string());
    const auto stem = f.stem().string();
    const auto at = stem.rfind('_');
    NITRO_CHECK(at != std::string::npos && at + 1 < stem.size(), "nitro_pack: ", f.string(),
                ": no label after a '_' in the name (img_000123_7.pt -> 7)");
    char* end = nullptr;
    const auto label = std::strtoll(stem.c_str() + at + 1, &end, 10);
    NITRO_CHECK(end != nullptr && *end == '\0', "nitro_pack: ", f.string(),
                ": the label after the last '_' is not a whole number (img_000123_7.pt -> 7)");
    if (!w) w.emplace(out, std::vector<nitro::data::RecordField>{{"image", image.scalar_type(), image.sizes().vec()},
                                                                 {"label", at::kLong, {}}},
                      nitro::data::RecordWriter::Options{.chunk_records = chunk});
    w->write({image, torch::tensor(static_cast<int64_t>(label))});
  }
  w->close();
  std::printf("nitro_pack: %zu tensors from %s -> %s\n", files.size(), dir.c_str(), out.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
