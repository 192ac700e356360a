#pragma once
// The definitions of nitro/io/file.hpp's non-template functions: included by file.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/io/file.hpp>

namespace nitro::io {

namespace detail {

NITRO_INLINE std::uint64_t xxh_round(std::uint64_t acc, std::uint64_t lane) noexcept {
  return std::rotl(acc + lane * xxh_p2, 31) * xxh_p1;
}

NITRO_INLINE std::uint64_t xxh_merge(std::uint64_t h, std::uint64_t acc) noexcept {
  return (h ^ xxh_round(0, acc)) * xxh_p1 + xxh_p4;
}

NITRO_INLINE std::uint64_t xxh_finish(std::uint64_t h, const unsigned char* p, const unsigned char* end) noexcept {
  // Lengths, not p + 8 <= end: no pointer is formed past the end (nor from a null p with nothing to read).
  for (; end - p >= 8; p += 8) h = std::rotl(h ^ xxh_round(0, read_le<std::uint64_t>(p)), 27) * xxh_p1 + xxh_p4;
  if (end - p >= 4) {
    h = std::rotl(h ^ (static_cast<std::uint64_t>(read_le<std::uint32_t>(p)) * xxh_p1), 23) * xxh_p2 + xxh_p3;
    p += 4;
  }
  for (; p < end; ++p) h = std::rotl(h ^ (*p * xxh_p5), 11) * xxh_p1;
  h ^= h >> 33;
  h *= xxh_p2;
  h ^= h >> 29;
  h *= xxh_p3;
  h ^= h >> 32;
  return h;
}

}  // namespace detail

NITRO_INLINE std::uint64_t xxh64(std::span<const std::byte> bytes, std::uint64_t seed) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  const unsigned char* const end = p + n;
  std::uint64_t h;
  if (n >= 32) {
    std::uint64_t v1 = seed + detail::xxh_p1 + detail::xxh_p2, v2 = seed + detail::xxh_p2, v3 = seed,
                  v4 = seed - detail::xxh_p1;
    for (const unsigned char* const limit = end - 32; p <= limit; p += 32) {
      v1 = detail::xxh_round(v1, detail::read_le<std::uint64_t>(p));
      v2 = detail::xxh_round(v2, detail::read_le<std::uint64_t>(p + 8));
      v3 = detail::xxh_round(v3, detail::read_le<std::uint64_t>(p + 16));
      v4 = detail::xxh_round(v4, detail::read_le<std::uint64_t>(p + 24));
    }
    h = std::rotl(v1, 1) + std::rotl(v2, 7) + std::rotl(v3, 12) + std::rotl(v4, 18);
    h = detail::xxh_merge(detail::xxh_merge(detail::xxh_merge(detail::xxh_merge(h, v1), v2), v3), v4);
  } else {
    h = seed + detail::xxh_p5;
  }
  return detail::xxh_finish(h + static_cast<std::uint64_t>(n), p, end);
}

NITRO_INLINE Xxh64::Xxh64(std::uint64_t seed) noexcept
    : seed_(seed), v_{seed + detail::xxh_p1 + detail::xxh_p2, seed + detail::xxh_p2, seed, seed - detail::xxh_p1} {}

NITRO_INLINE void Xxh64::update(std::span<const std::byte> bytes) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t n = bytes.size();
  if (n == 0) return;  // an empty span may hold a null pointer: nothing to copy from
  total_ += n;
  if (buffered_ > 0) {  // complete the stripe begun by an earlier piece
    const std::size_t take = std::min<std::size_t>(32 - buffered_, n);
    std::memcpy(buffer_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    n -= take;
    if (buffered_ < 32) return;
    stripe(buffer_);
    buffered_ = 0;
  }
  for (; n >= 32; p += 32, n -= 32) stripe(p);
  if (n > 0) {
    std::memcpy(buffer_, p, n);
    buffered_ = n;
  }
}

NITRO_INLINE std::uint64_t Xxh64::digest() const noexcept {
  std::uint64_t h;
  if (total_ >= 32) {
    h = std::rotl(v_[0], 1) + std::rotl(v_[1], 7) + std::rotl(v_[2], 12) + std::rotl(v_[3], 18);
    for (const std::uint64_t v : v_) h = detail::xxh_merge(h, v);
  } else {
    h = seed_ + detail::xxh_p5;
  }
  return detail::xxh_finish(h + total_, buffer_, buffer_ + buffered_);
}

