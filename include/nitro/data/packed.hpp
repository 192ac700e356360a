#pragma once
// Files of variable-length records: encoded images (JPEG or PNG bytes, as the files held them or
// re-encoded) with a class label or a list of boxes each, read through a memory mapping.
//
//   nitro::data::PackedWriter    writes records (encoded bytes + a label, or + boxes for detection)
//   nitro::data::PackedFile      maps a packed file; encoded(i) is a span viewing the mapping
//   nitro::data::PackedImages    a copyable handle on a PackedFile with the same reading members
//
//   nitro::data::PackedWriter w("train.npak", {.kind = nitro::data::PackedKind::classification});
//   w.write(jpeg_bytes, 7, "cat/0001.jpg");                 // bytes, label, the original name
//   w.close();                                              // fsync, then renamed into place
//
//   auto file = nitro::data::PackedFile::open("train.npak");
//   std::span<const std::uint8_t> bytes = file->encoded(17);  // no copy; decode with image::decode
//   int64_t label = file->label(17);
//
// `nitro_pack --images DIR` and `--yolo DIR` write such files from an ImageFolder tree or an
// Ultralytics detection layout (bench/nitro_pack.cpp).
//
// Layout (little-endian; every section starts at a multiple of 8):
//   header   4096 bytes: magic "NITROPAK", version (u32), header size (u32, 4096), kind (u32:
//            0 classification, 1 detection), 0 (u32), records per chunk (u64), and an XXH64 of the
//            header's first 4088 bytes in its last 8.
//   payload  from byte 4096: each record's encoded bytes, zero-padded to a multiple of 8, back to back
//            in record order.
//   index    56 bytes a record: offset in the file (u64), length (u64), label (i64; -1 in a
//            detection file), first box row (u64), box rows (u64), name offset in the names (u64),
//            name length (u64).
//   boxes    float32 rows of 5 (class, cx, cy, w, h), the records' rows in record order, zero-padded.
//   names    the records' names (UTF-8, not terminated) back to back, zero-padded.
//   footer   an XXH64 per chunk of records (its records' padded bytes, contiguous), then 64 bytes:
//            the index's offset, the record count, the chunk count, the box rows, the names' bytes
//            (u64 each), an XXH64 of the index, boxes and names as stored, an XXH64 of the footer
//            before it, and magic "NPAKEND1".
// The file is written under a temporary name, fsynced and renamed (io::AtomicFile): a reader never
// sees half a file.
//
// Opening checks the header, the footer, the size and every index entry (records back to back in
// the payload, box rows and names in order, each inside its table), so that nothing a damaged or
// crafted file says can point outside the file; the tables' checksum too, unless `Verify::none`.
// Each chunk's checksum is verified the first time one of its records is read (`Verify::lazy`, the
// default), all at open (`eager`), or never (`none`), reading the file itself (not the mapping).
// Every damaged, truncated or foreign file is a nitro::Error naming the file and the problem.
//
// The mapping is read-only. Do not change a packed file in place while a process has it open
// (truncate, cp over it): touching a page that no longer exists kills the process with SIGBUS.
// Replace it by writing a new file and renaming it over the old one, as PackedWriter does.
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>
#include <nitro/io/file.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nitro::data {

/// What a packed file's records carry besides their encoded bytes.
enum class PackedKind : std::uint32_t {
  /// An int64 label each (ImageFolder's class index).
  classification = 0,
  /// A list of boxes each: float32 rows (class, cx, cy, w, h), coordinates normalised to [0, 1].
  detection = 1,
};

