// libFuzzer target over the record-file reader (data/record_file.hpp): any bytes, as a file, through
// RecordFile::open (header, fields, footer, sizes) and every record it then offers: record(i)'s views
// of the mapping, read_into(i) into tensors of the fields' shapes, RecordDataset::get and
// RecordBatches::get_batch over all records. A damaged input must end in nitro::Error; anything else
// (a crash, a sanitizer report, a leak, another exception) is a finding, and so is a view that is not
// inside its record in the mapping, or bytes other than the file's.
//
// The reader checks XXH64s (header, footer, chunks) that a mutated input would almost never match,
// so before writing the input the harness puts the checksums that the reader computes where the
// reader looks for them, as far as the bytes locate them (a crafted file has right checksums too):
// the damage then reaches the structure checks. Two bytes of the header's unused part, which the
// reader ignores (it only hashes them), choose the rest:
//   byte 4000  mod 3: Verify::lazy, eager or none
//   byte 4001  bit 0: leave the checksums as they are (the mismatch paths)
// The seeds in corpus/record_reader/ are files that RecordWriter wrote (--make-corpus, below).
//
// With --make-corpus DIR (a plain build with -DNITRO_FUZZ_MAKE_CORPUS, no fuzzer) it writes that corpus.
#include <nitro/data/record_file.hpp>

#include <ATen/ops/empty.h>

#include "input_file.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

namespace rec = nitro::data::detail::rec;
using nitro::data::RecordFile;
using nitro::data::RecordVerify;

[[noreturn]] void finding(const char* what) { nitro_fuzz::finding("record_reader", what); }

std::uint64_t u64(const std::vector<unsigned char>& b, std::uint64_t at) { return rec::get<std::uint64_t>(b.data() + at); }
void put64(std::vector<unsigned char>& b, std::uint64_t at, std::uint64_t v) { rec::put<std::uint64_t>(b, at, v); }
std::uint64_t hash_of(const std::vector<unsigned char>& b, std::uint64_t at, std::uint64_t n) {
  return rec::hash(b.data() + at, static_cast<std::size_t>(n));
}

// The checksums the reader compares, put where it reads them (chunks, footer, header).
void fix_checksums(std::vector<unsigned char>& b) {
  const std::uint64_t size = b.size();
  if (size < rec::kHeaderBytes + rec::kFooterTail) return;
  const auto record_bytes = u64(b, 16), per_chunk = u64(b, 24);
  const auto count = u64(b, size - 32), chunks = u64(b, size - 24);
  const std::uint64_t payload = size - rec::kHeaderBytes - rec::kFooterTail;
  if (chunks <= payload / 8) {
    const std::uint64_t footer = chunks * 8 + rec::kFooterTail;
    const std::uint64_t footer_at = size - footer;
    if (record_bytes >= 1 && per_chunk >= 1 && count <= (payload - chunks * 8) / record_bytes) {
      for (std::uint64_t c = 0; count > 0 && c < chunks && c <= (count - 1) / per_chunk; ++c) {
        const std::uint64_t first = c * per_chunk;
        const std::uint64_t n = count - first > per_chunk ? per_chunk : count - first;
        put64(b, footer_at + 8 * c, hash_of(b, rec::kHeaderBytes + first * record_bytes, n * record_bytes));
      }
    }
    put64(b, size - 16, hash_of(b, footer_at, footer - 16));
  }
  put64(b, rec::kHeaderBytes - 8, hash_of(b, 0, rec::kHeaderBytes - 8));
}