NITRO_INLINE void Xxh64::stripe(const unsigned char* p) noexcept {
  for (int i = 0; i < 4; ++i) v_[i] = detail::xxh_round(v_[i], detail::read_le<std::uint64_t>(p + 8 * i));
}

namespace detail {

NITRO_INLINE std::uint64_t xxh3_fold(std::uint64_t a, std::uint64_t b) noexcept {
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<std::uint64_t>(p) ^ static_cast<std::uint64_t>(p >> 64);
}

NITRO_INLINE std::uint64_t xxh3_avalanche(std::uint64_t h) noexcept {
  h ^= h >> 37;
  h *= xxh3_mx1;
  return h ^ (h >> 32);
}

NITRO_INLINE std::uint64_t xxh3_avalanche_xxh64(std::uint64_t h) noexcept {
  h ^= h >> 33;
  h *= xxh_p2;
  h ^= h >> 29;
  h *= xxh_p3;
  return h ^ (h >> 32);
}

NITRO_INLINE std::uint64_t xxh3_mix16(const unsigned char* p, const unsigned char* s) noexcept {
  return xxh3_fold(read_le<std::uint64_t>(p) ^ read_le<std::uint64_t>(s),
                   read_le<std::uint64_t>(p + 8) ^ read_le<std::uint64_t>(s + 8));
}

NITRO_INLINE std::uint64_t xxh3_short(const unsigned char* p, std::size_t n) noexcept {
  const unsigned char* const s = xxh3_secret;
  if (n <= 16) {
    if (n > 8) {
      const std::uint64_t lo =
          read_le<std::uint64_t>(s + 24) ^ read_le<std::uint64_t>(s + 32) ^ read_le<std::uint64_t>(p);
      const std::uint64_t hi =
          read_le<std::uint64_t>(s + 40) ^ read_le<std::uint64_t>(s + 48) ^ read_le<std::uint64_t>(p + n - 8);
      return xxh3_avalanche(n + __builtin_bswap64(lo) + hi + xxh3_fold(lo, hi));
    }
    if (n >= 4) {
      const std::uint64_t in =
          read_le<std::uint32_t>(p + n - 4) + (static_cast<std::uint64_t>(read_le<std::uint32_t>(p)) << 32);
      std::uint64_t h = in ^ (read_le<std::uint64_t>(s + 8) ^ read_le<std::uint64_t>(s + 16));
      h ^= std::rotl(h, 49) ^ std::rotl(h, 24);
      h *= xxh3_mx2;
      h ^= (h >> 35) + n;
      h *= xxh3_mx2;
      return h ^ (h >> 28);
    }
    if (n > 0) {
      const std::uint32_t combined = (static_cast<std::uint32_t>(p[0]) << 16) |
                                     (static_cast<std::uint32_t>(p[n >> 1]) << 24) | p[n - 1] |
                                     static_cast<std::uint32_t>(n << 8);
      return xxh3_avalanche_xxh64(combined ^ (read_le<std::uint32_t>(s) ^ read_le<std::uint32_t>(s + 4)));
    }
    return xxh3_avalanche_xxh64(read_le<std::uint64_t>(s + 56) ^ read_le<std::uint64_t>(s + 64));
  }
  std::uint64_t acc = n * xxh_p1;
  if (n <= 128) {
    const std::size_t rounds = ((n - 1) >> 5) + 1;
    for (std::size_t i = rounds; i-- > 0;) {
      acc += xxh3_mix16(p + 16 * i, s + 32 * i);
      acc += xxh3_mix16(p + n - 16 * i - 16, s + 32 * i + 16);
    }
    return xxh3_avalanche(acc);
  }
  for (std::size_t i = 0; i < 8; ++i) acc += xxh3_mix16(p + 16 * i, s + 16 * i);
  acc = xxh3_avalanche(acc);
  for (std::size_t i = 8; i < n / 16; ++i) acc += xxh3_mix16(p + 16 * i, s + 16 * (i - 8) + 3);
  acc += xxh3_mix16(p + n - 16, s + 119);
  return xxh3_avalanche(acc);
}

NITRO_INLINE void xxh3_accumulate_scalar(std::uint64_t* acc, const unsigned char* p, const unsigned char* secret, std::size_t stripes) noexcept {
  for (std::size_t n = 0; n < stripes; ++n, p += xxh3_stripe, secret += 8)
    for (std::size_t i = 0; i < 8; ++i) {
      const std::uint64_t v = read_le<std::uint64_t>(p + 8 * i);
      const std::uint64_t k = v ^ read_le<std::uint64_t>(secret + 8 * i);
      acc[i ^ 1] += v;
      acc[i] += (k & 0xFFFFFFFFu) * (k >> 32);
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
NITRO_INLINE void xxh3_accumulate_sse2(std::uint64_t* acc, const unsigned char* p, const unsigned char* secret, std::size_t stripes) noexcept {
  __m128i a[4];
  for (int i = 0; i < 4; ++i) a[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(acc) + i);
  for (std::size_t n = 0; n < stripes; ++n, p += xxh3_stripe, secret += 8)
    for (int i = 0; i < 4; ++i) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p) + i);
      const __m128i k = _mm_xor_si128(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(secret) + i));
      const __m128i product = _mm_mul_epu32(k, _mm_srli_epi64(k, 32));
      a[i] = _mm_add_epi64(a[i], _mm_add_epi64(product, _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2))));
    }
  for (int i = 0; i < 4; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(acc) + i, a[i]);
}
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
NITRO_INLINE __attribute__((target("avx2"))) void xxh3_accumulate_avx2(std::uint64_t* acc, const unsigned char* p, const unsigned char* secret, std::size_t stripes) noexcept {
  __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc));
  __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc) + 1);
  for (std::size_t n = 0; n < stripes; ++n, p += xxh3_stripe, secret += 8) {
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p) + 1);
    const __m256i k0 = _mm256_xor_si256(v0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(secret)));
    const __m256i k1 = _mm256_xor_si256(v1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(secret) + 1));
    a0 = _mm256_add_epi64(a0, _mm256_add_epi64(_mm256_mul_epu32(k0, _mm256_srli_epi64(k0, 32)),
                                               _mm256_shuffle_epi32(v0, _MM_SHUFFLE(1, 0, 3, 2))));
    a1 = _mm256_add_epi64(a1, _mm256_add_epi64(_mm256_mul_epu32(k1, _mm256_srli_epi64(k1, 32)),
                                               _mm256_shuffle_epi32(v1, _MM_SHUFFLE(1, 0, 3, 2))));
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc), a0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc) + 1, a1);
}
#endif

