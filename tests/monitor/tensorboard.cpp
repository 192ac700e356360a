// monitor::TensorBoardSink: its files read back by the tensorboard package's own reader (every scalar,
// exact counts, float32 values), cut at every byte (the reader stops at the last complete record, never
// raises), a damaged record (the reader stops there: counts are asserted), and user errors.
#include <nitro/monitor/tensorboard.hpp>

#include "testing.hpp"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace nitro_test_monitor_tensorboard {  // one namespace per file: an area is compiled as one translation unit

namespace {

namespace fs = std::filesystem;
using nitro::monitor::MetricRow;
using nitro::monitor::TensorBoardSink;

std::string python() { return NITRO_TEST_PYTHON; }

// The reader's output, or nothing when there is no python with tensorboard.
std::optional<std::vector<std::string>> reader(const std::string& mode, const fs::path& file) {
  if (python().empty()) return std::nullopt;
  const std::string check = "'" + python() + "' -c 'import tensorboard' >/dev/null 2>&1";
  if (std::system(check.c_str()) != 0) return std::nullopt;
  const std::string command = "'" + python() + "' '" NITRO_SOURCE_DIR "/tests/monitor/read_tensorboard.py' " + mode +
                              " '" + file.string() + "' 2>&1";
  std::FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::vector<std::string> lines;
  char buffer[4096];
  std::string line;
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) {
    line += buffer;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      lines.push_back(line);
      line.clear();
    }
  }
  REQUIRE(::pclose(pipe) == 0);
  return lines;
}

bool skip_without_reader() {
  if (reader("read", "/dev/null").has_value()) return false;
  MESSAGE("skipped: no python with tensorboard (NITRO_TEST_PYTHON='" << python()
                                                                      << "'); cmake/deps.sh installs it");
  return true;
}

struct Value {
  std::int64_t step;
  std::string tag;
  double value;
  bool operator==(const Value&) const = default;
};

// The values read, in order; the file-version events counted apart.
std::pair<std::vector<Value>, int> parse(const std::vector<std::string>& lines, int* events = nullptr) {
  std::vector<Value> values;
  int versions = 0, count = 0;
  std::int64_t step = -1;
  for (const auto& l : lines) {
    std::istringstream in(l);
    std::string kind;
    in >> kind;
    if (kind == "E") {
      in >> step;
      ++count;
    } else if (kind == "F") {
      std::string v;
      in >> v;
      CHECK(v == "brain.Event:2");
      ++versions;
    } else if (kind == "V") {
      Value v{step, "", 0};
      in >> v.tag >> v.value;
      values.push_back(v);
    } else {
      FAIL("unexpected reader line: " << l);
    }
  }
  if (events != nullptr) *events = count;
  return {values, versions};
}

}  // namespace

TEST_CASE("tensorboard: CRC32C and its mask are TFRecord's") {
  using nitro::monitor::detail::crc32c;
  CHECK(crc32c("123456789", 9) == 0xE3069283u);  // the Castagnoli check value
  CHECK(crc32c("", 0) == 0u);
  // TFRecord's masked CRC of 8 zero bytes (a zero length), as TensorFlow's crc32c.mask computes it.
  const std::uint64_t zero = 0;
  const std::uint32_t c = crc32c(&zero, 8);
  CHECK(nitro::monitor::detail::masked_crc32c(&zero, 8) == static_cast<std::uint32_t>(((c >> 15) | (c << 17)) + 0xA282EAD8u));
}

