#pragma once
// The definitions of nitro/data/record_file.hpp's non-template functions: included by record_file.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/data/record_file.hpp>

namespace nitro::data::detail::rec {

NITRO_INLINE std::optional<uint64_t> field_bytes(const std::vector<int64_t>& shape, c10::ScalarType dtype) {
  // The product of the dimensions other than zeros must fit too: a tensor of shape {0, 2^62, 0} holds
  // no bytes, but its strides (and a batch of it) overflow LibTorch's 64-bit offsets.
  uint64_t n = c10::elementSize(dtype), nonzero = c10::elementSize(dtype);
  for (auto d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
    if (d > 0 && __builtin_mul_overflow(nonzero, static_cast<uint64_t>(d), &nonzero)) return std::nullopt;
  }
  if (nonzero > (uint64_t{1} << 48)) return std::nullopt;  // 256 TiB for one field: no real record
  return n;
}

NITRO_INLINE bool storable(c10::ScalarType t) {
  using S = c10::ScalarType;
  switch (t) {
    case S::Byte: case S::Char: case S::Short: case S::Int: case S::Long: case S::Half: case S::Float:
    case S::Double: case S::Bool: case S::BFloat16: case S::UInt16: case S::UInt32: case S::UInt64:
    case S::Float8_e5m2: case S::Float8_e4m3fn: case S::Float8_e5m2fnuz: case S::Float8_e4m3fnuz:
      return true;
    default:
      return false;
  }
}

NITRO_INLINE uint64_t hash(const unsigned char* p, size_t n) {
  return io::xxh64(std::span<const std::byte>(reinterpret_cast<const std::byte*>(p), n));
}

NITRO_INLINE std::pair<std::vector<uint64_t>, uint64_t> layout(const std::vector<RecordField>& fields) {
  std::vector<uint64_t> offsets;
  uint64_t at = 0;
  for (const auto& f : fields) {
    offsets.push_back(at);
    at += *field_bytes(f.shape, f.dtype);  // checked by check_fields: the sum stays under 17 x 4 GiB
    at = (at + 7) / 8 * 8;
  }
  return {offsets, at};
}

NITRO_INLINE void check_fields(const std::vector<RecordField>& fields) {
  NITRO_CHECK(!fields.empty() && fields.size() <= kMaxFields, "data::RecordWriter: a record has 1 to ", kMaxFields,
              " fields, got ", fields.size());
  for (const auto& f : fields) {
    NITRO_CHECK(!f.name.empty() && f.name.size() < kNameBytes, "data::RecordWriter: a field name has 1 to ",
                kNameBytes - 1, " characters, got '", f.name, "'");
    NITRO_CHECK(f.shape.size() <= kMaxDims, "data::RecordWriter: field '", f.name, "' has ", f.shape.size(),
                " dimensions; at most ", kMaxDims);
    NITRO_CHECK(storable(f.dtype), "data::RecordWriter: field '", f.name, "': dtype ", c10::toString(f.dtype),
                " is not storable; use a plain integer, bool or floating dtype");
    const auto bytes = field_bytes(f.shape, f.dtype);
    NITRO_CHECK(bytes && *bytes <= kMaxRecordBytes, "data::RecordWriter: field '", f.name, "' of shape ",
                c10::IntArrayRef(f.shape), " has a negative dimension, or more than 4 GiB, or dimensions other ",
                "than 0 that multiply to more than 2^48 bytes");
  }
}

}  // namespace nitro::data::detail::rec

