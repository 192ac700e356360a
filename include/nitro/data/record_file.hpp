#pragma once
// Files of fixed-shape records, read through a memory mapping without copying.
//
//   nitro::data::RecordWriter    writes records (e.g. a uint8 3x224x224 image and an int64 label each)
//   nitro::data::RecordFile      maps a record file; record(i) returns tensors that view the mapping
//   nitro::data::RecordDataset   a torch::data data set over a RecordFile (field 0 -> data, 1 -> target)
//   nitro::data::RecordBatches   a batch data set: records copied straight into one batch, with indices
//
//   nitro::data::RecordWriter w("train.nrec", {{"image", at::kByte, {3, 224, 224}}, {"label", at::kLong, {}}});
//   for (...) w.write({image_u8, label});
//   w.close();                                              // fsync, then renamed into place
//
//   auto file = nitro::data::RecordFile::open("train.nrec");
//   std::vector<at::Tensor> r = file->record(17);           // views: no copy, no read until touched
//
// Layout (little-endian): a 4096-byte header (magic "NITROREC", version, record size, records per
// chunk, each field's name, dtype, shape and offset in the record, and an XXH64 of the header), the
// records back to back (each field 8-byte aligned), and a footer (an XXH64 per chunk of records, the
// record count, an XXH64 of the footer, magic "NRECEND1"). The file is written under a temporary name,
// fsynced and renamed (io::AtomicFile): a reader never sees half a file.
//
// Opening checks the header, the footer and the size, so a truncated or foreign file is a nitro::Error
// naming the problem; each chunk's checksum is verified the first time one of its records is read
// (`Verify::lazy`, the default), all at open (`eager`), or never (`none`), reading the file itself
// (not the mapping). A crafted header (sizes, offsets, dtypes) is refused before anything is mapped
// into a tensor. The mapping is private: writing into a returned view changes this process's copy,
// never the file, but that copy is what later record() calls of this process return (clone a sample
// before changing it in place, e.g. in a transform).
//
// Do not change a record file in place while a process has it open (truncate, cp over it, rsync
// --inplace): touching a page that no longer exists kills the process with SIGBUS, which no library
// can turn into an error. Replace it by writing a new file and renaming it over the old one, as
// RecordWriter and nitro_pack do: the open mapping keeps the old file.
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>
#include <nitro/io/file.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/ScalarType.h>
#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <array>
#include <bit>
#include <unistd.h>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace nitro::data {

/// One field of a record: a name, a dtype and a fixed shape ({} for a scalar).
struct RecordField {
  std::string name;  ///< 1 to 31 characters, stored in the header.
  c10::ScalarType dtype = c10::ScalarType::Byte;  ///< A plain integer, bool or floating dtype.
  std::vector<int64_t> shape;  ///< The field's shape in every record, at most 8 dimensions; {} for a scalar.
};

namespace detail::rec {

static_assert(std::endian::native == std::endian::little,
              "data::RecordFile: the record format is little-endian; this machine is not");

inline constexpr char kMagic[8] = {'N', 'I', 'T', 'R', 'O', 'R', 'E', 'C'};
inline constexpr char kEndMagic[8] = {'N', 'R', 'E', 'C', 'E', 'N', 'D', '1'};
inline constexpr uint32_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 4096;
inline constexpr size_t kMaxFields = 16;
inline constexpr size_t kMaxDims = 8;
inline constexpr size_t kNameBytes = 32;
inline constexpr size_t kFieldBytes = kNameBytes + 4 + 4 + 8 + 8 * kMaxDims;  // 112
inline constexpr size_t kFieldsAt = 40;
inline constexpr size_t kFooterTail = 8 * 3 + 8;  // count, chunks, footer hash, magic

template <class T>
void put(std::vector<unsigned char>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);  // little-endian machines only (x86-64, aarch64)
}
template <class T>
T get(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

/// Bytes one field takes (numel x element size); empty on overflow or a negative dimension.
NITRO_INLINE std::optional<uint64_t> field_bytes(const std::vector<int64_t>& shape, c10::ScalarType dtype);

/// The dtypes a record file stores: plain numbers whose bytes mean the same on every machine.
NITRO_INLINE bool storable(c10::ScalarType t);

/// The largest record this format takes (4 GiB): a bound that keeps every size computation exact.
inline constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 32;
inline constexpr uint64_t kMaxChunkRecords = uint64_t{1} << 32;

NITRO_INLINE uint64_t hash(const unsigned char* p, size_t n);

/// Field offsets within a record (8-byte aligned) and the record's size.
NITRO_INLINE std::pair<std::vector<uint64_t>, uint64_t> layout(const std::vector<RecordField>& fields);

NITRO_INLINE void check_fields(const std::vector<RecordField>& fields);

}  // namespace detail::rec

