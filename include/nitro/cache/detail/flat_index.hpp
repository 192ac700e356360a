#pragma once
// The cache's key -> slot index: open addressing with linear probing and backward-shift deletion
// (no tombstones), at most half full. One probe of 16 bytes per lookup for 8-byte keys is what makes
// a hit cheaper than std::unordered_map's bucket and node chase. Internal to cache.hpp.
#include <nitro/core/error.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <type_traits>
#include <vector>

namespace nitro::cache {

/// A dense index the cache gives each resident entry; eviction policies keep their books per slot.
using Slot = std::uint32_t;
/// No slot.
inline constexpr Slot no_slot = std::numeric_limits<Slot>::max();

/// The default hash of a cache key: std::hash, then a 64-bit finaliser (murmur3's), because
/// std::hash of an integer is the identity and the index uses the low bits.
template <class Key>
struct KeyHash {
  /// std::hash<Key> of `key`, mixed so that every input bit reaches the low bits.
  std::uint64_t operator()(const Key& key) const noexcept {
    std::uint64_t x = static_cast<std::uint64_t>(std::hash<Key>{}(key));
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
  }
};

namespace detail {

template <class Key, class Hash>
class FlatIndex {
 public:
  FlatIndex() { rehash(16); }

  /// The slot of `key`, or no_slot.
  [[nodiscard]] Slot find(const Key& key) const noexcept { return find_hashed(key, hash_(key)); }
  [[nodiscard]] Slot find_hashed(const Key& key, std::uint64_t h) const noexcept {
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Bucket& b = buckets_[i];
      if (b.slot == no_slot) return no_slot;
      if (b.key == key) return b.slot;
    }
  }

  /// Adds `key` (which must be absent).
  void insert(const Key& key, Slot slot) {
    if (2 * (size_ + 1) > buckets_.size()) rehash(2 * buckets_.size());
    place(key, slot, hash_(key));
    ++size_;
  }

  /// Removes `key`; false when it was absent.
  bool erase(const Key& key) noexcept {
    std::size_t i = hash_(key) & mask_;
    for (;; i = (i + 1) & mask_) {
      if (buckets_[i].slot == no_slot) return false;
      if (buckets_[i].key == key) break;
    }
    // Backward shift: move later members of the probe run into the hole while that keeps each
    // reachable from its home bucket.
    for (std::size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      Bucket& b = buckets_[j];
      if (b.slot == no_slot) break;
      const std::size_t home = hash_(b.key) & mask_;
      // b may move to i when its home is not in the cyclic range (i, j].
      const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
      if (!stays) {
        buckets_[i] = std::move(b);
        i = j;
      }
    }
    buckets_[i].slot = no_slot;
    buckets_[i].key = Key{};
    --size_;
    return true;
  }

  void clear() {
    buckets_.assign(16, Bucket{});
    mask_ = 15;
    size_ = 0;
  }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t memory_bytes() const noexcept { return buckets_.capacity() * sizeof(Bucket); }
  [[nodiscard]] const Hash& hash_function() const noexcept { return hash_; }

 private:
  struct Bucket {
    Key key{};
    Slot slot = no_slot;
  };

  void place(const Key& key, Slot slot, std::uint64_t h) {
    std::size_t i = h & mask_;
    while (buckets_[i].slot != no_slot) i = (i + 1) & mask_;
    buckets_[i].key = key;
    buckets_[i].slot = slot;
  }

  void rehash(std::size_t buckets) {
    std::vector<Bucket> old(buckets);
    old.swap(buckets_);
    mask_ = buckets - 1;
    for (Bucket& b : old)
      if (b.slot != no_slot) place(b.key, b.slot, hash_(b.key));
  }

  std::vector<Bucket> buckets_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
  [[no_unique_address]] Hash hash_{};
};

}  // namespace detail
}  // namespace nitro::cache
