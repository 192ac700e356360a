#pragma once
// The definitions of nitro/data/packed.hpp's non-template functions: included by packed.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/data/packed.hpp>

namespace nitro::data::detail::pak {

NITRO_INLINE std::uint64_t hash(const void* p, std::size_t n) {
  return io::xxh64(std::span<const std::byte>(static_cast<const std::byte*>(p), n));
}

}  // namespace nitro::data::detail::pak

namespace nitro::data {

NITRO_INLINE PackedWriter::PackedWriter(const std::filesystem::path& path) : PackedWriter(path, Options{}) {}

NITRO_INLINE PackedWriter::PackedWriter(const std::filesystem::path& path, Options options) : o_(options), path_(path.string()), file_(path, io::AtomicFile::Options{.fsync = options.fsync}) {
  namespace p = detail::pak;
  NITRO_CHECK(o_.chunk_records >= 1 && static_cast<std::uint64_t>(o_.chunk_records) <= p::kMaxChunkRecords,
              "data::PackedWriter: chunk_records must be 1 to 2^32, got ", o_.chunk_records);
  NITRO_CHECK(o_.kind == PackedKind::classification || o_.kind == PackedKind::detection,
              "data::PackedWriter: kind must be PackedKind::classification or PackedKind::detection");
  std::vector<unsigned char> h(p::kHeaderBytes, 0);
  std::memcpy(h.data(), p::kMagic, 8);
  p::put<std::uint32_t>(h.data() + 8, p::kVersion);
  p::put<std::uint32_t>(h.data() + 12, static_cast<std::uint32_t>(p::kHeaderBytes));
  p::put<std::uint32_t>(h.data() + 16, static_cast<std::uint32_t>(o_.kind));
  p::put<std::uint64_t>(h.data() + 24, static_cast<std::uint64_t>(o_.chunk_records));
  p::put<std::uint64_t>(h.data() + p::kHeaderBytes - 8, p::hash(h.data(), p::kHeaderBytes - 8));
  file_.write(h.data(), h.size());
  at_ = p::kHeaderBytes;
}

NITRO_INLINE void PackedWriter::write(std::span<const std::uint8_t> encoded, int64_t label, std::string_view name) {
  NITRO_CHECK(o_.kind == PackedKind::classification, "data::PackedWriter::write: '", path_,
              "' is a detection file; give each record its boxes (a float [n, 5] tensor), not a label");
  append(encoded, label, {}, name);
}

NITRO_INLINE void PackedWriter::write(std::span<const std::uint8_t> encoded, const at::Tensor& boxes, std::string_view name) {
  NITRO_CHECK(o_.kind == PackedKind::detection, "data::PackedWriter::write: '", path_,
              "' is a classification file; give each record a label, not boxes");
  NITRO_CHECK(boxes.defined() && boxes.dim() == 2 && boxes.size(1) == 5 && boxes.layout() == c10::kStrided &&
                  !boxes.is_complex() && boxes.scalar_type() != at::kBool,
              "data::PackedWriter::write: boxes must be a real tensor of shape [n, 5] (class, cx, cy, w, h); got ",
              boxes.defined() ? c10::str(boxes.sizes(), " ", c10::toString(boxes.scalar_type()))
                              : std::string("an undefined tensor"));
  const at::Tensor b = boxes.to(c10::kCPU, at::kFloat).contiguous();
  const float* v = b.data_ptr<float>();
  for (int64_t k = 0; k < b.numel(); ++k)
    NITRO_CHECK(std::isfinite(v[k]), "data::PackedWriter::write: record ", count_, " (", name,
                "): a box value is not finite (", v[k], ")");
  append(encoded, -1, std::span<const float>(v, static_cast<std::size_t>(b.numel())), name);
}

NITRO_INLINE void PackedWriter::close() {
  namespace p = detail::pak;
  if (closed_) return;
  NITRO_CHECK(!failed_, "data::PackedWriter::close: an earlier write to '", path_,
              "' failed; the file is incomplete and is not put in place");
  if (count_ % o_.chunk_records != 0) hashes_.push_back(chunk_hash_.digest());
  const std::uint64_t index_at = at_;
  const std::uint64_t rows = boxes_.size() / 5;
  std::vector<unsigned char> t(p::padded(entries_.size() * p::kEntryBytes) + p::padded(rows * p::kBoxBytes) +
                                   p::padded(names_.size()),
                               0);
  unsigned char* q = t.data();
  for (const auto& e : entries_) {
    p::put<std::uint64_t>(q, e.offset);
    p::put<std::uint64_t>(q + 8, e.length);
    p::put<std::int64_t>(q + 16, e.label);
    p::put<std::uint64_t>(q + 24, e.box_first);
    p::put<std::uint64_t>(q + 32, e.box_count);
    p::put<std::uint64_t>(q + 40, e.name_offset);
    p::put<std::uint64_t>(q + 48, e.name_length);
    q += p::kEntryBytes;
  }
  if (!boxes_.empty()) std::memcpy(q, boxes_.data(), boxes_.size() * sizeof(float));
  q += p::padded(rows * p::kBoxBytes);
  if (!names_.empty()) std::memcpy(q, names_.data(), names_.size());
  file_.write(t.data(), t.size());
  std::vector<unsigned char> footer(hashes_.size() * 8 + p::kFooterTail, 0);
  for (std::size_t i = 0; i < hashes_.size(); ++i) p::put<std::uint64_t>(footer.data() + 8 * i, hashes_[i]);
  unsigned char* tail = footer.data() + hashes_.size() * 8;
  p::put<std::uint64_t>(tail, index_at);
  p::put<std::uint64_t>(tail + 8, static_cast<std::uint64_t>(count_));
  p::put<std::uint64_t>(tail + 16, static_cast<std::uint64_t>(hashes_.size()));
  p::put<std::uint64_t>(tail + 24, rows);
  p::put<std::uint64_t>(tail + 32, static_cast<std::uint64_t>(names_.size()));
  p::put<std::uint64_t>(tail + 40, p::hash(t.data(), t.size()));
  p::put<std::uint64_t>(tail + 48, p::hash(footer.data(), footer.size() - 16));
  std::memcpy(tail + 56, p::kEndMagic, 8);
  file_.write(footer.data(), footer.size());
  file_.finish();
  (void)file_.commit();  // false: the directory's fsync failed after the rename; the file is in place
  closed_ = true;
}

NITRO_INLINE void PackedWriter::append(std::span<const std::uint8_t> encoded, int64_t label, std::span<const float> boxes, std::string_view name) {
  namespace p = detail::pak;
  NITRO_CHECK(!closed_, "data::PackedWriter::write: the writer of '", path_, "' is closed");
  NITRO_CHECK(!failed_, "data::PackedWriter::write: an earlier write to '", path_, "' failed");
  NITRO_CHECK(!encoded.empty(), "data::PackedWriter::write: record ", count_, " (", name,
              ") has no bytes; an encoded image is never empty");
  NITRO_CHECK(encoded.size() <= p::kMaxRecordBytes, "data::PackedWriter::write: record ", count_, " (", name,
              ") of ", encoded.size(), " bytes is over the format's 4 GiB");
  static constexpr unsigned char zeros[8] = {};
  const std::size_t pad = p::padded(encoded.size()) - encoded.size();
  failed_ = true;  // until both writes are through: a half-written record makes close() refuse
  file_.write(encoded.data(), encoded.size());
  file_.write(zeros, pad);
  failed_ = false;
  chunk_hash_.update(encoded.data(), encoded.size());
  chunk_hash_.update(zeros, pad);
  entries_.push_back({at_, encoded.size(), label, boxes_.size() / 5, boxes.size() / 5, names_.size(), name.size()});
  boxes_.insert(boxes_.end(), boxes.begin(), boxes.end());
  names_.append(name);
  at_ += encoded.size() + pad;
  if (++count_ % o_.chunk_records == 0) {
    hashes_.push_back(chunk_hash_.digest());
    chunk_hash_ = io::Xxh64{};
  }
}

NITRO_INLINE std::shared_ptr<PackedFile> PackedFile::open(const std::filesystem::path& path, Options options) {
  std::shared_ptr<PackedFile> f(new PackedFile(path, options));
  if (options.verify == Verify::eager) f->verify();
  return f;
}

NITRO_INLINE PackedFile::~PackedFile() {
  if (base_ != nullptr) ::munmap(base_, size_);
}

NITRO_INLINE std::span<const std::uint8_t> PackedFile::encoded(int64_t i) {
  const auto& e = entry(i);
  check_chunk_once(i);
  return {static_cast<const std::uint8_t*>(base_) + e.offset, static_cast<std::size_t>(e.length)};
}

NITRO_INLINE at::Tensor PackedFile::boxes(int64_t i) const {
  const auto& e = entry(i);
  NITRO_CHECK(kind_ == PackedKind::detection, "data::PackedFile::boxes: '", path_,
              "' is a classification file: its records have labels (label(i)), not boxes");
  auto out = at::empty({static_cast<int64_t>(e.box_count), 5}, at::kFloat);
  if (e.box_count > 0)
    std::memcpy(out.data_ptr<float>(), boxes_.data() + e.box_first * 5, e.box_count * detail::pak::kBoxBytes);
  return out;
}

NITRO_INLINE std::string PackedFile::name(int64_t i) const {
  const auto& e = entry(i);
  return names_.substr(e.name_offset, e.name_length);
}

NITRO_INLINE void PackedFile::verify() {
  for (std::size_t c = 0; c < hashes_.size(); ++c) check_chunk(c);
}

NITRO_INLINE PackedFile::PackedFile(const std::filesystem::path& path, Options options) : path_(path.string()), options_(options) {
  namespace p = detail::pak;
  // Kept open: chunks and tables are read from the file with pread (a file cut short since it was
  // opened is then an error, not a SIGBUS).
  fd_.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));  // O_NONBLOCK: a FIFO does not hang
  NITRO_CHECK(fd_, "data::PackedFile: cannot open '", path_, "': ", io::os_error(errno));
  struct stat st {};
  NITRO_CHECK(::fstat(fd_.get(), &st) == 0, "data::PackedFile: cannot stat '", path_, "': ", io::os_error(errno));
  NITRO_CHECK(S_ISREG(st.st_mode), "data::PackedFile: '", path_, "' is not a regular file");
  size_ = static_cast<std::size_t>(st.st_size);
  char magic[8] = {};
  NITRO_CHECK(size_ < 8 || (io::pread_all(fd_.get(), magic, 8, 0) && std::memcmp(magic, p::kMagic, 8) == 0),
              "data::PackedFile: '", path_,
              "' is not a Nitro packed file (no NITROPAK magic); write it with data::PackedWriter or nitro_pack");
  NITRO_CHECK(size_ >= p::kHeaderBytes + p::kFooterTail, "data::PackedFile: '", path_, "' is ", size_,
              " bytes, too short for a packed file (truncated, or not one)");
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_.get(), 0);
  NITRO_CHECK(m != MAP_FAILED, "data::PackedFile: cannot map '", path_, "': ", io::os_error(errno));
  base_ = m;
  io::UnmapOnThrow unmap(base_, size_);  // the destructor does not run for a file refused below
  const auto* b = static_cast<const unsigned char*>(base_);
  NITRO_CHECK(p::get<std::uint32_t>(b + 8) == p::kVersion, "data::PackedFile: '", path_, "' has format version ",
              p::get<std::uint32_t>(b + 8), "; this Nitro reads version ", p::kVersion);
  NITRO_CHECK(p::get<std::uint64_t>(b + p::kHeaderBytes - 8) == p::hash(b, p::kHeaderBytes - 8),
              "data::PackedFile: '", path_, "': the header's checksum does not match (a damaged file)");
  const auto header = [&](const char* what) {
    nitro::detail::fail("data::PackedFile: '", path_, "': the header is inconsistent (", what,
                        "): a damaged or crafted file");
  };
  if (p::get<std::uint32_t>(b + 12) != p::kHeaderBytes) header("header size");
  const auto kind = p::get<std::uint32_t>(b + 16);
  if (kind > 1) header("kind");
  kind_ = static_cast<PackedKind>(kind);
  chunk_records_ = p::get<std::uint64_t>(b + 24);
  if (!(chunk_records_ >= 1 && chunk_records_ <= p::kMaxChunkRecords)) header("records per chunk");

  // The footer, from the end.
  const auto* end = b + size_;
  NITRO_CHECK(std::memcmp(end - 8, p::kEndMagic, 8) == 0, "data::PackedFile: '", path_,
              "' has no end marker: it is truncated (or was never closed by its writer)");
  const auto* tail = end - p::kFooterTail;
  const auto index_at = p::get<std::uint64_t>(tail);
  const auto count = p::get<std::uint64_t>(tail + 8);
  const auto chunks = p::get<std::uint64_t>(tail + 16);
  const auto rows = p::get<std::uint64_t>(tail + 24);
  const auto name_bytes = p::get<std::uint64_t>(tail + 32);
  const auto tables_hash = p::get<std::uint64_t>(tail + 40);
  const auto sizes = [&] {
    nitro::detail::fail("data::PackedFile: '", path_, "' is ", size_,
                        " bytes, which its header and footer do not account for (truncated or damaged)");
  };
  // In divided form, so no product can wrap.
  const std::uint64_t body = size_ - p::kHeaderBytes - p::kFooterTail;  // payload, tables, chunk hashes
  if (chunks > body / 8) sizes();
  const std::uint64_t footer_at = size_ - p::kFooterTail - chunks * 8;
  NITRO_CHECK(p::get<std::uint64_t>(end - 16) == p::hash(b + footer_at, size_ - footer_at - 16),
              "data::PackedFile: '", path_, "': the footer's checksum does not match (a damaged file)");
  if (!(index_at >= p::kHeaderBytes && index_at % 8 == 0 && index_at <= footer_at)) sizes();
  const std::uint64_t tables = footer_at - index_at;
  if (count > tables / p::kEntryBytes || rows > (tables - p::padded(count * p::kEntryBytes)) / p::kBoxBytes ||
      name_bytes > tables || chunks != count / chunk_records_ + (count % chunk_records_ != 0) ||
      (kind_ == PackedKind::classification && rows != 0) ||
      tables != p::padded(count * p::kEntryBytes) + p::padded(rows * p::kBoxBytes) + p::padded(name_bytes))
    sizes();
  const auto* f = b + footer_at;
  for (std::uint64_t c = 0; c < chunks; ++c) hashes_.push_back(p::get<std::uint64_t>(f + 8 * c));

  // The tables, read from the file (a private copy: what is checked is what is used).
  std::vector<unsigned char> t(static_cast<std::size_t>(tables));
  NITRO_CHECK(io::pread_all(fd_.get(), t.data(), t.size(), index_at), "data::PackedFile: '", path_,
              "': the index could not be read: ", io::os_error(errno));
  NITRO_CHECK(options_.verify == Verify::none || p::hash(t.data(), t.size()) == tables_hash, "data::PackedFile: '",
              path_, "': the index, boxes and names do not match their checksum (a damaged file)");
  const auto* boxes_at = t.data() + p::padded(count * p::kEntryBytes);
  boxes_.resize(static_cast<std::size_t>(rows * 5));
  if (rows > 0) std::memcpy(boxes_.data(), boxes_at, static_cast<std::size_t>(rows * p::kBoxBytes));
  for (std::size_t k = 0; k < boxes_.size(); ++k)
    NITRO_CHECK(std::isfinite(boxes_[k]), "data::PackedFile: '", path_, "': box row ", k / 5,
                " holds a value that is not finite (", boxes_[k], "), which the writer refuses (a damaged or crafted file)");
  names_.assign(reinterpret_cast<const char*>(boxes_at + p::padded(rows * p::kBoxBytes)),
                static_cast<std::size_t>(name_bytes));
  // Every entry where the writer puts it: records back to back from the header to the index, box
  // rows and names in order. Anything else is damage (or a crafted file), refused here.
  entries_.resize(static_cast<std::size_t>(count));
  std::uint64_t at = p::kHeaderBytes, box = 0, name = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    const auto* q = t.data() + i * p::kEntryBytes;
    p::Entry e{p::get<std::uint64_t>(q),      p::get<std::uint64_t>(q + 8),  p::get<std::int64_t>(q + 16),
               p::get<std::uint64_t>(q + 24), p::get<std::uint64_t>(q + 32), p::get<std::uint64_t>(q + 40),
               p::get<std::uint64_t>(q + 48)};
    const bool fits = e.offset == at && e.length >= 1 && e.length <= p::kMaxRecordBytes &&
                      e.length <= index_at - at && p::padded(e.length) <= index_at - at &&
                      e.box_first == box && e.box_count <= rows - box &&
                      (kind_ == PackedKind::detection ? e.label == -1 : e.box_count == 0) &&
                      e.name_offset == name && e.name_length <= name_bytes - name;
    NITRO_CHECK(fits, "data::PackedFile: '", path_, "': index entry ", i,
                " points outside the payload, boxes or names, or out of order (a damaged or crafted file)");
    at += p::padded(e.length);
    box += e.box_count;
    name += e.name_length;
    entries_[static_cast<std::size_t>(i)] = e;
  }
  NITRO_CHECK(at == index_at && box == rows && name == name_bytes, "data::PackedFile: '", path_,
              "': the index does not cover the payload, boxes and names exactly (a damaged or crafted file)");
  checked_ = std::make_unique<std::atomic<bool>[]>(static_cast<std::size_t>(chunks));
  for (std::uint64_t c = 0; c < chunks; ++c) checked_[c] = options_.verify == Verify::none;
  unmap.release();
}