namespace nitro::data {

NITRO_INLINE RecordWriter::RecordWriter(const std::filesystem::path& path, std::vector<RecordField> fields) : RecordWriter(path, std::move(fields), Options{}) {}

NITRO_INLINE RecordWriter::RecordWriter(const std::filesystem::path& path, std::vector<RecordField> fields, Options options) : fields_(std::move(fields)), o_(options), file_(path, io::AtomicFile::Options{.fsync = options.fsync}) {
  namespace r = detail::rec;
  r::check_fields(fields_);
  NITRO_CHECK(o_.chunk_records >= 1, "data::RecordWriter: chunk_records must be >= 1, got ", o_.chunk_records);
  auto [offsets, bytes] = r::layout(fields_);
  offsets_ = std::move(offsets);
  record_bytes_ = bytes;
  NITRO_CHECK(record_bytes_ > 0, "data::RecordWriter: every field is empty; a record must hold some bytes");
  NITRO_CHECK(record_bytes_ <= r::kMaxRecordBytes, "data::RecordWriter: a record of ", record_bytes_,
              " bytes is over the format's 4 GiB");
  NITRO_CHECK(static_cast<uint64_t>(o_.chunk_records) <= r::kMaxChunkRecords,
              "data::RecordWriter: chunk_records must be <= 2^32");
  std::vector<unsigned char> h(r::kHeaderBytes, 0);
  std::memcpy(h.data(), r::kMagic, 8);
  r::put<uint32_t>(h, 8, r::kVersion);
  r::put<uint32_t>(h, 12, static_cast<uint32_t>(r::kHeaderBytes));
  r::put<uint64_t>(h, 16, record_bytes_);
  r::put<uint64_t>(h, 24, static_cast<uint64_t>(o_.chunk_records));
  r::put<uint32_t>(h, 32, static_cast<uint32_t>(fields_.size()));
  for (size_t i = 0; i < fields_.size(); ++i) {
    const auto& f = fields_[i];
    const size_t at = r::kFieldsAt + i * r::kFieldBytes;
    std::memcpy(h.data() + at, f.name.data(), f.name.size());
    r::put<int32_t>(h, at + r::kNameBytes, static_cast<int32_t>(f.dtype));
    r::put<int32_t>(h, at + r::kNameBytes + 4, static_cast<int32_t>(f.shape.size()));
    r::put<uint64_t>(h, at + r::kNameBytes + 8, offsets_[i]);
    for (size_t d = 0; d < f.shape.size(); ++d) r::put<int64_t>(h, at + r::kNameBytes + 16 + 8 * d, f.shape[d]);
  }
  r::put<uint64_t>(h, r::kHeaderBytes - 8, r::hash(h.data(), r::kHeaderBytes - 8));
  file_.write(h.data(), h.size());
  buffer_.assign(record_bytes_, 0);
}

NITRO_INLINE void RecordWriter::write(const std::vector<at::Tensor>& values) {
  NITRO_CHECK(!closed_, "data::RecordWriter::write: the writer is closed");
  NITRO_CHECK(values.size() == fields_.size(), "data::RecordWriter::write: a record has ", fields_.size(),
              " fields, got ", values.size(), " tensors");
  std::fill(buffer_.begin(), buffer_.end(), 0);
  for (size_t i = 0; i < fields_.size(); ++i) {
    const auto& f = fields_[i];
    const auto& v = values[i];
    NITRO_CHECK(v.defined() && v.sizes().vec() == f.shape, "data::RecordWriter::write: field '", f.name,
                "' has shape ", c10::IntArrayRef(f.shape), ", got ",
                v.defined() ? c10::str(v.sizes()) : std::string("an undefined tensor"));
    NITRO_CHECK(v.layout() == c10::kStrided && !v.is_meta(), "data::RecordWriter::write: field '", f.name,
                "' must be a dense tensor with data (got layout ", v.layout(), " on ", v.device(), ")");
    // A float image in [0, 1] written to a uint8 field would be stored as zeros: convert explicitly.
    NITRO_CHECK(!(v.is_floating_point() && !c10::isFloatingType(f.dtype)),
                "data::RecordWriter::write: field '", f.name, "' is ", c10::toString(f.dtype), " and the value is ",
                c10::toString(v.scalar_type()), "; convert it yourself (e.g. (x * 255).round().to(torch::kByte))");
    const at::Tensor c = v.to(c10::kCPU, f.dtype).contiguous();
    if (c.nbytes() > 0) std::memcpy(buffer_.data() + offsets_[i], c.data_ptr(), c.nbytes());  // null data_ptr() when empty
  }
  file_.write(buffer_.data(), buffer_.size());
  chunk_hash_.update(std::span<const std::byte>(reinterpret_cast<const std::byte*>(buffer_.data()), buffer_.size()));
  if (++count_ % o_.chunk_records == 0) {
    hashes_.push_back(chunk_hash_.digest());
    chunk_hash_ = io::Xxh64{};
  }
}

NITRO_INLINE void RecordWriter::close() {
  namespace r = detail::rec;
  if (closed_) return;
  if (count_ % o_.chunk_records != 0) hashes_.push_back(chunk_hash_.digest());
  std::vector<unsigned char> footer(hashes_.size() * 8 + r::kFooterTail, 0);
  for (size_t i = 0; i < hashes_.size(); ++i) r::put<uint64_t>(footer, 8 * i, hashes_[i]);
  const size_t tail = hashes_.size() * 8;
  r::put<uint64_t>(footer, tail, static_cast<uint64_t>(count_));
  r::put<uint64_t>(footer, tail + 8, static_cast<uint64_t>(hashes_.size()));
  r::put<uint64_t>(footer, tail + 16, r::hash(footer.data(), tail + 16));
  std::memcpy(footer.data() + tail + 24, r::kEndMagic, 8);
  file_.write(footer.data(), footer.size());
  file_.finish();
  (void)file_.commit();  // false: the directory's fsync failed after the rename; the file is in place
  closed_ = true;
}

NITRO_INLINE std::shared_ptr<RecordFile> RecordFile::open(const std::filesystem::path& path, Options options) {
  std::shared_ptr<RecordFile> f(new RecordFile(path, options));
  if (options.verify == Verify::eager) f->verify();
  return f;
}

NITRO_INLINE RecordFile::~RecordFile() {
  if (base_ != nullptr) ::munmap(base_, size_);
}

NITRO_INLINE std::span<const std::byte> RecordFile::mapping() const noexcept {
  return {static_cast<const std::byte*>(base_), size_};
}

NITRO_INLINE std::vector<at::Tensor> RecordFile::record(int64_t i) {
  check_index(i);
  std::vector<at::Tensor> out;
  out.reserve(fields_.size());
  auto self = shared_from_this();
  auto* rec = record_ptr(i);
  for (size_t k = 0; k < fields_.size(); ++k) {
    out.push_back(at::from_blob(
        rec + offsets_[k], fields_[k].shape, [self](void*) {}, at::TensorOptions().dtype(fields_[k].dtype)));
  }
  return out;
}

NITRO_INLINE void RecordFile::read_into(int64_t i, const std::vector<at::Tensor>& out) {
  check_index(i);
  NITRO_CHECK(out.size() == fields_.size(), "data::RecordFile::read_into: ", fields_.size(),
              " destination tensors needed, got ", out.size());
  auto* rec = record_ptr(i);
  for (size_t k = 0; k < fields_.size(); ++k) {
    const auto& d = out[k];
    NITRO_CHECK(d.defined() && d.device().is_cpu() && d.is_contiguous() && d.scalar_type() == fields_[k].dtype &&
                    d.sizes().vec() == fields_[k].shape,
                "data::RecordFile::read_into: destination ", k, " must be a contiguous CPU tensor of ",
                c10::toString(fields_[k].dtype), " ", c10::IntArrayRef(fields_[k].shape));
    if (d.nbytes() > 0) std::memcpy(d.data_ptr(), rec + offsets_[k], d.nbytes());  // an empty field's data_ptr() is null
  }
}

NITRO_INLINE void RecordFile::verify() {
  for (size_t c = 0; c < hashes_.size(); ++c) check_chunk(c);
}

NITRO_INLINE RecordFile::RecordFile(const std::filesystem::path& path, Options options) : path_(path.string()), options_(options) {
  namespace r = detail::rec;
  // Kept open: chunks are verified from the file, not from the (writable) mapping.
  fd_.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));  // O_NONBLOCK: a FIFO does not hang
  const io::Fd& fd = fd_;
  NITRO_CHECK(fd, "data::RecordFile: cannot open '", path_, "': ", io::os_error(errno));
  struct stat st {};
  NITRO_CHECK(::fstat(fd.get(), &st) == 0, "data::RecordFile: cannot stat '", path_, "': ", io::os_error(errno));
  NITRO_CHECK(S_ISREG(st.st_mode), "data::RecordFile: '", path_, "' is not a regular file");
  size_ = static_cast<size_t>(st.st_size);
  NITRO_CHECK(size_ >= r::kHeaderBytes + r::kFooterTail, "data::RecordFile: '", path_, "' is ", size_,
              " bytes, too short for a record file (truncated, or not one)");
  // MAP_NORESERVE: a private writable mapping is otherwise charged in full against memory, and a
  // data set larger than RAM could not be opened.
  void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd.get(), 0);
  NITRO_CHECK(p != MAP_FAILED, "data::RecordFile: cannot map '", path_, "': ", io::os_error(errno));
  base_ = p;
  io::UnmapOnThrow unmap(base_, size_);  // the destructor does not run for a file refused below
  const auto* b = static_cast<const unsigned char*>(base_);
  NITRO_CHECK(std::memcmp(b, r::kMagic, 8) == 0, "data::RecordFile: '", path_,
              "' is not a Nitro record file (no NITROREC magic); write it with data::RecordWriter or nitro_pack");
  NITRO_CHECK(r::get<uint32_t>(b + 8) == r::kVersion, "data::RecordFile: '", path_, "' has format version ",
              r::get<uint32_t>(b + 8), "; this Nitro reads version ", r::kVersion);
  NITRO_CHECK(r::get<uint64_t>(b + r::kHeaderBytes - 8) == r::hash(b, r::kHeaderBytes - 8),
              "data::RecordFile: '", path_, "': the header's checksum does not match (a damaged file)");
  record_bytes_ = r::get<uint64_t>(b + 16);
  chunk_records_ = r::get<uint64_t>(b + 24);
  const auto nfields = r::get<uint32_t>(b + 32);
  const auto damaged = [&](const char* what) {
    nitro::detail::fail("data::RecordFile: '", path_, "': the header is inconsistent (", what,
                        "): a damaged or crafted file");
  };
  if (!(nfields >= 1 && nfields <= r::kMaxFields)) damaged("field count");
  if (!(chunk_records_ >= 1 && chunk_records_ <= r::kMaxChunkRecords)) damaged("records per chunk");
  if (!(record_bytes_ >= 1 && record_bytes_ <= r::kMaxRecordBytes)) damaged("record size");
  for (uint32_t i = 0; i < nfields; ++i) {
    const auto* f = b + r::kFieldsAt + i * r::kFieldBytes;
    RecordField field;
    field.name.assign(reinterpret_cast<const char*>(f), strnlen(reinterpret_cast<const char*>(f), r::kNameBytes));
    const auto dtype = r::get<int32_t>(f + r::kNameBytes);
    if (dtype < 0 || dtype >= static_cast<int32_t>(c10::ScalarType::NumOptions) ||
        !r::storable(static_cast<c10::ScalarType>(dtype)))
      damaged("a field's dtype");
    field.dtype = static_cast<c10::ScalarType>(dtype);
    const auto ndim = r::get<int32_t>(f + r::kNameBytes + 4);
    if (ndim < 0 || static_cast<size_t>(ndim) > r::kMaxDims) damaged("a field's dimensions");
    const auto offset = r::get<uint64_t>(f + r::kNameBytes + 8);
    for (int32_t d = 0; d < ndim; ++d) field.shape.push_back(r::get<int64_t>(f + r::kNameBytes + 16 + 8 * d));
    const auto bytes = r::field_bytes(field.shape, field.dtype);
    // Every field inside its record (offset and size are each under 4 GiB, so the sum is exact).
    if (!bytes || *bytes > record_bytes_ || offset > record_bytes_ - *bytes) damaged("a field's shape or offset");
    offsets_.push_back(offset);
    fields_.push_back(std::move(field));
  }
  // The footer, from the end.
  const auto* end = b + size_;
  NITRO_CHECK(std::memcmp(end - 8, r::kEndMagic, 8) == 0, "data::RecordFile: '", path_,
              "' has no end marker: it is truncated (or was never closed by its writer)");
  const auto count = r::get<uint64_t>(end - 32);
  const auto chunks = r::get<uint64_t>(end - 24);
  // In divided form, so no product can wrap: payload = records + chunk hashes.
  const uint64_t payload = size_ - r::kHeaderBytes - r::kFooterTail;
  const bool sizes_fit = chunks <= payload / 8 && count <= (payload - chunks * 8) / record_bytes_ &&
                         chunks == count / chunk_records_ + (count % chunk_records_ != 0) &&
                         payload == count * record_bytes_ + chunks * 8;
  NITRO_CHECK(sizes_fit, "data::RecordFile: '", path_, "' is ", size_,
              " bytes, which its header and footer do not account for (truncated or damaged)");
  count_ = static_cast<int64_t>(count);
  const size_t footer = chunks * 8 + r::kFooterTail;
  const auto* f = end - footer;
  NITRO_CHECK(r::get<uint64_t>(end - 16) == r::hash(f, footer - 16), "data::RecordFile: '", path_,
              "': the footer's checksum does not match (a damaged file)");
  for (uint64_t c = 0; c < chunks; ++c) hashes_.push_back(r::get<uint64_t>(f + 8 * c));
  checked_ = std::make_unique<std::atomic<bool>[]>(chunks);
  for (uint64_t c = 0; c < chunks; ++c) checked_[c] = options_.verify == Verify::none;
  unmap.release();
}

