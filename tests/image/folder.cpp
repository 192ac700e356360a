// data/image_folder.hpp: ImageFolder's classes and order against torchvision's, YOLO labels read exactly
// and their errors, the per-sample geometry (keyed random crops, Resize, Letterbox, ResizeCenterCrop)
// against references computed here or by Python, skip_bad, and the batches through a Prefetcher with
// two workers, two epochs and an exact resume. Every image is a small JPEG written by the test.
#include "testing.hpp"

#include <nitro/data/augment.hpp>
#include <nitro/data/image.hpp>
#include <nitro/data/image_folder.hpp>
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/sampler.hpp>
#include <nitro/data/source.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace nitro_test_image_folder {  // one namespace per file: an area is compiled as one translation unit

namespace {

namespace fs = std::filesystem;
namespace img = nitro::image;
namespace data = nitro::data;
namespace sample = nitro::data::sample;
namespace aug = nitro::data::augment;

struct TempDir : nitro::test::TempDir {
  TempDir() : nitro::test::TempDir("nitro-folder", /*create=*/true) {}
};

// doctest::Contains of a std::string.
doctest::Contains contains(const std::string& s) { return doctest::Contains(s.c_str()); }

int exit_code(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void write_bytes(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}
void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
  REQUIRE(out.good());
}
std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// A smooth, deterministic colour image [3, h, w] (pattern k), so that a crop or a shift shows.
at::Tensor pattern(std::int64_t h, std::int64_t w, int k) {
  const auto y = at::arange(h, at::kDouble).view({1, h, 1});
  const auto x = at::arange(w, at::kDouble).view({1, 1, w});
  const auto c = at::arange(3, at::kDouble).view({3, 1, 1});
  const auto v = 128 + 60 * at::sin(y * (0.045 + 0.01 * k) + c * 1.3 + k) + 55 * at::cos(x * (0.06 + 0.005 * k) + c * 2.1);
  return v.round().clamp(0, 255).to(at::kByte);
}
std::vector<std::uint8_t> jpeg(std::int64_t h, std::int64_t w, int k) { return img::encode_jpeg(pattern(h, w, k), {.quality = 92}); }

// An uncompressed 2x1 24-bit BMP: a real file of a format torchvision lists and Nitro does not decode.
std::vector<std::uint8_t> bmp() {
  std::vector<std::uint8_t> b = {'B', 'M', 62, 0, 0, 0, 0, 0, 0, 0, 54, 0, 0, 0,  // file header: size 62, pixels at 54
                                 40, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 24, 0, 0, 0, 0, 0, 8, 0, 0, 0,
                                 0x13, 0x0B, 0, 0, 0x13, 0x0B, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                 255, 0, 0, 0, 255, 0, 0, 0};  // one row: blue, green, 2 bytes of padding
  return b;
}

// What _upsample_bilinear2d_aa makes of a uint8 [3, h, w] at h x w.
at::Tensor aa(const at::Tensor& chw, std::int64_t h, std::int64_t w) {
  if (chw.size(1) == h && chw.size(2) == w) return chw;
  return at::_upsample_bilinear2d_aa(chw.unsqueeze(0), {h, w}, false).squeeze(0);
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The JPEG reduction (PIL's draft rule) for a window of ch x cw and an output of h x w, computed here:
// the largest of 8, 4, 2 with the window at least s times the output each way, else 1.
int draft_scale(std::int64_t ch, std::int64_t cw, std::int64_t h, std::int64_t w) {
  for (int s : {8, 4, 2})
    if (ch >= s * h && cw >= s * w) return s;
  return 1;
}

// The whole image decoded at 1/s, checked to be at that scale.
at::Tensor decode_at(const std::vector<std::uint8_t>& bytes, int s) {
  const auto info = img::probe(bytes);
  const auto sh = ceil_div(info.height, s), sw = ceil_div(info.width, s);
  auto full = img::decode(bytes, {.min_height = info.height / s, .min_width = info.width / s});
  REQUIRE(full.sizes() == c10::IntArrayRef({3, sh, sw}));
  return full;
}

// The reference of a cropped draft decode: the window (top, left, h, w) of the full image at 1/s,
// from floor(top / s) to ceil((top + h) / s), then resized to oh x ow.
at::Tensor crop_reference(const std::vector<std::uint8_t>& bytes, const std::array<std::int64_t, 4>& c, std::int64_t oh,
                          std::int64_t ow, bool draft, int* scale = nullptr) {
  const int s = draft ? draft_scale(c[2], c[3], oh, ow) : 1;
  if (scale != nullptr) *scale = s;
  const auto full = decode_at(bytes, s);
  const auto r0 = c[0] / s, r1 = std::min(full.size(1), ceil_div(c[0] + c[2], s));
  const auto c0 = c[1] / s, c1 = std::min(full.size(2), ceil_div(c[1] + c[3], s));
  return aa(full.slice(1, r0, r1).slice(2, c0, c1).contiguous(), oh, ow);
}

at::Tensor boxes_of(std::vector<std::vector<float>> rows) {
  auto t = at::empty({static_cast<std::int64_t>(rows.size()), 5}, at::kFloat);
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::size_t j = 0; j < 5; ++j) t[static_cast<std::int64_t>(i)][static_cast<std::int64_t>(j)] = rows[i][j];
  return t;
}

std::vector<std::int64_t> longs(const at::Tensor& t) {
  const auto c = t.contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

// ---- The one Python call: torchvision's ImageFolder on the trees below, and its Resize(256) +
// CenterCrop(224) of one JPEG. Made once, on first use, for the cases that compare with it.

// root/<class>/... files of the listing tree: (relative path, kind) with kind j JPEG, b BMP, t text.
const std::vector<std::pair<std::string, char>>& tree_files() {
  static const std::vector<std::pair<std::string, char>> f = {
      {"Zebra/z1.jpg", 'j'},
      {"a/10.jpg", 'j'},  // sorts before 9.jpg: names compare as strings
      {"a/9.jpg", 'j'},
      {"a/.hidden.jpg", 'j'},
      {"a/x.JPG", 'j'},
      {"a/notes.txt", 't'},
      {"a/A/5.jpg", 'j'},
      {"a/a/1.Jpeg", 'j'},
      {"a/a b/2.jpeg", 'j'},  // "a/a b" and "a/a-b" sort between "a/a" and "a/a/b" as paths
      {"a/a-b/4.jpg", 'j'},
      {"a/a/b/3.jpg", 'j'},
      {"a/a/b/c/d/6.jpg", 'j'},
      {"a/a/b/c/notes.TXT", 't'},
      {"a/dir.jpg/7.jpg", 'j'},  // a folder named like an image is walked, not listed
      {"a b/ab.jpg", 'j'},
      {"a-b/deep/er/est/f.jpg", 'j'},  // only nested files
      {"apple/p.bmp", 'b'},
      {"apple/q.WEBP", 't'},  // listed by its name (the content does not matter until read)
      {"apple/r.jpg", 'j'},
      {"apple/s.gif", 't'},
      {"apple/t.jpg.txt", 't'},
      {"apple/u.txt.jpg", 'j'},
      {"b2/Img 1.jpg", 'j'},
      {"b2/img 2.JPEG", 'j'},
      {"b2/img 3.jpeg", 'j'},
      {"readme.jpg", 'j'},  // a file at the top is no class
  };
  return f;
}

struct PythonReference {
  bool available = false;
  bool failed = false;  // Python ran and failed for another reason than a missing module
  std::string why;
  TempDir dir;
  fs::path tree, empty_tree, center_jpeg;
  // Per root (tree; empty_tree with allow_empty): classes with their index, samples with their label,
  // or the exception's type name.
  struct Listing {
    std::vector<std::pair<std::string, std::int64_t>> classes;
    std::vector<std::pair<std::string, std::int64_t>> samples;
    std::string error;
  };
  std::vector<Listing> listings;
  at::Tensor center;  // uint8 [3, 224, 224]
};

void write_tree(const fs::path& root) {
  for (const auto& [rel, kind] : tree_files()) {
    const auto p = root / rel;
    if (kind == 'j') write_bytes(p, jpeg(6 + static_cast<std::int64_t>(rel.size() % 5), 8, static_cast<int>(rel.size() % 7)));
    else if (kind == 'b') write_bytes(p, bmp());
    else write_text(p, "not an image\n");
  }
}
void write_empty_tree(const fs::path& root) {
  write_bytes(root / "cat/1.jpg", jpeg(8, 8, 1));
  fs::create_directories(root / "dog");                   // empty
  write_text(root / "emu/notes.txt", "no image here\n");  // only a file of another kind
  fs::create_directories(root / "fox/sub");               // only an empty subfolder
}

void build(PythonReference& p) {
  p.tree = p.dir / "tree";
  p.empty_tree = p.dir / "empty tree";
  p.center_jpeg = p.dir / "center.jpg";
  write_tree(p.tree);
  write_empty_tree(p.empty_tree);
  write_bytes(p.center_jpeg, jpeg(512, 680, 3));
  const std::string python = NITRO_TEST_PYTHON;
  if (python.empty()) {
    p.why = "no python (NITRO_TEST_PYTHON is empty)";
    return;
  }
  write_text(p.dir / "ref.py", R"py(import sys, warnings
warnings.filterwarnings("ignore")
import torch
from PIL import Image
from torchvision.datasets import ImageFolder
import torchvision.transforms.v2.functional as F
out, jpeg, raw = sys.argv[1], sys.argv[2], sys.argv[3]
with open(out, "w", encoding="utf-8") as f:
    for root, allow in zip(sys.argv[4::2], sys.argv[5::2]):
        f.write("R\n")
        try:
            d = ImageFolder(root, allow_empty=allow == "1")
        except Exception as e:
            f.write("E\t" + type(e).__name__ + "\n")
            continue
        for c in d.classes:
            f.write("C\t" + c + "\t" + str(d.class_to_idx[c]) + "\n")
        for path, label in d.samples:
            f.write("S\t" + path + "\t" + str(label) + "\n")
im = Image.open(jpeg).convert("RGB")
t = torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8).view(im.height, im.width, 3).permute(2, 0, 1)
t = F.center_crop(F.resize(t, [256], antialias=True), [224, 224])
open(raw, "wb").write(t.contiguous().numpy().tobytes())
)py");
  const auto q = [](const fs::path& x) { return "'" + x.string() + "'"; };
  const auto listing = p.dir / "listing.txt", raw = p.dir / "center.raw";
  const auto cmd = "'" + python + "' " + q(p.dir / "ref.py") + " " + q(listing) + " " + q(p.center_jpeg) + " " + q(raw) +
                   " " + q(p.tree) + " 0 " + q(p.empty_tree) + " 0 " + q(p.empty_tree) + " 1 2>" + q(p.dir / "stderr.txt");
  if (exit_code(cmd) != 0) {
    const auto err = read_text(p.dir / "stderr.txt");
    p.why = "no python with torchvision and numpy (NITRO_TEST_PYTHON='" + python + "'; pip install --no-deps torchvision into it): " + err;
    p.failed = err.find("ModuleNotFoundError") == std::string::npos;  // not a missing module: the script failed
    return;
  }
  std::istringstream in(read_text(listing));
  for (std::string line; std::getline(in, line);) {
    if (line == "R") {
      p.listings.emplace_back();
      continue;
    }
    const auto a = line.find('\t'), b = line.rfind('\t');
    if (line[0] == 'E') p.listings.back().error = line.substr(a + 1);
    else if (line[0] == 'C') p.listings.back().classes.emplace_back(line.substr(a + 1, b - a - 1), std::stoll(line.substr(b + 1)));
    else p.listings.back().samples.emplace_back(line.substr(a + 1, b - a - 1), std::stoll(line.substr(b + 1)));
  }
  const auto bytes = read_text(raw);
  REQUIRE(bytes.size() == 3u * 224 * 224);
  p.center = at::empty({3, 224, 224}, at::kByte);
  std::copy(bytes.begin(), bytes.end(), p.center.data_ptr<std::uint8_t>());
  p.available = true;
}

const PythonReference& python_reference() {
  static PythonReference r;
  static const bool built = (build(r), true);
  (void)built;
  if (r.failed) FAIL(r.why);
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// ImageFolder

TEST_CASE("ImageFolder: classes, class_to_idx and the sample order equal torchvision's ImageFolder on a tree with every rule") {
  const auto& py = python_reference();
  data::ImageFolder folder(py.tree);
  // What torchvision lists, written out by hand (and checked against torchvision itself below):
  // classes sorted as strings, each class walked as sorted(os.walk(...)), files sorted by name, the
  // extensions matched without case, the files of other kinds and the top-level file left out.
  const std::vector<std::string> classes = {"Zebra", "a", "a b", "a-b", "apple", "b2"};
  CHECK(folder.classes() == classes);
  for (std::size_t c = 0; c < classes.size(); ++c) CHECK(folder.class_to_idx().at(classes[c]) == static_cast<std::int64_t>(c));
  const std::vector<std::pair<std::string, std::int64_t>> by_hand = {
      {"Zebra/z1.jpg", 0}, {"a/.hidden.jpg", 1}, {"a/10.jpg", 1},   {"a/9.jpg", 1},         {"a/x.JPG", 1},
      {"a/A/5.jpg", 1},    {"a/a/1.Jpeg", 1},    {"a/a b/2.jpeg", 1}, {"a/a-b/4.jpg", 1},  {"a/a/b/3.jpg", 1},
      {"a/a/b/c/d/6.jpg", 1}, {"a/dir.jpg/7.jpg", 1}, {"a b/ab.jpg", 2}, {"a-b/deep/er/est/f.jpg", 3},
      {"apple/p.bmp", 4},  {"apple/q.WEBP", 4},  {"apple/r.jpg", 4}, {"apple/u.txt.jpg", 4}, {"b2/Img 1.jpg", 5},
      {"b2/img 2.JPEG", 5}, {"b2/img 3.jpeg", 5}};
  REQUIRE(folder.size().value() == by_hand.size());
  for (std::size_t i = 0; i < by_hand.size(); ++i) {
    CAPTURE(i);
    CHECK(folder.path(i) == py.tree.string() + "/" + by_hand[i].first);
    CHECK(folder.label(i) == by_hand[i].second);
  }
  if (!py.available) {
    MESSAGE("skipped the comparison with torchvision: " << py.why);
    return;
  }
  REQUIRE(py.listings.size() == 3);
  const auto& tv = py.listings[0];
  REQUIRE(tv.error.empty());
  REQUIRE(tv.classes.size() == folder.classes().size());
  for (std::size_t c = 0; c < tv.classes.size(); ++c) {
    CHECK(folder.classes()[c] == tv.classes[c].first);
    CHECK(folder.class_to_idx().at(tv.classes[c].first) == tv.classes[c].second);
  }
  REQUIRE(tv.samples.size() == folder.size().value());
  for (std::size_t i = 0; i < tv.samples.size(); ++i) {
    CAPTURE(i);
    CHECK(folder.path(i) == tv.samples[i].first);
    CHECK(folder.label(i) == tv.samples[i].second);
  }
}

TEST_CASE("ImageFolder: get(i) is the decoded file and its class, a BMP is a nitro::Error naming it") {
  const auto& py = python_reference();
  data::ImageFolder folder(py.tree.string() + "/");  // a trailing slash changes no path
  for (std::size_t i = 0; i < folder.size().value(); ++i) {
    CAPTURE(folder.path(i));
    const auto& p = folder.path(i);
    CHECK(p.find("//") == std::string::npos);
    const bool other = p.ends_with(".bmp") || p.ends_with(".WEBP");
    if (other) {
      CHECK_THROWS_WITH_AS(folder.get(i), contains(p), nitro::Error);
      continue;
    }
    const auto e = folder.get(i);
    CHECK(torch::equal(e.data, img::read(p)));
    CHECK(e.data.sizes() == img::read(p).sizes());
    CHECK(e.target.item<std::int64_t>() == folder.label(i));
    CHECK(e.target.scalar_type() == at::kLong);
  }
  // ImageFolderOptions::decode: how get() decodes.
  data::ImageFolder hwc(py.tree, {.decode = {.layout = img::Layout::hwc}});
  CHECK(torch::equal(hwc.get(0).data, img::read(hwc.path(0)).permute({1, 2, 0})));
  // Copies share the list.
  const auto copy = folder;
  CHECK(&copy.path(3) == &folder.path(3));
}

TEST_CASE("ImageFolder: an empty class is a nitro::Error naming it unless allow_empty, as torchvision's, and a bad root is refused") {
  const auto& py = python_reference();
  CHECK_THROWS_WITH_AS(data::ImageFolder(py.empty_tree), doctest::Contains("dog, emu, fox"), nitro::Error);
  CHECK_THROWS_WITH_AS(data::ImageFolder(py.empty_tree), doctest::Contains("allow_empty"), nitro::Error);
  data::ImageFolder allowed(py.empty_tree, {.allow_empty = true});
  CHECK(allowed.classes() == std::vector<std::string>{"cat", "dog", "emu", "fox"});
  REQUIRE(allowed.size().value() == 1);
  CHECK(allowed.path(0) == py.empty_tree.string() + "/cat/1.jpg");
  CHECK(allowed.label(0) == 0);
  // Other extensions: then .txt files are the samples.
  data::ImageFolder texts(py.tree, {.extensions = {".TXT"}, .allow_empty = true});
  REQUIRE(texts.size().value() == 3);
  CHECK(texts.path(0) == py.tree.string() + "/a/notes.txt");
  CHECK(texts.path(1) == py.tree.string() + "/a/a/b/c/notes.TXT");
  CHECK(texts.path(2) == py.tree.string() + "/apple/t.jpg.txt");
  CHECK(texts.label(2) == 4);
  CHECK_THROWS_WITH_AS(texts.get(1), doctest::Contains("notes.TXT"), nitro::Error);

  TempDir dir;
  CHECK_THROWS_WITH_AS(data::ImageFolder(dir / "missing"), doctest::Contains("is not a folder"), nitro::Error);
  write_bytes(dir / "flat/1.jpg", jpeg(8, 8, 0));
  CHECK_THROWS_WITH_AS(data::ImageFolder(dir / "flat/1.jpg"), doctest::Contains("1.jpg is not a folder"), nitro::Error);
  CHECK_THROWS_WITH_AS(data::ImageFolder(dir / "flat"), doctest::Contains("has no class folder"), nitro::Error);
  if (!py.available) {
    MESSAGE("skipped the comparison with torchvision: " << py.why);
    return;
  }
  REQUIRE(py.listings.size() == 3);
  CHECK(py.listings[1].error == "FileNotFoundError");
  const auto& tv = py.listings[2];
  REQUIRE(tv.error.empty());
  REQUIRE(tv.classes.size() == allowed.classes().size());
  for (std::size_t c = 0; c < tv.classes.size(); ++c) CHECK(allowed.classes()[c] == tv.classes[c].first);
  REQUIRE(tv.samples.size() == 1);
  CHECK(tv.samples[0].first == allowed.path(0));
}

// ---------------------------------------------------------------------------------------------------
// YoloDataset

TEST_CASE("YoloDataset: boxes are the label files' numbers, a missing file is no box, blank lines and CRLF are fine") {
  TempDir dir;
  const auto root = dir / "coco";
  for (const auto* name : {"b.jpg", "a.jpg", "c.JPG", "d.jpeg"}) write_bytes(root / "images/train" / name, jpeg(16, 24, 1));
  write_text(root / "images/train/notes.txt", "not an image\n");
  write_text(root / "labels/train/a.txt", "0 0.5 0.5 0.25 0.125\n17 0.1 0.2 0.3 0.4\n");
  write_text(root / "labels/train/b.txt", "\n3 0.75 0.25 0.5 0.5\r\n\r\n  \t \r\n1\t0 1 1 0\r\n  2 0.333 0.666 0.1 0.9  ");
  write_text(root / "labels/train/c.txt", "");
  // d.jpeg has no label file.
  const auto a = boxes_of({{0, 0.5f, 0.5f, 0.25f, 0.125f}, {17, 0.1f, 0.2f, 0.3f, 0.4f}});
  const auto b = boxes_of({{3, 0.75f, 0.25f, 0.5f, 0.5f}, {1, 0, 1, 1, 0}, {2, 0.333f, 0.666f, 0.1f, 0.9f}});
  const std::string images = root.string() + "/images/train/";
  for (const auto& r : {root, root / "images", root / "images/train", fs::path(root.string() + "/images/train/")}) {
    CAPTURE(r.string());
    data::YoloDataset yolo(r);
    REQUIRE(yolo.size() == 4);
    CHECK(yolo.path(0) == images + "a.jpg");
    CHECK(yolo.path(1) == images + "b.jpg");
    CHECK(yolo.path(2) == images + "c.JPG");
    CHECK(yolo.path(3) == images + "d.jpeg");
    CHECK(yolo.name(2) == yolo.path(2));
    CHECK(yolo.boxes(0).scalar_type() == at::kFloat);
    CHECK(torch::equal(yolo.boxes(0), a));
    CHECK(torch::equal(yolo.boxes(1), b));
    CHECK(yolo.boxes(2).sizes() == c10::IntArrayRef({0, 5}));
    CHECK(yolo.boxes(3).sizes() == c10::IntArrayRef({0, 5}));
    CHECK(yolo.box_count() == 5);
    CHECK(yolo.unlabelled() == 1);
    CHECK(yolo.label(0) == -1);
    CHECK(yolo.encoded(1) == img::read_file(images + "b.jpg"));
    CHECK_THROWS_AS((void)yolo.boxes(4), nitro::Error);
  }
  // A box tensor is the caller's: changing it changes nothing read later.
  data::YoloDataset yolo(root);
  yolo.boxes(0).fill_(9);
  CHECK(torch::equal(yolo.boxes(0), a));

  CHECK_THROWS_WITH_AS(data::YoloDataset(dir / "none"), doctest::Contains("is not a folder"), nitro::Error);
  fs::create_directories(dir / "no images/labels");
  CHECK_THROWS_WITH_AS(data::YoloDataset(dir / "no images"), doctest::Contains("has no images/ folder"), nitro::Error);
  fs::create_directories(dir / "empty/images/train");
  CHECK_THROWS_WITH_AS(data::YoloDataset(dir / "empty"), doctest::Contains("no image"), nitro::Error);
}

TEST_CASE("YoloDataset: each malformed label line is a nitro::Error naming file:line") {
  TempDir dir;
  write_bytes(dir / "set/images/x.jpg", jpeg(8, 8, 0));
  const auto label = dir / "set/labels/x.txt";
  const std::string where = label.string() + ":2";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"0 0.5 0.5 0.1", "4 numbers"},
      {"0 0.5 0.5 0.1 0.1 0.2", "more than 5 numbers"},
      {"0 0.5 0.5 0.1 0.1 0.2 0.3 0.4", "more than 5 numbers"},
      {"cat 0.5 0.5 0.1 0.1", "is not numbers"},
      {"0 0.5 0.5 0.1 0.1x", "is not numbers"},
      {"0,0.5,0.5,0.1,0.1", "is not numbers"},
      {"0 1.5 0.5 0.1 0.1", "outside [0, 1]"},
      {"0 0.5 -0.2 0.1 0.1", "outside [0, 1]"},
      {"0 0.5 0.5 1.0001 0.1", "outside [0, 1]"},
      {"-1 0.5 0.5 0.1 0.1", "not a whole number >= 0"},
      {"1.5 0.5 0.5 0.1 0.1", "not a whole number >= 0"},
      {"0 nan 0.5 0.1 0.1", "not finite"},
      {"0 0.5 inf 0.1 0.1", "not finite"},
      {"0 0.5 0.5 1e39 0.1", "too large for a float"},  // finite as a double, inf as the float kept
  };
  for (const auto& [line, why] : bad) {
    CAPTURE(line);
    write_text(label, "0 0.5 0.5 0.1 0.1\n" + line + "\n0 0.5 0.5 0.1 0.1\n");
    CHECK_THROWS_WITH_AS(data::YoloDataset(dir / "set"), contains(where + ": "), nitro::Error);
    CHECK_THROWS_WITH_AS(data::YoloDataset(dir / "set"), contains(why), nitro::Error);
  }
  // Without check_normalised, coordinates outside [0, 1] are read as they are (not a non-finite one).
  write_text(label, "0 0.5 0.5 0.1 0.1\r\n4 1.5 -0.25 2 0.5\r\n");
  data::YoloDataset loose(dir / "set", {.check_normalised = false});
  CHECK(torch::equal(loose.boxes(0), boxes_of({{0, 0.5f, 0.5f, 0.1f, 0.1f}, {4, 1.5f, -0.25f, 2, 0.5f}})));
  CHECK_THROWS_WITH_AS(data::YoloDataset(dir / "set"), contains(where + ": 1.5 is outside [0, 1]"), nitro::Error);
  write_text(label, "0 0.5 0.5 0.1 0.1\n0 nan 0.5 0.1 0.1\n");
  CHECK_THROWS_WITH_AS(data::YoloDataset(dir / "set", {.check_normalised = false}), contains(where), nitro::Error);
  write_text(label, "0 0.5 0.5 0.1 0.1\n0 0.5 0.5 -1e39 0.1\n");
  CHECK_THROWS_WITH_AS(data::YoloDataset(dir / "set", {.check_normalised = false}), contains(where), nitro::Error);
}

TEST_CASE("YoloDataset::label_path replaces the last /images/ and the extension") {
  using Y = data::YoloDataset;
  CHECK(Y::label_path("/d/images/train/a.jpg") == "/d/labels/train/a.txt");
  CHECK(Y::label_path("/d/images/x/images/b.JPG") == "/d/images/x/labels/b.txt");
  CHECK(Y::label_path("/d/images/train/images.jpg") == "/d/labels/train/images.txt");
  CHECK(Y::label_path("images/a.png") == "labels/a.txt");
  CHECK(Y::label_path("/d/images/a.b.jpeg") == "/d/labels/a.b.txt");
  CHECK(Y::label_path("/d/images/v1.2/c") == "/d/labels/v1.2/c.txt");  // a dot in a folder is no extension
  CHECK(Y::label_path("/d/my-images/a.jpg") == "/d/my-images/a.txt");   // no images folder: alongside
}

// ---------------------------------------------------------------------------------------------------
// Per-sample geometry

namespace {

// A folder of one class of JPEGs of these sizes (h, w), pattern k = their index.
struct Shapes {
  TempDir dir;
  std::vector<std::array<std::int64_t, 2>> sizes;
  std::vector<std::vector<std::uint8_t>> bytes;
  explicit Shapes(std::vector<std::array<std::int64_t, 2>> s) : sizes(std::move(s)) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      bytes.push_back(jpeg(sizes[i][0], sizes[i][1], static_cast<int>(i)));
      write_bytes(dir / ("root/c/" + std::string(1, static_cast<char>('a' + i)) + ".jpg"), bytes.back());
    }
  }
  [[nodiscard]] data::ImageFolder folder() const { return data::ImageFolder(dir / "root"); }
};

