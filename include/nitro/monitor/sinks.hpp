#pragma once
// Metric rows to files, one line per row, each on disk (in the OS's page cache) as soon as written:
//
//   CsvSink        step,time_s,loss,lr,scale,samples_per_s,memory_bytes,peak_memory_bytes, then rows;
//                  for spreadsheets, pandas.read_csv. Unknown values are empty fields.
//   JsonLinesSink  one JSON object per line, unknown values null; for bench/plot_metrics.py,
//                  pandas.read_json(lines=True), jq.
//   Sinks<S...>    writes every row to each of several sinks.
//
//   nitro::monitor::JsonLinesSink metrics{"runs/a/metrics.jsonl"};
//   metrics.write({.step = step, .time_s = seconds, .loss = loss.item<double>(), .lr = lr});
//
// Each row is formatted into one buffer, written with one fwrite and fflush'ed, so a crash loses at
// most the line being written; with fsync_every = N every Nth row is also fsync'ed (survives a
// power cut, costs a disk flush). Doubles are written in the shortest form that reads back to the
// same value (std::to_chars). Opening a path that cannot be written throws nitro::Error naming the
// path and the system's reason. Not thread-safe: write from one thread, or guard the sink.
#include <nitro/core/error.hpp>
#include <nitro/core/rank.hpp>

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

namespace nitro::monitor {

/// One sample of a run's metrics. NaN (doubles) and -1 (byte counts) mean "not known".
struct MetricRow {
  std::int64_t step = 0;
  /// Seconds since the run started.
  double time_s = 0;
  double loss = std::numeric_limits<double>::quiet_NaN();
  double lr = std::numeric_limits<double>::quiet_NaN();
  /// The fp16 loss scale; NaN when there is none.
  double scale = std::numeric_limits<double>::quiet_NaN();
  double samples_per_s = std::numeric_limits<double>::quiet_NaN();
  /// CUDA bytes allocated, or CPU resident bytes; -1 unknown.
  std::int64_t memory_bytes = -1;
  std::int64_t peak_memory_bytes = -1;
};

/// How a sink opens and syncs its file.
struct SinkOptions {
  /// Add to an existing file instead of replacing it (a CsvSink then writes no second header).
  bool append = false;
  /// fsync the file every this many rows, and at close; 0: never (fflush only).
  std::int64_t fsync_every = 0;
  /// Write in every process (give each its own path); false: only rank 0 (nitro::is_main_process(),
  /// core/rank.hpp) opens and writes the file, the other ranks' sinks write nothing.
  bool every_rank = false;
};

/// What Sinks<S...> needs of each sink.
template <class S>
concept MetricSink = requires(S& sink, const MetricRow& row) {
  sink.write(row);
  sink.flush();
  sink.close();
};

namespace detail {

/// The column names, in the order of MetricRow's fields.
inline constexpr std::string_view metric_header = "step,time_s,loss,lr,scale,samples_per_s,memory_bytes,peak_memory_bytes";

inline void append_int(std::string& out, std::int64_t value) {
  char text[24];
  const auto end = std::to_chars(text, text + sizeof text, value).ptr;
  out.append(text, end);
}

/// Shortest round-trip form; non-finite values as given.
inline void append_double(std::string& out, double value) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, value).ptr;
  out.append(text, end);
}

