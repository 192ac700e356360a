#pragma once
// The definitions of nitro/snapshot/snapshot.hpp's non-template functions: included by snapshot.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/snapshot/snapshot.hpp>

namespace nitro::snapshot {

NITRO_INLINE auto Manifest::find(std::string_view part) const noexcept -> const Part* {
  for (const auto& p : parts)
    if (p.name == part) return &p;
  return nullptr;
}

}  // namespace nitro::snapshot

namespace nitro::snapshot::detail {

NITRO_INLINE void corrupt(const std::filesystem::path& file, std::string_view part, std::string_view what) {
  ::nitro::detail::fail("nitro::snapshot: ", file.string(), part.empty() ? "" : ": part \"", part,
                        part.empty() ? "" : "\"", " is unreadable: ", what,
                        "; the file is damaged or not a snapshot (snapshot::latest() picks the newest good one)");
}

NITRO_INLINE std::string libtorch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

NITRO_INLINE std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

NITRO_INLINE PartHash::PartHash(std::uint32_t version) noexcept : xxh3_(version >= 2) {}

NITRO_INLINE void PartHash::update(const void* data, std::size_t n) noexcept {
  if (n == 0) return;
  if (xxh3_) xxh3_hash_.update(data, n);
  else xxh64_hash_.update(data, n);
}

NITRO_INLINE PartWriter::PartWriter(io::AtomicFile& file, std::uint64_t offset, std::uint32_t version) : file_(&file), offset_(offset), version_(version), hash_(version) {}

NITRO_INLINE void PartWriter::begin(std::string name) {
  part_ = Manifest::Part{std::move(name), offset_, 0, 0};
  hash_ = PartHash(version_);
}

NITRO_INLINE Manifest::Part PartWriter::end() {
  flush();
  part_.bytes = offset_ - part_.offset;
  part_.checksum = hash_.digest();
  return part_;
}

NITRO_INLINE void PartWriter::put(const void* data, std::size_t n) {
  if (n >= (1u << 16)) {
    flush();
    const auto* p = static_cast<const char*>(data);
    for (std::size_t done = 0; done < n;) {
      const std::size_t piece = std::min(piece_bytes, n - done);
      file_->write(p + done, piece);
      hash_.update(p + done, piece);
      done += piece;
    }
    offset_ += n;
    return;
  }
  const auto* p = static_cast<const char*>(data);
  buffer_.insert(buffer_.end(), p, p + n);
  if (buffer_.size() >= (1u << 20)) flush();
}

NITRO_INLINE void PartWriter::put_string(std::string_view s) {
  put_value<std::uint64_t>(s.size());
  put(s.data(), s.size());
}

NITRO_INLINE void PartWriter::put_dict(const StateDict& d, std::string_view part) {
  put_value<std::uint64_t>(d.tensors.size());
  for (const auto& [name, t] : d.tensors) {
    NITRO_CHECK(t.defined(), "nitro::snapshot: \"", name, "\" in part \"", part,
                "\" is an undefined tensor; leave it out of the StateDict instead");
    NITRO_CHECK(t.layout() == c10::kStrided && !t.is_nested() && !c10::isQIntType(t.scalar_type()),
                "nitro::snapshot: \"", name, "\" in part \"", part,
                "\" is not a dense tensor (sparse, nested or quantized); store a dense copy");
    const at::Tensor host = t.detach().to(at::kCPU).contiguous();
    put_string(name);
    put_value<std::int32_t>(static_cast<std::int32_t>(host.scalar_type()));
    put_value<std::uint32_t>(static_cast<std::uint32_t>(host.dim()));
    for (const auto s : host.sizes()) put_value<std::int64_t>(s);
    put_value<std::uint64_t>(host.nbytes());
    if (host.nbytes() > 0) put(host.data_ptr(), host.nbytes());
  }
  put_value<std::uint64_t>(d.integers.size());
  for (const auto& [name, v] : d.integers) put_string(name), put_value<std::int64_t>(v);
  put_value<std::uint64_t>(d.numbers.size());
  for (const auto& [name, v] : d.numbers) put_string(name), put_value<double>(v);
  put_value<std::uint64_t>(d.strings.size());
  for (const auto& [name, v] : d.strings) put_string(name), put_string(v);
}

NITRO_INLINE void PartWriter::flush() {
  if (buffer_.empty()) return;
  file_->write(buffer_.data(), buffer_.size());
  hash_.update(buffer_.data(), buffer_.size());
  offset_ += buffer_.size();
  buffer_.clear();
}

NITRO_INLINE PartReader::PartReader(int fd, const std::filesystem::path& file, const Manifest::Part& part, std::uint32_t version) : fd_(fd), file_(&file), part_(&part), at_(part.offset), left_(part.bytes), hash_(version) {}

NITRO_INLINE void PartReader::get(void* data, std::size_t n) {
  if (n > left_) fail("it ends early");
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    if (buffered() == 0) {
      if (n >= buffer_bytes) {  // more than the buffer holds: straight into place
        for (std::size_t done = 0; done < n;) {
          const std::size_t want = std::min(piece_bytes, n - done);
          if (!io::pread_all(fd_, p + done, want, at_)) fail("the file ends early or a read failed");
          hash_.update(p + done, want);
          consumed(want);
          done += want;
        }
        return;
      }
      refill();
    }
    const std::size_t take = std::min(n, buffered());
    std::memcpy(p, buffer_.get() + used_, take);
    hash_.update(p, take);
    used_ += take;
    consumed(take);
    p += take;
    n -= take;
  }
}

NITRO_INLINE std::string PartReader::get_string() {
  const auto n = get_value<std::uint64_t>();
  if (n > left_) fail("a string is longer than the part");
  std::string s(n, '\0');
  get(s.data(), n);
  return s;
}

NITRO_INLINE std::uint64_t PartReader::get_count(std::uint64_t smallest_entry) {
  const auto n = get_value<std::uint64_t>();
  if (n > left_ / smallest_entry) fail("a count is larger than the part can hold");
  return n;
}