std::vector<std::size_t> all(std::size_t n) {
  std::vector<std::size_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

}  // namespace

TEST_CASE("RandomResizedCrop: augment's keyed crop, only the window decoded at the draft scale then resized, the same in any batch") {
  Shapes s({{300, 400}, {600, 800}, {240, 180}, {97, 131}, {400, 300}, {64, 48}, {31, 29}, {512, 512}});
  const auto n = s.sizes.size();
  const sample::RandomResizedCrop geometry{.height = 32, .width = 40};
  const aug::RandomResizedCrop augment{.height = 32, .width = 40};
  const std::uint64_t seed = 11;
  data::ImageBatches batches(s.folder(), geometry, {.seed = seed});
  std::set<int> scales;
  std::map<std::int64_t, at::Tensor> by_epoch;
  for (const std::int64_t epoch : {0, 1}) {
    batches.set_epoch(epoch);
    CHECK(batches.epoch() == epoch);
    const auto b = batches.get_batch(all(n));
    REQUIRE(b.data.sizes() == c10::IntArrayRef({static_cast<std::int64_t>(n), 3, 32, 40}));
    by_epoch[epoch] = b.data;
    for (std::size_t i = 0; i < n; ++i) {
      CAPTURE(epoch);
      CAPTURE(i);
      const auto [H, W] = s.sizes[i];
      aug::detail::Rng g(seed, epoch, static_cast<std::int64_t>(i), sample::kStage);
      const auto c = geometry.crop({seed, epoch, static_cast<std::int64_t>(i)}, H, W);
      CHECK(c == augment.crop(g, H, W));
      int scale = 0;
      CHECK(torch::equal(b.data[static_cast<std::int64_t>(i)], crop_reference(s.bytes[i], c, 32, 40, true, &scale)));
      scales.insert(scale);
      // Without draft: the full-resolution window, resized.
      const auto full = sample::RandomResizedCrop{.height = 32, .width = 40, .draft = false};
      auto out = at::empty({3, 32, 40}, at::kByte);
      full(s.bytes[i], "x", {seed, epoch, static_cast<std::int64_t>(i)}, out);
      CHECK(torch::equal(out, crop_reference(s.bytes[i], c, 32, 40, false)));
    }
  }
  // The draws reach every scale (the sizes were picked for it).
  CHECK(scales == std::set<int>{1, 2, 4, 8});
  // Another epoch, other crops.
  int moved = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto [H, W] = s.sizes[i];
    const auto i64 = static_cast<std::int64_t>(i);
    if (geometry.crop({seed, 0, i64}, H, W) != geometry.crop({seed, 1, i64}, H, W)) {
      ++moved;
      CHECK_FALSE(torch::equal(by_epoch[0][i64], by_epoch[1][i64]));
    }
  }
  CHECK(moved >= static_cast<int>(n) - 1);
  // Another seed, other crops.
  CHECK(geometry.crop({seed + 1, 0, 0}, 300, 400) != geometry.crop({seed, 0, 0}, 300, 400));
  // The same sample in another batch, at another position, on another copy (a worker's), after the
  // epoch was set away and back: the same pixels.
  batches.set_epoch(0);
  auto copy = batches;  // as DatasetSource's workers copy it
  const auto some = copy.get_batch({5, 3, 1});
  CHECK(torch::equal(some.data[0], by_epoch[0][5]));
  CHECK(torch::equal(some.data[1], by_epoch[0][3]));
  CHECK(torch::equal(some.data[2], by_epoch[0][1]));
  copy.set_epoch(1);  // copies share the epoch
  CHECK(batches.epoch() == 1);
  CHECK(torch::equal(batches.get_batch({2, 2}).data[1], by_epoch[1][2]));
  CHECK(torch::equal(batches.get_batch({7}).data[0], by_epoch[1][7]));
}

