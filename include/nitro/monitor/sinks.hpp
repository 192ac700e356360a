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
#include <nitro/core/config.hpp>
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
  /// The optimizer step the row is for.
  std::int64_t step = 0;
  /// Seconds since the run started.
  double time_s = 0;
  /// The training loss at this step.
  double loss = std::numeric_limits<double>::quiet_NaN();
  /// The learning rate at this step.
  double lr = std::numeric_limits<double>::quiet_NaN();
  /// The fp16 loss scale; NaN when there is none.
  double scale = std::numeric_limits<double>::quiet_NaN();
  /// Training speed: samples (batch rows) per second.
  double samples_per_s = std::numeric_limits<double>::quiet_NaN();
  /// CUDA bytes allocated, or CPU resident bytes; -1 unknown.
  std::int64_t memory_bytes = -1;
  /// The highest memory_bytes so far; -1 unknown.
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

NITRO_INLINE void append_int(std::string& out, std::int64_t value);

/// Shortest round-trip form; non-finite values as given.
NITRO_INLINE void append_double(std::string& out, double value);

/// An append-only text file written line by line: the part CsvSink and JsonLinesSink share.
class LineFile {
 public:
  NITRO_INLINE LineFile(const char* sink, std::filesystem::path path, SinkOptions options);

  LineFile(const LineFile&) = delete;
  LineFile& operator=(const LineFile&) = delete;
  NITRO_INLINE LineFile(LineFile&& other) noexcept;
  NITRO_INLINE LineFile& operator=(LineFile&& other) noexcept;
  ~LineFile() { close_quietly(); }

  /// Writes `line` (which ends in '\n') with one fwrite, flushes, and fsyncs when due.
  NITRO_INLINE void put_row(const std::string& line);

  NITRO_INLINE void put(const std::string& text);

  NITRO_INLINE void flush();

  NITRO_INLINE void sync();

  NITRO_INLINE void close();

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

  NITRO_INLINE void close_quietly() noexcept;

  [[noreturn]] NITRO_INLINE void fail_open(int error) const;

  [[noreturn]] NITRO_INLINE void fail_io(const char* what) const;

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
  NITRO_INLINE SinkFile(const char* sink, std::filesystem::path path, SinkOptions options);
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
  NITRO_INLINE explicit CsvSink(std::filesystem::path path, SinkOptions options = {});

  /// Writes one row; it is in the file when write returns.
  NITRO_INLINE void write(const MetricRow& row);

 private:
  NITRO_INLINE static void field(std::string& out, double value);
  NITRO_INLINE static void field(std::string& out, std::int64_t value);

};

/// Rows as JSON lines: `{"step":1,"time_s":0.5,"loss":0.25,"lr":null,...}`, keys in MetricRow's
/// order. NaN, infinities and -1 are null (JSON has no infinity).
///
///   nitro::monitor::JsonLinesSink jsonl{"metrics.jsonl"};
///   jsonl.write({.step = 1, .time_s = 0.5, .loss = 0.25});
class JsonLinesSink : public detail::SinkFile {
 public:
  /// Opens (creates or, unless options.append, truncates) the file; throws nitro::Error if it cannot.
  NITRO_INLINE explicit JsonLinesSink(std::filesystem::path path, SinkOptions options = {});

  /// Writes one row; it is in the file when write returns.
  NITRO_INLINE void write(const MetricRow& row);

 private:
  NITRO_INLINE static void field(std::string& out, std::string_view key, double value);
  NITRO_INLINE static void field(std::string& out, std::string_view key, std::int64_t value);

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
  /// Takes the sinks (moved in), written in the order given.
  explicit Sinks(S... sinks) : sinks_(std::move(sinks)...) {}

  /// Writes `row` to every sink, in order.
  void write(const MetricRow& row) {
    std::apply([&](auto&... sink) { (sink.write(row), ...); }, sinks_);
  }
  /// Flushes every sink.
  void flush() {
    std::apply([](auto&... sink) { (sink.flush(), ...); }, sinks_);
  }
  /// Closes every sink.
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

#if !NITRO_COMPILED
#include <nitro/monitor/sinks-inl.hpp>
#endif