NITRO_INLINE StateDict PartReader::get_dict() {
  StateDict d;
  for (auto n = get_count(8 + 4 + 4 + 8); n > 0; --n) {
    std::string name = get_string();
    const auto dtype = get_value<std::int32_t>();
    const auto ndim = get_value<std::uint32_t>();
    if (dtype < 0 || dtype >= static_cast<std::int32_t>(c10::ScalarType::NumOptions)) fail("a dtype is invalid");
    const auto type = static_cast<c10::ScalarType>(dtype);
    if (c10::isQIntType(type) || type == c10::ScalarType::Undefined) fail("a dtype is invalid");
    if (ndim > max_ndim) fail("a tensor has too many dimensions");
    std::vector<std::int64_t> sizes(ndim);
    std::uint64_t expected = 0;
    try {
      expected = c10::elementSize(type);
    } catch (const std::exception&) {
      fail("a dtype is invalid");
    }
    // The byte count, and the product of the sizes with each 0 counted as 1: LibTorch computes
    // strides from it, which must fit in int64 even for a tensor of no elements.
    std::uint64_t strides = expected;
    for (auto& s : sizes) {
      s = get_value<std::int64_t>();
      if (s < 0) fail("a tensor has a negative size");
      if (__builtin_mul_overflow(expected, static_cast<std::uint64_t>(s), &expected) ||
          __builtin_mul_overflow(strides, static_cast<std::uint64_t>(std::max<std::int64_t>(s, 1)), &strides) ||
          strides > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail("a tensor is too large");
    }
    const auto nbytes = get_value<std::uint64_t>();
    if (nbytes != expected) fail("a tensor's byte count does not match its shape");
    if (nbytes > left_) fail("a tensor is larger than the part");
    // What decoding allocates stays within twice the part (plus 16 MB) until the part's checksum
    // is known to match: a damaged count cannot make a small file take much memory.
    decoded_ += nbytes + 512 + name.size();
    if (!verified_ && decoded_ > 2 * part_->bytes + (16u << 20)) verify_ahead();
    at::Tensor t;
    try {
      t = at::empty(sizes, at::TensorOptions().dtype(type));
    } catch (const c10::Error& e) {
      fail(std::string("a tensor cannot be made: ") + e.what_without_backtrace());
    }
    if (nbytes > 0) get(t.data_ptr(), nbytes);
    if (!d.tensors.emplace(std::move(name), std::move(t)).second) fail("a name appears twice");
  }
  for (auto n = get_count(16); n > 0; --n) {
    std::string name = get_string();
    if (!d.integers.emplace(std::move(name), get_value<std::int64_t>()).second) fail("a name appears twice");
  }
  for (auto n = get_count(16); n > 0; --n) {
    std::string name = get_string();
    if (!d.numbers.emplace(std::move(name), get_value<double>()).second) fail("a name appears twice");
  }
  for (auto n = get_count(16); n > 0; --n) {
    std::string name = get_string();
    if (!d.strings.emplace(std::move(name), get_string()).second) fail("a name appears twice");
  }
  finish();
  return d;
}

NITRO_INLINE void PartReader::verify_ahead() {
  PartHash hash = hash_;
  if (buffered() > 0) hash.update(buffer_.get() + used_, buffered());
  std::vector<char> piece(std::min<std::uint64_t>(left_, piece_bytes));
  for (std::uint64_t at = at_ + buffered(), left = left_ - buffered(); left > 0;) {
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(left, piece.size()));
    if (!io::pread_all(fd_, piece.data(), want, at)) fail("the file ends early or a read failed");
    hash.update(piece.data(), want);
    at += want;
    left -= want;
  }
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  if (hash.digest() != part_->checksum) fail("its checksum does not match (a changed or damaged byte)");
#endif
  verified_ = true;
}

NITRO_INLINE void PartReader::finish() {
  if (left_ != 0) fail("bytes are left over after its contents");
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION  // the fuzzer (tests/fuzz) reaches the decoder past it
  if (hash_.digest() != part_->checksum) fail("its checksum does not match (a changed or damaged byte)");
#endif
}

NITRO_INLINE void PartReader::skip_rest() {
  std::vector<char> piece(std::min<std::uint64_t>(left_, piece_bytes));
  while (left_ > 0) get(piece.data(), static_cast<std::size_t>(std::min<std::uint64_t>(left_, piece.size())));
}

NITRO_INLINE void PartReader::consumed(std::size_t n) noexcept {
  at_ += n;
  left_ -= n;
}

NITRO_INLINE void PartReader::refill() {
  if (!buffer_) buffer_ = std::make_unique_for_overwrite<char[]>(buffer_bytes);
  const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(left_, buffer_bytes));
  if (!io::pread_all(fd_, buffer_.get(), want, at_)) fail("the file ends early or a read failed");
  used_ = 0;
  filled_ = want;
}

NITRO_INLINE std::string hex16(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

NITRO_INLINE std::string manifest_text(const Manifest& m) {
  std::ostringstream out;
  out << "nitro-snapshot " << m.format_version << "\n"
      << "libtorch " << m.libtorch << "\n"
      << "nitro " << m.nitro << "\n"
      << "time " << m.time << "\n"
      << "step " << m.step << " " << m.micro_step << "\n";
  for (const auto& p : m.parts) out << "part " << p.name << " " << p.offset << " " << p.bytes << " " << hex16(p.checksum) << "\n";
  return std::move(out).str();
}

NITRO_INLINE std::optional<Manifest> parse_manifest(std::string_view text) {
  Manifest m;
  bool have_version = false, have_step = false;
  while (!text.empty()) {
    const auto eol = text.find('\n');
    if (eol == std::string_view::npos) return std::nullopt;  // every line ends with a newline
    const std::string line(text.substr(0, eol));
    text.remove_prefix(eol + 1);
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key == "nitro-snapshot") {
      in >> m.format_version;
      have_version = !in.fail();
    } else if (key == "libtorch") {
      in >> m.libtorch;
    } else if (key == "nitro") {
      in >> m.nitro;
    } else if (key == "time") {
      in >> m.time;
    } else if (key == "step") {
      in >> m.step >> m.micro_step;
      have_step = !in.fail();
    } else if (key == "part") {
      Manifest::Part p;
      std::string checksum;
      in >> p.name >> p.offset >> p.bytes >> checksum;
      if (in.fail() || checksum.size() != 16 || checksum.find_first_not_of("0123456789abcdef") != std::string::npos)
        return std::nullopt;
      p.checksum = std::stoull(checksum, nullptr, 16);
      m.parts.push_back(std::move(p));
    } else {
      return std::nullopt;
    }
    std::string extra;
    if (in >> extra) return std::nullopt;
  }
  if (!have_version || !have_step) return std::nullopt;
  return m;
}