TEST_CASE("Resize: the draft decode at the output's size, then the antialiased resize") {
  Shapes s({{300, 400}, {97, 131}, {50, 60}});
  const auto folder = s.folder();
  // 300 x 400 to 50 x 60 decodes at 1/4 (75 x 100; 1/8 would be 38 x 50).
  CHECK(draft_scale(300, 400, 50, 60) == 4);
  CHECK(img::decode(s.bytes[0], {.min_height = 50, .min_width = 60}).sizes() == c10::IntArrayRef({3, 75, 100}));
  for (const bool draft : {true, false}) {
    CAPTURE(draft);
    data::ImageBatches batches(folder, sample::Resize{.height = 50, .width = 60, .draft = draft});
    const auto b = batches.get_batch(all(3));
    REQUIRE(b.data.sizes() == c10::IntArrayRef({3, 3, 50, 60}));
    for (std::size_t i = 0; i < 3; ++i) {
      const auto [H, W] = s.sizes[i];
      const auto ref = crop_reference(s.bytes[i], {0, 0, H, W}, 50, 60, draft);
      CHECK(torch::equal(b.data[static_cast<std::int64_t>(i)], ref));
    }
    // An image already of the output's size is copied as decoded.
    CHECK(torch::equal(b.data[2], img::decode(s.bytes[2])));
  }
}

