#pragma once
// The definitions of nitro/cache/disk_tier.hpp's non-template functions: included by disk_tier.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/cache/disk_tier.hpp>

namespace nitro::cache::detail {

NITRO_INLINE bool is_spill_file_name(std::string_view name) noexcept {
  if (!name.ends_with(file_suffix)) return false;
  name.remove_suffix(file_suffix.size());
  if (name.starts_with('-')) name.remove_prefix(1);
  if (name.empty()) return false;
  for (char c : name)
    if (c < '0' || c > '9') return false;
  return true;
}

NITRO_INLINE std::vector<std::byte> encode_header(std::uint64_t key, std::uint32_t index, const at::Tensor& t) {
  FileHeader h{};
  std::memcpy(h.magic, file_magic, sizeof h.magic);
  h.version = file_version;
  h.key = key;
  h.index = index;
  if (t.defined()) {
    h.ndim = static_cast<std::uint32_t>(t.dim());
    h.dtype = static_cast<std::int32_t>(t.scalar_type());
    h.payload_bytes = static_cast<std::uint64_t>(t.nbytes());
    h.payload_checksum = xxh64({static_cast<const std::byte*>(t.data_ptr()), t.nbytes()});
  } else {
    h.dtype = undefined_dtype;
  }
  std::vector<std::byte> out(header_bytes(h.ndim));
  std::memcpy(out.data(), &h, sizeof h);
  for (std::uint32_t d = 0; d < h.ndim; ++d) {
    const std::int64_t s = t.size(d);
    std::memcpy(out.data() + sizeof h + 8 * d, &s, 8);
  }
  const std::uint64_t check = xxh64({out.data(), out.size() - 8});
  std::memcpy(out.data() + out.size() - 8, &check, 8);
  return out;
}

NITRO_INLINE std::optional<at::Tensor> decode_tensor(int fd, std::uint64_t key, std::uint32_t index, std::uint64_t& left, bool undefined_allowed) {
  FileHeader h{};
  if (left < header_bytes(0) || !read_all(fd, &h, sizeof h)) return std::nullopt;
  if (std::memcmp(h.magic, file_magic, sizeof h.magic) != 0 || h.version != file_version || h.key != key ||
      h.index != index || h.ndim > max_file_ndim || left < header_bytes(h.ndim))
    return std::nullopt;
  std::vector<std::byte> head(header_bytes(h.ndim));
  std::memcpy(head.data(), &h, sizeof h);
  if (!read_all(fd, head.data() + sizeof h, head.size() - sizeof h)) return std::nullopt;
  std::uint64_t check;
  std::memcpy(&check, head.data() + head.size() - 8, 8);
  if (check != xxh64({head.data(), head.size() - 8})) return std::nullopt;
  left -= head.size();
  if (h.payload_bytes > left) return std::nullopt;
  if (h.dtype == undefined_dtype) {
    if (!undefined_allowed || h.ndim != 0 || h.payload_bytes != 0) return std::nullopt;
    return at::Tensor();
  }
  if (h.dtype < 0 || h.dtype >= static_cast<std::int32_t>(c10::ScalarType::Undefined)) return std::nullopt;
  const auto dtype = static_cast<c10::ScalarType>(h.dtype);
  if (c10::isQIntType(dtype)) return std::nullopt;
  std::uint64_t item = 0;
  try {
    item = c10::elementSize(dtype);
  } catch (const c10::Error&) {
    return std::nullopt;
  }
  std::vector<std::int64_t> sizes(h.ndim);
  bool empty = false;
  for (std::uint32_t d = 0; d < h.ndim; ++d) {
    std::memcpy(&sizes[d], head.data() + sizeof h + 8 * d, 8);
    if (sizes[d] < 0) return std::nullopt;
    empty = empty || sizes[d] == 0;
  }
  std::uint64_t expected = empty ? 0 : item;
  for (std::uint32_t d = 0; d < h.ndim && !empty; ++d)  // an overflow would let a wrong shape pass
    if (__builtin_mul_overflow(expected, static_cast<std::uint64_t>(sizes[d]), &expected)) return std::nullopt;
  if (expected != h.payload_bytes) return std::nullopt;
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtype));
  if (h.payload_bytes > 0 && !read_all(fd, t.data_ptr(), h.payload_bytes)) return std::nullopt;
  if (xxh64({static_cast<const std::byte*>(t.data_ptr()), h.payload_bytes}) != h.payload_checksum)
    return std::nullopt;
  left -= h.payload_bytes;
  return t;
}

NITRO_INLINE std::optional<std::vector<at::Tensor>> decode_file(int fd, std::uint64_t key, std::uint64_t indexed_bytes, std::size_t count, bool undefined_allowed) {
  struct ::stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != indexed_bytes) return std::nullopt;
  std::uint64_t left = static_cast<std::uint64_t>(st.st_size);
  std::vector<at::Tensor> tensors;
  tensors.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    auto t = decode_tensor(fd, key, static_cast<std::uint32_t>(i), left, undefined_allowed);
    if (!t) return std::nullopt;
    tensors.push_back(std::move(*t));
  }
  if (left != 0) return std::nullopt;
  return tensors;
}

NITRO_INLINE void check_spillable(const at::Tensor& t, bool in_value, std::string_view who, std::string_view verb) {
  if (!t.defined()) {
    NITRO_CHECK(in_value, who, ": cannot ", verb, " an undefined tensor; ", verb, " a defined one");
    return;
  }
  NITRO_CHECK(t.layout() == c10::kStrided && !t.is_nested() && !c10::isQIntType(t.scalar_type()), who, ": cannot ",
              verb, " a ", t.layout(), " ", t.scalar_type(),
              " tensor; only dense (strided), non-quantized tensors can be spilled to disk (convert it, e.g. "
              ".to_dense())");
}

}  // namespace nitro::cache::detail

namespace nitro {

NITRO_INLINE double DiskTierStats::hit_ratio() const noexcept {
  const auto n = hits + misses;
  return n ? static_cast<double>(hits) / static_cast<double>(n) : 0.0;
}

NITRO_INLINE double TieredCacheStats::hit_ratio() const noexcept {
  const auto n = memory.hits + memory.misses;
  return n ? static_cast<double>(hits()) / static_cast<double>(n) : 0.0;
}

}  // namespace nitro
