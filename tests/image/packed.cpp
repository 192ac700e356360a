// data::PackedWriter / PackedFile (include/nitro/data/packed.hpp) and nitro_pack --images / --yolo.
#include <nitro/data/image.hpp>
#include <nitro/data/packed.hpp>
#include <nitro/data/record_file.hpp>

#include "child.hpp"
#include "testing.hpp"

#include <png.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <tuple>

namespace nitro_test_image_packed {  // one namespace per file: an area is compiled as one translation unit

namespace {

namespace img = nitro::image;
using nitro::data::PackedFile;
using nitro::data::PackedImages;
using nitro::data::PackedKind;
using nitro::data::PackedWriter;
using Bytes = std::vector<std::uint8_t>;

// A smooth RGB image (JPEG keeps it close) with some noise, uint8 [3, h, w].
at::Tensor picture(int64_t h, int64_t w, int64_t seed) {
  torch::manual_seed(static_cast<uint64_t>(seed));
  auto y = torch::linspace(0, 1, h).view({1, h, 1}), x = torch::linspace(0, 1, w).view({1, 1, w});
  auto base = torch::stack({(y * 200 + 20).expand({1, h, w})[0], (x * 180 + 40).expand({1, h, w})[0],
                            ((x + y) * 100 + 30).expand({1, h, w})[0]});
  return (base + torch::randn({3, h, w}) * 6 + seed % 17).round().clamp(0, 255).to(at::kByte);
}

Bytes jpeg(int64_t h, int64_t w, int64_t seed, int quality = 90) {
  return img::encode_jpeg(picture(h, w, seed), {.quality = quality});
}

// PNG bytes of a uint8 [3, h, w] image, through libpng's simplified API.
Bytes png(const at::Tensor& chw) {
  const auto hwc = chw.permute({1, 2, 0}).contiguous();
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(hwc.size(1));
  image.height = static_cast<png_uint_32>(hwc.size(0));
  image.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  REQUIRE(png_image_write_to_memory(&image, nullptr, &size, 0, hwc.data_ptr<std::uint8_t>(), 0, nullptr) != 0);
  Bytes out(size);
  REQUIRE(png_image_write_to_memory(&image, out.data(), &size, 0, hwc.data_ptr<std::uint8_t>(), 0, nullptr) != 0);
  out.resize(size);
  return out;
}

std::vector<char> bytes_of(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::filesystem::path& p, const void* b, size_t n) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(static_cast<const char*>(b), static_cast<std::streamsize>(n));
}
void write_bytes(const std::filesystem::path& p, const std::vector<char>& b) { write_bytes(p, b.data(), b.size()); }
void write_bytes(const std::filesystem::path& p, const Bytes& b) { write_bytes(p, b.data(), b.size()); }
void write_text(const std::filesystem::path& p, const std::string& s) { write_bytes(p, s.data(), s.size()); }

bool same(std::span<const std::uint8_t> a, const Bytes& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

template <class T>
T get(const std::vector<char>& b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}
template <class T>
void set(std::vector<char>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}
uint64_t xxh(const std::vector<char>& b, size_t from, size_t to) {
  return nitro::io::xxh64(std::span<const std::byte>(reinterpret_cast<const std::byte*>(b.data()) + from, to - from));
}
// Where the footer's parts are (packed.hpp's layout): tail = the last 64 bytes.
struct Footer {
  size_t tail, footer_at, index_at;
};
Footer footer_of(const std::vector<char>& b) {
  const size_t tail = b.size() - 64;
  return {tail, tail - 8 * get<uint64_t>(b, tail + 16), get<uint64_t>(b, tail)};
}
// After a crafted change: the header's, the tables' and the footer's checksums made right again,
// over the parts where the uncrafted file `f` has them.
std::vector<char> resealed(std::vector<char> b, const Footer& f) {
  set(b, 4088, xxh(b, 0, 4088));
  set(b, f.tail + 40, xxh(b, f.index_at, f.footer_at));
  set(b, f.tail + 48, xxh(b, f.footer_at, b.size() - 16));
  return b;
}

struct Written {
  std::vector<Bytes> bytes;
  std::vector<int64_t> labels;
  std::vector<std::string> names;
  std::vector<at::Tensor> boxes;
};

// n JPEG images of varied sizes in a classification (labels) or detection (boxes, some empty) file.
Written write_file(const std::filesystem::path& path, int64_t n, int64_t chunk, PackedKind kind) {
  Written w;
  PackedWriter out(path, {.chunk_records = chunk, .kind = kind, .fsync = false});
  for (int64_t i = 0; i < n; ++i) {
    w.bytes.push_back(jpeg(8 + i % 7, 9 + (i * 5) % 11, i));
    w.names.push_back(i == 3 ? std::string() : "class" + std::to_string(i % 3) + "/img_" + std::to_string(i) + ".jpg");
    if (kind == PackedKind::classification) {
      w.labels.push_back(i == 5 ? -7 : i % 3);
      out.write(w.bytes.back(), w.labels.back(), w.names.back());
    } else {
      w.boxes.push_back(torch::rand({i % 4, 5}));
      out.write(w.bytes.back(), w.boxes.back(), w.names.back());
    }
  }
  CHECK(out.count() == n);
  out.close();
  return w;
}

}  // namespace

TEST_CASE("PackedFile (pack): JPEG bytes, labels and names come back bitwise, and decode as the originals") {
  nitro::test::TempDir dir("nitro-pak", true);
  const auto path = dir / "train.npak";
  const auto w = write_file(path, 40, 8, PackedKind::classification);
  auto file = PackedFile::open(path);
  REQUIRE(file->size() == 40);
  CHECK(file->kind() == PackedKind::classification);
  for (int64_t i = 0; i < 40; ++i) {
    CAPTURE(i);
    const auto k = static_cast<size_t>(i);
    CHECK(same(file->encoded(i), w.bytes[k]));
    CHECK(file->label(i) == w.labels[k]);
    CHECK(file->name(i) == w.names[k]);
    // Each record starts 8-byte aligned in the mapping.
    CHECK(reinterpret_cast<std::uintptr_t>(file->encoded(i).data()) % 8 == 0);
  }
  CHECK(file->name(3).empty());
  CHECK(file->label(5) == -7);
  for (int64_t i : {0, 17, 39}) {
    const auto k = static_cast<size_t>(i);
    CHECK(torch::equal(img::decode(file->encoded(i)), img::decode(w.bytes[k])));
  }
  // PackedImages: copies share the file and read the same.
  PackedImages images(path);
  PackedImages copy = images;
  CHECK(copy.file() == images.file());
  CHECK(copy.size() == 40);
  CHECK(same(copy.encoded(11), w.bytes[11]));
  CHECK(copy.label(11) == w.labels[11]);
  CHECK(copy.name(11) == w.names[11]);
  // The mapping lives while any handle does: here only `copy` holds the file.
  auto span = copy.encoded(12);
  images = PackedImages(file);
  file.reset();
  CHECK(same(span, w.bytes[12]));
  CHECK_THROWS_WITH_AS((void)copy.encoded(40), doctest::Contains("record 40 is out of range"), nitro::Error);
  CHECK_THROWS_WITH_AS((void)copy.label(-1), doctest::Contains("out of range"), nitro::Error);
  CHECK_THROWS_WITH_AS((void)copy.boxes(0), doctest::Contains("classification file"), nitro::Error);
}

TEST_CASE("PackedFile (pack): detection records keep their boxes bitwise, empty lists included") {
  nitro::test::TempDir dir("nitro-pak", true);
  const auto path = dir / "det.npak";
  const auto w = write_file(path, 21, 4, PackedKind::detection);
  auto file = PackedFile::open(path, {.verify = PackedFile::Verify::eager});
  REQUIRE(file->size() == 21);
  CHECK(file->kind() == PackedKind::detection);
  int64_t empty = 0;
  for (int64_t i = 0; i < 21; ++i) {
    CAPTURE(i);
    const auto k = static_cast<size_t>(i);
    CHECK(same(file->encoded(i), w.bytes[k]));
    CHECK(file->name(i) == w.names[k]);
    CHECK(file->label(i) == -1);
    const auto b = file->boxes(i);
    CHECK(b.scalar_type() == at::kFloat);
    CHECK(b.sizes() == c10::IntArrayRef{i % 4, 5});
    CHECK(torch::equal(b, w.boxes[k]));
    empty += b.size(0) == 0;
  }
  CHECK(empty == 6);
  // boxes() is a copy: changing it changes nothing stored.
  file->boxes(1).fill_(9);
  CHECK(torch::equal(file->boxes(1), w.boxes[1]));
  PackedImages images(file);
  CHECK(torch::equal(images.boxes(2), w.boxes[2]));
}

TEST_CASE("PackedWriter (pack): what it refuses, an unclosed writer leaves no file, an empty file is valid") {
  nitro::test::TempDir dir("nitro-pak", true);
  const auto path = dir / "x.npak";
  const auto j = jpeg(8, 8, 1);
  {
    PackedWriter w(path, {.fsync = false});
    CHECK_THROWS_WITH_AS(w.write(j, torch::zeros({1, 5})), doctest::Contains("classification file"), nitro::Error);
    CHECK_THROWS_WITH_AS(w.write(Bytes{}, 1), doctest::Contains("has no bytes"), nitro::Error);
    w.write(j, 1, "a.jpg");
  }
  CHECK_FALSE(std::filesystem::exists(path));
  {
    PackedWriter w(path, {.kind = PackedKind::detection, .fsync = false});
    CHECK_THROWS_WITH_AS(w.write(j, 3), doctest::Contains("detection file"), nitro::Error);
    CHECK_THROWS_WITH_AS(w.write(j, torch::zeros({2, 4})), doctest::Contains("shape [n, 5]"), nitro::Error);
    CHECK_THROWS_WITH_AS(w.write(j, torch::full({1, 5}, NAN)), doctest::Contains("not finite"), nitro::Error);
    // A refused record leaves nothing behind: the next one is record 0 with its own boxes.
    CHECK_THROWS_AS(w.write(Bytes{}, torch::ones({2, 5})), nitro::Error);
    w.write(j, torch::full({1, 5}, 0.5), "b.jpg");
    w.close();
    auto f = PackedFile::open(path);
    REQUIRE(f->size() == 1);
    CHECK(torch::equal(f->boxes(0), torch::full({1, 5}, 0.5)));
  }
  CHECK_THROWS_WITH_AS(PackedWriter(path, {.chunk_records = 0}), doctest::Contains("chunk_records"), nitro::Error);
  PackedWriter empty(path, {.fsync = false});
  empty.close();
  CHECK(PackedFile::open(path, {.verify = PackedFile::Verify::eager})->size() == 0);
}

TEST_CASE("PackedFile (pack): a file refused after it was mapped leaves no mapping behind") {
  nitro::test::TempDir dir("nitro-pak", true);
  const auto path = dir / "x.npak";
  {
    PackedWriter w(path, {.fsync = false});
    w.write(jpeg(8, 8, 1), 1, "a.jpg");
    w.close();
  }
  std::vector<char> b;
  {
    std::ifstream in(path, std::ios::binary);
    b.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  b[8] = 2;  // format version 2: refused once mapped (checksums and all)
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(b.data(), static_cast<std::streamsize>(b.size()));
  for (int i = 0; i < 3; ++i) CHECK_THROWS_WITH_AS(PackedFile::open(path), doctest::Contains("format version 2"), nitro::Error);
  CHECK(nitro::test::mappings_of(path) == 0);
}

TEST_CASE("PackedFile (pack): a truncated, foreign or damaged file is a nitro::Error that says which") {
  nitro::test::TempDir dir("nitro-pak", true);
  const auto path = dir / "train.npak";
  const auto w = write_file(path, 30, 8, PackedKind::classification);
  const auto good = bytes_of(path);
  const auto f = footer_of(good);
  const auto bad = dir / "bad.npak";
  const auto opened = [&](const std::vector<char>& b, PackedFile::Verify verify = PackedFile::Verify::lazy) {
    write_bytes(bad, b);
    return PackedFile::open(bad, {.verify = verify});
  };
  for (size_t n : {size_t{0}, size_t{100}, size_t{4096}, size_t{5000}, f.index_at + 3, f.footer_at + 8,
                   good.size() / 2, good.size() - 1}) {
    CAPTURE(n);
    CHECK_THROWS_AS(opened({good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)}), nitro::Error);
  }
  CHECK_THROWS_WITH_AS(opened({good.begin(), good.end() - 1}), doctest::Contains("truncated"), nitro::Error);
  CHECK_THROWS_WITH_AS(opened({good.begin(), good.begin() + 100}), doctest::Contains("too short"), nitro::Error);
  // Records cut out of the middle, the rest kept: the sizes do not add up.
  std::vector<char> cut(good.begin(), good.begin() + 4096);
  cut.insert(cut.end(), good.begin() + 4096 + 1024, good.end());
  CHECK_THROWS_WITH_AS(opened(cut), doctest::Contains("bad.npak"), nitro::Error);
  // Not a packed file: a LibTorch archive, a record file.
  const auto foreign = dir / "weights.pt";
  torch::save(torch::randn({2000}), foreign.string());
  CHECK_THROWS_WITH_AS(PackedFile::open(foreign), doctest::Contains("not a Nitro packed file"), nitro::Error);
  const auto rec = dir / "r.nrec";
  {
    nitro::data::RecordWriter rw(rec, {{"x", at::kByte, {4}}}, {.fsync = false});
    rw.write({torch::zeros({4}, at::kByte)});
    rw.close();
  }
  CHECK_THROWS_WITH_AS(PackedFile::open(rec), doctest::Contains("not a Nitro packed file"), nitro::Error);
  CHECK_THROWS_WITH_AS(PackedFile::open(dir / "missing.npak"), doctest::Contains("cannot open"), nitro::Error);
  CHECK_THROWS_WITH_AS(PackedFile::open(dir.path), doctest::Contains("not a regular file"), nitro::Error);

  // One byte of record 20's bytes (chunk 2, records 16 to 23) changed: found when that chunk is first
  // read (lazy), at open (eager), never (none).
  auto damaged = good;
  const size_t at20 = get<uint64_t>(damaged, f.index_at + 20 * 56);
  damaged[at20 + 5] ^= 1;
  auto lazy = opened(damaged);
  CHECK(same(lazy->encoded(3), w.bytes[3]));  // chunk 0 is fine
  CHECK(lazy->label(20) == w.labels[20]);     // labels and names are in the (checked) index
  CHECK_THROWS_WITH_AS((void)lazy->encoded(17), doctest::Contains("chunk 2 (records 16 to 23)"), nitro::Error);
  CHECK_THROWS_WITH_AS((void)lazy->encoded(20), doctest::Contains("does not match its checksum"), nitro::Error);
  CHECK_THROWS_WITH_AS(lazy->verify(), doctest::Contains("chunk 2"), nitro::Error);
  CHECK_THROWS_WITH_AS(opened(damaged, PackedFile::Verify::eager), doctest::Contains("chunk 2"), nitro::Error);
  auto unchecked = opened(damaged, PackedFile::Verify::none);
  CHECK(unchecked->encoded(20).size() == w.bytes[20].size());
  CHECK_FALSE(same(unchecked->encoded(20), w.bytes[20]));
  // The padding after a record is in its chunk's checksum too.
  damaged = good;
  const size_t len29 = get<uint64_t>(damaged, f.index_at + 29 * 56 + 8);
  if (len29 % 8 != 0) {
    damaged[get<uint64_t>(damaged, f.index_at + 29 * 56) + len29] ^= 1;
    CHECK_THROWS_WITH_AS((void)opened(damaged)->encoded(29), doctest::Contains("chunk 3"), nitro::Error);
  }
  // A damaged header, index, box/name table or footer.
  damaged = good;
  damaged[50] ^= 1;
  CHECK_THROWS_WITH_AS(opened(damaged), doctest::Contains("header's checksum"), nitro::Error);
  damaged = good;
  damaged[f.index_at + 7 * 56 + 16] ^= 1;  // record 7's label
  CHECK_THROWS_WITH_AS(opened(damaged), doctest::Contains("index, boxes and names do not match"), nitro::Error);
  CHECK(opened(damaged, PackedFile::Verify::none)->label(7) != w.labels[7]);  // none: not checked
  damaged = good;
  damaged[f.footer_at - 3] ^= 1;  // the names
  CHECK_THROWS_WITH_AS(opened(damaged), doctest::Contains("index, boxes and names do not match"), nitro::Error);
  damaged = good;
  damaged[f.footer_at + 9] ^= 1;  // chunk 1's checksum
  CHECK_THROWS_WITH_AS(opened(damaged), doctest::Contains("footer's checksum"), nitro::Error);
  damaged = good;
  damaged[f.tail + 8] ^= 1;  // the record count
  CHECK_THROWS_AS(opened(damaged), nitro::Error);
  damaged = good;
  damaged[good.size() - 3] ^= 1;  // the end magic
  CHECK_THROWS_WITH_AS(opened(damaged), doctest::Contains("no end marker"), nitro::Error);
}

TEST_CASE("PackedFile (pack): crafted headers, footers and index entries with valid checksums are refused") {
  nitro::test::TempDir dir("nitro-pak", true);
  const auto path = dir / "det.npak";
  write_file(path, 20, 8, PackedKind::detection);
  const auto good = bytes_of(path);
  const auto f = footer_of(good);
  const auto bad = dir / "bad.npak";
  const auto refused = [&](size_t at, auto value, const char* what, const char* message) {
    CAPTURE(what);
    auto b = good;
    set(b, at, value);
    b = resealed(b, f);
    write_bytes(bad, b);
    CHECK_THROWS_WITH_AS(PackedFile::open(bad), doctest::Contains(message), nitro::Error);
    CHECK_THROWS_WITH_AS(PackedFile::open(bad, {.verify = PackedFile::Verify::none}), doctest::Contains(message),
                         nitro::Error);
  };
  // Header: version 2, records per chunk 0 or 2^64 - 1, a kind that does not exist, another header size.
  refused(8, uint32_t{2}, "version", "format version 2");
  refused(24, uint64_t{0}, "chunk size 0", "header is inconsistent (records per chunk)");
  refused(24, ~uint64_t{0}, "chunk size 2^64 - 1", "header is inconsistent (records per chunk)");
  refused(16, uint32_t{7}, "kind 7", "header is inconsistent (kind)");
  refused(12, uint32_t{8192}, "header size", "header is inconsistent (header size)");
  // A classification header on a file with boxes.
  refused(16, uint32_t{0}, "kind classification", "do not account for");
  // Footer: huge counts, an index beyond the file or inside the header.
  const char* sizes = "do not account for";
  refused(f.tail + 8, uint64_t{1} << 61, "count 2^61", sizes);
  refused(f.tail + 8, uint64_t{21}, "count one more", sizes);
  refused(f.tail + 16, uint64_t{1} << 60, "chunks 2^60", sizes);
  refused(f.tail + 24, ~uint64_t{0}, "box rows 2^64 - 1", sizes);
  refused(f.tail + 32, ~uint64_t{0} - 3, "name bytes that wrap", sizes);
  refused(f.tail, uint64_t{1} << 40, "index beyond the file", sizes);
  refused(f.tail, uint64_t{64}, "index inside the header", sizes);
  refused(f.tail, f.index_at + 4, "index not aligned", sizes);
  // Index entries: offsets beyond the file or overlapping, lengths, boxes and names out of their tables.
  const auto entry = [&](size_t i, size_t field) { return f.index_at + 56 * i + 8 * field; };
  const char* outside = "index entry";
  refused(entry(3, 0), uint64_t{1} << 40, "offset beyond the file", outside);
  refused(entry(3, 0), get<uint64_t>(good, entry(2, 0)), "offset of the record before", outside);
  refused(entry(3, 1), uint64_t{1} << 33, "length over 4 GiB", outside);
  refused(entry(19, 1), get<uint64_t>(good, entry(19, 1)) + 4096, "length into the index", outside);
  refused(entry(3, 1), uint64_t{0}, "length 0", outside);
  refused(entry(5, 3), uint64_t{1} << 50, "first box beyond the table", outside);
  refused(entry(5, 4), ~uint64_t{0}, "box count 2^64 - 1", outside);
  refused(entry(5, 5), uint64_t{1} << 50, "name beyond the names", outside);
  refused(entry(5, 6), ~uint64_t{0}, "name length 2^64 - 1", outside);
  refused(entry(5, 2), int64_t{4}, "a label in a detection file", outside);
  // A box value that is not finite (the writer refuses those): the boxes table follows the index.
  const size_t boxes_at = f.index_at + 56 * 20;
  refused(boxes_at + 4, std::numeric_limits<float>::quiet_NaN(), "a NaN cx", "not finite");
  refused(boxes_at + 5 * 4 * 7 + 12, std::numeric_limits<float>::infinity(), "an infinite w", "not finite");
  // The last record one 8-byte step shorter: the index no longer covers the payload.
  auto b = good;
  const auto len = get<uint64_t>(b, entry(19, 1));
  set(b, entry(19, 1), len > 8 ? len - 8 : len + 8);
  write_bytes(bad, resealed(b, f));
  CHECK_THROWS_WITH_AS(PackedFile::open(bad), doctest::Contains("index"), nitro::Error);
}

// ---- nitro_pack --images / --yolo ------------------------------------------------------------------

namespace {

std::string nitro_pack_path() {
#ifdef NITRO_PACK_PATH
  return NITRO_PACK_PATH;
#else
  // tests/CMakeLists.txt does not say where it is: next to the tests' folder (bench/nitro_pack).
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / "bench" / "nitro_pack")
      .string();
#endif
}

// Runs nitro_pack with `args`: its exit code and what it printed.
std::pair<int, std::string> nitro_pack(const std::vector<std::string>& args, const std::filesystem::path& log) {
  const auto exe = nitro_pack_path();
  REQUIRE_MESSAGE(std::filesystem::exists(exe), "nitro_pack is not built at ", exe, " (build the nitro_pack target)");
  std::vector<std::string> argv{exe};
  argv.insert(argv.end(), args.begin(), args.end());
  std::filesystem::remove(log);
  const int rc = nitro::test::wait_child(nitro::test::spawn_program(argv, log.string()));
  std::ifstream in(log);
  return {rc, std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>())};
}

}  // namespace