TEST_CASE("Letterbox: Ultralytics' placement, grey 114 around the resized image, the boxes mapped onto the canvas") {
  // placement(h, w) = {new height, new width, top, left}: Ultralytics' LetterBox, worked by hand
  // (r = min(size / h, size / w); new size round(h r), round(w r) with Python's round, a tie to even;
  // top = round((size - nh) / 2 - 0.1), left likewise).
  const sample::Letterbox lb{.size = 640};
  using P = std::array<std::int64_t, 4>;
  CHECK(lb.placement(375, 500) == P{480, 640, 80, 0});
  CHECK(lb.placement(500, 375) == P{640, 480, 0, 80});
  CHECK(lb.placement(333, 500) == P{426, 640, 107, 0});  // 426.24
  CHECK(lb.placement(335, 500) == P{429, 640, 105, 0});  // 428.8; the odd 211 rows split 105 above, 106 below
  CHECK(lb.placement(640, 640) == P{640, 640, 0, 0});
  CHECK(lb.placement(1, 1) == P{640, 640, 0, 0});
  CHECK(lb.placement(1, 1000) == P{1, 640, 319, 0});
  CHECK(lb.placement(7, 3) == P{640, 274, 0, 183});
  CHECK(lb.placement(963, 1280) == P{482, 640, 79, 0});  // 481.5: to the even 482
  CHECK(lb.placement(321, 1280) == P{160, 640, 240, 0});  // 160.5: to the even 160, as Python's round
  CHECK(sample::Letterbox{.size = 5}.placement(7, 3) == P{5, 2, 0, 1});
  CHECK(sample::Letterbox{.size = 4}.placement(3, 7) == P{2, 4, 1, 0});
  CHECK(sample::Letterbox{.size = 2}.placement(5, 3) == P{2, 1, 0, 0});
  CHECK(sample::Letterbox{.size = 640, .scaleup = false}.placement(100, 80) == P{100, 80, 270, 280});
  CHECK(sample::Letterbox{.size = 640, .scaleup = false}.placement(1280, 960) == P{640, 480, 0, 80});

  Shapes s({{300, 400}, {240, 180}, {64, 48}});
  const sample::Key key{};
  // 300 x 400 at 200: 150 x 200 from row 25; the draft decode at 1/2 is exactly that size.
  {
    const sample::Letterbox g{.size = 200};
    CHECK(g.placement(300, 400) == P{150, 200, 25, 0});
    auto out = at::empty({3, 200, 200}, at::kByte);
    at::Tensor boxes = boxes_of({{3, 0.5f, 0.5f, 0.5f, 0.2f}, {1, 0.25f, 0.1f, 0.1f, 0.2f}});
    g(s.bytes[0], "a", key, out, &boxes);
    CHECK((out.slice(1, 0, 25) == 114).all().item<bool>());
    CHECK((out.slice(1, 175, 200) == 114).all().item<bool>());
    CHECK(torch::equal(out.slice(1, 25, 175), img::decode(s.bytes[0], {.min_height = 150, .min_width = 200})));
    CHECK(torch::equal(out.slice(1, 25, 175), crop_reference(s.bytes[0], {0, 0, 300, 400}, 150, 200, true)));
    // cy' = cy 150 / 200 + 25 / 200, h' = h 150 / 200; x unchanged (the image spans the width).
    CHECK(torch::allclose(boxes, boxes_of({{3, 0.5f, 0.5f, 0.5f, 0.15f}, {1, 0.25f, 0.2f, 0.1f, 0.15f}}), 0, 1e-6));
  }
  // 240 x 180 at 200: 200 x 150 from column 25 (r = 5 / 6); resized from the 1/1 decode.
  {
    const sample::Letterbox g{.size = 200, .pad = 7};
    CHECK(g.placement(240, 180) == P{200, 150, 0, 25});
    auto out = at::empty({3, 200, 200}, at::kByte);
    at::Tensor boxes = boxes_of({{0, 0.5f, 0.5f, 1, 1}, {2, 0.2f, 0.7f, 0.4f, 0.2f}});
    g(s.bytes[1], "b", key, out, &boxes);
    CHECK((out.slice(2, 0, 25) == 7).all().item<bool>());
    CHECK((out.slice(2, 175, 200) == 7).all().item<bool>());
    CHECK(torch::equal(out.slice(2, 25, 175), aa(img::decode(s.bytes[1]), 200, 150)));
    // cx' = cx 150 / 200 + 25 / 200, w' = w 150 / 200.
    CHECK(torch::allclose(boxes, boxes_of({{0, 0.5f, 0.5f, 0.75f, 1}, {2, 0.275f, 0.7f, 0.3f, 0.2f}}), 0, 1e-6));
  }
  // scaleup = false: a small image is placed as decoded, centred.
  {
    const sample::Letterbox g{.size = 100, .scaleup = false};
    CHECK(g.placement(64, 48) == P{64, 48, 18, 26});
    auto out = at::empty({3, 100, 100}, at::kByte);
    g(s.bytes[2], "c", key, out);
    CHECK(torch::equal(out.slice(1, 18, 82).slice(2, 26, 74), img::decode(s.bytes[2])));
    auto grey = out.clone();
    grey.slice(1, 18, 82).slice(2, 26, 74).fill_(114);
    CHECK((grey == 114).all().item<bool>());
    // With scaleup it fills the width.
    CHECK(sample::Letterbox{.size = 100}.placement(64, 48) == P{100, 75, 0, 12});
  }
}

