#pragma once
// The definitions of nitro/monitor/tensorboard.hpp's non-template functions: included by tensorboard.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/monitor/tensorboard.hpp>

namespace nitro::monitor::detail {

NITRO_INLINE std::uint32_t crc32c(const void* data, std::size_t n) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = 0xFFFFFFFFu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

NITRO_INLINE std::uint32_t masked_crc32c(const void* data, std::size_t n) {
  const std::uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

NITRO_INLINE void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

NITRO_INLINE void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

}  // namespace nitro::monitor::detail

namespace nitro::monitor {

NITRO_INLINE TensorBoardSink::TensorBoardSink(std::filesystem::path logdir, TensorBoardOptions options) : options_(options) {
  NITRO_CHECK(options_.fsync_every >= 0, "TensorBoardSink: fsync_every must be >= 0 (0: never fsync), got ",
              options_.fsync_every);
  NITRO_CHECK(!logdir.empty(), "TensorBoardSink: the log directory is empty; name one, e.g. \"runs/a\"");
  if (!options_.every_rank && !nitro::is_main_process()) return;  // another rank writes
  std::error_code ec;
  std::filesystem::create_directories(logdir, ec);
  NITRO_CHECK(!ec, "TensorBoardSink: cannot create the log directory '", logdir.string(), "': ", ec.message(),
              "; choose a path you may write to");
  char host[256] = "localhost";
  (void)::gethostname(host, sizeof host - 1);
  static std::atomic<int> opened{0};
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  path_ = logdir / ("events.out.tfevents." + std::to_string(seconds) + "." + host + "." +
                    std::to_string(::getpid()) + "." + std::to_string(opened++));
  file_ = std::fopen(path_.c_str(), "wbx");  // x: never over another writer's file
  if (file_ == nullptr) {
    const int error = errno;
    ::nitro::detail::fail("TensorBoardSink: cannot create '", path_.string(), "': ", std::strerror(error),
                          "; check that the directory is writable");
  }
  // The first event names the format version, as TensorFlow's writer does.
  std::string event;
  detail::put_key(event, 1, 1);
  detail::put_fixed(event, now());
  detail::put_bytes(event, 3, "brain.Event:2");
  put_record(event);
}

NITRO_INLINE TensorBoardSink::TensorBoardSink(TensorBoardSink&& other) noexcept : options_(other.options_), path_(std::move(other.path_)), file_(std::exchange(other.file_, nullptr)),
      events_(other.events_), bytes_(other.bytes_), closed_(other.closed_) {
  other.closed_ = true;  // a write to the moved-from sink is an error, not silently dropped
}

NITRO_INLINE TensorBoardSink::~TensorBoardSink() {
  try {
    close();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; close() reports it when called
  }
}

NITRO_INLINE void TensorBoardSink::write(const MetricRow& row) {
  std::vector<std::pair<std::string_view, double>> values;
  values.reserve(6);
  const auto add = [&](std::string_view tag, double v) {
    if (!std::isnan(v)) values.emplace_back(tag, v);
  };
  add("loss", row.loss);
  add("lr", row.lr);
  add("loss_scale", row.scale);
  add("samples_per_s", row.samples_per_s);
  if (row.memory_bytes >= 0) add("memory_mib", static_cast<double>(row.memory_bytes) / 1048576.0);
  if (row.peak_memory_bytes >= 0) add("peak_memory_mib", static_cast<double>(row.peak_memory_bytes) / 1048576.0);
  scalars(row.step, values);
}

NITRO_INLINE void TensorBoardSink::scalar(std::string_view tag, std::int64_t step, double value) {
  const std::pair<std::string_view, double> one{tag, value};
  scalars(step, std::span<const std::pair<std::string_view, double>>(&one, 1));
}

NITRO_INLINE void TensorBoardSink::scalars(std::int64_t step, std::span<const std::pair<std::string_view, double>> values) {
  if (file_ == nullptr) {
    NITRO_CHECK(!closed_, "TensorBoardSink: write after close(); open a new sink");
    return;  // another rank's sink
  }
  if (values.empty()) return;
  std::string summary;
  for (const auto& [tag, v] : values) {
    NITRO_CHECK(!tag.empty(), "TensorBoardSink: a scalar's tag is empty; name it, e.g. \"loss\"");
    std::string value;
    detail::put_bytes(value, 1, tag);
    detail::put_key(value, 2, 5);
    detail::put_fixed(value, static_cast<float>(v));
    detail::put_bytes(summary, 1, value);
  }
  std::string event;
  event.reserve(summary.size() + 24);
  detail::put_key(event, 1, 1);
  detail::put_fixed(event, now());
  detail::put_key(event, 2, 0);
  detail::put_varint(event, static_cast<std::uint64_t>(step));
  detail::put_bytes(event, 5, summary);
  put_record(event);
}

NITRO_INLINE void TensorBoardSink::scalars(std::int64_t step, std::initializer_list<std::pair<std::string_view, double>> values) {
  scalars(step, std::span<const std::pair<std::string_view, double>>(values.begin(), values.size()));
}

NITRO_INLINE void TensorBoardSink::scalars(std::int64_t step, const std::vector<std::pair<std::string_view, double>>& values) {
  scalars(step, std::span<const std::pair<std::string_view, double>>(values.data(), values.size()));
}

NITRO_INLINE void TensorBoardSink::flush() {
  if (file_ != nullptr && std::fflush(file_) != 0) fail_io("flush");
}

NITRO_INLINE void TensorBoardSink::close() {
  closed_ = true;
  if (file_ == nullptr) return;
  std::FILE* f = std::exchange(file_, nullptr);
  const bool ok = std::fflush(f) == 0 && (options_.fsync_every == 0 || ::fsync(::fileno(f)) == 0);
  const int error = errno;
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    errno = ok ? errno : error;
    fail_io("close");
  }
}

NITRO_INLINE double TensorBoardSink::now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

NITRO_INLINE void TensorBoardSink::put_record(const std::string& payload) {
  std::string record;
  record.reserve(payload.size() + 16);
  const auto length = static_cast<std::uint64_t>(payload.size());
  detail::put_fixed(record, length);
  detail::put_fixed(record, detail::masked_crc32c(record.data(), 8));
  record += payload;
  detail::put_fixed(record, detail::masked_crc32c(payload.data(), payload.size()));
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
    fail_io("write to");
  ++events_;
  bytes_ += static_cast<std::int64_t>(record.size());
  if (options_.fsync_every > 0 && events_ % options_.fsync_every == 0 && ::fsync(::fileno(file_)) != 0)
    fail_io("fsync");
}

NITRO_INLINE void TensorBoardSink::fail_io(const char* what) const {
  const int error = errno;
  ::nitro::detail::fail("TensorBoardSink: cannot ", what, " '", path_.string(), "': ",
                        error != 0 ? std::strerror(error) : "I/O error",
                        "; check the free space and that the file system is still mounted");
}

}  // namespace nitro::monitor
