#include <nitro/data/prefetcher.hpp>
#include <nitro/data/record_file.hpp>
#include <nitro/data/synthetic.hpp>

#include "testing.hpp"

#include <fstream>

namespace nitro_test_data_record_file {  // one namespace per file: an area is compiled as one translation unit

namespace {

using nitro::data::RecordField;
using nitro::data::RecordFile;
using nitro::data::RecordWriter;

std::vector<RecordField> image_fields() { return {{"image", at::kByte, {3, 8, 8}}, {"label", at::kLong, {}}}; }

// n SyntheticImages samples as uint8 images and labels, written with `chunk` records per chunk.
std::pair<at::Tensor, at::Tensor> write_images(const std::filesystem::path& path, int64_t n, int64_t chunk) {
  nitro::data::SyntheticImages set({.size = n, .height = 8, .width = 8, .noise = 1.0, .seed = 3});
  auto [x, y] = set.stacked(0, n);
  const auto u8 = (x * 40 + 128).clamp(0, 255).to(at::kByte);
  RecordWriter w(path, image_fields(), {.chunk_records = chunk, .fsync = false});
  for (int64_t i = 0; i < n; ++i) w.write({u8[i], y[i]});
  CHECK(w.count() == n);
  w.close();
  return {u8, y};
}

std::vector<char> bytes_of(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::filesystem::path& p, const std::vector<char>& b, size_t n) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(b.data(), static_cast<std::streamsize>(n));
}

}  // namespace