NITRO_INLINE Xxh3Accumulate xxh3_accumulate() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const Xxh3Accumulate chosen =
      __builtin_cpu_supports("avx2") ? &xxh3_accumulate_avx2 : &xxh3_accumulate_sse2;
  return chosen;
#else
  return &xxh3_accumulate_scalar;
#endif
}

NITRO_INLINE void xxh3_scramble(std::uint64_t* acc) noexcept {
  for (std::size_t i = 0; i < 8; ++i) {
    std::uint64_t a = acc[i];
    a ^= a >> 47;
    a ^= read_le<std::uint64_t>(xxh3_secret + 128 + 8 * i);
    acc[i] = a * xxh3_p32_1;
  }
}

NITRO_INLINE std::uint64_t xxh3_merge(const std::uint64_t* acc, std::uint64_t length) noexcept {
  std::uint64_t h = length * xxh_p1;
  for (std::size_t i = 0; i < 4; ++i)
    h += xxh3_fold(acc[2 * i] ^ read_le<std::uint64_t>(xxh3_secret + 11 + 16 * i),
                   acc[2 * i + 1] ^ read_le<std::uint64_t>(xxh3_secret + 11 + 16 * i + 8));
  return xxh3_avalanche(h);
}

NITRO_INLINE void xxh3_consume(std::uint64_t* acc, std::size_t& in_block, const unsigned char* p, std::size_t stripes) noexcept {
  const Xxh3Accumulate accumulate = xxh3_accumulate();
  while (stripes > 0) {
    const std::size_t take = std::min(stripes, xxh3_block_stripes - in_block);
    accumulate(acc, p, xxh3_secret + 8 * in_block, take);
    p += take * xxh3_stripe;
    stripes -= take;
    in_block += take;
    if (in_block == xxh3_block_stripes) {
      xxh3_scramble(acc);
      in_block = 0;
    }
  }
}

}  // namespace detail