NITRO_INLINE std::optional<std::pair<std::int64_t, std::int64_t>> snapshot_name_numbers(std::string_view name) noexcept {
  if (!name.starts_with("snapshot-") || !name.ends_with(".nitro")) return std::nullopt;
  name.remove_prefix(9);
  name.remove_suffix(6);
  const auto dash = name.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  const auto number = [](std::string_view digits) -> std::optional<std::int64_t> {
    if (digits.empty() || digits.size() > 18) return std::nullopt;
    std::int64_t v = 0;
    for (const char c : digits) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v * 10 + (c - '0');
    }
    return v;
  };
  const auto step = number(name.substr(0, dash)), micro = number(name.substr(dash + 1));
  if (!step || !micro) return std::nullopt;
  return std::pair{*step, *micro};
}

}  // namespace nitro::snapshot::detail

namespace nitro::snapshot {

NITRO_INLINE Reader::Reader(std::filesystem::path file) : file_(std::move(file)) {
  fd_.reset(::open(file_.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd_) {
    const int err = errno;
    ::nitro::detail::fail("nitro::snapshot: cannot open ", file_.string(), ": ", io::os_error(err),
                          "; give the path of a snapshot file (snapshot::latest(directory) finds the newest)");
  }
  struct ::stat st {};
  if (::fstat(fd_.get(), &st) != 0 || !S_ISREG(st.st_mode)) detail::corrupt(file_, "", "it is not a regular file");
  size_ = static_cast<std::uint64_t>(st.st_size);
  if (size_ < detail::header_bytes + detail::footer_bytes) detail::corrupt(file_, "", "it is too short (truncated?)");
  char header[detail::header_bytes];
  read_at(header, sizeof header, 0);
  if (std::memcmp(header, detail::header_magic, 8) != 0) detail::corrupt(file_, "", "it does not begin like a snapshot");
  // The version before anything else: a later format may place its footer elsewhere, or use the
  // reserved bytes.
  std::uint32_t version, reserved;
  std::memcpy(&version, header + 8, 4);
  std::memcpy(&reserved, header + 12, 4);
  NITRO_CHECK(version >= oldest_format_version && version <= snapshot::format_version, "nitro::snapshot: ",
              file_.string(), " has format version ", version, "; this Nitro (", version_string,
              ") reads format versions ", oldest_format_version, " and ", snapshot::format_version,
              ". Load it with the Nitro that wrote it; if none writes that version, the file is damaged");
  if (reserved != 0) detail::corrupt(file_, "", "the header's reserved bytes (12 to 15) are not zero");
  version_ = version;
  char footer[detail::footer_bytes];
  read_at(footer, sizeof footer, size_ - sizeof footer);
  if (std::memcmp(footer + 24, detail::footer_magic, 8) != 0)
    detail::corrupt(file_, "", "its footer is missing (the file was cut short or is damaged)");
  std::uint64_t offset, bytes, checksum;
  std::memcpy(&offset, footer, 8);
  std::memcpy(&bytes, footer + 8, 8);
  std::memcpy(&checksum, footer + 16, 8);
  if (bytes > detail::max_manifest_bytes || offset < detail::header_bytes ||
      offset > size_ - detail::footer_bytes || bytes != size_ - detail::footer_bytes - offset)
    detail::corrupt(file_, "", "its footer points outside the file");
  std::string text(bytes, '\0');
  read_at(text.data(), bytes, offset);
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  if (io::xxh64({reinterpret_cast<const std::byte*>(text.data()), text.size()}) != checksum)
    detail::corrupt(file_, "manifest", "its checksum does not match");
#else
  (void)checksum;
#endif
  auto manifest = detail::parse_manifest(text);
  if (!manifest) detail::corrupt(file_, "manifest", "it is not a manifest this Nitro can parse");
  // The header and the manifest agree, or one of them is damaged (or forged).
  if (manifest->format_version != version)
    detail::corrupt(file_, "manifest", ::nitro::detail::concat("it says format version ", manifest->format_version,
                                                               ", the header ", version));
  if (manifest->parts.size() > detail::max_parts) detail::corrupt(file_, "manifest", "it lists too many parts");
  std::set<std::string_view> names;
  for (const auto& p : manifest->parts) {
    if (p.offset < detail::header_bytes || p.offset > offset || p.bytes > offset - p.offset)
      detail::corrupt(file_, p.name, "the manifest places it outside the file");
    if (!names.insert(p.name).second) detail::corrupt(file_, p.name, "the manifest lists it twice");
  }
  manifest_ = std::move(*manifest);
}

NITRO_INLINE StateDict Reader::read(std::string_view part) const {
  const auto* p = manifest_.find(part);
  NITRO_CHECK(p != nullptr, "nitro::snapshot: ", file_.string(), " has no part \"", part,
              "\"; it was saved without it (see snapshot::Contents)");
  detail::PartReader in(fd_.get(), file_, *p, version_);
  StateDict d = in.get_dict();
  read_.push_back(p);
  return d;
}

NITRO_INLINE void Reader::verify_unread() const {
  for (const auto& p : manifest_.parts) {
    if (std::find(read_.begin(), read_.end(), &p) != read_.end()) continue;
    detail::PartReader in(fd_.get(), file_, p, version_);
    in.skip_rest();
    in.finish();
  }
}

NITRO_INLINE void Reader::verify() const {
  for (const auto& p : manifest_.parts) {
    detail::PartReader in(fd_.get(), file_, p, version_);
    in.skip_rest();
    in.finish();
  }
}

NITRO_INLINE void Reader::read_at(void* data, std::size_t n, std::uint64_t offset) const {
  if (!io::pread_all(fd_.get(), data, n, offset)) detail::corrupt(file_, "", "it ends early");
}

NITRO_INLINE std::optional<std::string> check(const std::filesystem::path& file) {
  try {
    Reader(file).verify();
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
}

NITRO_INLINE std::vector<std::filesystem::path> list(const std::filesystem::path& directory) {
  std::vector<std::pair<std::pair<std::int64_t, std::int64_t>, std::filesystem::path>> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(directory, ec)) {
    std::error_code ignored;
    if (const auto numbers = detail::snapshot_name_numbers(e.path().filename().string());
        numbers && e.is_regular_file(ignored))
      found.emplace_back(*numbers, e.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::filesystem::path> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

NITRO_INLINE std::optional<std::filesystem::path> latest(const std::filesystem::path& directory) {
  for (auto& file : list(directory))
    if (!check(file)) return file;
  return std::nullopt;
}

NITRO_INLINE std::size_t remove_temporary_files(const std::filesystem::path& directory) {
  std::size_t removed = 0;
  std::error_code ec;
  std::vector<std::filesystem::path> temps;
  for (const auto& e : std::filesystem::directory_iterator(directory, ec)) {
    const std::string name = e.path().filename().string();
    if (io::is_temp_name(name) && name.starts_with(".snapshot-")) temps.push_back(e.path());
  }
  for (const auto& t : temps) {
    std::error_code ignored;
    removed += std::filesystem::remove(t, ignored) ? 1 : 0;
  }
  return removed;
}

NITRO_INLINE std::string file_name(std::int64_t step, std::int64_t micro_step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "snapshot-%012lld-%06lld.nitro", static_cast<long long>(step),
                static_cast<long long>(micro_step));
  return buf;
}

}  // namespace nitro::snapshot

namespace nitro::snapshot::detail {

NITRO_INLINE StateDict model_part(torch::nn::Module& model) {
  StateDict d;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) d.tensors.emplace("param/" + p.key(), p.value());
  for (const auto& b : model.named_buffers(/*recurse=*/true))
    if (b.value().defined()) d.tensors.emplace("buffer/" + b.key(), b.value());
  return d;
}

NITRO_INLINE StateDict grads_part(torch::nn::Module& model) {
  StateDict d;
  for (const auto& p : model.named_parameters(/*recurse=*/true))
    if (p.value().grad().defined()) d.tensors.emplace(p.key(), p.value().grad());
  return d;
}

NITRO_INLINE std::string describe(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes() << " " << c10::toString(t.scalar_type());
  return std::move(out).str();
}

NITRO_INLINE void check_same_tensors(const std::filesystem::path& file, std::string_view part, const std::map<std::string, at::Tensor, std::less<>>& saved, const std::vector<std::pair<std::string, at::Tensor>>& live, std::string_view what) {
  for (const auto& [name, t] : live) {
    const auto it = saved.find(name);
    NITRO_CHECK(it != saved.end(), "nitro::snapshot: ", file.string(), ": part \"", part, "\" has no ", what, " \"",
                name, "\" that this model has; load a snapshot of the same model");
    NITRO_CHECK(it->second.sizes() == t.sizes() && it->second.scalar_type() == t.scalar_type(), "nitro::snapshot: ",
                file.string(), ": part \"", part, "\": ", what, " \"", name, "\" is ", describe(it->second),
                " in the snapshot and ", describe(t), " in this model; load a snapshot of the same model");
  }
  if (saved.size() != live.size()) {
    for (const auto& entry : saved) {
      const std::string& name = entry.first;
      const bool here = std::any_of(live.begin(), live.end(), [&](const auto& l) { return l.first == name; });
      NITRO_CHECK(here, "nitro::snapshot: ", file.string(), ": part \"", part, "\" has ", what, " \"", name,
                  "\", which this model does not have; load a snapshot of the same model");
    }
  }
}

NITRO_INLINE ModelLoad prepare_model(const std::filesystem::path& file, torch::nn::Module& model, StateDict&& saved, std::optional<StateDict>&& grads, std::string_view prefix) {
  const std::string model_name = ::nitro::detail::concat(prefix, "model"), grads_name = ::nitro::detail::concat(prefix, "grads");
  std::vector<std::pair<std::string, at::Tensor>> live;
  for (const auto& p : model.named_parameters(true)) live.emplace_back("param/" + p.key(), p.value());
  for (const auto& b : model.named_buffers(true))
    if (b.value().defined()) live.emplace_back("buffer/" + b.key(), b.value());
  check_same_tensors(file, model_name, saved.tensors, live, "parameter or buffer");
  ModelLoad out;
  for (auto& [name, t] : live) out.copies.emplace_back(t, std::move(saved.tensors.find(name)->second));
  if (grads) {
    std::vector<std::pair<std::string, at::Tensor>> params;
    for (const auto& p : model.named_parameters(true)) params.emplace_back(p.key(), p.value());
    for (const auto& entry : grads->tensors) {
      const std::string& name = entry.first;
      const at::Tensor& g = entry.second;
      const auto it = std::find_if(params.begin(), params.end(), [&](const auto& p) { return p.first == name; });
      NITRO_CHECK(it != params.end(), "nitro::snapshot: ", file.string(), ": part \"", grads_name, "\" has a gradient for \"",
                  name, "\", which this model does not have; load a snapshot of the same model");
      NITRO_CHECK(g.sizes() == it->second.sizes() && g.scalar_type() == it->second.scalar_type(),
                  "nitro::snapshot: ", file.string(), ": part \"", grads_name, "\": the gradient of \"", name, "\" is ",
                  describe(g), ", the parameter is ", describe(it->second));
    }
    for (auto& [name, p] : params) {
      const auto it = grads->tensors.find(name);
      out.grads.emplace_back(p, it != grads->tensors.end() ? it->second : at::Tensor{});
    }
  }
  return out;
}

NITRO_INLINE void copy_into(const std::vector<std::pair<at::Tensor, at::Tensor>>& copies) {
  struct Piece {
    char* to;
    const char* from;
    std::size_t bytes;
  };
  constexpr std::size_t piece_size = 4u << 20;
  std::vector<Piece> pieces;
  for (const auto& [live, saved] : copies) {
    if (live.device().is_cpu() && saved.device().is_cpu() && live.is_contiguous() && saved.is_contiguous() &&
        live.scalar_type() == saved.scalar_type() && live.nbytes() == saved.nbytes()) {
      auto* to = static_cast<char*>(live.data_ptr());
      const auto* from = static_cast<const char*>(saved.data_ptr());
      for (std::size_t at = 0; at < live.nbytes(); at += piece_size)
        pieces.push_back({to + at, from + at, std::min(piece_size, live.nbytes() - at)});
      live.unsafeGetTensorImpl()->bump_version();  // as copy_ does: autograd sees the change
    } else {
      live.detach().copy_(saved);
    }
  }
  std::atomic<std::size_t> next{0};
  const auto work = [&]() noexcept {
    for (std::size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < pieces.size();)
      std::memcpy(pieces[i].to, pieces[i].from, pieces[i].bytes);
  };
  const auto threads =
      std::min<std::size_t>(static_cast<std::size_t>(std::max(1, at::get_num_threads())), pieces.size());
  std::vector<std::thread> helpers;
  for (std::size_t t = 1; t < threads; ++t) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {  // no more threads: the others and this one do the rest
      break;
    }
  }
  work();
  for (auto& h : helpers) h.join();
}

NITRO_INLINE void apply_model(ModelLoad& load) {
  at::NoGradGuard no_grad;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies = load.copies;
  for (auto& [param, grad] : load.grads) {
    if (!grad.defined()) {
      param.mutable_grad() = at::Tensor{};
    } else if (param.grad().defined() && param.grad().sizes() == grad.sizes() &&
               param.grad().scalar_type() == grad.scalar_type()) {
      copies.emplace_back(param.grad(), grad);
    } else {
      param.mutable_grad() = grad.to(param.device(), /*non_blocking=*/false, /*copy=*/true);
    }
  }
  copy_into(copies);
}

NITRO_INLINE std::string serialize_options(const torch::optim::OptimizerOptions& options) {
  torch::serialize::OutputArchive archive;
  options.serialize(archive);
  std::ostringstream out;
  archive.save_to(out);
  return std::move(out).str();
}

NITRO_INLINE std::map<const void*, std::string> parameter_names(torch::nn::Module* model) {
  std::map<const void*, std::string> names;
  if (model != nullptr)
    for (const auto& p : model->named_parameters(true)) names.emplace(p.value().unsafeGetTensorImpl(), p.key());
  return names;
}

NITRO_INLINE std::string optimizer_type(const torch::optim::Optimizer& optimizer) {
  const auto& o = optimizer;
  return c10::demangle(typeid(o).name());
}

NITRO_INLINE StateDict optimizer_part(torch::optim::Optimizer& optimizer, torch::nn::Module* model) {
  StateDict d;
  const auto names = parameter_names(model);
  d.strings["type"] = optimizer_type(optimizer);
  auto& groups = optimizer.param_groups();
  d.integers["groups"] = static_cast<std::int64_t>(groups.size());
  std::int64_t k = 0;
  bool known = true;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string prefix = "group/" + std::to_string(g) + "/";
    d.integers[prefix + "params"] = static_cast<std::int64_t>(groups[g].params().size());
    if (groups[g].has_options()) d.strings[prefix + "options"] = serialize_options(groups[g].options());
    for (const auto& p : groups[g].params()) {
      const auto it = optimizer.state().find(p.unsafeGetTensorImpl());
      const std::string key = "state/" + std::to_string(k++) + "/";
      if (const auto name = names.find(p.unsafeGetTensorImpl()); name != names.end()) d.strings[key + "param"] = name->second;
      if (it == optimizer.state().end()) continue;
      known = known && memory::detail::with_state_type(*it->second, [&]<class S>() {
        auto& state = static_cast<S&>(*it->second);
        d.strings[key + "type"] = std::string(memory::detail::state_type_name<S>);
        if constexpr (memory::detail::state_has_step<S>) d.integers[key + "step"] = state.step();
        int i = 0;
        memory::detail::for_each_state_tensor(state, [&](const at::Tensor& t, auto) {
          if (t.defined()) d.tensors.emplace(key + std::to_string(i), t);
          ++i;
        });
      });
    }
  }
  if (!known) {  // an optimizer whose state is not one of those above: LibTorch's own form, whole
    d = StateDict{};
    d.strings["type"] = optimizer_type(optimizer);
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    std::ostringstream out;
    archive.save_to(out);
    d.strings["torch_archive"] = std::move(out).str();
  }
  return d;
}

NITRO_INLINE OptimizerLoad prepare_optimizer(const std::filesystem::path& file, torch::optim::Optimizer& optimizer, const StateDict& saved, torch::nn::Module* model, std::string_view part_prefix) {
  OptimizerLoad out;
  const std::string owner = ::nitro::detail::concat("nitro::snapshot: part \"", part_prefix, "optimizer\"");
  const auto bad = [&](auto&&... what) {
    ::nitro::detail::fail("nitro::snapshot: ", file.string(), ": part \"", part_prefix, "optimizer\": ", what...,
                          "; load a snapshot of the same optimizer over the same parameters");
  };
  // The optimizer's own type: Adam's state in an AdamW (the same options) would pass every other check.
  if (const auto type = saved.strings.find("type"); type == saved.strings.end() || type->second != optimizer_type(optimizer))
    bad("the snapshot's optimizer is ", type != saved.strings.end() ? type->second : std::string("unnamed"),
        ", this one ", optimizer_type(optimizer));
  const auto names = parameter_names(model);
  if (const auto it = saved.strings.find("torch_archive"); it != saved.strings.end()) {
    // LibTorch's API checks this form only by loading it into the optimizer: load() does that first,
    // with a backup to put back if it fails.
    out.torch_archive = it->second;
    return out;
  }
  auto& groups = optimizer.param_groups();
  const auto n = saved.integer("groups", owner);
  if (n != static_cast<std::int64_t>(groups.size()))
    bad("the snapshot has ", n, " parameter groups, this optimizer ", groups.size());
  std::int64_t k = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string prefix = "group/" + std::to_string(g) + "/";
    const auto count = saved.integer(prefix + "params", owner);
    if (count != static_cast<std::int64_t>(groups[g].params().size()))
      bad("group ", g, " has ", count, " parameters in the snapshot and ", groups[g].params().size(), " here");
    const auto opt = saved.strings.find(prefix + "options");
    if (opt != saved.strings.end() && groups[g].has_options()) {
      auto options = groups[g].options().clone();
      try {
        torch::serialize::InputArchive archive;
        std::istringstream in(opt->second);
        archive.load_from(in);
        options->serialize(archive);
      } catch (const std::exception& e) {
        bad("the options of group ", g, " do not load into this optimizer's (", e.what(), ")");
      }
      out.options.push_back(std::move(options));
    } else {
      if ((opt != saved.strings.end()) != groups[g].has_options())
        bad("group ", g, opt != saved.strings.end() ? " has options in the snapshot and none here" : " has no options in the snapshot");
      out.options.push_back(nullptr);
    }
    for (const auto& p : groups[g].params()) {
      const std::string key = "state/" + std::to_string(k++) + "/";
      // Parameters matched by position, as LibTorch does; with the model at hand, their names agree too.
      if (const auto saved_name = saved.strings.find(key + "param"); saved_name != saved.strings.end()) {
        const auto name = names.find(p.unsafeGetTensorImpl());
        if (name != names.end() && name->second != saved_name->second)
          bad("its parameter ", k - 1, " (group ", g, ") is \"", saved_name->second, "\" in the snapshot and \"",
              name->second, "\" here: this optimizer lists its parameters in another order");
      }
      const auto type = saved.strings.find(key + "type");
      if (type == saved.strings.end()) continue;  // no state yet (no step taken)
      std::unique_ptr<torch::optim::OptimizerParamState> state;
      const bool known = memory::detail::with_state_type_named(type->second, [&]<class S>() {
        auto s = std::make_unique<S>();
        if constexpr (memory::detail::state_has_step<S>) s->step(saved.integer(key + "step", owner));
        int i = 0;
        memory::detail::for_each_state_tensor(*s, [&](const at::Tensor&, auto set) {
          const auto t = saved.tensors.find(key + std::to_string(i++));
          if (t == saved.tensors.end()) return;
          if (t->second.sizes() != p.sizes())
            bad("the state of parameter ", k - 1, " (group ", g, ") is ", describe(t->second), ", the parameter ",
                describe(p));
          set(t->second);
        });
        state = std::move(s);
      });
      if (!known) bad("parameter ", k - 1, " has a state of unknown type \"", type->second, "\"");
      // The optimizer's own type must make this kind of state: Adam's state in an SGD is refused.
      if (const auto live = optimizer.state().find(p.unsafeGetTensorImpl()); live != optimizer.state().end()) {
        const auto& live_state = *live->second;
        const auto& saved_state = *state;
        if (typeid(live_state) != typeid(saved_state))
          bad("parameter ", k - 1, " has a ", type->second, " state in the snapshot and another kind here");
      }
      out.states.emplace_back(p.unsafeGetTensorImpl(), std::move(state));
    }
  }
  return out;
}

