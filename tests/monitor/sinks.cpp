#include <nitro/monitor/sinks.hpp>

#include "testing.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace nitro_test_monitor_sinks {  // one namespace per file: an area is compiled as one translation unit

namespace {

namespace fs = std::filesystem;
using nitro::monitor::CsvSink;
using nitro::monitor::JsonLinesSink;
using nitro::monitor::MetricRow;

/// A fresh directory under the system's temporary one, removed with its contents at the end.
struct TempDir : nitro::test::TempDir {
  TempDir() : nitro::test::TempDir("nitro-sinks", /*create=*/true) {}
};

/// The file's lines, read with a stream of its own (the sink may still be open).
std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ',')) fields.push_back(field);
  if (!line.empty() && line.back() == ',') fields.emplace_back();
  return fields;
}

/// A flat JSON object of numbers and nulls ({"a":1,"b":null}) as key -> raw value text; throws on
/// anything else.
std::map<std::string, std::string> parse_flat_json(const std::string& line) {
  std::map<std::string, std::string> out;
  std::size_t i = 0;
  const auto expect = [&](char c) {
    if (i >= line.size() || line[i] != c) throw std::runtime_error("expected '" + std::string(1, c) + "' in " + line);
    ++i;
  };
  expect('{');
  while (true) {
    expect('"');
    const auto end = line.find('"', i);
    if (end == std::string::npos) throw std::runtime_error("unterminated key in " + line);
    const auto key = line.substr(i, end - i);
    i = end + 1;
    expect(':');
    const auto value_end = line.find_first_of(",}", i);
    if (value_end == std::string::npos) throw std::runtime_error("unterminated value in " + line);
    out[key] = line.substr(i, value_end - i);
    i = value_end;
    if (line[i] == '}') break;
    expect(',');
  }
  expect('}');
  if (i != line.size()) throw std::runtime_error("trailing text in " + line);
  return out;
}

MetricRow full_row() {
  return {.step = 1,
          .time_s = 0.5,
          .loss = 0.25,
          .lr = 0.001,
          .scale = 65536,
          .samples_per_s = 1234.5,
          .memory_bytes = 1048576,
          .peak_memory_bytes = 2097152};
}

int exit_code(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("CsvSink writes the header then one row per write with unknown values as empty fields") {
  TempDir dir;
  const auto path = dir / "metrics.csv";
  {
    CsvSink csv{path};
    csv.write(full_row());
    csv.write({.step = 2, .time_s = 1});
    const double inf = std::numeric_limits<double>::infinity();
    csv.write({.step = 3, .time_s = 0.1 + 0.2, .loss = inf, .lr = 1.0 / 3, .scale = -inf, .memory_bytes = 0});
    CHECK(csv.rows() == 3);
  }
  const auto lines = read_lines(path);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0] == "step,time_s,loss,lr,scale,samples_per_s,memory_bytes,peak_memory_bytes");
  CHECK(lines[1] == "1,0.5,0.25,0.001,65536,1234.5,1048576,2097152");
  CHECK(lines[2] == "2,1,,,,,,");
  const auto fields = split_csv(lines[3]);
  REQUIRE(fields.size() == 8);
  CHECK(fields[0] == "3");
  CHECK(std::strtod(fields[1].c_str(), nullptr) == 0.1 + 0.2);  // round-trips exactly
  CHECK(fields[2] == "inf");
  CHECK(std::strtod(fields[3].c_str(), nullptr) == 1.0 / 3);
  CHECK(fields[4] == "-inf");
  CHECK(fields[5].empty());
  CHECK(fields[6] == "0");
  CHECK(fields[7].empty());
}

TEST_CASE("JsonLinesSink writes one JSON object per line with null for unknown values") {
  TempDir dir;
  const auto path = dir / "metrics.jsonl";
  {
    JsonLinesSink jsonl{path};
    jsonl.write(full_row());
    jsonl.write({.step = 2, .time_s = 1});
    jsonl.write({.step = 3,
                 .time_s = 0.1 + 0.2,
                 .loss = std::numeric_limits<double>::infinity(),
                 .lr = 1.0 / 3,
                 .scale = 1e-300,
                 .samples_per_s = 12.25,
                 .memory_bytes = 7,
                 .peak_memory_bytes = 9});
  }
  const auto lines = read_lines(path);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] ==
        R"({"step":1,"time_s":0.5,"loss":0.25,"lr":0.001,"scale":65536,"samples_per_s":1234.5,)"
        R"("memory_bytes":1048576,"peak_memory_bytes":2097152})");
  CHECK(lines[1] ==
        R"({"step":2,"time_s":1,"loss":null,"lr":null,"scale":null,"samples_per_s":null,)"
        R"("memory_bytes":null,"peak_memory_bytes":null})");
  const auto row = parse_flat_json(lines[2]);
  CHECK(row.size() == 8);
  CHECK(row.at("step") == "3");
  CHECK(std::strtod(row.at("time_s").c_str(), nullptr) == 0.1 + 0.2);
  CHECK(row.at("loss") == "null");  // JSON has no infinity
  CHECK(std::strtod(row.at("lr").c_str(), nullptr) == 1.0 / 3);
  CHECK(std::strtod(row.at("scale").c_str(), nullptr) == 1e-300);
  CHECK(row.at("samples_per_s") == "12.25");
  CHECK(row.at("memory_bytes") == "7");
  CHECK(row.at("peak_memory_bytes") == "9");
}