NITRO_INLINE std::uint64_t xxh3(std::span<const std::byte> bytes) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  if (n <= 240) return detail::xxh3_short(p, n);
  std::uint64_t acc[8];
  std::memcpy(acc, detail::xxh3_acc_init, sizeof acc);
  std::size_t in_block = 0;
  // Every stripe but the last (which may be partial, and is taken as the input's last 64 bytes).
  detail::xxh3_consume(acc, in_block, p, (n - 1) / detail::xxh3_stripe);
  detail::xxh3_accumulate()(acc, p + n - detail::xxh3_stripe, detail::xxh3_secret + 192 - detail::xxh3_stripe - 7, 1);
  return detail::xxh3_merge(acc, n);
}

NITRO_INLINE void Xxh3::update(std::span<const std::byte> bytes) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t n = bytes.size();
  total_ += n;
  // Data is consumed only when more follows it: the last stripe of the input is digest()'s.
  if (buffered_ > detail::xxh3_buffer) __builtin_unreachable();  // (GCC's bounds warnings cannot tell)
  if (n <= detail::xxh3_buffer - buffered_) {
    if (n > 0) std::memcpy(buffer_ + buffered_, p, n);
    buffered_ += n;
    return;
  }
  if (buffered_ > 0) {  // fill the buffer, then consume it whole (more input follows)
    const std::size_t take = detail::xxh3_buffer - buffered_;
    std::memcpy(buffer_ + buffered_, p, take);
    p += take;
    n -= take;
    detail::xxh3_consume(acc_, in_block_, buffer_, detail::xxh3_buffer / detail::xxh3_stripe);
    buffered_ = 0;
  }
  if (n > detail::xxh3_buffer) {  // straight from the input, all but the last 1 to 64 bytes
    const std::size_t stripes = (n - 1) / detail::xxh3_stripe;
    detail::xxh3_consume(acc_, in_block_, p, stripes);
    p += stripes * detail::xxh3_stripe;
    n -= stripes * detail::xxh3_stripe;
    // Kept for digest(), whose last stripe may reach back into it.
    std::memcpy(buffer_ + detail::xxh3_buffer - detail::xxh3_stripe, p - detail::xxh3_stripe, detail::xxh3_stripe);
  }
  std::memcpy(buffer_, p, n);
  buffered_ = n;
}

NITRO_INLINE std::uint64_t Xxh3::digest() const noexcept {
  if (total_ <= 240) return detail::xxh3_short(buffer_, static_cast<std::size_t>(total_));
  std::uint64_t acc[8];
  std::memcpy(acc, acc_, sizeof acc);
  std::size_t in_block = in_block_;
  unsigned char last[detail::xxh3_stripe];
  const unsigned char* last_stripe;
  if (buffered_ >= detail::xxh3_stripe) {
    detail::xxh3_consume(acc, in_block, buffer_, (buffered_ - 1) / detail::xxh3_stripe);
    last_stripe = buffer_ + buffered_ - detail::xxh3_stripe;
  } else {  // the rest of the last stripe is the end of what was consumed before
    std::memcpy(last, buffer_ + detail::xxh3_buffer - (detail::xxh3_stripe - buffered_), detail::xxh3_stripe - buffered_);
    std::memcpy(last + detail::xxh3_stripe - buffered_, buffer_, buffered_);
    last_stripe = last;
  }
  detail::xxh3_accumulate()(acc, last_stripe, detail::xxh3_secret + 192 - detail::xxh3_stripe - 7, 1);
  return detail::xxh3_merge(acc, total_);
}

NITRO_INLINE Fd::Fd(int fd) noexcept : fd_(fd) {}

NITRO_INLINE Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

NITRO_INLINE void Fd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