NITRO_INLINE void apply_optimizer(torch::optim::Optimizer& optimizer, OptimizerLoad& load) {
  if (load.torch_archive) {
    optimizer.state().clear();
    torch::serialize::InputArchive archive;
    std::istringstream in(*load.torch_archive);
    archive.load_from(in);
    optimizer.load(archive);
    return;
  }
  auto& groups = optimizer.param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (load.options[g]) groups[g].set_options(std::move(load.options[g]));
  std::map<void*, c10::Device> devices;
  for (auto& group : groups)
    for (const auto& p : group.params()) devices.emplace(p.unsafeGetTensorImpl(), p.device());
  optimizer.state().clear();
  for (auto& entry : load.states) {
    void* const key = entry.first;
    auto& state = entry.second;
    const auto device = devices.at(key);
    memory::detail::with_state_type(*state, [&]<class S>() {
      memory::detail::for_each_state_tensor(static_cast<S&>(*state), [&](const at::Tensor& t, auto set) {
        if (t.defined() && t.device() != device) set(t.to(device, false, true));
      });
    });
    optimizer.state()[key] = std::move(state);
  }
}

NITRO_INLINE StateDict rng_part() {
  StateDict d;
  {
    auto cpu = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(cpu.mutex());
    d.tensors["cpu"] = cpu.get_state();
  }
#if NITRO_WITH_CUDA
  if (c10::cuda::device_count() > 0)
    for (c10::DeviceIndex i = 0; i < static_cast<c10::DeviceIndex>(c10::cuda::device_count()); ++i) {
      auto gen = at::cuda::detail::getDefaultCUDAGenerator(i);
      std::lock_guard<std::mutex> lock(gen.mutex());
      d.tensors["cuda/" + std::to_string(i)] = gen.get_state();
    }
#endif
  return d;
}