namespace detail::pak {

static_assert(std::endian::native == std::endian::little,
              "data::PackedFile: the packed format is little-endian; this machine is not");

inline constexpr char kMagic[8] = {'N', 'I', 'T', 'R', 'O', 'P', 'A', 'K'};
inline constexpr char kEndMagic[8] = {'N', 'P', 'A', 'K', 'E', 'N', 'D', '1'};
inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::size_t kHeaderBytes = 4096;
inline constexpr std::size_t kEntryBytes = 56;
inline constexpr std::size_t kBoxBytes = 5 * 4;
inline constexpr std::size_t kFooterTail = 8 * 8;
/// The largest record (4 GiB) and chunk (2^32 records): bounds that keep every size computation exact.
inline constexpr std::uint64_t kMaxRecordBytes = std::uint64_t{1} << 32;
inline constexpr std::uint64_t kMaxChunkRecords = std::uint64_t{1} << 32;

inline constexpr std::uint64_t padded(std::uint64_t n) noexcept { return (n + 7) / 8 * 8; }

template <class T>
void put(unsigned char* at, T v) noexcept {
  std::memcpy(at, &v, sizeof v);  // little-endian machines only (x86-64, aarch64)
}
template <class T>
T get(const unsigned char* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
NITRO_INLINE std::uint64_t hash(const void* p, std::size_t n);

/// One record's index entry, as stored.
struct Entry {
  std::uint64_t offset = 0, length = 0;
  std::int64_t label = -1;
  std::uint64_t box_first = 0, box_count = 0, name_offset = 0, name_length = 0;
};

}  // namespace detail::pak

/// Writes a packed file (see the top of this file).
class PackedWriter {
 public:
  /// What a PackedWriter's records carry, how checksums are grouped and whether it fsyncs.
  struct Options {
    /// Records per checksummed chunk, >= 1.
    int64_t chunk_records = 256;
    PackedKind kind = PackedKind::classification;  ///< Labels (classification) or boxes (detection) per record.
    /// fsync before the rename (off only for scratch files).
    bool fsync = true;
  };

  /// Starts a classification file at `path` with the default Options; see below.
  NITRO_INLINE explicit PackedWriter(const std::filesystem::path& path);
  /// Starts a packed file, written under a temporary name next to `path` until close(). Throws
  /// nitro::Error when chunk_records is out of range, kind is not a PackedKind, or the temporary file
  /// cannot be created.
  NITRO_INLINE PackedWriter(const std::filesystem::path& path, Options options);
  PackedWriter(const PackedWriter&) = delete;
  PackedWriter& operator=(const PackedWriter&) = delete;
  /// Without close(), nothing is written under the target name (the temporary file is removed).
  ~PackedWriter() = default;

  /// Appends a record of a classification file: the encoded bytes (stored as given), a label and a
  /// name (e.g. the image's path relative to the data set's root).
  NITRO_INLINE void write(std::span<const std::uint8_t> encoded, int64_t label, std::string_view name = {});

  /// Appends a record of a detection file: the encoded bytes, the boxes (any real dtype, shape [n, 5],
  /// rows class, cx, cy, w, h; n may be 0) and a name.
  NITRO_INLINE void write(std::span<const std::uint8_t> encoded, const at::Tensor& boxes, std::string_view name = {});

  /// Writes the index, boxes, names and footer, fsyncs and renames the file into place.
  NITRO_INLINE void close();

  /// Records written so far.
  [[nodiscard]] int64_t count() const noexcept { return count_; }

 private:
  NITRO_INLINE void append(std::span<const std::uint8_t> encoded, int64_t label, std::span<const float> boxes,
              std::string_view name);

  Options o_;
  std::string path_;
  io::AtomicFile file_;
  std::uint64_t at_ = 0;
  std::vector<detail::pak::Entry> entries_;
  std::vector<float> boxes_;
  std::string names_;
  io::Xxh64 chunk_hash_;
  std::vector<std::uint64_t> hashes_;
  int64_t count_ = 0;
  bool closed_ = false, failed_ = false;
};

/// When PackedFile checks its chunks' checksums.
enum class PackedVerify { lazy, eager, none };
/// Options of PackedFile::open.
struct PackedFileOptions {
  /// lazy: each chunk when one of its records is first read; eager: all at open; none: never (nor
  /// the tables' checksum; their structure is checked whatever this says).
  PackedVerify verify = PackedVerify::lazy;
};

/// A mapped packed file (see the top of this file). Thread-safe for reading; not copyable (hold it
/// by the shared_ptr open() returns, or through PackedImages).
class PackedFile {
 public:
  using Verify = PackedVerify;        ///< When chunks are checked (PackedVerify).
  using Options = PackedFileOptions;  ///< Options of open() (PackedFileOptions).