NITRO_INLINE void RecordFile::check_index(int64_t i) {
  NITRO_CHECK(i >= 0 && i < count_, "data::RecordFile: record ", i, " is out of range; '", path_, "' has ", count_,
              " records");
  const auto c = static_cast<size_t>(static_cast<uint64_t>(i) / chunk_records_);
  if (!checked_[c].load(std::memory_order_acquire)) check_chunk(c);
}

NITRO_INLINE void RecordFile::check_chunk(size_t c) {
  const uint64_t first = c * chunk_records_;
  const uint64_t n = std::min<uint64_t>(chunk_records_, static_cast<uint64_t>(count_) - first);
  uint64_t at = detail::rec::kHeaderBytes + first * record_bytes_;
  uint64_t left = n * record_bytes_;
  io::Xxh64 h;
  std::vector<unsigned char> buffer(static_cast<size_t>(std::min<uint64_t>(left, uint64_t{1} << 20)));
  while (left > 0) {
    const auto take = static_cast<size_t>(std::min<uint64_t>(left, buffer.size()));
    NITRO_CHECK(io::pread_all(fd_.get(), buffer.data(), take, at), "data::RecordFile: '", path_,
                "': chunk ", c, " could not be read (the file was cut short or changed since it was opened?)");
    h.update(std::span<const std::byte>(reinterpret_cast<const std::byte*>(buffer.data()), take));
    at += take;
    left -= take;
  }
  NITRO_CHECK(h.digest() == hashes_[c], "data::RecordFile: '", path_, "': chunk ", c, " (records ", first, " to ",
              first + n - 1, ") does not match its checksum (a damaged file)");
  checked_[c].store(true, std::memory_order_release);
}