NITRO_INLINE void check_rng(const std::filesystem::path& file, const StateDict& saved) {
  const auto cpu = saved.tensors.find("cpu");
  const at::Tensor now = at::detail::getDefaultCPUGenerator().get_state();
  NITRO_CHECK(cpu != saved.tensors.end() && cpu->second.sizes() == now.sizes() &&
                  cpu->second.scalar_type() == now.scalar_type(),
              "nitro::snapshot: ", file.string(), ": part \"rng\" holds no CPU generator state of this LibTorch's form");
}

NITRO_INLINE void apply_rng(const StateDict& saved) {
  {
    auto cpu = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_state(saved.tensors.at("cpu"));
  }
#if NITRO_WITH_CUDA
  if (c10::cuda::device_count() > 0)
    for (c10::DeviceIndex i = 0; i < static_cast<c10::DeviceIndex>(c10::cuda::device_count()); ++i)
      if (const auto it = saved.tensors.find("cuda/" + std::to_string(i)); it != saved.tensors.end())
      {
        auto gen = at::cuda::detail::getDefaultCUDAGenerator(i);
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(it->second);
      }
#endif
}

NITRO_INLINE StateDict sampler_part(const data::SamplerState& s) {
  StateDict d;
  d.integers["seed"] = static_cast<std::int64_t>(s.seed);
  d.integers["epoch"] = s.epoch;
  d.integers["index"] = s.index;
  d.integers["size"] = s.size;
  d.integers["shuffle"] = s.shuffle ? 1 : 0;
  if (s.shards != 1) d.integers["shards"] = s.shards;
  return d;
}