  /// Maps `path` and checks its header, footer, size and index (and every chunk with Verify::eager).
  /// Throws nitro::Error naming the file and the problem when it cannot be opened or mapped, is not a
  /// packed file, is truncated or damaged, or has a bad checksum.
  NITRO_INLINE static std::shared_ptr<PackedFile> open(const std::filesystem::path& path, Options options = {});
  PackedFile(const PackedFile&) = delete;
  PackedFile& operator=(const PackedFile&) = delete;
  NITRO_INLINE ~PackedFile();

  /// The number of records.
  [[nodiscard]] int64_t size() const noexcept { return static_cast<int64_t>(entries_.size()); }
  /// Whether records carry labels or boxes.
  [[nodiscard]] PackedKind kind() const noexcept { return kind_; }
  /// The path the file was opened from.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

  /// Record `i`'s encoded bytes, viewing the (read-only) mapping: valid while this file is alive.
  [[nodiscard]] NITRO_INLINE std::span<const std::uint8_t> encoded(int64_t i);
  /// Record `i`'s label; -1 for every record of a detection file.
  [[nodiscard]] int64_t label(int64_t i) const { return entry(i).label; }
  /// Record `i`'s boxes, a float32 [n, 5] tensor of rows (class, cx, cy, w, h) (a copy; n may be 0).
  /// A classification file has none: a nitro::Error.
  [[nodiscard]] NITRO_INLINE at::Tensor boxes(int64_t i) const;
  /// Record `i`'s name as written (e.g. its path relative to the data set's root).
  [[nodiscard]] NITRO_INLINE std::string name(int64_t i) const;

  /// Checks every chunk's checksum now; throws nitro::Error naming the first bad chunk.
  NITRO_INLINE void verify();

 private:
  NITRO_INLINE PackedFile(const std::filesystem::path& path, Options options);

  NITRO_INLINE const detail::pak::Entry& entry(int64_t i) const;

  NITRO_INLINE void check_chunk_once(int64_t i);

  // Hashes the chunk as the file holds it (pread: a file cut short since it was opened is an error
  // here rather than a SIGBUS).
  NITRO_INLINE void check_chunk(std::size_t c);

  std::string path_;
  Options options_;
  io::Fd fd_;
  void* base_ = nullptr;
  std::size_t size_ = 0;
  PackedKind kind_ = PackedKind::classification;
  std::uint64_t chunk_records_ = 1;
  std::vector<detail::pak::Entry> entries_;
  std::vector<float> boxes_;
  std::string names_;
  std::vector<std::uint64_t> hashes_;
  std::unique_ptr<std::atomic<bool>[]> checked_;
};

/// A copyable handle on a PackedFile with its reading members (what data::ImageBatches takes as a
/// source): copies share the file.
///   nitro::data::PackedImages images("train.npak");
///   auto x = nitro::image::decode(images.encoded(3));
class PackedImages {
 public:
  /// Opens `path` (PackedFile::open, which says what it throws).
  NITRO_INLINE explicit PackedImages(const std::filesystem::path& path, PackedFileOptions options = {});
  /// A handle on an open file. Throws nitro::Error when file is null.
  NITRO_INLINE explicit PackedImages(std::shared_ptr<PackedFile> file);

  /// The number of records.
  [[nodiscard]] int64_t size() const noexcept { return file_->size(); }
  /// Whether records carry labels or boxes.
  [[nodiscard]] PackedKind kind() const noexcept { return file_->kind(); }
  /// Record `i`'s encoded bytes, viewing the mapping (PackedFile::encoded).
  [[nodiscard]] std::span<const std::uint8_t> encoded(int64_t i) const { return file_->encoded(i); }
  /// Record `i`'s label; -1 in a detection file (PackedFile::label).
  [[nodiscard]] int64_t label(int64_t i) const { return file_->label(i); }
  /// Record `i`'s boxes, float32 [n, 5] (PackedFile::boxes; a nitro::Error in a classification file).
  [[nodiscard]] at::Tensor boxes(int64_t i) const { return file_->boxes(i); }
  /// Record `i`'s name as written (PackedFile::name).
  [[nodiscard]] std::string name(int64_t i) const { return file_->name(i); }
  /// The shared file.
  [[nodiscard]] const std::shared_ptr<PackedFile>& file() const noexcept { return file_; }

 private:
  std::shared_ptr<PackedFile> file_;
};

}  // namespace nitro::data

#if !NITRO_COMPILED
#include <nitro/data/packed-inl.hpp>
#endif