/// Writes a record file (see the top of this file). Every record is checked against the fields.
class RecordWriter {
 public:
  /// How a RecordWriter groups checksums and whether it fsyncs.
  struct Options {
    /// Records per checksummed chunk, >= 1.
    int64_t chunk_records = 1024;
    /// fsync before the rename (off only for scratch files).
    bool fsync = true;
  };

  /// Starts a record file of `fields` (1 to 16) at `path`, with the default Options; see below.
  NITRO_INLINE RecordWriter(const std::filesystem::path& path, std::vector<RecordField> fields);
  /// Starts a record file of `fields` (1 to 16), written under a temporary name next to `path` until
  /// close(). Throws nitro::Error on a bad field (name, dtype, shape, a record over 4 GiB), on
  /// chunk_records < 1, or when the temporary file cannot be created.
  NITRO_INLINE RecordWriter(const std::filesystem::path& path, std::vector<RecordField> fields, Options options);
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;
  /// Without close(), nothing is written under the target name (the temporary file is removed).
  ~RecordWriter() = default;

  /// Appends one record: one tensor per field, of its shape (any dtype convertible to the field's,
  /// on any device).
  NITRO_INLINE void write(const std::vector<at::Tensor>& values);

  /// Writes the footer, fsyncs and renames the file into place. Records written so far: count().
  NITRO_INLINE void close();

  /// Records written so far.
  [[nodiscard]] int64_t count() const noexcept { return count_; }

 private:
  std::vector<RecordField> fields_;
  Options o_;
  io::AtomicFile file_;
  std::vector<uint64_t> offsets_;
  uint64_t record_bytes_ = 0;
  std::vector<unsigned char> buffer_;
  io::Xxh64 chunk_hash_;
  std::vector<uint64_t> hashes_;
  int64_t count_ = 0;
  bool closed_ = false;
};

/// When RecordFile checks its chunks' checksums.
enum class RecordVerify { lazy, eager, none };
/// Options of RecordFile::open.
struct RecordFileOptions {
  /// lazy: each chunk when one of its records is first read; eager: all at open; none: never.
  RecordVerify verify = RecordVerify::lazy;
};

/// A mapped record file (see the top of this file). Thread-safe for reading.
class RecordFile : public std::enable_shared_from_this<RecordFile> {
 public:
  using Verify = RecordVerify;        ///< When chunks are checked (RecordVerify).
  using Options = RecordFileOptions;  ///< Options of open() (RecordFileOptions).

  /// Maps `path` and checks its header, footer and size (and every chunk with Verify::eager). Throws
  /// nitro::Error naming the problem when the file cannot be opened or mapped, is not a record file,
  /// is truncated, or has a bad checksum.
  NITRO_INLINE static std::shared_ptr<RecordFile> open(const std::filesystem::path& path, Options options = {});
  RecordFile(const RecordFile&) = delete;
  RecordFile& operator=(const RecordFile&) = delete;
  NITRO_INLINE ~RecordFile();

  /// The number of records.
  [[nodiscard]] int64_t size() const noexcept { return count_; }
  /// The fields of every record, as written.
  [[nodiscard]] const std::vector<RecordField>& fields() const noexcept { return fields_; }
  /// Bytes one record takes in the file (its fields, each 8-byte aligned).
  [[nodiscard]] uint64_t record_bytes() const noexcept { return record_bytes_; }
  /// The mapping, for checks that a view lies inside it.
  [[nodiscard]] NITRO_INLINE std::span<const std::byte> mapping() const noexcept;

  /// Record `i`: one tensor per field, each a view of the mapping (no copy). The views keep the file
  /// mapped; they are CPU tensors, writable (copy-on-write: the file never changes).
  NITRO_INLINE std::vector<at::Tensor> record(int64_t i);

