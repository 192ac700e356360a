#pragma once
// The eviction policies the cache benchmarks and cache_sim compare, as one type list, and what they
// share: the options to give each policy, a trivial value with a fixed weight (so a replay measures
// the policy, not tensors), and policy names as a user may type them.
#include <nitro/cache/cache.hpp>
#include <nitro/cache/evict/clairvoyant.hpp>
#include <nitro/cache/evict/fifo.hpp>
#include <nitro/cache/evict/lfu.hpp>
#include <nitro/cache/evict/lru.hpp>
#include <nitro/cache/evict/no_evict.hpp>
#include <nitro/cache/evict/s3fifo.hpp>
#include <nitro/cache/evict/sieve.hpp>
#include <nitro/cache/evict/wtinylfu.hpp>

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace nitro::bench {

template <class... P>
struct PolicyList {
  static constexpr std::size_t size = sizeof...(P);
};

/// Every policy, in the order the tables show them; Clairvoyant (Belady's bound) last.
using CachePolicies = PolicyList<evict::Lru, evict::Lfu, evict::Fifo, evict::Sieve, evict::S3Fifo, evict::WTinyLfu,
                                 evict::NoEvict, evict::Clairvoyant>;

/// Calls f(std::type_identity<P>{}) for each policy P of the list, in order.
template <class... P, class F>
void for_each_policy(PolicyList<P...>, F&& f) {
  (f(std::type_identity<P>{}), ...);
}

/// Whether P is Belady's rule (it needs the future access order).
template <class P>
constexpr bool is_clairvoyant = requires(typename P::Options o, std::vector<std::int64_t> v) { o.accesses = v; };

/// The options for policy P in a cache of `entries` entries whose gets will follow `future`: a
/// frequency sketch sized for the entries (WTinyLfu), the future order (Clairvoyant).
template <class P>
typename P::Options policy_options(std::size_t entries, const std::vector<std::int64_t>& future = {}) {
  typename P::Options o{};
  if constexpr (requires { o.expected_entries = entries; }) o.expected_entries = entries;
  if constexpr (is_clairvoyant<P>) o.accesses = future;
  return o;
}

/// A trivial cached value: replays measure the policy, not the values.
struct Unit {};
/// Every entry weighs the same `bytes`, so a budget of N * bytes holds N entries.
struct FixedWeight {
  std::int64_t bytes = 1;
  std::int64_t operator()(const Unit&) const noexcept { return bytes; }
};

/// A policy name as typed ("NoEvict", "no-evict" and "no_evict" are the same): lower case, no '_' or '-'.
inline std::string normalized_name(std::string_view name) {
  std::string s;
  for (const char c : name)
    if (c != '_' && c != '-') s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace nitro::bench