TEST_CASE("tensorboard: every scalar written is read back by TensorBoard's reader, exactly") {
  if (skip_without_reader()) return;
  nitro::test::TempDir dir("nitro-tb", true);
  std::vector<Value> expected;
  fs::path file;
  {
    TensorBoardSink tb{dir.path / "run"};
    file = tb.path();
    CHECK(file.filename().string().rfind("events.out.tfevents.", 0) == 0);
    for (int step = 0; step < 60; ++step) {
      MetricRow row{.step = step, .time_s = step * 0.1, .loss = 2.5 / (step + 1), .lr = 1e-3 * (1 + step % 3),
                    .samples_per_s = 1000.0 + step, .memory_bytes = 1048576ll * (10 + step)};
      if (step % 5 == 0) row.scale = 65536.0;  // some rows without a loss scale
      if (step % 7 == 0) row.peak_memory_bytes = 1048576ll * 100;
      tb.write(row);
      const auto f = [](double v) { return static_cast<double>(static_cast<float>(v)); };
      expected.push_back({step, "loss", f(row.loss)});
      expected.push_back({step, "lr", f(row.lr)});
      if (step % 5 == 0) expected.push_back({step, "loss_scale", 65536.0});
      expected.push_back({step, "samples_per_s", f(row.samples_per_s)});
      expected.push_back({step, "memory_mib", f(10.0 + step)});
      if (step % 7 == 0) expected.push_back({step, "peak_memory_mib", 100.0});
      if (step % 10 == 0) {
        tb.scalar("phase/forward_ms", step, 12.25 + step);
        expected.push_back({step, "phase/forward_ms", f(12.25 + step)});
        tb.scalars(step, {{"phase/data_ms", 0.5}, {"phase/backward_ms", 20.0}});
        expected.push_back({step, "phase/data_ms", 0.5});
        expected.push_back({step, "phase/backward_ms", 20.0});
      }
    }
    CHECK(tb.events() == 1 + 60 + 6 + 6);
  }
  int events = 0;
  const auto [values, versions] = parse(*reader("read", file), &events);
  CHECK(versions == 1);
  CHECK(events == 1 + 60 + 12);
  REQUIRE(values.size() == expected.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    CAPTURE(i);
    CHECK(values[i].step == expected[i].step);
    CHECK(values[i].tag == expected[i].tag);
    CHECK(values[i].value == expected[i].value);  // float32 exactly
  }
}

TEST_CASE("tensorboard: a file cut at any byte reads up to its last complete event, and a damaged one stops there") {
  if (skip_without_reader()) return;
  nitro::test::TempDir dir("nitro-tb", true);
  std::vector<std::int64_t> ends;  // where each event's record ends
  fs::path file;
  {
    TensorBoardSink tb{dir.path};
    file = tb.path();
    ends.push_back(tb.bytes());
    for (int step = 1; step <= 4; ++step) {
      tb.write({.step = step, .loss = 1.0 / step});
      ends.push_back(tb.bytes());
    }
  }
  const auto counts = *reader("truncations", file);
  REQUIRE(counts.size() == static_cast<std::size_t>(ends.back()) + 1);
  for (std::size_t k = 0; k < counts.size(); ++k) {
    int complete = 0;
    for (auto e : ends) complete += e <= static_cast<std::int64_t>(k) ? 1 : 0;
    CAPTURE(k);
    CHECK(counts[k] == std::to_string(complete));
  }
  // A damaged payload in the third event: the reader keeps the two before it and stops, silently.
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[static_cast<std::size_t>(ends[1] + 14)] ^= 0x40;
  const auto damaged = dir.path / "events.out.tfevents.damaged";
  std::ofstream(damaged, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  int events = 0;
  (void)parse(*reader("read", damaged), &events);
  CHECK(events == 2);
}

TEST_CASE("tensorboard: user errors say what to do, and the sink fits Sinks<...>") {
  nitro::test::TempDir dir("nitro-tb", true);
  CHECK_THROWS_WITH_AS(TensorBoardSink(""), doctest::Contains("log directory is empty"), nitro::Error);
  CHECK_THROWS_WITH_AS(TensorBoardSink(dir.path, {.fsync_every = -1}), doctest::Contains("fsync_every must be >= 0"),
                       nitro::Error);
  { std::ofstream(dir.path / "file") << "x"; }
  CHECK_THROWS_WITH_AS(TensorBoardSink(dir.path / "file" / "run"), doctest::Contains("cannot create the log directory"),
                       nitro::Error);
  TensorBoardSink tb{dir.path / "ok", {.fsync_every = 2}};
  CHECK_THROWS_WITH_AS(tb.scalar("", 1, 1.0), doctest::Contains("tag is empty"), nitro::Error);
  nitro::monitor::Sinks sinks{nitro::monitor::CsvSink{dir.path / "m.csv"}, std::move(tb)};
  sinks.write({.step = 1, .loss = 0.5});
  sinks.close();
  CHECK(sinks.get<1>().events() == 2);
  CHECK_THROWS_WITH_AS(sinks.get<1>().scalar("loss", 2, 1.0), doctest::Contains("write after close"), nitro::Error);
  TensorBoardSink a{dir.path / "moved"};
  TensorBoardSink b{std::move(a)};
  b.scalar("loss", 1, 1.0);
  CHECK_THROWS_WITH_AS(a.scalar("loss", 2, 1.0), doctest::Contains("write after close"), nitro::Error);  // NOLINT(bugprone-use-after-move)
}

}  // namespace nitro_test_monitor_tensorboard
