#pragma once
// Cache workloads for the cache benchmarks and cache_sim: reading an access trace (one integer key per
// line, gzip-compressed or plain), replaying it through a cache, and two generated workloads with an
// exact answer: shuffled epochs (a training data set read in a fresh random order each epoch) and
// independent Zipf requests. Reading traces needs zlib (link ZLIB::ZLIB, or -lz); a build without it
// defines NITRO_HAVE_ZLIB to 0, and read_trace then throws nitro::Error saying so (the trace-reading
// tests and benchmark rows are skipped; the generated workloads need nothing).
#include <nitro/core/error.hpp>

#if !defined(NITRO_HAVE_ZLIB)
#define NITRO_HAVE_ZLIB 1
#endif
#if NITRO_HAVE_ZLIB
#include <zlib.h>
#endif

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

namespace nitro::bench {

namespace detail {

inline bool is_space(char c) noexcept { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

inline std::string_view trimmed(std::string_view s) noexcept {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace detail

#if NITRO_HAVE_ZLIB
namespace detail {

struct GzClose {
  void operator()(gzFile f) const noexcept { gzclose(f); }
};
using GzFile = std::unique_ptr<std::remove_pointer_t<gzFile>, GzClose>;

/// What zlib says went wrong with `f`, or "" when nothing did (end of file is not an error).
inline std::string gz_error(gzFile f) {
  int code = Z_OK;
  const char* text = gzerror(f, &code);
  if (code == Z_OK || code == Z_STREAM_END) return {};
  if (code == Z_ERRNO) return std::strerror(errno);
  return text ? text : "zlib error " + std::to_string(code);
}

}  // namespace detail

/// The keys of a trace file, in order: one integer per line, surrounding whitespace allowed, blank
/// lines skipped. The file may be gzip-compressed or plain (zlib reads both). Throws nitro::Error for
/// a file that cannot be read, a line that is not an integer or does not fit in 64 bits, and a trace
/// with no keys.
inline std::vector<std::int64_t> read_trace(const std::string& path) {
  std::error_code ec;
  NITRO_CHECK(!std::filesystem::is_directory(path, ec), "read_trace: '", path,
              "' is a directory; give a trace file (one integer key per line, gzip-compressed or plain)");
  errno = 0;
  detail::GzFile file(gzopen(path.c_str(), "rb"));
  if (!file) {
    const int err = errno;
    nitro::detail::fail("read_trace: cannot open trace file '", path, "': ",
                        err ? std::strerror(err) : "zlib could not allocate its state",
                        "; check the path (a trace is a text file of one integer key per line, gzip-compressed or "
                        "plain; the benchmarks look in $NITRO_TRACES, then in ../shared/traces)");
  }
  gzbuffer(file.get(), 1 << 16);

  std::vector<std::int64_t> keys;
  std::size_t line_number = 0;
  // zlib reports a damaged or truncated file after handing out what it could decode.
  auto check_stream = [&] {
    if (const std::string err = detail::gz_error(file.get()); !err.empty())
      nitro::detail::fail("read_trace: cannot read trace file '", path, "' past line ", line_number, ": ", err,
                          "; the file is damaged or truncated (a trace is one integer key per line, gzip-compressed "
                          "or plain)");
  };
  std::string line;
  char buffer[4096];
  for (bool more = true; more;) {
    // One whole line, however long: gzgets stops at a newline or a full buffer.
    line.clear();
    for (;;) {
      if (!gzgets(file.get(), buffer, sizeof buffer)) {
        more = false;
        check_stream();
        break;
      }
      line += buffer;
      if (line.back() == '\n') break;
    }
    if (line.empty()) continue;
    ++line_number;
    const std::string_view text = detail::trimmed(line);
    if (text.empty()) continue;
    std::string_view digits = text;
    if (digits.front() == '+') digits.remove_prefix(1);
    std::int64_t key = 0;
    const auto [end, parsed] = std::from_chars(digits.data(), digits.data() + digits.size(), key);
    if (parsed == std::errc::result_out_of_range) {
      check_stream();
      nitro::detail::fail("read_trace: ", path, ":", line_number, ": key '", text,
                          "' is out of range (a key must fit in a signed 64-bit integer)");
    }
    if (parsed != std::errc{} || end != digits.data() + digits.size() || digits.empty()) {
      check_stream();
      nitro::detail::fail("read_trace: ", path, ":", line_number, ": '", text,
                          "' is not an integer key (a trace is one integer key per line)");
    }
    keys.push_back(key);
  }
  NITRO_CHECK(!keys.empty(), "read_trace: trace file '", path,
              "' holds no keys; a trace is one integer key per line (gzip-compressed or plain)");
  return keys;
}
#else
/// This build has no zlib: reading a trace is refused, with what to do.
inline std::vector<std::int64_t> read_trace(const std::string& path) {
  nitro::detail::fail("read_trace: cannot read '", path, "': this build has no zlib (NITRO_HAVE_ZLIB=0); install "
                      "zlib1g-dev, or carry it to the GPU machine with ../shared/gpu/prepare.sh, and configure again");
}
#endif

/// Replays `trace` through `cache` the way a reader uses it: get, and on a miss put `value`.
/// Returns the cache's stats() afterwards (hit_ratio() is the trace's hit ratio on a fresh cache).
template <class CacheT, class Key, class Value = typename CacheT::value_type>
auto replay(CacheT& cache, const std::vector<Key>& trace, const Value& value = Value{}) {
  for (const Key& key : trace)
    if (!cache.get(key)) cache.put(key, value);
  return cache.stats();
}

/// `epochs` passes over the keys 0..keys-1, each in a fresh random order (std::shuffle with one
/// std::mt19937_64 seeded with `seed`), concatenated: a training data set read for `epochs` epochs.
inline std::vector<std::int64_t> shuffled_epochs(std::size_t keys, std::size_t epochs, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> order(keys), trace;
  trace.reserve(keys * epochs);
  for (std::size_t e = 0; e < epochs; ++e) {
    std::iota(order.begin(), order.end(), std::int64_t{0});
    std::shuffle(order.begin(), order.end(), rng);
    trace.insert(trace.end(), order.begin(), order.end());
  }
  return trace;
}

/// Zipf's law over the keys 1..n: P(k) = k^-s / sum(i^-s, i = 1..n). Exact inverse-CDF sampling over
/// the precomputed cumulative weights (a binary search per draw), no approximation.
class Zipf {
 public:
  Zipf(double s, std::size_t n) : cumulative_(n) {
    NITRO_CHECK(n > 0, "bench::Zipf: the number of keys is 0; give at least 1");
    NITRO_CHECK(std::isfinite(s) && s >= 0, "bench::Zipf: skew ", s, " must be finite and >= 0");
    double total = 0;
    for (std::size_t k = 1; k <= n; ++k) cumulative_[k - 1] = total += std::pow(static_cast<double>(k), -s);
  }
  /// The exact probability of key k (1 <= k <= n).
  [[nodiscard]] double probability(std::size_t k) const {
    NITRO_CHECK(k >= 1 && k <= cumulative_.size(), "bench::Zipf: key ", k, " is outside 1..", cumulative_.size());
    return (cumulative_[k - 1] - (k > 1 ? cumulative_[k - 2] : 0.0)) / cumulative_.back();
  }
  /// The probability that a request hits one of the keys 1..c: the hit ratio of keeping the c most popular.
  [[nodiscard]] double top_mass(std::size_t c) const {
    return c == 0 ? 0.0 : cumulative_[std::min(c, cumulative_.size()) - 1] / cumulative_.back();
  }
  [[nodiscard]] std::size_t keys() const noexcept { return cumulative_.size(); }

  template <class Rng>
  std::int64_t operator()(Rng& rng) const {
    const double u = std::uniform_real_distribution<double>(0.0, cumulative_.back())(rng);
    const auto it = std::upper_bound(cumulative_.begin(), cumulative_.end(), u);
    const auto i = std::min<std::size_t>(static_cast<std::size_t>(it - cumulative_.begin()), cumulative_.size() - 1);
    return static_cast<std::int64_t>(i + 1);
  }

 private:
  std::vector<double> cumulative_;  // cumulative_[k - 1] = sum(i^-s, i = 1..k)
};

/// `count` independent requests drawn from Zipf(s) over the keys 1..keys, std::mt19937_64 seeded with `seed`.
inline std::vector<std::int64_t> zipf_requests(double s, std::size_t keys, std::size_t count, std::uint64_t seed) {
  const Zipf zipf(s, keys);
  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> trace(count);
  for (auto& k : trace) k = zipf(rng);
  return trace;
}

}  // namespace nitro::bench
