// bench/trace.hpp: reading access traces (gzip or plain) and the generated workloads of the cache
// benchmarks.
#include "testing.hpp"

#include "bench/trace.hpp"

#if NITRO_HAVE_ZLIB
#include <zlib.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

namespace nitro_test_cache_trace {  // one namespace per file: an area is compiled as one translation unit

namespace {
using Keys = std::vector<std::int64_t>;
}  // namespace

#if NITRO_HAVE_ZLIB
namespace {

namespace fs = std::filesystem;

/// A file in the temporary directory, removed at the end of the test.
struct TempFile {
  explicit TempFile(const std::string& name)
      : path(fs::temp_directory_path() / ("nitro_trace_" + std::to_string(::getpid()) + "_" + name)) {}
  ~TempFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  [[nodiscard]] std::string str() const { return path.string(); }
  fs::path path;
};

void write_plain(const TempFile& f, const std::string& text) {
  std::ofstream out(f.path, std::ios::binary);
  out << text;
}

void write_gzip(const TempFile& f, const std::string& text) {
  gzFile out = gzopen(f.str().c_str(), "wb");
  REQUIRE(out != nullptr);
  REQUIRE(gzwrite(out, text.data(), static_cast<unsigned>(text.size())) == static_cast<int>(text.size()));
  REQUIRE(gzclose(out) == Z_OK);
}

}  // namespace

TEST_CASE("read_trace reads a plain file of one key per line") {
  TempFile f("plain.txt");
  write_plain(f, "1\n2\n3\n-4\n9223372036854775807\n");
  CHECK(nitro::bench::read_trace(f.str()) == Keys{1, 2, 3, -4, 9223372036854775807LL});
}

TEST_CASE("read_trace reads a gzip file and gives the same keys as the plain one") {
  std::string text;
  Keys expected;
  for (std::int64_t k = 0; k < 20000; ++k) {
    const std::int64_t key = (k * 7919) % 2531;
    text += std::to_string(key) + "\n";
    expected.push_back(key);
  }
  TempFile gz("keys.gz"), plain("keys.txt");
  write_gzip(gz, text);
  write_plain(plain, text);
  CHECK(fs::file_size(gz.path) < fs::file_size(plain.path));  // really compressed
  CHECK(nitro::bench::read_trace(gz.str()) == expected);
  CHECK(nitro::bench::read_trace(plain.str()) == expected);
}

TEST_CASE("read_trace skips blank lines and allows whitespace around a key and CRLF endings") {
  TempFile f("spaces.gz");
  write_gzip(f, "\n  5\n\t6 \r\n\r\n   \n+7\r\n8");  // the last line has no newline
  CHECK(nitro::bench::read_trace(f.str()) == Keys{5, 6, 7, 8});
}

TEST_CASE("read_trace reads a line longer than its buffer") {
  TempFile f("long.txt");
  std::string text(10000, ' ');  // built in steps: GCC 12 warns falsely on a chain of string +
  text += "42";
  text.append(5000, ' ');
  text += "\n43\n";
  write_plain(f, text);
  CHECK(nitro::bench::read_trace(f.str()) == Keys{42, 43});
}

TEST_CASE("read_trace names the file and the line number and text of a line that is not an integer") {
  TempFile f("bad.gz");
  write_gzip(f, "1\n2\n\n3x\n4\n");
  CHECK_THROWS_WITH_AS(nitro::bench::read_trace(f.str()), doctest::Contains(":4: '3x' is not an integer key"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::bench::read_trace(f.str()), doctest::Contains(f.str().c_str()), nitro::Error);

  TempFile g("words.txt");
  write_plain(g, "10\nkey eleven\n");
  CHECK_THROWS_WITH_AS(nitro::bench::read_trace(g.str()), doctest::Contains(":2: 'key eleven' is not an integer key"),
                       nitro::Error);
  TempFile h("float.txt");
  write_plain(h, "1.5\n");
  CHECK_THROWS_WITH_AS(nitro::bench::read_trace(h.str()), doctest::Contains(":1: '1.5'"), nitro::Error);
}

TEST_CASE("read_trace refuses a key that does not fit in 64 bits") {
  TempFile f("big.txt");
  write_plain(f, "1\n99999999999999999999\n");
  CHECK_THROWS_WITH_AS(nitro::bench::read_trace(f.str()), doctest::Contains(":2: key '99999999999999999999' is out of range"),
                       nitro::Error);
}

TEST_CASE("read_trace names a missing file and what to do") {
  const std::string path = (fs::temp_directory_path() / "nitro_no_such_trace.gz").string();
  CHECK_THROWS_WITH_AS(nitro::bench::read_trace(path), doctest::Contains(("cannot open trace file '" + path + "'").c_str()),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::bench::read_trace(path), doctest::Contains("check the path"), nitro::Error);
  const std::string dir = fs::temp_directory_path().string();
  CHECK_THROWS_WITH_AS(nitro::bench::read_trace(dir), doctest::Contains("is a directory"), nitro::Error);
}

TEST_CASE("read_trace refuses an empty trace") {
  TempFile empty("empty.txt"), blank("blank.gz");
  write_plain(empty, "");
  write_gzip(blank, "\n \n\t\n");
  CHECK_THROWS_WITH_AS(nitro::bench::read_trace(empty.str()), doctest::Contains("holds no keys"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::bench::read_trace(blank.str()), doctest::Contains("holds no keys"), nitro::Error);
}

TEST_CASE("read_trace reports a truncated gzip file") {
  std::string text;
  for (int k = 0; k < 50000; ++k) text += std::to_string(k * 31 % 9973) + "\n";
  TempFile whole("whole.gz"), cut("cut.gz");
  write_gzip(whole, text);
  std::ifstream in(whole.path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_plain(cut, bytes.substr(0, bytes.size() / 2));
  CHECK_THROWS_WITH_AS(nitro::bench::read_trace(cut.str()), doctest::Contains("damaged or truncated"), nitro::Error);
}

#else
TEST_CASE("without zlib read_trace says so, and the trace-reading tests are skipped") {
  MESSAGE("built without zlib (NITRO_HAVE_ZLIB=0): the trace-reading tests are skipped");
  CHECK_THROWS_WITH_AS(nitro::bench::read_trace("any.trace.gz"), doctest::Contains("this build has no zlib"), nitro::Error);
}
#endif

TEST_CASE("Zipf samples key 1 with its exact probability") {
  constexpr double s = 0.99;
  constexpr std::size_t n = 1000, samples = 200000;
  double total = 0;
  for (std::size_t k = 1; k <= n; ++k) total += std::pow(static_cast<double>(k), -s);
  const double p1 = 1.0 / total, p2 = std::pow(2.0, -s) / total;
  const nitro::bench::Zipf zipf(s, n);
  CHECK(zipf.probability(1) == doctest::Approx(p1).epsilon(1e-12));
  CHECK(zipf.probability(2) == doctest::Approx(p2).epsilon(1e-12));

  const Keys keys = nitro::bench::zipf_requests(s, n, samples, 1234);
  REQUIRE(keys.size() == samples);
  CHECK(std::all_of(keys.begin(), keys.end(), [](std::int64_t k) { return k >= 1 && k <= 1000; }));
  const auto ones = static_cast<double>(std::count(keys.begin(), keys.end(), 1));
  const auto twos = static_cast<double>(std::count(keys.begin(), keys.end(), 2));
  // Five standard deviations of a binomial proportion over 200k draws.
  const double sd1 = std::sqrt(p1 * (1 - p1) / samples), sd2 = std::sqrt(p2 * (1 - p2) / samples);
  CHECK(std::abs(ones / samples - p1) < 5 * sd1);
  CHECK(std::abs(twos / samples - p2) < 5 * sd2);
  // The same seed gives the same requests.
  CHECK(nitro::bench::zipf_requests(s, n, 1000, 1234) == Keys(keys.begin(), keys.begin() + 1000));
}

TEST_CASE("Zipf top_mass is the share of the most popular keys") {
  const nitro::bench::Zipf zipf(0.99, 5000);
  double top = 0, all = 0;
  for (std::size_t k = 1; k <= 5000; ++k) {
    all += zipf.probability(k);
    if (k <= 512) top += zipf.probability(k);
  }
  CHECK(all == doctest::Approx(1.0));
  CHECK(zipf.top_mass(512) == doctest::Approx(top));
  CHECK(zipf.top_mass(512) == doctest::Approx(0.74).epsilon(0.01));  // the traces README's figure
  CHECK(zipf.top_mass(5000) == doctest::Approx(1.0));
}

TEST_CASE("shuffled_epochs gives each epoch as a fresh permutation of the keys") {
  constexpr std::size_t n = 1000, epochs = 4;
  const Keys trace = nitro::bench::shuffled_epochs(n, epochs, 99);
  REQUIRE(trace.size() == n * epochs);
  Keys identity(n);
  std::iota(identity.begin(), identity.end(), std::int64_t{0});
  std::vector<Keys> orders;
  for (std::size_t e = 0; e < epochs; ++e) {
    Keys epoch(trace.begin() + static_cast<std::ptrdiff_t>(e * n), trace.begin() + static_cast<std::ptrdiff_t>((e + 1) * n));
    CHECK(epoch != identity);  // shuffled
    orders.push_back(epoch);
    std::sort(epoch.begin(), epoch.end());
    CHECK(epoch == identity);  // every key once
  }
  for (std::size_t e = 1; e < epochs; ++e) CHECK(orders[e] != orders[e - 1]);  // a fresh order each epoch
  CHECK(nitro::bench::shuffled_epochs(n, epochs, 99) == trace);                 // reproducible
  CHECK(nitro::bench::shuffled_epochs(n, epochs, 100) != trace);
}

}  // namespace nitro_test_cache_trace