NITRO_INLINE data::SamplerState sampler_state(const StateDict& d) {
  constexpr std::string_view owner = "nitro::snapshot: part \"data\"";
  const auto shards = d.integers.find("shards");  // written by sharded samplers only
  return {static_cast<std::uint64_t>(d.integer("seed", owner)), d.integer("epoch", owner), d.integer("index", owner),
          d.integer("size", owner), d.integer("shuffle", owner) != 0, shards == d.integers.end() ? 1 : shards->second};
}

NITRO_INLINE void save(const std::filesystem::path& file, std::span<const Unit> units, const Contents& c, const SaveOptions& options) {
  ::nitro::detail::check_library_version();
  const std::uint32_t version = options.format_version;
  NITRO_CHECK(version >= oldest_format_version && version <= format_version, "nitro::snapshot::save: ",
              file.string(), ": SaveOptions::format_version is ", version, "; this Nitro writes format versions ",
              oldest_format_version, " and ", format_version);
  NITRO_CHECK(!options.step || *options.step >= 0, "nitro::snapshot::save: ", file.string(),
              ": SaveOptions::step must be >= 0, got ", options.step.value_or(0));
  if (file.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(file.parent_path(), ec);
  }
  io::AtomicFile out(file, {.fsync = options.fsync});
  char header[header_bytes] = {};
  std::memcpy(header, header_magic, 8);
  std::memcpy(header + 8, &version, 4);
  out.write(header, sizeof header);
  PartWriter w(out, header_bytes, version);
  Manifest m{version, libtorch_version(), version_string, utc_now(), 0, 0, {}};
  const auto part = [&](std::string name, const StateDict& d) {
    w.begin(name);
    w.put_dict(d, name);
    m.parts.push_back(w.end());
  };
  bool first_loop = true;
  for (const Unit& u : units) {
    if (u.model != nullptr) {
      part(u.prefix + "model", model_part(*u.model));
      part(u.prefix + "grads", grads_part(*u.model));
    }
    if (u.optimizer != nullptr) part(u.prefix + "optimizer", optimizer_part(*u.optimizer, u.model));
    if (u.loop != nullptr) {
      auto [dict, hooks] = u.loop->save();
      dict.strings["policies"] = u.loop->policies;
      part(u.prefix + "loop", dict);
      for (const auto& [name, d] : hooks) part(u.prefix + "hook/" + name, d);
      if (first_loop) {
        m.step = u.loop->step;
        m.micro_step = u.loop->micro_step;
      }
      first_loop = false;
    }
  }
  if (options.step) {
    m.step = *options.step;
    m.micro_step = 0;
  }
  if (c.rng) part("rng", rng_part());
  if (c.sampler != nullptr) part("data", sampler_part(c.sampler->state()));
  if (c.extras != nullptr) part("extras", *c.extras);
  const std::string text = manifest_text(m);
  const std::uint64_t offset = w.offset();
  out.write(text.data(), text.size());
  char footer[footer_bytes];
  const std::uint64_t bytes = text.size();
  const std::uint64_t checksum = io::xxh64({reinterpret_cast<const std::byte*>(text.data()), text.size()});
  std::memcpy(footer, &offset, 8);
  std::memcpy(footer + 8, &bytes, 8);
  std::memcpy(footer + 16, &checksum, 8);
  std::memcpy(footer + 24, footer_magic, 8);
  out.write(footer, sizeof footer);
  if (!out.commit())
    ::nitro::detail::fail("nitro::snapshot: ", file.string(), " is written, but the fsync of its directory failed (",
                          io::os_error(errno), "): it may not survive a machine crash; check the disk");
}

