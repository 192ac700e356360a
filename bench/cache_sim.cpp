// cache_sim: replays an access trace through nitro::Cache_st with a chosen eviction policy and prints
// the hit ratio. Each key gets one value weighing --bytes-per-key bytes (default 1) under a budget of
// --capacity such values, so the replay measures the policy, not the values.
//
//   cache_sim --trace ../shared/traces/gli.trace.gz --policy wtinylfu --capacity 1000
//   cache_sim --trace multi1.trace.gz --policy all --capacity 512
//
// --policy opt is Clairvoyant given the trace itself: Belady's bound. Exit code 2 for bad arguments
// or an unreadable trace.
#include "cache_policies.hpp"
#include "common.hpp"
#include "trace.hpp"

#include <nitro/core/error.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace {

using nitro::bench::CachePolicies;

constexpr const char* usage =
    "usage: cache_sim --trace FILE --policy NAME --capacity N [--bytes-per-key B]\n"
    "  --trace FILE         one integer key per line, gzip-compressed or plain\n"
    "  --policy NAME        an eviction policy, 'opt' (Belady's bound: clairvoyant given the trace) or 'all'\n"
    "  --capacity N         the cache holds N entries (a budget of N * B bytes), N > 0\n"
    "  --bytes-per-key B    the weight of each entry in bytes, B > 0 (default 1)\n"
    "Ends with RESULT <policy>_hit_pct=<hit %> goal<=<OPT hit %> for each policy: none can beat Belady.\n";

std::string valid_policies() {
  std::string s;
  nitro::bench::for_each_policy(CachePolicies{}, [&s](auto tag) {
    using P = typename decltype(tag)::type;
    s += std::string(P::name) + ", ";
  });
  return s + "opt, all";
}

std::uint64_t positive(std::string_view flag, std::string_view text) {
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  NITRO_CHECK(ec == std::errc{} && end == text.data() + text.size() && n > 0, "cache_sim: ", flag, " '", text,
              "' is not a positive integer");
  return n;
}

struct Row {
  std::string policy;
  nitro::CacheStats stats;
};

template <class P>
Row simulate(std::string label, const std::vector<std::int64_t>& trace, std::uint64_t entries, std::uint64_t bytes) {
  using Cache = nitro::Cache_st<P, std::int64_t, nitro::bench::Unit, nitro::bench::FixedWeight>;
  Cache cache({.capacity_bytes = entries * bytes, .policy = nitro::bench::policy_options<P>(entries, trace)},
              nitro::bench::FixedWeight{static_cast<std::int64_t>(bytes)});
  return {std::move(label), nitro::bench::replay(cache, trace)};
}

}  // namespace

int main(int argc, char** argv) {
  std::string trace_path, policy;
  std::uint64_t capacity = 0, bytes = 1;
  std::vector<Row> rows;
  std::vector<std::int64_t> trace;
  bool all = false;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string_view arg = argv[i], value;
      if (arg == "-h" || arg == "--help") {
        std::fputs(usage, stdout);
        return 0;
      }
      if (const auto eq = arg.find('='); eq != std::string_view::npos && arg.starts_with("--")) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
      } else if (arg.starts_with("--")) {
        NITRO_CHECK(i + 1 < argc, "cache_sim: ", arg, " needs a value");
        value = argv[++i];
      }
      if (arg == "--trace") trace_path = value;
      else if (arg == "--policy") policy = value;
      else if (arg == "--capacity") capacity = positive(arg, value);
      else if (arg == "--bytes-per-key") bytes = positive(arg, value);
      else nitro::detail::fail("cache_sim: unknown argument '", argv[i], "'");
    }
    NITRO_CHECK(!trace_path.empty(), "cache_sim: --trace FILE is missing");
    NITRO_CHECK(!policy.empty(), "cache_sim: --policy NAME is missing; one of: ", valid_policies());
    NITRO_CHECK(capacity > 0, "cache_sim: --capacity N is missing; give the number of entries the cache holds, N > 0");
    NITRO_CHECK(capacity <= (std::uint64_t{1} << 62) / bytes, "cache_sim: --capacity ", capacity,
                " times --bytes-per-key ", bytes, " is too large");

    const std::string want = nitro::bench::normalized_name(policy);
    all = want == "all";
    bool known = all;
    // Validate the name before reading the trace, so a typo fails fast.
    nitro::bench::for_each_policy(CachePolicies{}, [&](auto tag) {
      using P = typename decltype(tag)::type;
      known = known || want == nitro::bench::normalized_name(P::name) ||
              (want == "opt" && nitro::bench::is_clairvoyant<P>);
    });
    NITRO_CHECK(known, "cache_sim: unknown policy '", policy, "'; valid: ", valid_policies());

    trace = nitro::bench::read_trace(trace_path);
    nitro::bench::for_each_policy(CachePolicies{}, [&](auto tag) {
      using P = typename decltype(tag)::type;
      const bool opt = nitro::bench::is_clairvoyant<P>;
      if (all || want == nitro::bench::normalized_name(P::name) || (want == "opt" && opt))
        rows.push_back(simulate<P>(opt ? std::string(P::name) + " (opt)" : std::string(P::name), trace, capacity, bytes));
    });
  } catch (const nitro::Error& e) {
    std::fprintf(stderr, "%s\n%s", e.what(), usage);
    return 2;
  }

  std::vector<std::int64_t> distinct = trace;
  std::sort(distinct.begin(), distinct.end());
  const auto keys = std::unique(distinct.begin(), distinct.end()) - distinct.begin();
  std::printf("trace %s: %zu requests, %td distinct keys; capacity %llu entries x %llu bytes\n", trace_path.c_str(),
              trace.size(), keys, static_cast<unsigned long long>(capacity), static_cast<unsigned long long>(bytes));
  std::printf("%-18s %10s %10s %10s %8s\n", "policy", "capacity", "requests", "hits", "hit %");
  for (const Row& r : rows)
    std::printf("%-18s %10llu %10llu %10llu %8.2f\n", r.policy.c_str(), static_cast<unsigned long long>(capacity),
                static_cast<unsigned long long>(r.stats.hits + r.stats.misses),
                static_cast<unsigned long long>(r.stats.hits), 100.0 * r.stats.hit_ratio());
  // No policy can beat Belady's bound on the same trace: each row is checked against it.
  Row opt = simulate<nitro::evict::Clairvoyant>("opt", trace, capacity, bytes);
  for (const Row& r : rows) {
    std::string name = nitro::bench::normalized_name(r.policy.substr(0, r.policy.find(' ')));
    nitro::bench::result(name + "_hit_pct", 100.0 * r.stats.hit_ratio(), "<=", 100.0 * opt.stats.hit_ratio());
  }
  return 0;
}