/// An append-only text file written line by line: the part CsvSink and JsonLinesSink share.
class LineFile {
 public:
  LineFile(const char* sink, std::filesystem::path path, SinkOptions options)
      : sink_(sink), path_(std::move(path)), options_(options) {
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

  LineFile(const LineFile&) = delete;
  LineFile& operator=(const LineFile&) = delete;
  LineFile(LineFile&& other) noexcept
      : sink_(other.sink_),
        path_(std::move(other.path_)),
        options_(other.options_),
        file_(std::exchange(other.file_, nullptr)),
        rows_(other.rows_),
        existing_bytes_(other.existing_bytes_),
        partial_line_(other.partial_line_),
        first_line_(std::move(other.first_line_)),
        inert_(other.inert_) {}
  LineFile& operator=(LineFile&& other) noexcept {
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
  ~LineFile() { close_quietly(); }

  /// Writes `line` (which ends in '\n') with one fwrite, flushes, and fsyncs when due.
  void put_row(const std::string& line) {
    put(line);
    ++rows_;
    if (options_.fsync_every > 0 && rows_ % options_.fsync_every == 0) sync();
  }

  void put(const std::string& text) {
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

  void flush() {
    if (file_ == nullptr) return;
    errno = 0;
    if (std::fflush(file_) != 0) fail_io("flush");
  }

  void sync() {
    flush();
    if (file_ == nullptr) return;
    errno = 0;
    if (::fsync(::fileno(file_)) != 0 && errno != EINVAL && errno != EROFS) fail_io("fsync");
  }

  void close() {
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

  [[nodiscard]] bool is_open() const noexcept { return file_ != nullptr; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  [[nodiscard]] std::int64_t rows() const noexcept { return rows_; }
  /// With append: the bytes that were in the file before it was opened (0 for a new file).
  [[nodiscard]] std::int64_t existing_bytes() const noexcept { return existing_bytes_; }
  /// With append: the first line that was in the file ("" for a new or empty file).
  [[nodiscard]] const std::string& first_line() const noexcept { return first_line_; }
  [[nodiscard]] const char* sink() const noexcept { return sink_; }

 private:
  const char* sink_ext() const { return std::strcmp(sink_, "CsvSink") == 0 ? "csv" : "jsonl"; }

  void close_quietly() noexcept {
    try {
      close();
    } catch (...) {  // NOLINT(bugprone-empty-catch): destructors and moves must not throw
    }
  }

  [[noreturn]] void fail_open(int error) const {
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

  [[noreturn]] void fail_io(const char* what) const {
    const int error = errno;
    ::nitro::detail::fail(sink_, ": cannot ", what, " '", path_.string(), "': ",
                          error != 0 ? std::strerror(error) : "I/O error",
                          "; check the free space and that the file system is still mounted");
  }

  const char* sink_;
  std::filesystem::path path_;
  SinkOptions options_;
  std::FILE* file_ = nullptr;
  std::int64_t rows_ = 0;
  std::int64_t existing_bytes_ = 0;
  bool partial_line_ = false;
  std::string first_line_;
  bool inert_ = false;  // another rank writes the file
};

/// What CsvSink and JsonLinesSink share: the file, flush, close, path, rows.
class SinkFile {
 public:
  void flush() { file_.flush(); }
  /// Flushes (fsyncs if fsync_every > 0) and closes; throws nitro::Error if that fails. Idempotent.
  void close() { file_.close(); }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return file_.path(); }
  /// Rows written by this sink.
  [[nodiscard]] std::int64_t rows() const noexcept { return file_.rows(); }

 protected:
  SinkFile(const char* sink, std::filesystem::path path, SinkOptions options) : file_(sink, std::move(path), options) {}
  LineFile file_;
};

}  // namespace detail

/// Rows as CSV, under the header `step,time_s,loss,lr,scale,samples_per_s,memory_bytes,peak_memory_bytes`.
/// NaN and -1 are empty fields; infinities are "inf" and "-inf" (which Python's float() reads).
/// Appending to a non-empty file checks that its header is this one and writes none.
///
///   nitro::monitor::CsvSink csv{"metrics.csv", {.append = true}};
///   csv.write({.step = 10, .time_s = 1.5, .loss = 0.25});   // "10,1.5,0.25,,,,,\n"
class CsvSink : public detail::SinkFile {
 public:
  /// Opens (creates or, unless options.append, truncates) the file; throws nitro::Error if it cannot.
  explicit CsvSink(std::filesystem::path path, SinkOptions options = {})
      : SinkFile("CsvSink", std::move(path), options) {
    if (file_.existing_bytes() > 0) {
      NITRO_CHECK(file_.first_line() == detail::metric_header, "CsvSink: cannot append to '", file_.path().string(),
                  "': its first line is not the header '", detail::metric_header,
                  "'; append to a file a CsvSink wrote, or open without append to replace it");
    } else {
      file_.put(std::string(detail::metric_header) + "\n");
    }
  }

  /// Writes one row; it is in the file when write returns.
  void write(const MetricRow& row) {
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

 private:
  static void field(std::string& out, double value) {
    if (!std::isnan(value)) detail::append_double(out, value);
  }
  static void field(std::string& out, std::int64_t value) {
    if (value >= 0) detail::append_int(out, value);
  }

};

/// Rows as JSON lines: `{"step":1,"time_s":0.5,"loss":0.25,"lr":null,...}`, keys in MetricRow's
/// order. NaN, infinities and -1 are null (JSON has no infinity).
///
///   nitro::monitor::JsonLinesSink jsonl{"metrics.jsonl"};
///   jsonl.write({.step = 1, .time_s = 0.5, .loss = 0.25});
class JsonLinesSink : public detail::SinkFile {
 public:
  /// Opens (creates or, unless options.append, truncates) the file; throws nitro::Error if it cannot.
  explicit JsonLinesSink(std::filesystem::path path, SinkOptions options = {})
      : SinkFile("JsonLinesSink", std::move(path), options) {}

  /// Writes one row; it is in the file when write returns.
  void write(const MetricRow& row) {
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

 private:
  static void field(std::string& out, std::string_view key, double value) {
    out += key;
    if (std::isfinite(value)) {
      detail::append_double(out, value);
    } else {
      out += "null";
    }
  }
  static void field(std::string& out, std::string_view key, std::int64_t value) {
    out += key;
    if (value >= 0) {
      detail::append_int(out, value);
    } else {
      out += "null";
    }
  }

};

static_assert(MetricSink<CsvSink>);
static_assert(MetricSink<JsonLinesSink>);

/// Several sinks as one: each row goes to each, in order.
///
///   nitro::monitor::Sinks sinks{nitro::monitor::CsvSink{"m.csv"}, nitro::monitor::JsonLinesSink{"m.jsonl"}};
///   sinks.write(row);
template <MetricSink... S>
class Sinks {
 public:
  explicit Sinks(S... sinks) : sinks_(std::move(sinks)...) {}

  void write(const MetricRow& row) {
    std::apply([&](auto&... sink) { (sink.write(row), ...); }, sinks_);
  }
  void flush() {
    std::apply([](auto&... sink) { (sink.flush(), ...); }, sinks_);
  }
  void close() {
    std::apply([](auto&... sink) { (sink.close(), ...); }, sinks_);
  }
  /// The I-th sink.
  template <std::size_t I>
  [[nodiscard]] auto& get() noexcept {
    return std::get<I>(sinks_);
  }

 private:
  std::tuple<S...> sinks_;
};

}  // namespace nitro::monitor
