// libFuzzer target over the packed-image reader (data/packed.hpp): any bytes, as a file, through
// PackedFile::open (header, footer, sizes, every index entry) and every record it then offers
// (encoded bytes, label, boxes, name). A damaged input must end in nitro::Error; anything else (a
// crash, a sanitizer report, a leak, another exception) is a finding, and so is a record whose bytes
// are not the file's bytes where the format puts them (records back to back from byte 4096).
//
// The reader checks XXH64s (header, tables, footer, chunks) that a mutated input would almost never
// match, so before writing the input the harness puts the checksums that the reader computes where
// the reader looks for them, as far as the bytes locate them (a crafted file has right checksums
// too): the damage then reaches the structure checks. Two bytes of the header's reserved part, which
// the reader ignores (it only hashes them), choose the rest:
//   byte 4000  mod 3: Verify::lazy, eager or none
//   byte 4001  bit 0: leave the checksums as they are (the mismatch paths)
// The seeds in corpus/packed_reader/ are files that PackedWriter wrote (--make-corpus, below).
//
// With --make-corpus DIR (a plain build with -DNITRO_FUZZ_MAKE_CORPUS, no fuzzer, -lturbojpeg -ljpeg -lpng)
// it writes that corpus.
#include <nitro/data/packed.hpp>

#include "input_file.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

namespace pak = nitro::data::detail::pak;
using nitro::data::PackedFile;
using nitro::data::PackedKind;
using nitro::data::PackedVerify;

[[noreturn]] void finding(const char* what) { nitro_fuzz::finding("packed_reader", what); }

std::uint64_t u64(const std::vector<unsigned char>& b, std::uint64_t at) { return pak::get<std::uint64_t>(b.data() + at); }
void put64(std::vector<unsigned char>& b, std::uint64_t at, std::uint64_t v) { pak::put<std::uint64_t>(b.data() + at, v); }
std::uint64_t hash_of(const std::vector<unsigned char>& b, std::uint64_t at, std::uint64_t n) {
  return pak::hash(b.data() + at, static_cast<std::size_t>(n));
}

// The checksums the reader compares, put where it reads them (chunks, tables, footer, header: each
// hash covers the ones before it in this order).
void fix_checksums(std::vector<unsigned char>& b) {
  const std::uint64_t size = b.size();
  if (size < pak::kHeaderBytes + pak::kFooterTail) return;
  const std::uint64_t tail = size - pak::kFooterTail;
  const auto index_at = u64(b, tail), count = u64(b, tail + 8), chunks = u64(b, tail + 16);
  const std::uint64_t body = size - pak::kHeaderBytes - pak::kFooterTail;
  if (chunks <= body / 8) {
    const std::uint64_t footer_at = tail - chunks * 8;
    const auto per_chunk = u64(b, 24);
    if (index_at >= pak::kHeaderBytes && index_at <= footer_at) {
      // Each chunk: from its first record's offset to the end of its last one's padded bytes.
      if (per_chunk >= 1 && count <= (footer_at - index_at) / pak::kEntryBytes) {
        for (std::uint64_t c = 0; count > 0 && c < chunks && c <= (count - 1) / per_chunk; ++c) {
          const std::uint64_t first = c * per_chunk;
          const std::uint64_t last = (count - first > per_chunk ? first + per_chunk : count) - 1;
          const auto from = u64(b, index_at + first * pak::kEntryBytes);
          const auto last_at = u64(b, index_at + last * pak::kEntryBytes);
          const auto last_len = u64(b, index_at + last * pak::kEntryBytes + 8);
          if (from <= size && last_at <= size && last_len <= size && last_at + pak::padded(last_len) <= size &&
              from <= last_at + pak::padded(last_len))
            put64(b, footer_at + 8 * c, hash_of(b, from, last_at + pak::padded(last_len) - from));
        }
      }
      put64(b, tail + 40, hash_of(b, index_at, footer_at - index_at));
    }
    put64(b, size - 16, hash_of(b, footer_at, size - footer_at - 16));
  }
  put64(b, pak::kHeaderBytes - 8, hash_of(b, 0, pak::kHeaderBytes - 8));
}