NITRO_INLINE bool write_all(int fd, const void* data, std::size_t n) noexcept {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ::ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

NITRO_INLINE bool read_all(int fd, void* data, std::size_t n) noexcept {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ::ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;  // an error, or the file ended early
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

NITRO_INLINE bool pread_all(int fd, void* data, std::size_t n, std::uint64_t offset) noexcept {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ::ssize_t r = ::pread(fd, p, n, static_cast<::off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    offset += static_cast<std::uint64_t>(r);
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

NITRO_INLINE bool sync_directory(const std::filesystem::path& directory) noexcept {
  Fd dir(::open(directory.empty() ? "." : directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  return dir && ::fsync(dir.get()) == 0;
}

NITRO_INLINE bool is_temp_name(std::string_view name) noexcept {
  return name.size() > 5 && name.front() == '.' && name.ends_with(".tmp");
}

NITRO_INLINE AtomicFile::AtomicFile(std::filesystem::path target) : AtomicFile(std::move(target), Options{}) {}

NITRO_INLINE AtomicFile::AtomicFile(std::filesystem::path target, Options options) : target_(std::move(target)), o_(options) {
  NITRO_CHECK(!target_.empty() && target_.has_filename(), "nitro::io::AtomicFile: the target path \"",
              target_.string(), "\" names no file; give a file path such as runs/a/step-100.nitro");
  static std::atomic<std::uint64_t> counter{0};
  // A long name is shortened (its first 100 characters and a hash of it): the temporary's name must
  // fit the file system's limit whenever the target's does.
  std::string base = target_.filename().string();
  if (base.size() > 180) {
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx",
                  static_cast<unsigned long long>(xxh64({reinterpret_cast<const std::byte*>(base.data()), base.size()})));
    base = base.substr(0, 100) + "-" + hash;
  }
  temp_ = target_.parent_path() / ("." + base + "." + std::to_string(::getpid()) + "." + std::to_string(counter++) + ".tmp");
  fd_.reset(::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd_) {
    const int err = errno;
    nitro::detail::fail("nitro::io::AtomicFile: cannot create ", temp_.string(), ": ", os_error(err),
                        "; check that the directory ", directory().string(), " exists and is writable");
  }
}

NITRO_INLINE void AtomicFile::write(const void* data, std::size_t n) {
  NITRO_CHECK(fd_, "nitro::io::AtomicFile: ", target_.string(), " was already committed or abandoned");
  if (!write_all(fd_.get(), data, n)) {
    const int err = errno;
    abandon();
    nitro::detail::fail("nitro::io::AtomicFile: cannot write ", n, " bytes to ", temp_.string(), ": ", os_error(err),
                        "; free space on that disk (the previous ", target_.filename().string(), ", if any, is intact)");
  }
  written_ += n;
}

NITRO_INLINE void AtomicFile::finish() {
  NITRO_CHECK(fd_ || (finished_ && !committed_ && !removed_), "nitro::io::AtomicFile: ", target_.string(),
              " was already committed or abandoned");
  if (finished_) return;
  if (o_.fsync && ::fsync(fd_.get()) != 0) failed("fsync");
  if (!fd_.close()) failed("close");
  finished_ = true;
}

NITRO_INLINE bool AtomicFile::commit() {
  finish();
  if (::rename(temp_.c_str(), target_.c_str()) != 0) failed("rename");
  committed_ = true;
  return !o_.fsync || sync_directory(directory());
}

NITRO_INLINE void AtomicFile::abandon() noexcept {
  if (fd_) fd_.close();
  if (!committed_ && !removed_) {
    ::unlink(temp_.c_str());
    removed_ = true;
  }
}

NITRO_INLINE void AtomicFile::failed(const char* what) {
  const int err = errno;
  abandon();
  nitro::detail::fail("nitro::io::AtomicFile: cannot ", what, " ", temp_.string(), ": ", os_error(err), "; the previous ",
                      target_.filename().string(), ", if any, is intact");
}

NITRO_INLINE std::filesystem::path AtomicFile::directory() const {
  return target_.has_parent_path() ? target_.parent_path() : std::filesystem::path(".");
}

}  // namespace nitro::io

namespace nitro::detail {

NITRO_INLINE void tree_failed(TreeFailure& failure, int err, const char* action, const TreeFrame* dir, const char* name) noexcept {
  failure.err = err;
  failure.action = action;
  if (failure.where == nullptr) return;
  try {
    std::string path = name;
    for (const TreeFrame* f = dir; f != nullptr; f = f->parent) path = std::string(f->name) + "/" + path;
    *failure.where = std::move(path);
  } catch (...) {  // no memory for the message: it names no path
  }
}

NITRO_INLINE bool remove_directory_contents(int fd, const TreeFrame& here, std::uintmax_t& removed, TreeFailure& failure) noexcept {
  ::DIR* const dir = ::fdopendir(fd);
  if (dir == nullptr) {
    const int err = errno;
    ::close(fd);
    tree_failed(failure, err, "read the directory", here.parent, here.name);
    return false;
  }
  struct Closer {
    ::DIR* dir;
    ~Closer() { ::closedir(dir); }
  } closer{dir};
  const int at = ::dirfd(dir);
  for (;;) {
    errno = 0;
    const ::dirent* const entry = ::readdir(dir);
    if (entry == nullptr) {
      if (errno == 0) return true;
      tree_failed(failure, errno, "read the directory", here.parent, here.name);
      return false;
    }
    const char* const name = entry->d_name;
    if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'))) continue;
    bool is_dir = entry->d_type == DT_DIR;
    if (entry->d_type == DT_UNKNOWN) {  // file systems that do not say (some network ones)
      struct ::stat st {};
      if (::fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;  // removed meanwhile
        tree_failed(failure, errno, "inspect", &here, name);
        return false;
      }
      is_dir = S_ISDIR(st.st_mode);
    }
    if (is_dir) {
      const int sub = ::openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0) {
        const TreeFrame child{&here, name};
        if (!remove_directory_contents(sub, child, removed, failure)) return false;
      } else if (errno == ENOENT) {
        continue;
      } else if (errno == ELOOP || errno == ENOTDIR) {
        is_dir = false;  // replaced by a symlink or a file meanwhile: removed as one
      } else {
        tree_failed(failure, errno, "open the directory", &here, name);
        return false;
      }
    }
    if (::unlinkat(at, name, is_dir ? AT_REMOVEDIR : 0) != 0) {
      if (errno == ENOENT) continue;
      tree_failed(failure, errno, "remove", &here, name);
      return false;
    }
    ++removed;
  }
}

NITRO_INLINE std::uintmax_t remove_tree_at(const std::filesystem::path& path, TreeFailure& failure) noexcept {
  constexpr auto failed = static_cast<std::uintmax_t>(-1);
  // "link/" would have the system follow a symlink: without the trailing '/' the link itself goes.
  const std::string& given = path.native();
  std::size_t length = given.size();
  while (length > 1 && given[length - 1] == '/') --length;
  std::string trimmed;
  const char* top = given.c_str();
  if (length < given.size()) {
    try {
      trimmed.assign(given, 0, length);
    } catch (...) {
      tree_failed(failure, ENOMEM, "remove", nullptr, top);
      return failed;
    }
    top = trimmed.c_str();
  }
  struct ::stat st {};
  if (::fstatat(AT_FDCWD, top, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return 0;
    tree_failed(failure, errno, "inspect", nullptr, top);
    return failed;
  }
  std::uintmax_t removed = 0;
  bool is_dir = S_ISDIR(st.st_mode);
  if (is_dir) {
    const int fd = ::open(top, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      const TreeFrame root{nullptr, top};
      if (!remove_directory_contents(fd, root, removed, failure)) {
        failure.removed = removed;
        return failed;
      }
    } else if (errno == ENOENT) {
      return 0;
    } else if (errno == ELOOP || errno == ENOTDIR) {
      is_dir = false;
    } else {
      tree_failed(failure, errno, "open the directory", nullptr, top);
      return failed;
    }
  }
  if (::unlinkat(AT_FDCWD, top, is_dir ? AT_REMOVEDIR : 0) != 0) {
    if (errno == ENOENT) return removed;
    tree_failed(failure, errno, "remove", nullptr, top);
    failure.removed = removed;
    return failed;
  }
  return removed + 1;
}

}  // namespace nitro::detail

namespace nitro::io {

NITRO_INLINE std::uintmax_t remove_tree(const std::filesystem::path& path) {
  std::string where;
  nitro::detail::TreeFailure failure{.where = &where};
  const std::uintmax_t removed = nitro::detail::remove_tree_at(path, failure);
  if (failure.err != 0 && failure.removed == 0)
    nitro::detail::fail("nitro::io::remove_tree(", path.string(), "): cannot ", failure.action, " ", where, ": ",
                        os_error(failure.err), "; nothing was removed: check the path and its permissions");
  if (failure.err != 0)
    nitro::detail::fail("nitro::io::remove_tree(", path.string(), "): cannot ", failure.action, " ", where, ": ",
                        os_error(failure.err), "; ", failure.removed, " entries were removed before it and the rest is",
                        " left: fix the cause (permissions, a read-only file system, a mount point inside the tree)",
                        " and remove it again");
  return removed;
}

NITRO_INLINE std::uintmax_t remove_tree(const std::filesystem::path& path, std::error_code& ec) noexcept {
  nitro::detail::TreeFailure failure;
  const std::uintmax_t removed = nitro::detail::remove_tree_at(path, failure);
  ec = failure.err != 0 ? std::error_code(failure.err, std::generic_category()) : std::error_code();
  return removed;
}

}  // namespace nitro::io