TEST_CASE("nitro_pack --images (pack): torchvision's ImageFolder order and labels, bytes unchanged or resized") {
  nitro::test::TempDir dir("nitro-pak", true);
  const auto root = dir.path / "tree";
  std::map<std::string, Bytes> files;
  const auto add = [&](const std::string& rel, Bytes b) {
    write_bytes(root / rel, b);
    files[rel] = std::move(b);
  };
  // Class "dog" sorts after "cat"; within a class, folders by path ("s-t" before "s/u": '-' < '/'),
  // files by name ("10" before "2"); extensions in any case; other files skipped.
  add("dog/2.jpg", jpeg(90, 120, 1));
  add("dog/10.JPG", jpeg(40, 30, 2));
  add("dog/s/u/deep.jpeg", jpeg(100, 50, 3));
  add("dog/s-t/side.jpg", jpeg(64, 64, 4));
  add("dog/s/a.png", png(picture(70, 35, 5)));
  add("cat/b.jpg", jpeg(33, 47, 6));
  add("cat/a.jpg", jpeg(80, 100, 7));
  write_text(root / "dog" / "notes.txt", "not an image\n");
  write_text(root / "cat" / "s" / "labels.csv", "a,b\n");
  // What torchvision 0.26 gives for this tree (ImageFolder(root).samples, run once by hand).
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"cat/a.jpg", 0}, {"cat/b.jpg", 0},       {"dog/10.JPG", 1},        {"dog/2.jpg", 1},
      {"dog/s/a.png", 1}, {"dog/s-t/side.jpg", 1}, {"dog/s/u/deep.jpeg", 1}};
  const auto out = dir / "tree.npak", log = dir / "pack.log";
  auto [rc, text] = nitro_pack({"--images", root.string(), "--out", out.string(), "--chunk", "3"}, log);
  REQUIRE_MESSAGE(rc == 0, text);
  CHECK(text.find("7 images in 2 classes") != std::string::npos);
  auto file = PackedFile::open(out, {.verify = PackedFile::Verify::eager});
  REQUIRE(file->size() == 7);
  uint64_t bytes = 0;
  for (int64_t i = 0; i < 7; ++i) {
    const auto& [name, label] = expected[static_cast<size_t>(i)];
    CHECK(file->name(i) == name);
    CHECK(file->label(i) == label);
    CHECK(same(file->encoded(i), files[name]));
    bytes += files[name].size();
  }
  CHECK(text.find(std::to_string(bytes) + " bytes in, " + std::to_string(bytes) + " bytes out") != std::string::npos);

  // --resize 64 --quality 80: JPEGs whose longer side is 64 (smaller images keep their size), close to
  // the original resized with antialiasing.
  const auto small = dir / "small.npak";
  std::tie(rc, text) = nitro_pack(
      {"--images", root.string(), "--out", small.string(), "--resize", "64", "--quality", "80"}, log);
  REQUIRE_MESSAGE(rc == 0, text);
  auto resized = PackedFile::open(small);
  REQUIRE(resized->size() == 7);
  const std::map<std::string, std::vector<int64_t>> shapes = {
      {"cat/a.jpg", {3, 51, 64}},  {"cat/b.jpg", {3, 33, 47}},  {"dog/10.JPG", {3, 40, 30}}, {"dog/2.jpg", {3, 48, 64}},
      {"dog/s/a.png", {3, 64, 32}}, {"dog/s-t/side.jpg", {3, 64, 64}}, {"dog/s/u/deep.jpeg", {3, 64, 32}}};
  for (int64_t i = 0; i < 7; ++i) {
    const auto name = resized->name(i);
    CAPTURE(name);
    CHECK(name == expected[static_cast<size_t>(i)].first);
    CHECK(resized->label(i) == expected[static_cast<size_t>(i)].second);
    CHECK(img::sniff(resized->encoded(i)) == img::Format::jpeg);
    const auto x = img::decode(resized->encoded(i));
    CHECK(x.sizes().vec() == shapes.at(name));
    const auto original = img::decode(files[name]).unsqueeze(0).to(at::kFloat);
    const auto want = at::_upsample_bilinear2d_aa(original, {x.size(1), x.size(2)}, false).squeeze(0);
    CHECK((x.to(at::kFloat) - want).abs().mean().item<double>() < 4.0);
  }

  // What it refuses: a file with an image extension that is not JPEG or PNG, a class without images.
  write_text(root / "cat" / "fake.bmp", "BM not really");
  std::tie(rc, text) = nitro_pack({"--images", root.string(), "--out", out.string()}, log);
  CHECK(rc != 0);
  CHECK(text.find("fake.bmp: not a JPEG or PNG file") != std::string::npos);
  std::filesystem::remove(root / "cat" / "fake.bmp");
  std::filesystem::create_directories(root / "empty");
  std::tie(rc, text) = nitro_pack({"--images", root.string(), "--out", out.string()}, log);
  CHECK(rc != 0);
  CHECK(text.find("for the classes empty") != std::string::npos);
  // The failed runs left the earlier file as it was.
  CHECK(PackedFile::open(out, {.verify = PackedFile::Verify::eager})->size() == 7);
}