// Opens the file as the reader and reads everything it offers, checking it against the bytes `b`.
void read_all(const std::vector<unsigned char>& b, PackedVerify verify) {
  std::shared_ptr<PackedFile> file;
  try {
    file = PackedFile::open(nitro_fuzz::memory_file_path(), {.verify = verify});
  } catch (const nitro::Error&) {
    return;  // a refused file: what damaged input must give
  }
  const nitro::data::PackedImages images(file);
  // What the reader returns must be the file's bytes where the index (now checked) puts them.
  const std::uint64_t tail = b.size() - pak::kFooterTail;
  const auto index_at = u64(b, tail), count = u64(b, tail + 8), rows = u64(b, tail + 24);
  if (count != static_cast<std::uint64_t>(images.size())) finding("a record count other than the footer's");
  const std::uint64_t boxes_at = index_at + pak::padded(count * pak::kEntryBytes);
  const std::uint64_t names_at = boxes_at + pak::padded(rows * pak::kBoxBytes);
  for (std::int64_t i = 0; i < images.size(); ++i) {
    const std::uint64_t entry = index_at + static_cast<std::uint64_t>(i) * pak::kEntryBytes;
    const auto offset = u64(b, entry), length = u64(b, entry + 8), box_first = u64(b, entry + 24),
               box_count = u64(b, entry + 32), name_offset = u64(b, entry + 40), name_length = u64(b, entry + 48);
    if (offset > b.size() || length > b.size() - offset) finding("an index entry outside the file was accepted");
    try {
      const auto bytes = images.encoded(i);
      if (bytes.size() != length || std::memcmp(bytes.data(), b.data() + offset, bytes.size()) != 0)
        finding("a record's bytes are not the file's bytes at its place");
    } catch (const nitro::Error&) {
      // a chunk whose checksum does not match (lazy): its records are refused, the others still read
    }
    const auto name = images.name(i);
    if (names_at > b.size() || name_offset > b.size() - names_at || name_length > b.size() - names_at - name_offset ||
        name != std::string(reinterpret_cast<const char*>(b.data() + names_at + name_offset), name_length))
      finding("a record's name is not the file's bytes at its place");
    const auto label = images.label(i);
    if (label != pak::get<std::int64_t>(b.data() + entry + 16)) finding("a label other than the index's");
    if (images.kind() == PackedKind::detection) {
      if (label != -1) finding("a detection record with a label");
      const auto boxes = images.boxes(i);
      if (boxes.dim() != 2 || boxes.size(0) != static_cast<std::int64_t>(box_count) || boxes.size(1) != 5 ||
          boxes.scalar_type() != at::kFloat || !boxes.is_contiguous())
        finding("boxes not a float [n, 5] tensor of the index's rows");
      if (box_count > 0 && std::memcmp(boxes.data_ptr<float>(), b.data() + boxes_at + box_first * pak::kBoxBytes,
                                       box_count * pak::kBoxBytes) != 0)
        finding("boxes other than the file's rows at their place");
      for (std::uint64_t k = 0; k < box_count * 5; ++k)
        if (!std::isfinite(boxes.data_ptr<float>()[k])) finding("a box value that is not finite");
    } else {
      try {
        (void)images.boxes(i);
        finding("boxes of a classification record");
      } catch (const nitro::Error&) {
      }
    }
  }
  try {
    (void)images.label(images.size());
    finding("a record past the end");
  } catch (const nitro::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return nitro_fuzz::read_input<PackedVerify>(data, size, pak::kHeaderBytes, "packed_reader", fix_checksums, read_all);
}

#ifdef NITRO_FUZZ_MAKE_CORPUS
#include <nitro/data/image.hpp>

#include <ATen/ATen.h>

#include <filesystem>

int main(int argc, char** argv) {
  const auto corpus = nitro_fuzz::corpus_dir(argc, argv);
  if (!corpus) return 2;
  const std::filesystem::path dir = *corpus;
  using nitro::data::PackedWriter;
  // Small real images: JPEG bytes of 8 x 8 and 5 x 3 pictures (their content does not matter here).
  const auto picture = [](std::int64_t h, std::int64_t w, std::int64_t k) {
    return ((at::arange(3 * h * w, at::kInt) * (7 + k)) % 251).to(at::kByte).reshape({3, h, w});
  };
  const auto j1 = nitro::image::encode_jpeg(picture(8, 8, 0), {.quality = 50});
  const auto j2 = nitro::image::encode_jpeg(picture(5, 3, 1), {.quality = 90, .subsampling = nitro::image::Subsampling::s444});
  const auto j3 = nitro::image::encode_jpeg(picture(8, 8, 2), {.quality = 30});
  {
    PackedWriter w(dir / "cls-3.npak", {.chunk_records = 2, .kind = PackedKind::classification, .fsync = false});
    w.write(j1, 0, "cat/0001.jpg");
    w.write(j2, 7, "dog/0002.jpg");
    w.write(j3, 2, "cat/0003.jpg");
    w.close();
  }
  {
    PackedWriter w(dir / "cls-1.npak", {.kind = PackedKind::classification, .fsync = false});
    w.write(j2, 123456789, "");
    w.close();
  }
  {
    PackedWriter w(dir / "cls-0.npak", {.kind = PackedKind::classification, .fsync = false});
    w.close();
  }
  {
    PackedWriter w(dir / "det-3.npak", {.chunk_records = 1, .kind = PackedKind::detection, .fsync = false});
    w.write(j1, at::tensor({0.f, 0.5f, 0.5f, 0.25f, 0.25f, 3.f, 0.1f, 0.2f, 0.05f, 0.1f}).reshape({2, 5}), "a.jpg");
    w.write(j2, at::empty({0, 5}, at::kFloat), "b.jpg");
    w.write(j3, at::tensor({1.f, 0.9f, 0.9f, 0.2f, 0.2f, 2.f, 0.3f, 0.3f, 0.6f, 0.6f, 0.f, 0.f, 0.f, 1.f, 1.f}).reshape({3, 5}),
            "images/train/c.jpg");
    w.close();
  }
  {
    // Records of 1 to 20 bytes (any bytes: the reader does not decode them), 4 a chunk: every padding.
    PackedWriter w(dir / "det-20-small.npak", {.chunk_records = 4, .kind = PackedKind::detection, .fsync = false});
    for (int i = 1; i <= 20; ++i) {
      std::vector<std::uint8_t> bytes(static_cast<std::size_t>(i));
      for (int k = 0; k < i; ++k) bytes[static_cast<std::size_t>(k)] = static_cast<std::uint8_t>(i * 16 + k);
      w.write(bytes, at::full({i % 3, 5}, 0.125f * static_cast<float>(i % 8)), std::string(static_cast<std::size_t>(i % 5), 'n'));
    }
    w.close();
  }
  return 0;
}
#endif