TEST_CASE("each sink row is in the file as soon as write returns while the sink is still open") {
  TempDir dir;
  CsvSink csv{dir / "live.csv"};
  JsonLinesSink jsonl{dir / "live.jsonl", {.fsync_every = 2}};
  CHECK(read_lines(dir / "live.csv").size() == 1);  // the header
  CHECK(read_lines(dir / "live.jsonl").empty());
  for (int step = 1; step <= 3; ++step) {
    csv.write({.step = step, .time_s = step * 0.5});
    jsonl.write({.step = step, .time_s = step * 0.5});
    const auto csv_lines = read_lines(dir / "live.csv");
    const auto json_lines = read_lines(dir / "live.jsonl");
    REQUIRE(csv_lines.size() == static_cast<std::size_t>(step + 1));
    REQUIRE(json_lines.size() == static_cast<std::size_t>(step));
    CHECK(split_csv(csv_lines.back())[0] == std::to_string(step));
    CHECK(parse_flat_json(json_lines.back()).at("step") == std::to_string(step));
  }
  CHECK(read_all(dir / "live.jsonl").back() == '\n');
}

TEST_CASE("sink append keeps the earlier rows and writes no second header while the default replaces the file") {
  TempDir dir;
  const auto csv_path = dir / "m.csv";
  const auto json_path = dir / "m.jsonl";
  {
    CsvSink csv{csv_path};
    JsonLinesSink jsonl{json_path};
    for (int step = 1; step <= 2; ++step) {
      csv.write({.step = step});
      jsonl.write({.step = step});
    }
  }
  {
    CsvSink csv{csv_path, {.append = true}};
    JsonLinesSink jsonl{json_path, {.append = true}};
    csv.write({.step = 3});
    jsonl.write({.step = 3});
  }
  auto csv_lines = read_lines(csv_path);
  REQUIRE(csv_lines.size() == 4);
  CHECK(csv_lines[0].rfind("step,", 0) == 0);
  CHECK(csv_lines[1].rfind("1,", 0) == 0);
  CHECK(csv_lines[3].rfind("3,", 0) == 0);
  auto json_lines = read_lines(json_path);
  REQUIRE(json_lines.size() == 3);
  CHECK(parse_flat_json(json_lines[0]).at("step") == "1");
  CHECK(parse_flat_json(json_lines[2]).at("step") == "3");
  {  // appending to a file that does not exist creates it, header included
    CsvSink csv{dir / "new.csv", {.append = true}};
    csv.write({.step = 1});
  }
  CHECK(read_lines(dir / "new.csv").size() == 2);
  {  // without append: replaced
    CsvSink csv{csv_path};
    csv.write({.step = 9});
  }
  csv_lines = read_lines(csv_path);
  REQUIRE(csv_lines.size() == 2);
  CHECK(csv_lines[1].rfind("9,", 0) == 0);
}

TEST_CASE("sink append after a crash that cut the last line starts the next row on a line of its own") {
  TempDir dir;
  const auto path = dir / "crashed.jsonl";
  {
    std::ofstream out(path, std::ios::binary);
    out << R"({"step":1,"time_s":0.5})" << "\n" << R"({"step":2,"ti)";
  }
  {
    JsonLinesSink jsonl{path, {.append = true}};
    jsonl.write({.step = 3});
  }
  const auto lines = read_lines(path);
  REQUIRE(lines.size() == 3);
  CHECK(lines[1] == R"({"step":2,"ti)");
  CHECK(parse_flat_json(lines[2]).at("step") == "3");
}

TEST_CASE("CsvSink refuses to append to a file with another header and leaves it as it was") {
  TempDir dir;
  const auto path = dir / "other.csv";
  {
    std::ofstream out(path, std::ios::binary);
    out << "epoch,accuracy\n1,0.5";
  }
  CHECK_THROWS_WITH_AS(CsvSink(path, {.append = true}), doctest::Contains("is not the header"), nitro::Error);
  CHECK(read_all(path) == "epoch,accuracy\n1,0.5");
}

