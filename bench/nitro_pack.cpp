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
//       an ImageFolder tree as torchvision's datasets.ImageFolder reads it: the classes are DIR's
//       subfolders in sorted order (label = the class's index), and each class's files with one of
//       torchvision's IMG_EXTENSIONS (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, any case), found
//       recursively (folder by folder, folders sorted by path, files sorted by name). Only JPEG and PNG
//       are packed (what Nitro decodes): any other file with such an extension is an error naming it.
//       Each record's name is the file's path relative to DIR.
//   nitro_pack --yolo DIR --out FILE [--resize N] [--quality Q] [--chunk C]
//       an Ultralytics detection set: every image under DIR/images (recursively, sorted by path; same
//       extensions and rule), its boxes in DIR/labels/<the same relative path>.txt, a line
//       `class cx cy w h` per box (normalised to [0, 1]; blank lines skipped). A missing label file
//       means no boxes; a malformed line is an error naming file:line. Names are relative to DIR/images.
//   Without --resize and --quality the files' bytes are stored unchanged. With either, each image is
//   decoded, its longer side brought down to N if larger (aspect kept; bilinear with antialiasing, as
//   torchvision's resize), and re-encoded as JPEG at quality Q (default 90): FFCV's writer's
//   max_resolution and jpeg_quality. Normalised boxes are unchanged by a resize.
//   The image modes need nitro::image (TurboJPEG and libpng: NITRO_IMAGE=1).
#include <nitro/data/record_file.hpp>
#include <nitro/data/synthetic.hpp>
#if NITRO_IMAGE
#include <nitro/data/image.hpp>
#include <nitro/data/packed.hpp>

#include <ATen/ops/_upsample_bilinear2d_aa.h>
#endif

#include <torch/serialize.h>

#include <algorithm>
#include <cctype>
#include <charconv>
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

// The directory scanning below mirrors torchvision's datasets.ImageFolder and Ultralytics' layout.
// TODO(issue 33): use data::ImageFolder / data::YoloDataset's scanner (data/image_folder.hpp).

/// torchvision's IMG_EXTENSIONS, compared with the lowered file name's end (as has_file_allowed_extension).
bool image_extension(const std::string& filename) {
  std::string lower = filename;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* e : {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"})
    if (lower.ends_with(e)) return true;
  return false;
}

/// Every file under `dir` with an image extension, as os.walk(dir, followlinks=True) finds them,
/// in torchvision's order: folders sorted by their path (sorted(os.walk(...))), files by name.
std::vector<fs::path> image_files(const fs::path& dir) {
  std::vector<std::pair<std::string, std::vector<std::string>>> folders;
  std::vector<fs::path> todo{dir};
  while (!todo.empty()) {
    const fs::path d = todo.back();
    todo.pop_back();
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(d)) {
      std::error_code ec;
      if (e.is_directory(ec)) todo.push_back(e.path());  // follows links, as os.walk(followlinks=True)
      else if (image_extension(e.path().filename().string())) files.push_back(e.path().filename().string());
    }
    std::sort(files.begin(), files.end());
    folders.emplace_back(d.string(), std::move(files));
  }
  std::sort(folders.begin(), folders.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<fs::path> out;
  for (const auto& [folder, files] : folders)
    for (const auto& f : files) out.push_back(fs::path(folder) / f);
  return out;
}

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

/// A YOLO label file's boxes, float [n, 5]; none if the file does not exist.
at::Tensor yolo_boxes(const fs::path& file) {
  std::vector<float> v;
  std::error_code ec;
  if (!fs::exists(file, ec)) return at::empty({0, 5}, at::kFloat);
  std::ifstream in(file);
  NITRO_CHECK(in.good(), "nitro_pack: ", file.string(), ": cannot open the label file");
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    std::vector<std::string> words;
    for (size_t i = 0; i < line.size();) {
      while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      const size_t start = i;
      while (i < line.size() && !std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      if (i > start) words.push_back(line.substr(start, i - start));
    }
    if (words.empty()) continue;
    float row[5] = {};
    bool ok = words.size() == 5;
    for (size_t k = 0; ok && k < 5; ++k) {
      const auto& word = words[k];
      const auto r = std::from_chars(word.data(), word.data() + word.size(), row[k]);
      ok = r.ec == std::errc() && r.ptr == word.data() + word.size() && std::isfinite(row[k]);
    }
    ok = ok && row[0] >= 0 && row[0] == std::floor(row[0]);
    for (size_t k = 1; ok && k < 5; ++k) ok = row[k] >= 0 && row[k] <= 1;
    NITRO_CHECK(ok, "nitro_pack: ", file.string(), ":", number,
                ": expected 'class cx cy w h' (a whole class number >= 0 and four coordinates in [0, 1]), got '",
                line, "'");
    v.insert(v.end(), row, row + 5);
  }
  NITRO_CHECK(!in.bad(), "nitro_pack: ", file.string(), ": read failed");
  auto boxes = at::empty({static_cast<int64_t>(v.size() / 5), 5}, at::kFloat);
  if (!v.empty()) std::memcpy(boxes.data_ptr<float>(), v.data(), v.size() * sizeof(float));
  return boxes;
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
      const fs::path root(images);
      NITRO_CHECK(fs::is_directory(root), "nitro_pack: --images ", images, " is not a folder");
      std::vector<std::string> classes;
      for (const auto& e : fs::directory_iterator(root)) {
        std::error_code ec;
        if (e.is_directory(ec)) classes.push_back(e.path().filename().string());
      }
      std::sort(classes.begin(), classes.end());
      NITRO_CHECK(!classes.empty(), "nitro_pack: no class folder in ", images,
                  " (an ImageFolder tree holds one folder of images per class)");
      std::vector<std::pair<fs::path, int64_t>> files;
      for (size_t c = 0; c < classes.size(); ++c) {
        const auto found = image_files(root / classes[c]);
        NITRO_CHECK(!found.empty(), "nitro_pack: class folder ", (root / classes[c]).string(),
                    " holds no image file (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp)");
        for (const auto& f : found) files.emplace_back(f, static_cast<int64_t>(c));
      }
      data::PackedWriter w(out, {.chunk_records = chunk, .kind = data::PackedKind::classification});
      for (const auto& [f, label] : files)
        w.write(image_bytes(f, p), label, f.lexically_relative(root).generic_string());
      w.close();
      print_summary((" in " + std::to_string(classes.size()) + " classes").c_str(), files.size(), images, p, out);
    } else {
      const fs::path root(yolo), image_root = root / "images", label_root = root / "labels";
      NITRO_CHECK(fs::is_directory(image_root), "nitro_pack: --yolo ", yolo,
                  " has no images/ folder (Ultralytics layout: DIR/images/..., DIR/labels/... .txt)");
      auto files = image_files(image_root);
      std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) { return a.string() < b.string(); });
      NITRO_CHECK(!files.empty(), "nitro_pack: no image file under ", image_root.string());
      data::PackedWriter w(out, {.chunk_records = chunk, .kind = data::PackedKind::detection});
      for (const auto& f : files) {
        const fs::path rel = f.lexically_relative(image_root);
        const auto boxes = yolo_boxes((label_root / rel).replace_extension(".txt"));
        w.write(image_bytes(f, p), boxes, rel.generic_string());
      }
      w.close();
      print_summary("", files.size(), yolo, p, out);
    }
    return 0;
#else
    throw nitro::Error("nitro_pack: --images and --yolo need nitro::image (TurboJPEG and libpng); this nitro_pack "
                       "was built without them (install libturbojpeg0-dev libpng-dev and reconfigure)");
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
