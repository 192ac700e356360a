#pragma once
// The definitions of nitro/monitor/sinks.hpp's non-template functions: included by sinks.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/monitor/sinks.hpp>

namespace nitro::monitor::detail {

NITRO_INLINE void append_int(std::string& out, std::int64_t value) {
  char text[24];
  const auto end = std::to_chars(text, text + sizeof text, value).ptr;
  out.append(text, end);
}

NITRO_INLINE void append_double(std::string& out, double value) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, value).ptr;
  out.append(text, end);
}

NITRO_INLINE LineFile::LineFile(const char* sink, std::filesystem::path path, SinkOptions options) : sink_(sink), path_(std::move(path)), options_(options) {
  NITRO_CHECK(options_.fsync_every >= 0, sink_, ": fsync_every must be >= 0 (0: never fsync), got ",
              options_.fsync_every);
  NITRO_CHECK(!path_.empty(), sink_, ": the path is empty; name the file to write, e.g. \"metrics.", sink_ext(),
              "\"");
  if (!options_.every_rank && !nitro::is_main_process()) {  // rank 0 writes this file
    inert_ = true;
    return;
  }
  std::error_code ec;
  if (std::filesystem::is_directory(path_, ec)) {
    fail_open(EISDIR);
  }
  if (options_.append) {
    // What is there already: its first line (CsvSink checks the header) and whether it ends a line
    // (a crash mid-write leaves a partial last line, which the next row must not be glued to).
    std::ifstream in(path_, std::ios::binary);
    if (in) {
      std::getline(in, first_line_);
      in.clear();
      in.seekg(0, std::ios::end);
      const auto size = static_cast<std::int64_t>(in.tellg());
      existing_bytes_ = size > 0 ? size : 0;
      if (existing_bytes_ > 0) {
        in.seekg(-1, std::ios::end);
        char last = '\n';
        in.get(last);
        partial_line_ = last != '\n';
      }
    }
  }
  errno = 0;
  file_ = std::fopen(path_.c_str(), options_.append ? "ab" : "wb");
  if (file_ == nullptr) fail_open(errno);
}

NITRO_INLINE LineFile::LineFile(LineFile&& other) noexcept : sink_(other.sink_),
      path_(std::move(other.path_)),
      options_(other.options_),
      file_(std::exchange(other.file_, nullptr)),
      rows_(other.rows_),
      existing_bytes_(other.existing_bytes_),
      partial_line_(other.partial_line_),
      first_line_(std::move(other.first_line_)),
      inert_(other.inert_) {}

NITRO_INLINE LineFile& LineFile::operator=(LineFile&& other) noexcept {
  if (this != &other) {
    close_quietly();
    sink_ = other.sink_;
    path_ = std::move(other.path_);
    options_ = other.options_;
    file_ = std::exchange(other.file_, nullptr);
    rows_ = other.rows_;
    existing_bytes_ = other.existing_bytes_;
    partial_line_ = other.partial_line_;
    first_line_ = std::move(other.first_line_);
    inert_ = other.inert_;
  }
  return *this;
}

NITRO_INLINE void LineFile::put_row(const std::string& line) {
  put(line);
  ++rows_;
  if (options_.fsync_every > 0 && rows_ % options_.fsync_every == 0) sync();
}

NITRO_INLINE void LineFile::put(const std::string& text) {
  if (inert_) return;
  NITRO_CHECK(file_ != nullptr, sink_, ": write after close() of '", path_.string(), "'; open a new sink");
  if (partial_line_) [[unlikely]] {  // a crash cut the last line short: start a new one
    partial_line_ = false;
    put("\n");
  }
  errno = 0;
  const auto written = std::fwrite(text.data(), 1, text.size(), file_);
  if (written != text.size() || std::fflush(file_) != 0) fail_io("write to");
}

NITRO_INLINE void LineFile::flush() {
  if (file_ == nullptr) return;
  errno = 0;
  if (std::fflush(file_) != 0) fail_io("flush");
}

NITRO_INLINE void LineFile::sync() {
  flush();
  if (file_ == nullptr) return;
  errno = 0;
  if (::fsync(::fileno(file_)) != 0 && errno != EINVAL && errno != EROFS) fail_io("fsync");
}