NITRO_INLINE unsigned char* RecordFile::record_ptr(int64_t i) {
  return static_cast<unsigned char*>(base_) + detail::rec::kHeaderBytes + static_cast<uint64_t>(i) * record_bytes_;
}

NITRO_INLINE RecordDataset::RecordDataset(std::shared_ptr<RecordFile> file) : file_(std::move(file)) {
  NITRO_CHECK(file_ != nullptr, "data::RecordDataset: the file is null");
}

NITRO_INLINE torch::data::Example<> RecordDataset::get(size_t index) {
  auto r = file_->record(static_cast<int64_t>(index));
  return {r[0], r.size() > 1 ? r[1] : at::empty({0}, at::kLong)};
}

NITRO_INLINE RecordBatches::RecordBatches(std::shared_ptr<RecordFile> file) : file_(std::move(file)) {
  NITRO_CHECK(file_ != nullptr, "data::RecordBatches: the file is null");
  NITRO_CHECK(file_->fields().size() <= 2, "data::RecordBatches: the file has ", file_->fields().size(),
              " fields; a RecordBatch holds two (data, target): read other files with RecordFile::read_into");
}

NITRO_INLINE RecordBatch RecordBatches::get_batch(std::vector<size_t> indices) {
  const auto n = static_cast<int64_t>(indices.size());
  const auto& fields = file_->fields();
  const auto stacked = [&](const RecordField& f) {
    std::vector<int64_t> shape{n};
    shape.insert(shape.end(), f.shape.begin(), f.shape.end());
    return at::empty(shape, at::TensorOptions().dtype(f.dtype));
  };
  RecordBatch b{stacked(fields[0]),
                fields.size() > 1 ? stacked(fields[1]) : at::empty({n, 0}, at::kLong),
                at::empty({n}, at::kLong)};
  auto* index = b.index.data_ptr<int64_t>();
  std::vector<at::Tensor> into(fields.size());
  for (int64_t k = 0; k < n; ++k) {
    const auto i = static_cast<int64_t>(indices[static_cast<size_t>(k)]);
    into[0] = b.data[k];
    if (fields.size() > 1) into[1] = b.target[k];
    file_->read_into(i, into);
    index[k] = i;
  }
  return b;
}

}  // namespace nitro::data