  /// Copies record `i`'s fields into `out` (one tensor per field, of its shape and dtype, e.g. slices
  /// of a pinned staging batch), without an intermediate tensor.
  NITRO_INLINE void read_into(int64_t i, const std::vector<at::Tensor>& out);

  /// Checks every chunk's checksum now; throws nitro::Error naming the first bad chunk.
  NITRO_INLINE void verify();

 private:
  NITRO_INLINE RecordFile(const std::filesystem::path& path, Options options);

  NITRO_INLINE void check_index(int64_t i);

  // Hashes the chunk as the file holds it (pread: writes into views do not count, and a file cut
  // short since it was opened is an error here rather than a SIGBUS).
  NITRO_INLINE void check_chunk(size_t c);

  NITRO_INLINE unsigned char* record_ptr(int64_t i);

  std::string path_;
  Options options_;
  io::Fd fd_;
  void* base_ = nullptr;
  size_t size_ = 0;
  uint64_t record_bytes_ = 0, chunk_records_ = 1;
  int64_t count_ = 0;
  std::vector<RecordField> fields_;
  std::vector<uint64_t> offsets_;
  std::vector<uint64_t> hashes_;
  std::unique_ptr<std::atomic<bool>[]> checked_;
};

/// A torch::data data set over a RecordFile: field 0 is the example's data, field 1 its target (an
/// empty int64 tensor for a one-field file, so that Stack<> works); both views of the mapping (clone
/// before changing them in place: see the top of this file).
///   auto loader = torch::data::make_data_loader(RecordDataset(file).map(Stack<>()), 64);
class RecordDataset : public torch::data::datasets::Dataset<RecordDataset> {
 public:
  /// A data set over `file`. Throws nitro::Error when file is null.
  NITRO_INLINE explicit RecordDataset(std::shared_ptr<RecordFile> file);
  /// Record `index` as {field 0, field 1}, views of the mapping. Throws nitro::Error past size().
  NITRO_INLINE torch::data::Example<> get(size_t index) override;
  /// The number of records.
  [[nodiscard]] std::optional<size_t> size() const override { return static_cast<size_t>(file_->size()); }
  /// The file read.
  [[nodiscard]] const std::shared_ptr<RecordFile>& file() const noexcept { return file_; }

 private:
  std::shared_ptr<RecordFile> file_;
};

/// A batch of records and the data-set indices of its samples (what data::augment's Keys need, and
/// what lets a prefetcher move it: nitro_map_tensors).
struct RecordBatch {
  /// Field 0 of each record, stacked: [N, ...field 0's shape].
  at::Tensor data;
  /// Field 1, stacked (an empty int64 [N, 0] for a one-field file).
  at::Tensor target;
  /// The samples' indices in the file, int64 [N].
  at::Tensor index;
  /// A copy with `f` applied to data, target and index: how Nitro moves the batch between devices
  /// (nitro::map_tensors, core/device.hpp).
  template <class F>
  friend RecordBatch nitro_map_tensors(const RecordBatch& b, F&& f) {
    return {f(b.data), f(b.target), f(b.index)};
  }
};

/// A torch::data batch data set over a RecordFile: get_batch(indices) copies the records straight
/// from the mapping into one contiguous batch (no per-sample tensor, no stacking), with the indices.
///   auto source = nitro::from_dataset(nitro::data::RecordBatches(file), sampler, 64);  // RecordBatch
class RecordBatches
    : public torch::data::datasets::BatchDataset<RecordBatches, RecordBatch, std::vector<size_t>> {
 public:
  /// A batch data set over `file`, which must have one or two fields. Throws nitro::Error when file is
  /// null or has more than two fields (read those with RecordFile::read_into).
  NITRO_INLINE explicit RecordBatches(std::shared_ptr<RecordFile> file);
  /// Records `indices` copied into one batch (CPU, contiguous). Throws nitro::Error on an index past
  /// size() or a chunk whose checksum fails.
  NITRO_INLINE RecordBatch get_batch(std::vector<size_t> indices) override;
  /// The number of records.
  [[nodiscard]] std::optional<size_t> size() const override { return static_cast<size_t>(file_->size()); }
  /// The file read.
  [[nodiscard]] const std::shared_ptr<RecordFile>& file() const noexcept { return file_; }

 private:
  std::shared_ptr<RecordFile> file_;
};

}  // namespace nitro::data

#if !NITRO_COMPILED
#include <nitro/data/record_file-inl.hpp>
#endif