TEST_CASE("ResizeCenterCrop: 224 x 224, and close to torchvision's Resize(256) then CenterCrop(224)") {
  const auto& py = python_reference();
  const auto bytes = img::read_file(py.center_jpeg);
  const sample::ResizeCenterCrop g{};
  CHECK(g.output_size() == std::array<std::int64_t, 2>{224, 224});
  for (const bool draft : {true, false}) {
    CAPTURE(draft);
    auto out = at::empty({3, 224, 224}, at::kByte);
    sample::ResizeCenterCrop{.draft = draft}(bytes, "center.jpg", {}, out);
    // By hand: 512 x 680, the shorter side to 256 (s = 1/2): the centre 224 x 224 is the full-size
    // window of 448 x 448 at (32, 116), decoded at 1/2 with draft (224 x 224 is enough), then resized.
    CHECK(torch::equal(out, crop_reference(bytes, {32, 116, 448, 448}, 224, 224, draft)));
    if (!py.available) {
      MESSAGE("skipped the comparison with torchvision: " << py.why);
      continue;
    }
    // Not torchvision's pixels at the border, nor with draft. torchvision resizes the whole image to
    // 256 x 340 and crops at (16, 58); Nitro resizes only the full-size window (32, 116, 448 x 448) to
    // 224 x 224: the same filter taps (the window starts on an even pixel), except that the window's
    // edge rows and columns lose the taps outside it. Observed, draft off: equal inside the 1-pixel
    // border, mean 0.011 and at most 2 grey levels over the whole crop. With draft the window is the
    // 1/2 DCT-scaled decode, not the full one resized: observed mean 0.58, at most 4.
    const auto diff = (out.to(at::kFloat) - py.center.to(at::kFloat)).abs();
    const auto inner = diff.slice(1, 1, 223).slice(2, 1, 223);
    const double mean = diff.mean().item<double>();
    MESSAGE("ResizeCenterCrop against torchvision, draft " << draft << ": mean |difference| " << mean << ", max "
                                                             << diff.max().item<double>() << "; inside the 1-pixel border: mean "
                                                             << inner.mean().item<double>() << ", max " << inner.max().item<double>());
    if (draft) {
      CHECK(mean < 1.0);
      CHECK(diff.max().item<double>() <= 8);
    } else {
      CHECK(inner.max().item<double>() == 0);
      CHECK(mean < 0.05);
      CHECK(diff.max().item<double>() <= 3);
    }
  }
}

