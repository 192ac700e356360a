#pragma once
// Files that are never half written, and the checksum that tells a good file from a damaged one.
// No LibTorch here: the snapshot container (io/snapshot.hpp), the cache's disk tier
// (cache/disk_tier.hpp) and the fuzzer over the snapshot reader share it.
//
//   nitro::io::AtomicFile out{"/runs/a/step-100.nitro"};   // writes "/runs/a/.step-100.nitro.<pid>.<n>.tmp"
//   out.write(bytes, n);                                    // as many times as needed
//   out.commit();            // fsync the file, rename it over the target, fsync the directory
//                            // (false: renamed, but the directory's fsync failed)
//   // not committed (an exception, a return): the destructor removes the temporary file
//
// The rename is atomic on POSIX file systems: a reader, or a process started after a crash at any
// moment, sees the old file or the new one, never a mix; with fsync on (the default) the new file
// and its name are on disk when commit() returns, so a machine crash after it loses neither.
// Temporary names start with '.' and end with ".tmp" (is_temp_name), so a directory listing that
// looks for snapshots never takes one for a snapshot.
//
//   xxh64(span)              XXH64 of a buffer (Yann Collet's xxHash, 64-bit; several GB/s)
//   Xxh64                    the same hash over data given in pieces (update(), digest())
//
// POSIX only (open/write/fsync/rename).
#include <nitro/core/error.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace nitro::io {

// ---- XXH64 (Yann Collet's xxHash, 64-bit): four 8-byte lanes per 32-byte stripe, several GB/s ------

inline constexpr std::uint64_t xxh_p1 = 0x9E3779B185EBCA87ULL;
inline constexpr std::uint64_t xxh_p2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr std::uint64_t xxh_p3 = 0x165667B19E3779F9ULL;
inline constexpr std::uint64_t xxh_p4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr std::uint64_t xxh_p5 = 0x27D4EB2F165667C5ULL;

// The hash is defined on little-endian words; a big-endian host swaps, so values agree across hosts.
template <class Word>
inline Word read_le(const unsigned char* p) noexcept {
  Word w;
  std::memcpy(&w, p, sizeof(Word));
  if constexpr (std::endian::native == std::endian::big) {
    if constexpr (sizeof(Word) == 8) w = __builtin_bswap64(w);
    else w = __builtin_bswap32(w);
  }
  return w;
}
inline std::uint64_t xxh_round(std::uint64_t acc, std::uint64_t lane) noexcept {
  return std::rotl(acc + lane * xxh_p2, 31) * xxh_p1;
}
inline std::uint64_t xxh_merge(std::uint64_t h, std::uint64_t acc) noexcept {
  return (h ^ xxh_round(0, acc)) * xxh_p1 + xxh_p4;
}

