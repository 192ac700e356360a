#pragma once
// The definitions of nitro/cache/evict/wtinylfu.hpp's non-template functions: included by wtinylfu.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/cache/evict/wtinylfu.hpp>

namespace nitro::evict::detail {

NITRO_INLINE unsigned FrequencySketch::frequency(std::uint64_t hash) const noexcept {
  const Where w = where(hash);
  unsigned freq = 15;
  for (unsigned i = 0; i < 4; ++i) {
    const unsigned h = w.counters >> (i << 3);
    const auto count =
        static_cast<unsigned>((table_[w.block + (h & 1u) + (i << 1)] >> (((h >> 1) & 15u) << 2)) & 0xfu);
    freq = std::min(freq, count);
  }
  return freq;
}

NITRO_INLINE void FrequencySketch::increment(std::uint64_t hash) noexcept {
  const Where w = where(hash);
  bool added = false;
  for (unsigned i = 0; i < 4; ++i) {
    const unsigned h = w.counters >> (i << 3);
    added |= increment_at(w.block + (h & 1u) + (i << 1), (h >> 1) & 15u);
  }
  if (added && ++additions_ == sample_size_) reset();
}

NITRO_INLINE void FrequencySketch::clear() noexcept {
  std::fill(table_.begin(), table_.end(), 0);
  additions_ = 0;
}

NITRO_INLINE auto FrequencySketch::where(std::uint64_t h) const noexcept -> Where {
  auto x = static_cast<std::uint32_t>(h ^ (h >> 32));
  x ^= x >> 17;
  x *= 0xed5ad4bbu;
  x ^= x >> 11;
  x *= 0xac4c1b51u;
  x ^= x >> 15;
  std::uint32_t c = x * 0x31848babu;
  c ^= c >> 14;
  return {base_ + ((static_cast<std::size_t>(x) & block_mask_) << 3), c};
}

NITRO_INLINE bool FrequencySketch::increment_at(std::size_t i, unsigned j) noexcept {  // counter j (0..15) of word i
  const unsigned offset = j << 2;
  const std::uint64_t mask = 0xfULL << offset;
  if ((table_[i] & mask) == mask) return false;
  table_[i] += 1ULL << offset;
  return true;
}

NITRO_INLINE void FrequencySketch::reset() noexcept {
  std::size_t odd = 0;
  for (auto& word : table_) {
    odd += static_cast<std::size_t>(std::popcount(word & 0x1111111111111111ULL));
    word = (word >> 1) & 0x7777777777777777ULL;
  }
  additions_ = (additions_ >> 1) - (odd >> 2);
}

}  // namespace nitro::evict::detail