TEST_CASE("RecordFile: records come back as written, as views inside the mapping") {
  nitro::test::TempDir dir("nitro-rec", true);
  const auto path = dir / "train.nrec";
  auto [images, labels] = write_images(path, 300, 64);
  auto file = RecordFile::open(path);
  REQUIRE(file->size() == 300);
  REQUIRE(file->fields().size() == 2);
  CHECK(file->fields()[0].name == "image");
  CHECK(file->fields()[0].dtype == at::kByte);
  CHECK(file->fields()[1].shape.empty());
  const auto map = file->mapping();
  for (int64_t i = 0; i < 300; ++i) {
    auto r = file->record(i);
    CHECK(torch::equal(r[0], images[i]));
    CHECK(r[1].item<int64_t>() == labels[i].item<int64_t>());
    // Zero copy: the tensor's data lies inside the mapping.
    const auto* p = static_cast<const std::byte*>(r[0].data_ptr());
    CHECK(p >= map.data());
    CHECK(p + r[0].nbytes() <= map.data() + map.size());
  }
  // A view keeps the mapping alive after the file object is gone; writing into it changes only this
  // process's copy.
  auto view = file->record(5)[0];
  file.reset();
  view.fill_(7);
  CHECK(view.sum().item<int64_t>() == 7 * 3 * 8 * 8);
  auto again = RecordFile::open(path);
  CHECK(torch::equal(again->record(5)[0], images[5]));
  // read_into: straight into a caller's (e.g. pinned staging) tensors.
  auto img = torch::empty({3, 8, 8}, at::kByte), lab = torch::empty({}, at::kLong);
  again->read_into(17, {img, lab});
  CHECK(torch::equal(img, images[17]));
  CHECK(lab.item<int64_t>() == labels[17].item<int64_t>());
  CHECK_THROWS_WITH_AS(again->read_into(17, {torch::empty({3, 8, 8}), lab}), doctest::Contains("destination 0"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(again->record(300), doctest::Contains("out of range"), nitro::Error);
}

TEST_CASE("RecordFile: an empty field reads back, a refused file leaves no mapping, an overflowing shape is refused") {
  nitro::test::TempDir dir("nitro-rec", true);
  const auto path = dir / "empty.nrec";
  {
    RecordWriter w(path, {{"none", at::kFloat, {0, 4}}, {"label", at::kLong, {}}}, {.fsync = false});
    for (int64_t i = 0; i < 3; ++i) w.write({torch::empty({0, 4}), torch::tensor(i)});
    w.close();
  }
  {
    auto file = RecordFile::open(path, {.verify = RecordFile::Verify::eager});
    auto none = torch::empty({0, 4}), label = torch::empty({}, at::kLong);
    file->read_into(2, {none, label});
    CHECK(label.item<int64_t>() == 2);
    CHECK(file->record(1)[0].sizes() == at::IntArrayRef{0, 4});
  }
  // Format version 2 is refused after the file was mapped: the mapping goes with the refusal.
  auto b = bytes_of(path);
  b[8] = 2;
  write_bytes(path, b, b.size());
  for (int i = 0; i < 3; ++i) CHECK_THROWS_AS(RecordFile::open(path), nitro::Error);
  CHECK(nitro::test::mappings_of(path) == 0);
  // No bytes, but non-zero dimensions whose product is past 2^48 bytes (strides that overflow LibTorch's
  // offsets).
  CHECK_THROWS_WITH_AS(RecordWriter(dir / "huge.nrec", {{"x", at::kByte, {0, int64_t{1} << 62, 0}}}),
                       doctest::Contains("multiply to more than 2^48 bytes"), nitro::Error);
}

TEST_CASE("RecordDataset through make_data_loader with 2 workers reads every record") {
  nitro::test::TempDir dir("nitro-rec", true);
  const auto path = dir / "train.nrec";
  auto [images, labels] = write_images(path, 200, 50);
  nitro::data::RecordDataset set(RecordFile::open(path));
  auto loader = torch::data::make_data_loader(set.map(torch::data::transforms::Stack<>()),
                                              torch::data::DataLoaderOptions().batch_size(32).workers(2));
  int64_t seen = 0, label_sum = 0, pixel_sum = 0;
  for (auto& b : *loader) {
    seen += b.data.size(0);
    label_sum += b.target.sum().item<int64_t>();
    pixel_sum += b.data.to(at::kLong).sum().item<int64_t>();
  }
  CHECK(seen == 200);
  CHECK(label_sum == labels.sum().item<int64_t>());
  CHECK(pixel_sum == images.to(at::kLong).sum().item<int64_t>());
}

TEST_CASE("RecordFile: a truncated, foreign or damaged file is a nitro::Error that says which") {
  nitro::test::TempDir dir("nitro-rec", true);
  const auto path = dir / "train.nrec";
  write_images(path, 100, 16);
  const auto good = bytes_of(path);
  const auto cut = dir / "cut.nrec";
  for (size_t n : {size_t{0}, size_t{100}, size_t{4096}, size_t{5000}, good.size() / 2, good.size() - 1}) {
    CAPTURE(n);
    write_bytes(cut, good, n);
    CHECK_THROWS_AS(RecordFile::open(cut), nitro::Error);
  }
  write_bytes(cut, good, good.size() - 1);
  CHECK_THROWS_WITH_AS(RecordFile::open(cut), doctest::Contains("truncated"), nitro::Error);
  // Records cut out, the footer kept: the sizes do not add up.
  std::vector<char> short_file(good.begin(), good.begin() + 4096);
  short_file.insert(short_file.end(), good.end() - 8 * 7 - 32, good.end());
  write_bytes(cut, short_file, short_file.size());
  CHECK_THROWS_WITH_AS(RecordFile::open(cut), doctest::Contains("do not account for"), nitro::Error);
  // Not a record file at all.
  const auto foreign = dir / "weights.pt";
  torch::save(torch::randn({2000}), foreign.string());
  CHECK_THROWS_WITH_AS(RecordFile::open(foreign), doctest::Contains("not a Nitro record file"), nitro::Error);
  CHECK_THROWS_WITH_AS(RecordFile::open(dir / "missing.nrec"), doctest::Contains("cannot open"), nitro::Error);
  // One byte of record 40 (chunk 2) changed: found when that chunk is first read, or at open if eager.
  auto damaged = good;
  damaged[4096 + 40 * 200 + 3] ^= 1;
  write_bytes(cut, damaged, damaged.size());
  auto lazy = RecordFile::open(cut);
  CHECK(lazy->record(10)[1].defined());  // chunk 0 is fine
  CHECK_THROWS_WITH_AS(lazy->record(40), doctest::Contains("chunk 2 (records 32 to 47)"), nitro::Error);
  CHECK_THROWS_WITH_AS(lazy->verify(), doctest::Contains("chunk 2"), nitro::Error);
  CHECK_THROWS_WITH_AS(RecordFile::open(cut, {.verify = RecordFile::Verify::eager}), doctest::Contains("chunk 2"),
                       nitro::Error);
  auto unchecked = RecordFile::open(cut, {.verify = RecordFile::Verify::none});
  CHECK(unchecked->record(40)[0].defined());
  // A damaged header.
  damaged = good;
  damaged[50] ^= 1;
  write_bytes(cut, damaged, damaged.size());
  CHECK_THROWS_WITH_AS(RecordFile::open(cut), doctest::Contains("header's checksum"), nitro::Error);
}

TEST_CASE("RecordWriter: a record unlike the fields is refused, and an unclosed writer leaves no file") {
  nitro::test::TempDir dir("nitro-rec", true);
  const auto path = dir / "x.nrec";
  {
    RecordWriter w(path, image_fields(), {.fsync = false});
    CHECK_THROWS_WITH_AS(w.write({torch::zeros({3, 8, 9}, at::kByte), torch::tensor(1)}),
                         doctest::Contains("field 'image'"), nitro::Error);
    CHECK_THROWS_WITH_AS(w.write({torch::zeros({3, 8, 8}, at::kByte)}), doctest::Contains("2 fields"), nitro::Error);
    w.write({torch::zeros({3, 8, 8}, at::kByte), torch::tensor(1)});
  }
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK_THROWS_WITH_AS(RecordWriter(path, {}), doctest::Contains("1 to 16 fields"), nitro::Error);
  CHECK_THROWS_WITH_AS(RecordWriter(path, {{"", at::kByte, {1}}}), doctest::Contains("field name"), nitro::Error);
  CHECK_THROWS_WITH_AS(RecordWriter(path, {{"a", at::kByte, {1}}}, {.chunk_records = 0}),
                       doctest::Contains("chunk_records"), nitro::Error);
  // An empty file (no records) is valid.
  RecordWriter empty(path, image_fields(), {.fsync = false});
  empty.close();
  CHECK(RecordFile::open(path)->size() == 0);
}

namespace {

// Rewrites a header field of `good` and its checksum, as a crafted file would.
std::vector<char> crafted(std::vector<char> b, size_t at, const void* value, size_t n) {
  std::memcpy(b.data() + at, value, n);
  const auto h = nitro::io::xxh64(std::span<const std::byte>(reinterpret_cast<const std::byte*>(b.data()), 4088));
  std::memcpy(b.data() + 4088, &h, 8);
  return b;
}

}  // namespace

TEST_CASE("RecordFile: a crafted header with valid checksums is refused before any record is mapped") {
  nitro::test::TempDir dir("nitro-rec", true);
  const auto path = dir / "train.nrec";
  write_images(path, 20, 8);
  const auto good = bytes_of(path);
  const auto bad = dir / "bad.nrec";
  const auto refused = [&](size_t at, auto value, const char* what) {
    CAPTURE(what);
    const auto b = crafted(good, at, &value, sizeof value);
    write_bytes(bad, b, b.size());
    CHECK_THROWS_WITH_AS(RecordFile::open(bad), doctest::Contains("header is inconsistent"), nitro::Error);
  };
  // Field 0 starts at byte 40: name (32), dtype (4), ndim (4), offset (8), shape (8 x 8).
  refused(40 + 40, uint64_t{1} << 40, "offset far outside the record");
  refused(40 + 48, int64_t{1} << 24, "a dimension larger than the record");
  refused(40 + 32, int32_t{1000}, "a dtype that does not exist");
  refused(40 + 32, static_cast<int32_t>(c10::ScalarType::QInt8), "a quantized dtype");
  refused(40 + 48, int64_t{-1}, "a negative dimension");
  refused(40 + 36, int32_t{9}, "nine dimensions");
  refused(16, uint64_t{1} << 63, "a record size that wraps the size check");
  refused(24, ~uint64_t{0}, "records per chunk that wrap the chunk count");
  refused(32, uint32_t{0}, "no field");
  // The footer's count crafted (with its checksum) to wrap count x record size.
  auto b = good;
  const size_t tail = b.size() - 32;
  const uint64_t huge = uint64_t{1} << 61;
  std::memcpy(b.data() + tail, &huge, 8);
  std::memcpy(b.data() + tail + 8, &huge, 8);
  write_bytes(bad, b, b.size());
  CHECK_THROWS_WITH_AS(RecordFile::open(bad), doctest::Contains("do not account for"), nitro::Error);
}

TEST_CASE("RecordFile: writing into a view neither changes the file nor fails verification") {
  nitro::test::TempDir dir("nitro-rec", true);
  const auto path = dir / "train.nrec";
  auto [images, labels] = write_images(path, 40, 8);
  auto file = RecordFile::open(path, {.verify = RecordFile::Verify::none});
  file->record(3)[0].fill_(0);
  CHECK_NOTHROW(file->verify());
  CHECK(torch::equal(RecordFile::open(path)->record(3)[0], images[3]));
  // What the writer refuses: unstorable dtypes, floats into integer fields.
  CHECK_THROWS_WITH_AS(RecordWriter(dir / "q.nrec", {{"a", at::kQInt8, {1}}}), doctest::Contains("not storable"),
                       nitro::Error);
  RecordWriter w(dir / "w.nrec", image_fields(), {.fsync = false});
  CHECK_THROWS_WITH_AS(w.write({torch::rand({3, 8, 8}), torch::tensor(1)}), doctest::Contains("convert it yourself"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(RecordWriter(dir / "big.nrec", {{"a", at::kByte, {3, int64_t{1} << 62}}}),
                       doctest::Contains("more than 4 GiB"), nitro::Error);
}

TEST_CASE("RecordBatches: records copied into one batch with their indices, through a prefetcher") {
  nitro::test::TempDir dir("nitro-rec", true);
  const auto path = dir / "train.nrec";
  auto [images, labels] = write_images(path, 50, 16);
  nitro::data::RecordBatches batches(RecordFile::open(path));
  CHECK(batches.size() == std::optional<size_t>(50));
  const auto b = batches.get_batch({7, 3, 49, 3});
  CHECK(b.data.sizes() == c10::IntArrayRef{4, 3, 8, 8});
  CHECK(b.data.is_contiguous());
  CHECK(torch::equal(b.data, images.index({torch::tensor({7, 3, 49, 3})})));
  CHECK(torch::equal(b.target, labels.index({torch::tensor({7, 3, 49, 3})})));
  CHECK(torch::equal(b.index, torch::tensor({7, 3, 49, 3}, at::kLong)));
  CHECK_THROWS_AS(batches.get_batch({50}), nitro::Error);
  // A batch source for a prefetcher: every index once.
  auto p = nitro::prefetch<nitro::Cpu>(
      nitro::from_dataset(batches, torch::data::samplers::SequentialSampler(50), 16), {.workers = 2});
  std::vector<int64_t> seen;
  while (auto batch = p.next()) {
    CHECK(torch::equal(batch->data, images.index({batch->index})));
    for (int64_t k = 0; k < batch->index.numel(); ++k) seen.push_back(batch->index[k].item<int64_t>());
  }
  CHECK(seen.size() == 50);
  for (int64_t i = 0; i < 50; ++i) CHECK(seen[static_cast<size_t>(i)] == i);
}

}  // namespace nitro_test_data_record_file