TEST_CASE("geometry: each validate() refuses bad options with a nitro::Error, and so do the batches made with them") {
  CHECK_THROWS_WITH_AS(sample::Resize{.height = 0}.validate(), doctest::Contains("Resize"), nitro::Error);
  CHECK_THROWS_AS(sample::Resize{.width = -1}.validate(), nitro::Error);
  CHECK_NOTHROW(sample::Resize{.height = 1, .width = 1}.validate());
  CHECK_THROWS_WITH_AS((sample::ResizeCenterCrop{.resize = 200, .height = 224}.validate()), doctest::Contains("<= resize"),
                       nitro::Error);
  CHECK_THROWS_AS((sample::ResizeCenterCrop{.resize = 256, .width = 257}.validate()), nitro::Error);
  CHECK_THROWS_AS((sample::ResizeCenterCrop{.resize = 0}.validate()), nitro::Error);
  CHECK_NOTHROW((sample::ResizeCenterCrop{.resize = 224}.validate()));
  CHECK_THROWS_WITH_AS((sample::RandomResizedCrop{.scale_min = 0}.validate()), doctest::Contains("RandomResizedCrop"),
                       nitro::Error);
  CHECK_THROWS_AS((sample::RandomResizedCrop{.scale_max = 1.5}.validate()), nitro::Error);
  CHECK_THROWS_AS((sample::RandomResizedCrop{.scale_min = 0.6, .scale_max = 0.5}.validate()), nitro::Error);
  CHECK_THROWS_AS((sample::RandomResizedCrop{.ratio_min = 2, .ratio_max = 1}.validate()), nitro::Error);
  CHECK_THROWS_AS((sample::RandomResizedCrop{.ratio_min = 0}.validate()), nitro::Error);
  CHECK_THROWS_AS((sample::RandomResizedCrop{.height = 0}.validate()), nitro::Error);
  CHECK_NOTHROW((sample::RandomResizedCrop{}.validate()));
  CHECK_THROWS_WITH_AS(sample::Letterbox{.size = 0}.validate(), doctest::Contains("Letterbox"), nitro::Error);
  CHECK_NOTHROW(sample::Letterbox{.size = 1}.validate());
  Shapes s({{8, 8}});
  CHECK_THROWS_AS(data::ImageBatches(s.folder(), sample::Resize{.height = 0}), nitro::Error);
  CHECK_THROWS_AS(data::ImageBatches(s.folder(), sample::RandomResizedCrop{.scale_max = 2}), nitro::Error);
}

// ---------------------------------------------------------------------------------------------------
// Batches

TEST_CASE("ImageBatches: a RecordBatch of uint8 images, the labels and the indices, and an index out of range refused") {
  TempDir dir;
  for (int c = 0; c < 3; ++c)
    for (int k = 0; k < 2; ++k)
      write_bytes(dir / ("root/class" + std::to_string(c) + "/" + std::to_string(k) + ".jpg"), jpeg(20 + 3 * c, 30 - k, c + k));
  data::ImageFolder folder(dir / "root");
  data::ImageBatches batches(folder, sample::Resize{.height = 12, .width = 16});
  CHECK(batches.size().value() == 6);
  const auto b = batches.get_batch({5, 0, 2, 2});
  CHECK(b.data.sizes() == c10::IntArrayRef({4, 3, 12, 16}));
  CHECK(b.data.scalar_type() == at::kByte);
  CHECK(b.target.scalar_type() == at::kLong);
  CHECK(longs(b.target) == std::vector<std::int64_t>{2, 0, 1, 1});
  CHECK(longs(b.index) == std::vector<std::int64_t>{5, 0, 2, 2});
  CHECK(torch::equal(b.data[1], aa(img::read(folder.path(0)), 12, 16)));
  CHECK(torch::equal(b.data[2], b.data[3]));
  CHECK(batches.get_batch({}).data.sizes() == c10::IntArrayRef({0, 3, 12, 16}));
  CHECK_THROWS_WITH_AS(batches.get_batch({1, 6}), doctest::Contains("index 6 of a data set of 6"), nitro::Error);
}