TEST_CASE("nitro_pack --yolo (pack): boxes from the label files, none for a missing one, file:line for a bad line") {
  nitro::test::TempDir dir("nitro-pak", true);
  const auto root = dir.path / "yolo";
  const auto a = jpeg(60, 80, 1), b = png(picture(30, 20, 2)), c = jpeg(40, 40, 3);
  write_bytes(root / "images" / "train" / "a.jpg", a);
  write_bytes(root / "images" / "train" / "b.png", b);
  write_bytes(root / "images" / "val" / "c.jpg", c);
  write_text(root / "labels" / "train" / "a.txt", "0 0.5 0.5 0.25 0.125\n\n  3 0.1 0.2 0.3 0.4  \n");
  write_text(root / "labels" / "val" / "c.txt", "1 0.5 0.5 0.5 0.5\n2 0.5 0.5 1.5 0.5\n");
  const auto out = dir / "yolo.npak", log = dir / "pack.log";
  auto [rc, text] = nitro_pack({"--yolo", root.string(), "--out", out.string()}, log);
  CHECK(rc != 0);
  CHECK(text.find("c.txt:2: 1.5 is outside [0, 1]") != std::string::npos);
  write_text(root / "labels" / "val" / "c.txt", "1 0.5 0.5 0.5\n");
  std::tie(rc, text) = nitro_pack({"--yolo", root.string(), "--out", out.string()}, log);
  CHECK(text.find("c.txt:1:") != std::string::npos);
  write_text(root / "labels" / "val" / "c.txt", "1 0.5 0.5 0.5 0.5\n");
  for (const bool resize : {false, true}) {
    CAPTURE(resize);
    std::vector<std::string> args{"--yolo", root.string(), "--out", out.string()};
    if (resize) args.insert(args.end(), {"--resize", "32"});
    std::tie(rc, text) = nitro_pack(args, log);
    REQUIRE_MESSAGE(rc == 0, text);
    auto file = PackedFile::open(out, {.verify = PackedFile::Verify::eager});
    REQUIRE(file->size() == 3);
    CHECK(file->kind() == PackedKind::detection);
    CHECK(file->name(0) == "train/a.jpg");
    CHECK(file->name(1) == "train/b.png");
    CHECK(file->name(2) == "val/c.jpg");
    CHECK(torch::equal(file->boxes(0), torch::tensor({0.f, 0.5f, 0.5f, 0.25f, 0.125f, 3.f, 0.1f, 0.2f, 0.3f, 0.4f})
                                           .view({2, 5})));
    CHECK(file->boxes(1).sizes() == c10::IntArrayRef{0, 5});
    CHECK(torch::equal(file->boxes(2), torch::tensor({1.f, 0.5f, 0.5f, 0.5f, 0.5f}).view({1, 5})));
    if (!resize) {
      CHECK(same(file->encoded(0), a));
      CHECK(same(file->encoded(1), b));
      CHECK(same(file->encoded(2), c));
    } else {
      CHECK(img::decode(file->encoded(0)).sizes() == c10::IntArrayRef{3, 24, 32});
      CHECK(img::decode(file->encoded(1)).sizes() == c10::IntArrayRef{3, 30, 20});
      CHECK(img::decode(file->encoded(2)).sizes() == c10::IntArrayRef{3, 32, 32});
    }
  }
}

}  // namespace nitro_test_image_packed