NITRO_INLINE void save(const std::filesystem::path& file, const Contents& c, const LoopAccess* loop, const SaveOptions& options) {
  const Unit unit{"", c.model, c.optimizer, loop};
  save(file, std::span<const Unit>(&unit, 1), c, options);
}

NITRO_INLINE Manifest load(const std::filesystem::path& file, std::span<const Unit> units, const Contents& c) {
  ::nitro::detail::check_library_version();
  Reader reader(file);
  std::vector<UnitLoad> loads(units.size());
  for (std::size_t i = 0; i < units.size(); ++i) {
    const Unit& u = units[i];
    UnitLoad& l = loads[i];
    if (u.model != nullptr) {
      const std::string grads = u.prefix + "grads";
      l.model = prepare_model(file, *u.model, reader.read(u.prefix + "model"),
                              reader.has(grads) ? std::optional<StateDict>(reader.read(grads)) : std::nullopt, u.prefix);
    }
    if (u.optimizer != nullptr)
      l.optimizer = prepare_optimizer(file, *u.optimizer, reader.read(u.prefix + "optimizer"), u.model, u.prefix);
    if (u.loop != nullptr) {
      l.loop_dict = reader.read(u.prefix + "loop");
      const auto policies = l.loop_dict->strings.find("policies");
      NITRO_CHECK(policies != l.loop_dict->strings.end() && policies->second == u.loop->policies, "nitro::snapshot: ",
                  file.string(), ": part \"", u.prefix, "loop\": the snapshot's loop has the policies \"",
                  policies != l.loop_dict->strings.end() ? policies->second : std::string("?"), "\", this loop \"",
                  u.loop->policies, "\"; load it into a loop of the same AMP, accumulation and clip policies");
      const std::string hook_prefix = u.prefix + "hook/";
      for (const auto& p : reader.manifest().parts)
        if (p.name.starts_with(hook_prefix)) l.hooks.emplace(p.name.substr(hook_prefix.size()), reader.read(p.name));
    }
  }
  std::optional<StateDict> rng;
  if (c.rng) {
    rng = reader.read("rng");
    check_rng(file, *rng);
  }
  std::optional<data::SamplerState> sampler;
  if (c.sampler != nullptr) sampler = sampler_state(reader.read("data"));
  std::optional<StateDict> extras;
  if (c.extras != nullptr) extras = reader.read("extras");
  reader.verify_unread();  // every part's checksum, those not loaded too, before anything changes
  // The sampler checks its state against itself without changing it; then a copy is loaded below.
  if (sampler) {
    try {
      c.sampler->check_state(*sampler);
    } catch (const Error& e) {
      ::nitro::detail::fail("nitro::snapshot: ", file.string(), ": part \"data\": ", e.what());
    }
  }
  // Everything is read and checked; each loop's load_state checks its own state and hooks last. A
  // loop that refuses its state has the loops loaded before it put back.
  const auto undo_loops = [&](std::size_t upto) {
    for (std::size_t j = upto; j-- > 0;)
      if (loads[j].loop_before) units[j].loop->load(loads[j].loop_before->first, loads[j].loop_before->second);
  };
  for (std::size_t i = 0; i < units.size(); ++i) {
    if (units[i].loop == nullptr) continue;
    loads[i].loop_before = units[i].loop->save();
    try {
      units[i].loop->load(*loads[i].loop_dict, loads[i].hooks);
    } catch (const std::exception& e) {  // a hook's load_state_dict may throw anything
      loads[i].loop_before.reset();
      undo_loops(i);
      ::nitro::detail::fail("nitro::snapshot: ", file.string(), ": part \"", units[i].prefix, "loop\": ", e.what());
    } catch (...) {
      loads[i].loop_before.reset();
      undo_loops(i);
      throw;
    }
  }
  // An optimizer in LibTorch's own form is checked only by loading it: if that fails, it, the
  // optimizers loaded before it and the loops are put back, and nothing else has changed yet.
  std::vector<std::unique_ptr<memory::StateBackup>> backups;
  for (std::size_t i = 0; i < units.size(); ++i) {
    if (!loads[i].optimizer || !loads[i].optimizer->torch_archive) continue;
    backups.push_back(std::make_unique<memory::StateBackup>(nullptr, units[i].optimizer));
    try {
      apply_optimizer(*units[i].optimizer, *loads[i].optimizer);
    } catch (const std::exception& e) {
      for (auto it = backups.rbegin(); it != backups.rend(); ++it) (*it)->restore();
      undo_loops(units.size());
      ::nitro::detail::fail("nitro::snapshot: ", file.string(), ": part \"", units[i].prefix,
                            "optimizer\" does not load into this optimizer (", e.what(),
                            "); load a snapshot of the same optimizer");
    }
  }
  for (auto& l : loads)
    if (l.model) apply_model(*l.model);
  for (std::size_t i = 0; i < units.size(); ++i)
    if (loads[i].optimizer && !loads[i].optimizer->torch_archive) apply_optimizer(*units[i].optimizer, *loads[i].optimizer);
  if (sampler) c.sampler->load_state(*sampler);
  if (rng) apply_rng(*rng);
  if (extras) *c.extras = std::move(*extras);
  return reader.manifest();
}