// Opens the file as the reader and reads everything it offers, checking it against the bytes `b`.
void read_all(const std::vector<unsigned char>& b, RecordVerify verify) {
  std::shared_ptr<RecordFile> file;
  try {
    file = RecordFile::open(nitro_fuzz::memory_file_path(), {.verify = verify});
  } catch (const nitro::Error&) {
    return;  // a refused file: what damaged input must give
  }
  const auto map = file->mapping();
  if (map.size() != b.size()) finding("a mapping of another size than the file");
  const auto& fields = file->fields();
  const std::uint64_t rb = file->record_bytes();
  bool all_read = true;
  for (std::int64_t i = 0; i < file->size(); ++i) {
    std::vector<at::Tensor> views;
    try {
      views = file->record(i);
    } catch (const nitro::Error&) {
      all_read = false;  // a chunk whose checksum does not match (lazy): its records are refused
      continue;
    }
    if (views.size() != fields.size()) finding("record() gave another number of tensors than fields");
    const std::uint64_t first = rec::kHeaderBytes + static_cast<std::uint64_t>(i) * rb;
    std::vector<at::Tensor> copies;
    for (std::size_t k = 0; k < views.size(); ++k) {
      const auto& v = views[k];
      if (v.scalar_type() != fields[k].dtype || v.sizes().vec() != fields[k].shape)
        finding("a view of another dtype or shape than its field");
      copies.push_back(at::empty(fields[k].shape, at::TensorOptions().dtype(fields[k].dtype)));
      const std::uint64_t n = v.nbytes();
      if (n == 0) continue;  // an empty field: no bytes, and data_ptr() may be null
      const auto pos = static_cast<const std::byte*>(v.data_ptr()) - map.data();
      if (pos < 0 || static_cast<std::uint64_t>(pos) < first || static_cast<std::uint64_t>(pos) > first + rb ||
          n > first + rb - static_cast<std::uint64_t>(pos))
        finding("a view outside its record");
      if (std::memcmp(v.data_ptr(), b.data() + pos, n) != 0) finding("a view's bytes are not the file's");
    }
    file->read_into(i, copies);
    for (std::size_t k = 0; k < views.size(); ++k)
      if (copies[k].nbytes() > 0 && std::memcmp(copies[k].data_ptr(), views[k].data_ptr(), copies[k].nbytes()) != 0)
        finding("read_into's bytes differ from record()'s");
  }
  if (all_read && file->size() > 0) {
    nitro::data::RecordDataset dataset(file);
    (void)dataset.get(0);
    if (fields.size() <= 2) {
      nitro::data::RecordBatches batches(file);
      std::vector<std::size_t> all(static_cast<std::size_t>(file->size()));
      for (std::size_t i = 0; i < all.size(); ++i) all[i] = all.size() - 1 - i;
      const auto batch = batches.get_batch(all);
      if (batch.data.size(0) != file->size()) finding("a batch of another size than asked");
    }
  }
  try {
    (void)file->record(file->size());
    finding("a record past the end");
  } catch (const nitro::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return nitro_fuzz::read_input<RecordVerify>(data, size, rec::kHeaderBytes, "record_reader", fix_checksums, read_all);
}

#ifdef NITRO_FUZZ_MAKE_CORPUS
#include <ATen/ATen.h>

#include <filesystem>

int main(int argc, char** argv) {
  const auto corpus = nitro_fuzz::corpus_dir(argc, argv);
  if (!corpus) return 2;
  const std::filesystem::path dir = *corpus;
  using nitro::data::RecordWriter;
  const auto counting = [](std::int64_t n, at::ScalarType t, std::vector<std::int64_t> shape, std::int64_t k) {
    return (at::arange(n, at::kLong) * (3 + k) % 97).to(t).reshape(shape);
  };
  {
    // tests/data/record_file.cpp's fields: a uint8 image and an int64 label; 5 records, 2 a chunk.
    RecordWriter w(dir / "image-label.nrec", {{"image", at::kByte, {3, 4, 4}}, {"label", at::kLong, {}}},
                   {.chunk_records = 2, .fsync = false});
    for (std::int64_t i = 0; i < 5; ++i) w.write({counting(48, at::kByte, {3, 4, 4}, i), at::scalar_tensor(i, at::kLong)});
    w.close();
  }
  {
    RecordWriter w(dir / "float-1field.nrec", {{"x", at::kFloat, {2, 3}}}, {.fsync = false});
    for (std::int64_t i = 0; i < 3; ++i) w.write({counting(6, at::kFloat, {2, 3}, i) / 7});
    w.close();
  }
  {
    // Many dtypes, a scalar, an empty field and 8 dimensions; 2 records, 1 a chunk.
    std::vector<nitro::data::RecordField> fields = {
        {"half", at::kHalf, {3}},        {"flag", at::kBool, {}},       {"bf16", at::kBFloat16, {2, 1}},
        {"i16", at::kShort, {1, 1, 3}},  {"empty", at::kFloat, {0, 4}}, {"u64", at::kUInt64, {2}},
        {"deep", at::kChar, {1, 2, 1, 2, 1, 1, 2, 1}}, {"f8", at::kFloat8_e4m3fn, {5}}};
    RecordWriter w(dir / "dtypes.nrec", fields, {.chunk_records = 1, .fsync = false});
    for (std::int64_t i = 0; i < 2; ++i) {
      std::vector<at::Tensor> r;
      for (const auto& f : fields) {
        std::int64_t n = 1;
        for (auto d : f.shape) n *= d;
        r.push_back(counting(n, at::kLong, f.shape, i).to(f.dtype == at::kBool ? at::kBool : at::kInt));
      }
      w.write(r);
    }
    w.close();
  }
  {
    RecordWriter w(dir / "empty.nrec", {{"image", at::kByte, {3, 2, 2}}, {"label", at::kLong, {}}}, {.fsync = false});
    w.close();
  }
  {
    // Odd-sized fields (each padded to 8 bytes) and 9 records, 4 a chunk: a last chunk of 1.
    RecordWriter w(dir / "odd-9.nrec", {{"a", at::kByte, {5}}, {"b", at::kShort, {3}}}, {.chunk_records = 4, .fsync = false});
    for (std::int64_t i = 0; i < 9; ++i) w.write({counting(5, at::kByte, {5}, i), counting(3, at::kShort, {3}, i)});
    w.close();
  }
  return 0;
}
#endif
