#pragma once
// nitro::monitor::TensorBoardSink: metric rows (and any scalar) as TensorBoard event files, usable
// wherever CsvSink and JsonLinesSink are (a MetricSink, so also inside Sinks<...>).
//
//   nitro::monitor::TensorBoardSink tb{"runs/a"};          // runs/a/events.out.tfevents.<time>.<host>.<pid>.<n>
//   tb.write({.step = step, .loss = loss, .lr = lr});      // scalars loss, lr, ... at that step
//   tb.scalar("phase/forward_ms", step, 12.5);             // any other scalar
//   // tensorboard --logdir runs
//
// The file is what TensorFlow's summary writer makes: TFRecord framing (uint64 length, masked CRC32C
// of the length, payload, masked CRC32C of the payload) around `Event` protocol buffers. The few
// fields needed are encoded here by hand (wall_time, step, file_version, summary.value{tag,
// simple_value}): a protobuf library would be a dependency for 60 lines, and LibTorch's include
// directory ships protobuf 3.13 headers that shadow the system's. Each event is written with one
// fwrite and fflush'ed (a crash loses at most the event being written: TensorBoard reads up to the
// last complete record); fsync_every as the other sinks. Values are float32 in the file (TensorBoard's
// simple_value); byte counts are written in MiB. Not thread-safe: write from one thread.
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>
#include <nitro/core/rank.hpp>
#include <nitro/monitor/sinks.hpp>

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nitro::monitor {

namespace detail {

/// CRC32C (Castagnoli), as TFRecord uses.
NITRO_INLINE std::uint32_t crc32c(const void* data, std::size_t n);

/// TFRecord's masked CRC: rotated right by 15 bits, plus a constant.
NITRO_INLINE std::uint32_t masked_crc32c(const void* data, std::size_t n);

// Protocol-buffer wire format: the pieces an Event needs.
NITRO_INLINE void put_varint(std::string& out, std::uint64_t v);
inline void put_key(std::string& out, int field, int wire) { put_varint(out, static_cast<std::uint64_t>(field << 3 | wire)); }
template <class T>
inline void put_fixed(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts (as everywhere Nitro builds)
  out.append(bytes, sizeof(T));
}
NITRO_INLINE void put_bytes(std::string& out, int field, std::string_view bytes);

}  // namespace detail

/// A TensorBoardSink's knobs.
struct TensorBoardOptions {
  /// fsync the file every this many events, and at close; 0: never (fflush only).
  std::int64_t fsync_every = 0;
  /// Write in every process (each gets its own file: the names differ by pid); false: only rank 0.
  bool every_rank = false;
};

/// Scalars as TensorBoard event files in a log directory (see the top of this file).
class TensorBoardSink {
 public:
  /// Creates `logdir` if needed and a new event file in it; throws nitro::Error if it cannot.
  NITRO_INLINE explicit TensorBoardSink(std::filesystem::path logdir, TensorBoardOptions options = {});
  /// Takes over the open file of `other`; writing to `other` afterwards throws nitro::Error.
  NITRO_INLINE TensorBoardSink(TensorBoardSink&& other) noexcept;
  TensorBoardSink& operator=(TensorBoardSink&&) = delete;
  TensorBoardSink(const TensorBoardSink&) = delete;
  TensorBoardSink& operator=(const TensorBoardSink&) = delete;
  NITRO_INLINE ~TensorBoardSink();

  /// The row's known values as scalars at its step: loss, lr, loss_scale, samples_per_s,
  /// memory_mib, peak_memory_mib (NaN and -1 are left out).
  NITRO_INLINE void write(const MetricRow& row);

  /// One scalar: `tag` at `step` (e.g. "phase/forward_ms").
  NITRO_INLINE void scalar(std::string_view tag, std::int64_t step, double value);

  /// Several scalars at one step, as one event.
  NITRO_INLINE void scalars(std::int64_t step, std::span<const std::pair<std::string_view, double>> values);
  /// As above, for a brace list: `tb.scalars(step, {{"loss", 0.5}, {"lr", 1e-3}})`.
  NITRO_INLINE void scalars(std::int64_t step, std::initializer_list<std::pair<std::string_view, double>> values);
  /// As above, for a vector.
  NITRO_INLINE void scalars(std::int64_t step, const std::vector<std::pair<std::string_view, double>>& values);

  /// Flushes the event file.
  NITRO_INLINE void flush();
  /// Flushes, fsyncs (when fsync_every > 0) and closes; throws nitro::Error if that fails. Idempotent.
  NITRO_INLINE void close();

  /// The event file ("" in a rank that does not write).
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// Events written, the file-version event included.
  [[nodiscard]] std::int64_t events() const noexcept { return events_; }
  /// Bytes written so far (each event's record ends at the value this had after writing it).
  [[nodiscard]] std::int64_t bytes() const noexcept { return bytes_; }

 private:
  NITRO_INLINE static double now();

  NITRO_INLINE void put_record(const std::string& payload);

  [[noreturn]] NITRO_INLINE void fail_io(const char* what) const;

  TensorBoardOptions options_;
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  std::int64_t events_ = 0, bytes_ = 0;
  bool closed_ = false;
};

static_assert(MetricSink<TensorBoardSink>);

}  // namespace nitro::monitor

#if !NITRO_COMPILED
#include <nitro/monitor/tensorboard-inl.hpp>
#endif