TEST_CASE("skip_bad: a truncated JPEG fails its batch naming the file, or is left out and counted, by every copy") {
  TempDir dir;
  for (int k = 0; k < 4; ++k) write_bytes(dir / ("root/c/" + std::to_string(k) + ".jpg"), jpeg(24, 32, k));
  // Two kinds of bad file: cut in its headers (no SOS marker), and cut in its compressed data.
  auto header_cut = jpeg(24, 32, 9);
  header_cut.resize(header_cut.size() / 2);
  write_bytes(dir / "root/c/2b.jpg", header_cut);  // index 3: 0, 1, 2, 2b, 3, 3b
  auto data_cut = jpeg(96, 128, 8);
  data_cut.resize(data_cut.size() * 3 / 4);
  write_bytes(dir / "root/c/3b.jpg", data_cut);  // index 5
  data::ImageFolder folder(dir / "root");
  const auto bad = folder.path(3), bad2 = folder.path(5);
  REQUIRE(bad.ends_with("2b.jpg"));
  REQUIRE(bad2.ends_with("3b.jpg"));
  const sample::RandomResizedCrop g{.height = 8, .width = 8};
  {
    data::ImageBatches strict(folder, g);
    CHECK_THROWS_WITH_AS(strict.get_batch({5}), contains(bad2 + ": truncated or corrupt JPEG data"), nitro::Error);
    CHECK_THROWS_WITH_AS(strict.get_batch({0, 3, 4}), contains(bad), nitro::Error);
    CHECK(strict.skipped() == 0);
    // A failed file leaves nothing behind on the thread: the next samples decode.
    CHECK(strict.get_batch({0, 4, 1}).data.size(0) == 3);
  }
  data::ImageBatches lenient(folder, g, {.seed = 3, .skip_bad = true});
  data::ImageBatches reference(folder, g, {.seed = 3});
  const auto b = lenient.get_batch({0, 3, 4, 5, 1});
  CHECK(b.data.sizes() == c10::IntArrayRef({3, 3, 8, 8}));
  CHECK(longs(b.index) == std::vector<std::int64_t>{0, 4, 1});
  CHECK(longs(b.target) == std::vector<std::int64_t>{0, 0, 0});
  CHECK(torch::equal(b.data, reference.get_batch({0, 4, 1}).data));
  CHECK(lenient.skipped() == 2);
  CHECK(lenient.skipped_names() == std::vector<std::string>{bad, bad2});
  // A worker's copy counts into the same totals, and shares the epoch.
  auto copy = lenient;
  const auto only = copy.get_batch({3});
  CHECK(only.data.size(0) == 0);
  CHECK(only.index.numel() == 0);
  CHECK(lenient.skipped() == 3);
  CHECK(lenient.skipped_names() == std::vector<std::string>{bad, bad2, bad});
  copy.set_epoch(4);
  CHECK(lenient.epoch() == 4);
  // An error that is not the file's (an index out of range) is not skipped.
  CHECK_THROWS_AS(copy.get_batch({9}), nitro::Error);
}

TEST_CASE("DetectionBatches: Letterbox and RandomResizedCrop move each sample's boxes with its pixels") {
  TempDir dir;
  write_bytes(dir / "set/images/a.jpg", jpeg(300, 400, 0));
  write_bytes(dir / "set/images/b.jpg", jpeg(240, 180, 1));
  write_bytes(dir / "set/images/c.jpg", jpeg(50, 70, 2));
  write_text(dir / "set/labels/a.txt", "3 0.5 0.5 0.5 0.2\n1 0.25 0.1 0.1 0.2\n");
  write_text(dir / "set/labels/b.txt", "0 0.5 0.5 1 1\n2 0.2 0.7 0.4 0.2\n5 0.9 0.05 0.1 0.1\n");
  data::YoloDataset yolo(dir / "set");
  REQUIRE(yolo.size() == 3);
  {
    data::DetectionBatches batches(yolo, sample::Letterbox{.size = 200});
    const auto b = batches.get_batch({1, 0, 2});
    CHECK(b.data.sizes() == c10::IntArrayRef({3, 3, 200, 200}));
    CHECK(longs(b.index) == std::vector<std::int64_t>{1, 0, 2});
    REQUIRE(b.boxes.size() == 3);
    // By hand, as in the Letterbox case: a at 150 x 200 from row 25, b at 200 x 150 from column 25.
    CHECK(torch::allclose(b.boxes[1], boxes_of({{3, 0.5f, 0.5f, 0.5f, 0.15f}, {1, 0.25f, 0.2f, 0.1f, 0.15f}}), 0, 1e-6));
    CHECK(torch::allclose(b.boxes[0], boxes_of({{0, 0.5f, 0.5f, 0.75f, 1}, {2, 0.275f, 0.7f, 0.3f, 0.2f},
                                                {5, 0.8f, 0.05f, 0.075f, 0.1f}}),
                          0, 1e-6));
    CHECK(b.boxes[2].sizes() == c10::IntArrayRef({0, 5}));
    // The data set's boxes are unchanged.
    CHECK(torch::equal(yolo.boxes(0), boxes_of({{3, 0.5f, 0.5f, 0.5f, 0.2f}, {1, 0.25f, 0.1f, 0.1f, 0.2f}})));
  }
  {
    const sample::RandomResizedCrop g{.height = 24, .width = 24, .scale_min = 0.3};
    const aug::RandomResizedCrop augment{.height = 24, .width = 24, .scale_min = 0.3};
    data::DetectionBatches batches(yolo, g, {.seed = 5});
    data::ImageBatches images(yolo, g, {.seed = 5});
    for (const std::int64_t epoch : {0, 3}) {
      batches.set_epoch(epoch);
      images.set_epoch(epoch);
      const auto b = batches.get_batch({0, 1, 2});
      CHECK(torch::equal(b.data, images.get_batch({0, 1, 2}).data));
      for (std::int64_t i = 0; i < 2; ++i) {
        CAPTURE(epoch);
        CAPTURE(i);
        const auto info = img::probe(yolo.encoded(static_cast<std::size_t>(i)));
        const auto c = g.crop({5, epoch, i}, info.height, info.width);
        const auto want = augment.crop_boxes({yolo.boxes(static_cast<std::size_t>(i))}, {c}, info.height, info.width)[0];
        CHECK(torch::equal(b.boxes[static_cast<std::size_t>(i)], want));
      }
      CHECK(b.boxes[2].sizes() == c10::IntArrayRef({0, 5}));
    }
    // Hand-checked on one crop: the first box of a in the crop of epoch 0.
    const auto c = g.crop({5, 0, 0}, 300, 400);
    const double x0 = std::clamp((0.25 * 400 - static_cast<double>(c[1])) / static_cast<double>(c[3]), 0.0, 1.0),
                 x1 = std::clamp((0.75 * 400 - static_cast<double>(c[1])) / static_cast<double>(c[3]), 0.0, 1.0),
                 y0 = std::clamp((0.4 * 300 - static_cast<double>(c[0])) / static_cast<double>(c[2]), 0.0, 1.0),
                 y1 = std::clamp((0.6 * 300 - static_cast<double>(c[0])) / static_cast<double>(c[2]), 0.0, 1.0);
    batches.set_epoch(0);
    const auto first = batches.get_batch({0}).boxes[0];
    REQUIRE(x1 > x0);
    REQUIRE(y1 > y0);
    REQUIRE(first.size(0) >= 1);
    CHECK(first[0][0].item<float>() == 3);
    CHECK(first[0][1].item<double>() == doctest::Approx((x0 + x1) / 2).epsilon(1e-6));
    CHECK(first[0][2].item<double>() == doctest::Approx((y0 + y1) / 2).epsilon(1e-6));
    CHECK(first[0][3].item<double>() == doctest::Approx(x1 - x0).epsilon(1e-6));
    CHECK(first[0][4].item<double>() == doctest::Approx(y1 - y0).epsilon(1e-6));
  }
}

// ---------------------------------------------------------------------------------------------------
// The pipeline