NITRO_INLINE const detail::pak::Entry& PackedFile::entry(int64_t i) const {
  NITRO_CHECK(i >= 0 && i < size(), "data::PackedFile: record ", i, " is out of range; '", path_, "' has ", size(),
              " records");
  return entries_[static_cast<std::size_t>(i)];
}

NITRO_INLINE void PackedFile::check_chunk_once(int64_t i) {
  const auto c = static_cast<std::size_t>(static_cast<std::uint64_t>(i) / chunk_records_);
  if (!checked_[c].load(std::memory_order_acquire)) check_chunk(c);
}

NITRO_INLINE void PackedFile::check_chunk(std::size_t c) {
  const std::uint64_t first = c * chunk_records_;
  const std::uint64_t last = std::min<std::uint64_t>(first + chunk_records_, entries_.size()) - 1;
  std::uint64_t at = entries_[first].offset;
  std::uint64_t left = entries_[last].offset + detail::pak::padded(entries_[last].length) - at;
  io::Xxh64 h;
  std::vector<unsigned char> buffer(static_cast<std::size_t>(std::min<std::uint64_t>(left, std::uint64_t{1} << 20)));
  while (left > 0) {
    const auto take = static_cast<std::size_t>(std::min<std::uint64_t>(left, buffer.size()));
    NITRO_CHECK(io::pread_all(fd_.get(), buffer.data(), take, at), "data::PackedFile: '", path_, "': chunk ", c,
                " could not be read (the file was cut short or changed since it was opened?)");
    h.update(buffer.data(), take);
    at += take;
    left -= take;
  }
  NITRO_CHECK(h.digest() == hashes_[c], "data::PackedFile: '", path_, "': chunk ", c, " (records ", first, " to ",
              last, ") does not match its checksum (a damaged file)");
  checked_[c].store(true, std::memory_order_release);
}

NITRO_INLINE PackedImages::PackedImages(const std::filesystem::path& path, PackedFileOptions options) : file_(PackedFile::open(path, options)) {}

NITRO_INLINE PackedImages::PackedImages(std::shared_ptr<PackedFile> file) : file_(std::move(file)) {
  NITRO_CHECK(file_ != nullptr, "data::PackedImages: the file is null");
}

}  // namespace nitro::data