// The last bytes (fewer than 32) and the final avalanche, for xxh64() and Xxh64.
inline std::uint64_t xxh_finish(std::uint64_t h, const unsigned char* p, const unsigned char* end) noexcept {
  for (; p + 8 <= end; p += 8) h = std::rotl(h ^ xxh_round(0, read_le<std::uint64_t>(p)), 27) * xxh_p1 + xxh_p4;
  if (p + 4 <= end) {
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

/// XXH64 of `bytes`: nitro::io::xxh64(span) == XXH64(data, size, seed).
inline std::uint64_t xxh64(std::span<const std::byte> bytes, std::uint64_t seed = 0) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  const unsigned char* const end = p + n;
  std::uint64_t h;
  if (n >= 32) {
    std::uint64_t v1 = seed + xxh_p1 + xxh_p2, v2 = seed + xxh_p2, v3 = seed, v4 = seed - xxh_p1;
    for (const unsigned char* const limit = end - 32; p <= limit; p += 32) {
      v1 = xxh_round(v1, read_le<std::uint64_t>(p));
      v2 = xxh_round(v2, read_le<std::uint64_t>(p + 8));
      v3 = xxh_round(v3, read_le<std::uint64_t>(p + 16));
      v4 = xxh_round(v4, read_le<std::uint64_t>(p + 24));
    }
    h = std::rotl(v1, 1) + std::rotl(v2, 7) + std::rotl(v3, 12) + std::rotl(v4, 18);
    h = xxh_merge(xxh_merge(xxh_merge(xxh_merge(h, v1), v2), v3), v4);
  } else {
    h = seed + xxh_p5;
  }
  return xxh_finish(h + static_cast<std::uint64_t>(n), p, end);
}

/// XXH64 over data given in pieces: the digest equals xxh64() of the pieces concatenated.
///   io::Xxh64 h; h.update(a); h.update(b); h.digest() == io::xxh64(a + b)
class Xxh64 {
 public:
  explicit Xxh64(std::uint64_t seed = 0) noexcept
      : seed_(seed), v_{seed + xxh_p1 + xxh_p2, seed + xxh_p2, seed, seed - xxh_p1} {}

  void update(std::span<const std::byte> bytes) noexcept {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
    std::size_t n = bytes.size();
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
  void update(const void* data, std::size_t n) noexcept { update({static_cast<const std::byte*>(data), n}); }

  [[nodiscard]] std::uint64_t digest() const noexcept {
    std::uint64_t h;
    if (total_ >= 32) {
      h = std::rotl(v_[0], 1) + std::rotl(v_[1], 7) + std::rotl(v_[2], 12) + std::rotl(v_[3], 18);
      for (const std::uint64_t v : v_) h = xxh_merge(h, v);
    } else {
      h = seed_ + xxh_p5;
    }
    return xxh_finish(h + total_, buffer_, buffer_ + buffered_);
  }

 private:
  void stripe(const unsigned char* p) noexcept {
    for (int i = 0; i < 4; ++i) v_[i] = xxh_round(v_[i], read_le<std::uint64_t>(p + 8 * i));
  }

  std::uint64_t seed_;
  std::uint64_t v_[4];
  std::uint64_t total_ = 0;
  unsigned char buffer_[32] = {};
  std::size_t buffered_ = 0;
};

// ---- POSIX files ---------------------------------------------------------------------------------

/// Closes a POSIX file descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) noexcept : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int get() const noexcept { return fd_; }
  void reset(int fd) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  [[nodiscard]] explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Closes now, reporting the error close can give (a delayed write failure on some file systems).
  bool close() noexcept { return ::close(std::exchange(fd_, -1)) == 0; }

 private:
  int fd_;
};

inline bool write_all(int fd, const void* data, std::size_t n) noexcept {
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

inline bool read_all(int fd, void* data, std::size_t n) noexcept {
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

/// Reads n bytes at `offset` (the file position is not used); false on an error or an early end.
inline bool pread_all(int fd, void* data, std::size_t n, std::uint64_t offset) noexcept {
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

inline std::string os_error(int err) { return std::error_code(err, std::generic_category()).message(); }


/// fsyncs a directory, so that a rename or an unlink in it is on disk. Returns false on failure.
inline bool sync_directory(const std::filesystem::path& directory) noexcept {
  Fd dir(::open(directory.empty() ? "." : directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  return dir && ::fsync(dir.get()) == 0;
}

/// Whether a file name is an AtomicFile's temporary name (".<target>.<pid>.<n>.tmp").
inline bool is_temp_name(std::string_view name) noexcept {
  return name.size() > 5 && name.front() == '.' && name.ends_with(".tmp");
}

/// A file written under a temporary name in the target's directory and renamed over the target by
/// commit(); removed if never committed. Every failure throws nitro::Error naming the file, the
/// system's reason and what to do; after a failure the target is what it was before (a failed fsync
/// of the directory after the rename is commit()'s false, not a throw: the target is new by then).
class AtomicFile {
 public:
  struct Options {
    /// fsync the file before the rename and the directory after it (a machine crash then loses
    /// neither). Off only for files that can be made again (the cache's spills).
    bool fsync = true;
  };

  explicit AtomicFile(std::filesystem::path target) : AtomicFile(std::move(target), Options{}) {}
  AtomicFile(std::filesystem::path target, Options options) : target_(std::move(target)), o_(options) {
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
      detail::fail("nitro::io::AtomicFile: cannot create ", temp_.string(), ": ", os_error(err),
                   "; check that the directory ", directory().string(), " exists and is writable");
    }
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() { abandon(); }

  /// Appends n bytes. Throws nitro::Error (disk full, I/O error), removing the temporary file.
  void write(const void* data, std::size_t n) {
    NITRO_CHECK(fd_, "nitro::io::AtomicFile: ", target_.string(), " was already committed or abandoned");
    if (!write_all(fd_.get(), data, n)) {
      const int err = errno;
      abandon();
      detail::fail("nitro::io::AtomicFile: cannot write ", n, " bytes to ", temp_.string(), ": ", os_error(err),
                   "; free space on that disk (the previous ", target_.filename().string(), ", if any, is intact)");
    }
    written_ += n;
  }
  void write(std::span<const std::byte> bytes) { write(bytes.data(), bytes.size()); }

  /// fsync (Options::fsync) and close: the contents are final. commit() does it when not done; a
  /// caller that renames under a lock of its own calls it first, outside that lock.
  void finish() {
    NITRO_CHECK(fd_ || (finished_ && !committed_ && !removed_), "nitro::io::AtomicFile: ", target_.string(),
                " was already committed or abandoned");
    if (finished_) return;
    if (o_.fsync && ::fsync(fd_.get()) != 0) failed("fsync");
    if (!fd_.close()) failed("close");
    finished_ = true;
  }

  /// finish(), then rename over the target and fsync the directory (Options::fsync). Throws
  /// nitro::Error and leaves the target as it was when the write, the fsync of the file or the rename
  /// fails. Once renamed, the target is the new file: returns false when the fsync of the directory
  /// then failed (the new name may not survive a machine crash), true otherwise.
  [[nodiscard]] bool commit() {
    finish();
    if (::rename(temp_.c_str(), target_.c_str()) != 0) failed("rename");
    committed_ = true;
    return !o_.fsync || sync_directory(directory());
  }

  /// Gives up: closes and removes the temporary file (the target is untouched). Idempotent.
  void abandon() noexcept {
    if (fd_) fd_.close();
    if (!committed_ && !removed_) {
      ::unlink(temp_.c_str());
      removed_ = true;
    }
  }

  [[nodiscard]] const std::filesystem::path& target() const noexcept { return target_; }
  [[nodiscard]] const std::filesystem::path& temp_path() const noexcept { return temp_; }
  [[nodiscard]] std::uint64_t bytes_written() const noexcept { return written_; }

 private:
  [[noreturn]] void failed(const char* what) {
    const int err = errno;
    abandon();
    detail::fail("nitro::io::AtomicFile: cannot ", what, " ", temp_.string(), ": ", os_error(err), "; the previous ",
                 target_.filename().string(), ", if any, is intact");
  }
  [[nodiscard]] std::filesystem::path directory() const {
    return target_.has_parent_path() ? target_.parent_path() : std::filesystem::path(".");
  }

  std::filesystem::path target_;
  Options o_;
  std::filesystem::path temp_;
  Fd fd_;
  std::uint64_t written_ = 0;
  bool finished_ = false;
  bool committed_ = false;
  bool removed_ = false;
};

}  // namespace nitro::io