NITRO_INLINE Manifest load(const std::filesystem::path& file, const Contents& c, const LoopAccess* loop) {
  const Unit unit{"", c.model, c.optimizer, loop};
  return load(file, std::span<const Unit>(&unit, 1), c);
}

}  // namespace nitro::snapshot::detail

namespace nitro::snapshot {

NITRO_INLINE void save(const std::filesystem::path& file, const Contents& contents, const SaveOptions& options) {
  detail::save(file, contents, nullptr, options);
}

NITRO_INLINE Manifest load(const std::filesystem::path& file, const Contents& contents) {
  return detail::load(file, contents, nullptr);
}

}  // namespace nitro::snapshot

namespace nitro::snapshot::detail {

NITRO_INLINE NamedUnits::NamedUnits(std::string_view what, const std::filesystem::path& file, std::span<const Named> loops) {
  NITRO_CHECK(!loops.empty(), "nitro::snapshot::", what, ": ", file.string(), ": no loops given; give "
              "{{\"generator\", g_loop}, {\"discriminator\", d_loop}}, or save(file, loop) for one");
  access.reserve(loops.size());
  for (std::size_t i = 0; i < loops.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      NITRO_CHECK(loops[i].name() != loops[j].name(), "nitro::snapshot::", what, ": ", file.string(),
                  ": two loops are named \"", loops[i].name(), "\"; give each its own name");
      NITRO_CHECK(&loops[i].model() != &loops[j].model() && &loops[i].optimizer() != &loops[j].optimizer(),
                  "nitro::snapshot::", what, ": ", file.string(), ": the loops \"", loops[j].name(), "\" and \"",
                  loops[i].name(), "\" share a model or an optimizer; each loop of a snapshot trains its own");
    }
    access.push_back(loops[i].access());
  }
  for (std::size_t i = 0; i < loops.size(); ++i)
    units.push_back(Unit{loops[i].name() + "/", &loops[i].model(), &loops[i].optimizer(), &access[i]});
}

}  // namespace nitro::snapshot::detail

namespace nitro::snapshot {

NITRO_INLINE void save(const std::filesystem::path& file, std::span<const Named> loops, const Contents& contents, const SaveOptions& options) {
  NITRO_CHECK(contents.model == nullptr && contents.optimizer == nullptr, "nitro::snapshot::save: ", file.string(),
              ": with several loops, Contents::model and ::optimizer must be null (each loop brings its own)");
  const detail::NamedUnits u("save", file, loops);
  detail::save(file, u.units, contents, options);
}

NITRO_INLINE void save(const std::filesystem::path& file, std::initializer_list<Named> loops, const Contents& contents, const SaveOptions& options) {
  save(file, std::span<const Named>(loops.begin(), loops.size()), contents, options);
}

NITRO_INLINE Manifest load(const std::filesystem::path& file, std::span<const Named> loops, const Contents& contents) {
  NITRO_CHECK(contents.model == nullptr && contents.optimizer == nullptr, "nitro::snapshot::load: ", file.string(),
              ": with several loops, Contents::model and ::optimizer must be null (each loop brings its own)");
  bool adopts = false;
  for (const auto& l : loops) adopts = adopts || static_cast<bool>(l.adopt());
  if (adopts) {  // level::Auto loops: their choices first
    Reader reader(file);
    for (const auto& l : loops)
      if (l.adopt()) l.adopt()(reader.read(l.name() + "/loop"));
  }
  const detail::NamedUnits u("load", file, loops);
  auto manifest = detail::load(file, u.units, contents);
  for (const auto& l : loops)
    if (l.after_load()) l.after_load()();
  return manifest;
}

NITRO_INLINE Manifest load(const std::filesystem::path& file, std::initializer_list<Named> loops, const Contents& contents) {
  return load(file, std::span<const Named>(loops.begin(), loops.size()), contents);
}

}  // namespace nitro::snapshot