NITRO_INLINE void LineFile::close() {
  if (file_ == nullptr) return;
  std::FILE* file = file_;
  bool ok = true;
  int error = 0;
  errno = 0;
  if (std::fflush(file) != 0) {
    ok = false;
    error = errno;
  }
  if (ok && options_.fsync_every > 0 && ::fsync(::fileno(file)) != 0 && errno != EINVAL && errno != EROFS) {
    ok = false;
    error = errno;
  }
  file_ = nullptr;
  if (std::fclose(file) != 0 && ok) {
    ok = false;
    error = errno;
  }
  if (!ok) {
    errno = error;
    fail_io("close");
  }
}

NITRO_INLINE void LineFile::close_quietly() noexcept {
  try {
    close();
  } catch (...) {  // NOLINT(bugprone-empty-catch): destructors and moves must not throw
  }
}

NITRO_INLINE void LineFile::fail_open(int error) const {
  const char* hint = "check that the directory exists and is writable";
  if (error == ENOENT) {
    hint = "create its directory first (std::filesystem::create_directories) or choose another path";
  } else if (error == EISDIR) {
    hint = "it is a directory: name a file inside it, e.g. dir/metrics.csv";
  } else if (error == EACCES || error == EPERM || error == EROFS) {
    hint = "choose a path you may write to";
  }
  ::nitro::detail::fail(sink_, ": cannot open '", path_.string(), "' for writing: ",
                        error != 0 ? std::strerror(error) : "unknown error", "; ", hint);
}

NITRO_INLINE void LineFile::fail_io(const char* what) const {
  const int error = errno;
  ::nitro::detail::fail(sink_, ": cannot ", what, " '", path_.string(), "': ",
                        error != 0 ? std::strerror(error) : "I/O error",
                        "; check the free space and that the file system is still mounted");
}

NITRO_INLINE SinkFile::SinkFile(const char* sink, std::filesystem::path path, SinkOptions options) : file_(sink, std::move(path), options) {}

}  // namespace nitro::monitor::detail

namespace nitro::monitor {

NITRO_INLINE CsvSink::CsvSink(std::filesystem::path path, SinkOptions options) : SinkFile("CsvSink", std::move(path), options) {
  if (file_.existing_bytes() > 0) {
    NITRO_CHECK(file_.first_line() == detail::metric_header, "CsvSink: cannot append to '", file_.path().string(),
                "': its first line is not the header '", detail::metric_header,
                "'; append to a file a CsvSink wrote, or open without append to replace it");
  } else {
    file_.put(std::string(detail::metric_header) + "\n");
  }
}

NITRO_INLINE void CsvSink::write(const MetricRow& row) {
  std::string line;
  line.reserve(160);
  detail::append_int(line, row.step);
  line += ',';
  field(line, row.time_s);
  line += ',';
  field(line, row.loss);
  line += ',';
  field(line, row.lr);
  line += ',';
  field(line, row.scale);
  line += ',';
  field(line, row.samples_per_s);
  line += ',';
  field(line, row.memory_bytes);
  line += ',';
  field(line, row.peak_memory_bytes);
  line += '\n';
  file_.put_row(line);
}

NITRO_INLINE void CsvSink::field(std::string& out, double value) {
  if (!std::isnan(value)) detail::append_double(out, value);
}

NITRO_INLINE void CsvSink::field(std::string& out, std::int64_t value) {
  if (value >= 0) detail::append_int(out, value);
}

NITRO_INLINE JsonLinesSink::JsonLinesSink(std::filesystem::path path, SinkOptions options) : SinkFile("JsonLinesSink", std::move(path), options) {}

NITRO_INLINE void JsonLinesSink::write(const MetricRow& row) {
  std::string line;
  line.reserve(200);
  line += "{\"step\":";
  detail::append_int(line, row.step);
  field(line, ",\"time_s\":", row.time_s);
  field(line, ",\"loss\":", row.loss);
  field(line, ",\"lr\":", row.lr);
  field(line, ",\"scale\":", row.scale);
  field(line, ",\"samples_per_s\":", row.samples_per_s);
  field(line, ",\"memory_bytes\":", row.memory_bytes);
  field(line, ",\"peak_memory_bytes\":", row.peak_memory_bytes);
  line += "}\n";
  file_.put_row(line);
}

NITRO_INLINE void JsonLinesSink::field(std::string& out, std::string_view key, double value) {
  out += key;
  if (std::isfinite(value)) {
    detail::append_double(out, value);
  } else {
    out += "null";
  }
}

NITRO_INLINE void JsonLinesSink::field(std::string& out, std::string_view key, std::int64_t value) {
  out += key;
  if (value >= 0) {
    detail::append_int(out, value);
  } else {
    out += "null";
  }
}

}  // namespace nitro::monitor