TEST_CASE("opening a sink on a path that cannot be written throws nitro::Error with the path and the reason") {
  TempDir dir;
  CHECK_THROWS_WITH_AS(CsvSink("/nonexistent-dir/x.csv"), doctest::Contains("'/nonexistent-dir/x.csv'"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(CsvSink("/nonexistent-dir/x.csv"), doctest::Contains("No such file or directory"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(JsonLinesSink("/nonexistent-dir/x.jsonl"), doctest::Contains("create its directory"),
                       nitro::Error);
  const std::string directory = dir.path.string();
  CHECK_THROWS_WITH_AS(JsonLinesSink(dir.path), doctest::Contains(directory.c_str()), nitro::Error);
  CHECK_THROWS_WITH_AS(CsvSink(dir.path, {.append = true}), doctest::Contains("Is a directory"), nitro::Error);
  CHECK_THROWS_WITH_AS(CsvSink(""), doctest::Contains("path is empty"), nitro::Error);
  CHECK_THROWS_WITH_AS(CsvSink(dir / "a.csv", {.fsync_every = -1}), doctest::Contains("fsync_every must be >= 0"),
                       nitro::Error);
}

TEST_CASE("sinks move and close once and a write after close throws") {
  TempDir dir;
  JsonLinesSink a{dir / "a.jsonl"};
  a.write({.step = 1});
  JsonLinesSink b = std::move(a);
  b.write({.step = 2});
  a.close();  // the moved-from sink holds no file: nothing to do
  CHECK(b.path() == dir / "a.jsonl");
  CHECK(b.rows() == 2);
  b.close();
  b.close();
  CHECK_THROWS_WITH_AS(b.write({.step = 3}), doctest::Contains("write after close()"), nitro::Error);
  CHECK(read_lines(dir / "a.jsonl").size() == 2);

  CsvSink c{dir / "c.csv"};
  CsvSink d{dir / "d.csv"};
  d = std::move(c);  // d's own file is closed first
  d.write({.step = 5});
  d.close();
  CHECK(read_lines(dir / "c.csv").size() == 2);
  CHECK(read_lines(dir / "d.csv").size() == 1);
}

TEST_CASE("Sinks writes every row to each sink") {
  TempDir dir;
  nitro::monitor::Sinks sinks{CsvSink{dir / "m.csv"}, JsonLinesSink{dir / "m.jsonl", {.fsync_every = 1}}};
  sinks.write(full_row());
  sinks.write({.step = 2});
  sinks.flush();
  CHECK(sinks.get<0>().rows() == 2);
  sinks.close();
  CHECK(read_lines(dir / "m.csv").size() == 3);
  CHECK(read_lines(dir / "m.jsonl").size() == 2);
}

TEST_CASE("bench/plot_metrics.py draws a PNG from the JSON lines a sink wrote for two runs") {
  const std::string python = NITRO_TEST_PYTHON;
  if (python.empty() || exit_code("'" + python + "' -c 'import matplotlib' >/dev/null 2>&1") != 0) {
    MESSAGE("skipped: no python with matplotlib (NITRO_TEST_PYTHON='" << python
                                                                        << "'); pip install matplotlib into it");
    return;
  }
  TempDir dir;
  for (const std::string run : {"base", "fast"}) {
    JsonLinesSink jsonl{dir / (run + ".jsonl")};
    for (int step = 1; step <= 40; ++step) {
      MetricRow row{.step = step, .time_s = step * 0.1, .loss = 2.0 / step, .samples_per_s = 900.0 + step};
      if (step % 7 != 0) row.memory_bytes = 1'000'000 + 1000 * step;  // some nulls
      row.peak_memory_bytes = 2'000'000;
      jsonl.write(row);
    }
  }
  const std::string script = std::string(NITRO_SOURCE_DIR) + "/bench/plot_metrics.py";
  const auto png = dir / "out.png";
  const auto run = [&](const std::string& args) {
    return exit_code("'" + python + "' '" + script + "' " + args + " >/dev/null 2>" + (dir / "stderr.txt").string());
  };
  REQUIRE(run("'" + (dir / "base.jsonl").string() + "' '" + (dir / "fast.jsonl").string() + "' -o '" +
              png.string() + "' --title 'two runs'") == 0);
  const auto bytes = read_all(png);
  REQUIRE(bytes.size() > 1000);
  CHECK(bytes.substr(0, 8) == "\x89PNG\r\n\x1a\n");

  CHECK(run("'" + (dir / "missing.jsonl").string() + "' -o '" + png.string() + "'") == 2);
  CHECK(read_all(dir / "stderr.txt").find("missing.jsonl") != std::string::npos);
  {
    std::ofstream out(dir / "not.jsonl");
    out << "step,time_s\n1,2\n";
  }
  CHECK(run("'" + (dir / "not.jsonl").string() + "' -o '" + png.string() + "'") == 2);
  CHECK(read_all(dir / "stderr.txt").find("not JSON lines") != std::string::npos);
}

}  // namespace nitro_test_monitor_sinks