TEST_CASE("ImageBatches through from_dataset and a Prefetcher with 2 workers: two epochs as made directly, and an exact resume") {
  Shapes s({{40, 56}, {33, 47}, {64, 48}, {50, 50}, {29, 61}, {45, 38}, {70, 52}, {36, 36}, {58, 41}, {44, 66}, {31, 35}});
  const std::size_t n = s.sizes.size(), batch = 3;  // 4 batches an epoch, the last of 2
  const sample::RandomResizedCrop g{.height = 16, .width = 16};
  const data::ImageBatchOptions options{.seed = 21};
  const std::uint64_t order_seed = 8;
  using Batches = data::ImageBatches<data::ImageFolder, sample::RandomResizedCrop>;
  using Source = nitro::DatasetSource<Batches, data::ResumableSampler>;
  using Prefetcher = nitro::Prefetcher<nitro::Cpu, Source>;

  // Made directly: epoch e's order in batches, each get_batch with the epoch set.
  std::vector<std::vector<data::RecordBatch>> expected(2);
  {
    Batches direct(s.folder(), g, options);
    for (const std::int64_t e : {0, 1}) {
      direct.set_epoch(e);
      const auto order = data::epoch_order(order_seed, e, n);
      for (std::size_t at = 0; at < n; at += batch)
        expected[static_cast<std::size_t>(e)].push_back(
            direct.get_batch(std::vector<std::size_t>(order.begin() + static_cast<std::ptrdiff_t>(at),
                                                      order.begin() + static_cast<std::ptrdiff_t>(std::min(n, at + batch)))));
    }
  }
  REQUIRE(expected[0].size() == 4);
  CHECK_FALSE(torch::equal(expected[0][0].data, expected[1][0].data));
  const auto same = [](const data::RecordBatch& a, const data::RecordBatch& b) {
    return torch::equal(a.data, b.data) && torch::equal(a.target, b.target) && torch::equal(a.index, b.index);
  };
  const auto check_rest = [&](Prefetcher& p, std::int64_t epoch, std::size_t from) {
    std::size_t k = from;
    for (auto& b : p) {
      CAPTURE(epoch);
      CAPTURE(k);
      REQUIRE(k < expected[static_cast<std::size_t>(epoch)].size());
      CHECK(same(b, expected[static_cast<std::size_t>(epoch)][k]));
      ++k;
    }
    CHECK(k == expected[static_cast<std::size_t>(epoch)].size());
  };

  SUBCASE("two epochs, one prefetcher") {
    data::ResumableSampler sampler(n, {.seed = order_seed});
    Prefetcher p{nitro::from_dataset(Batches(s.folder(), g, options), sampler, batch), {.depth = 2, .workers = 2}};
    for (const std::int64_t e : {0, 1}) {
      p.set_epoch(e);
      check_rest(p, e, 0);
    }
    CHECK(sampler.state().epoch == 1);
  }
  SUBCASE("stopped mid-epoch and resumed in a fresh prefetcher over a fresh data set") {
    for (const std::int64_t stop_epoch : {0, 1}) {
      CAPTURE(stop_epoch);
      data::ResumableSampler sampler(n, {.seed = order_seed});
      data::SamplerState st;
      {
        Prefetcher p{nitro::from_dataset(Batches(s.folder(), g, options), sampler, batch), {.depth = 2, .workers = 2}};
        for (std::int64_t e = 0; e < stop_epoch; ++e) {
          p.set_epoch(e);
          check_rest(p, e, 0);
        }
        p.set_epoch(stop_epoch);
        for (std::size_t k = 0; k < 2; ++k) {
          auto b = p.next();
          REQUIRE(b.has_value());
          CHECK(same(*b, expected[static_cast<std::size_t>(stop_epoch)][k]));
        }
        st = sampler.state();
      }  // the batches made ahead are dropped
      CHECK(st.epoch == stop_epoch);
      CHECK(st.index == static_cast<std::int64_t>(2 * batch));
      // The resumed run, as the prefetcher's header writes the loop: set_epoch(e) at the top of the
      // epoch, from the sampler's; the crops are keyed by (seed, epoch, index), so the rest is exact.
      data::ResumableSampler fresh(n);
      fresh.load_state(st);
      Prefetcher q{nitro::from_dataset(Batches(s.folder(), g, options), fresh, batch), {.depth = 2, .workers = 2}};
      q.set_epoch(st.epoch);
      check_rest(q, stop_epoch, 2);
      if (stop_epoch == 0) {
        q.set_epoch(1);
        check_rest(q, 1, 0);
      }
    }
  }
}

// From the outside review: ResizeCenterCrop ignored a detection sample's boxes, which then no longer
// matched the pixels.
TEST_CASE("ResizeCenterCrop moves a detection sample's boxes into the centre window, and drops those left outside") {
  // 100 x 400: the shorter side to 256 is x 2.56, so the centre 224 x 224 is the centre 88 x 88 of the
  // image (ceil(224 / 2.56) = 88): rows 6..94, columns 156..244.
  const auto bytes = img::encode_jpeg(pattern(100, 400, 3), {.quality = 95});
  const sample::ResizeCenterCrop g{.resize = 256, .height = 224, .width = 224};
  auto out = at::empty({3, 224, 224}, at::kByte);
  // A box on the left band (x 0..50) is outside the window: dropped.
  at::Tensor outside = torch::tensor({0.f, 0.0625f, 0.5f, 0.125f, 1.f}).view({1, 5});
  g(bytes, "c", {}, out, &outside);
  CHECK(outside.size(0) == 0);
  // A centred box of 40 x 20 pixels: x 180..220, y 40..60 -> in the window 24..64 and 34..54 of 88.
  at::Tensor centred = torch::tensor({5.f, 0.5f, 0.5f, 0.1f, 0.2f}).view({1, 5});
  g(bytes, "c", {}, out, &centred);
  REQUIRE(centred.size(0) == 1);
  CHECK(torch::allclose(centred, torch::tensor({5.f, 0.5f, 0.5f, 40.f / 88, 20.f / 88}).view({1, 5}), 0, 1e-6));
  // Through DetectionBatches as well.
  struct One {
    std::vector<std::uint8_t> b;
    std::vector<std::uint8_t> encoded(std::size_t) const { return b; }
    std::int64_t label(std::size_t) const { return -1; }
    std::string name(std::size_t) const { return "one"; }
    at::Tensor boxes(std::size_t) const { return torch::tensor({0.f, 0.0625f, 0.5f, 0.125f, 1.f, 5.f, 0.5f, 0.5f, 0.1f, 0.2f}).view({2, 5}); }
    std::size_t size() const { return 1; }
  };
  data::DetectionBatches det(One{bytes}, g);
  const auto b = det.get_batch({0});
  REQUIRE(b.boxes.size() == 1);
  CHECK(b.boxes[0].size(0) == 1);
  CHECK(b.boxes[0][0][0].item<float>() == 5.f);
}

// From the outside review: a YOLO data set inside a folder that happens to be named images
// (/data/images/coco) was taken for an images folder, and everything under it read as images.
TEST_CASE("YoloDataset: a parent folder named images does not make the data set's root an images folder") {
  TempDir dir;
  const auto root = dir.path / "images" / "ds";
  write_bytes(root / "images" / "a.jpg", jpeg(20, 30, 1));
  write_text(root / "labels" / "a.txt", "2 0.5 0.5 0.25 0.25\n");
  write_bytes(root / "previews" / "p.jpg", jpeg(20, 30, 2));  // not part of the data set
  const data::YoloDataset set(root);
  REQUIRE(set.size() == 1);
  CHECK(set.path(0) == (root / "images" / "a.jpg").string());
  CHECK(set.unlabelled() == 0);
  CHECK(torch::equal(set.boxes(0), torch::tensor({2.f, 0.5f, 0.5f, 0.25f, 0.25f}).view({1, 5})));
  // Its images folder named directly still works, and so does one under it.
  CHECK(data::YoloDataset(root / "images").size() == 1);
}

}  // namespace nitro_test_image_folder
