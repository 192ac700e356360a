#pragma once
// Files that are never half written, and the checksum that tells a good file from a damaged one.
// No LibTorch here: the snapshot container (snapshot/snapshot.hpp), the cache's disk tier
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
//   xxh3(span), Xxh3         XXH3 (64-bit, seed 0), the same two ways: about twice XXH64's speed
//                            with SSE2 or AVX2 (snapshots' parts)
//   remove_tree(path)        std::filesystem::remove_all without LibTorch's copy of it, which crashes
//                            on a directory that is not empty (why: the region at the end)
//
// POSIX only (open/write/fsync/rename; openat/readdir/unlinkat for remove_tree).
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
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

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>  // XXH3's SSE2 and AVX2 accumulation
#endif

namespace nitro::io {

// ---- XXH64 (Yann Collet's xxHash, 64-bit): four 8-byte lanes per 32-byte stripe, several GB/s ------

namespace detail {  // xxHash's constants and steps: not API (the tests of the XXH3 kernels use them)

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
NITRO_INLINE std::uint64_t xxh_round(std::uint64_t acc, std::uint64_t lane) noexcept;
NITRO_INLINE std::uint64_t xxh_merge(std::uint64_t h, std::uint64_t acc) noexcept;

// The last bytes (fewer than 32) and the final avalanche, for xxh64() and Xxh64.
NITRO_INLINE std::uint64_t xxh_finish(std::uint64_t h, const unsigned char* p, const unsigned char* end) noexcept;

}  // namespace detail

/// XXH64 of `bytes`: nitro::io::xxh64(span) == XXH64(data, size, seed).
NITRO_INLINE std::uint64_t xxh64(std::span<const std::byte> bytes, std::uint64_t seed = 0) noexcept;

/// XXH64 over data given in pieces: the digest equals xxh64() of the pieces concatenated.
///   io::Xxh64 h; h.update(a); h.update(b); h.digest() == io::xxh64(a + b)
class Xxh64 {
 public:
  /// An empty hash state with `seed` (XXH64's seed; 0 as xxh64()'s default).
  NITRO_INLINE explicit Xxh64(std::uint64_t seed = 0) noexcept;

  /// Hashes the next piece.
  NITRO_INLINE void update(std::span<const std::byte> bytes) noexcept;
  /// Hashes the next piece: `n` bytes at `data`.
  void update(const void* data, std::size_t n) noexcept { update({static_cast<const std::byte*>(data), n}); }

  /// The hash of everything given so far; more may be given after.
  [[nodiscard]] NITRO_INLINE std::uint64_t digest() const noexcept;

 private:
  NITRO_INLINE void stripe(const unsigned char* p) noexcept;

  std::uint64_t seed_;
  std::uint64_t v_[4];
  std::uint64_t total_ = 0;
  unsigned char buffer_[32] = {};
  std::size_t buffered_ = 0;
};

// ---- XXH3 (64-bit): xxHash's newer hash, about twice XXH64's speed ---------------------------------
// XXH3_64bits with seed 0 and the default secret (xxHash's doc/xxhash_spec.md): 8 lanes of 64-bit
// accumulators over 64-byte stripes, each lane one 32 x 32 -> 64-bit multiply per 8 bytes, which
// SSE2 and AVX2 do two and four at a time (AVX2 when the CPU has it; other CPUs than x86-64 run the
// plain loop; AVX-512 measured no faster than AVX2). Snapshots of format version 2 check their parts
// with it: with XXH64, hashing took half as long as reading the file from the page cache.

namespace detail {

inline constexpr std::uint64_t xxh3_p32_1 = 0x9E3779B1U;
inline constexpr std::uint64_t xxh3_p32_2 = 0x85EBCA77U;
inline constexpr std::uint64_t xxh3_p32_3 = 0xC2B2AE3DU;
inline constexpr std::uint64_t xxh3_mx1 = 0x165667919E3779F9ULL;
inline constexpr std::uint64_t xxh3_mx2 = 0x9FB21C651E98DF25ULL;
inline constexpr std::size_t xxh3_stripe = 64;
inline constexpr std::size_t xxh3_block_stripes = 16;  // (192 - 64) / 8 with the default secret
inline constexpr std::size_t xxh3_buffer = 256;        // 4 stripes, as the reference's streaming state

alignas(64) inline constexpr unsigned char xxh3_secret[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

NITRO_INLINE std::uint64_t xxh3_fold(std::uint64_t a, std::uint64_t b) noexcept;
NITRO_INLINE std::uint64_t xxh3_avalanche(std::uint64_t h) noexcept;
NITRO_INLINE std::uint64_t xxh3_avalanche_xxh64(std::uint64_t h) noexcept;
NITRO_INLINE std::uint64_t xxh3_mix16(const unsigned char* p, const unsigned char* s) noexcept;

/// XXH3 of at most 240 bytes (the reference's short and medium inputs).
NITRO_INLINE std::uint64_t xxh3_short(const unsigned char* p, std::size_t n) noexcept;

/// Accumulates `stripes` 64-byte stripes into the 8 lanes, the secret advancing 8 bytes a stripe.
NITRO_INLINE void xxh3_accumulate_scalar(std::uint64_t* acc, const unsigned char* p, const unsigned char* secret,
                                   std::size_t stripes) noexcept;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
NITRO_INLINE void xxh3_accumulate_sse2(std::uint64_t* acc, const unsigned char* p, const unsigned char* secret,
                                 std::size_t stripes) noexcept;

__attribute__((target("avx2"))) NITRO_INLINE void xxh3_accumulate_avx2(std::uint64_t* acc, const unsigned char* p,
                                                                 const unsigned char* secret,
                                                                 std::size_t stripes) noexcept;
#endif

using Xxh3Accumulate = void (*)(std::uint64_t*, const unsigned char*, const unsigned char*, std::size_t) noexcept;

/// The fastest accumulation this CPU runs (chosen once; the results are the same bits).
NITRO_INLINE Xxh3Accumulate xxh3_accumulate() noexcept;

NITRO_INLINE void xxh3_scramble(std::uint64_t* acc) noexcept;

NITRO_INLINE std::uint64_t xxh3_merge(const std::uint64_t* acc, std::uint64_t length) noexcept;

/// Consumes whole stripes into `acc`, scrambling after each full block of 16; `in_block` is the
/// number of stripes of the current block already consumed.
NITRO_INLINE void xxh3_consume(std::uint64_t* acc, std::size_t& in_block, const unsigned char* p,
                         std::size_t stripes) noexcept;

inline constexpr std::uint64_t xxh3_acc_init[8] = {xxh3_p32_3, xxh_p1, xxh_p2,     xxh_p3,
                                                   xxh_p4,     xxh3_p32_2, xxh_p5, xxh3_p32_1};

}  // namespace detail

/// XXH3 (64-bit, seed 0) of `bytes`: nitro::io::xxh3(span) == XXH3_64bits(data, size).
NITRO_INLINE std::uint64_t xxh3(std::span<const std::byte> bytes) noexcept;

/// XXH3 (64-bit, seed 0) over data given in pieces: the digest equals xxh3() of the pieces concatenated.
///   io::Xxh3 h; h.update(a); h.update(b); h.digest() == io::xxh3(a + b)
class Xxh3 {
 public:
  /// An empty hash state.
  Xxh3() noexcept { std::memcpy(acc_, detail::xxh3_acc_init, sizeof acc_); }

  /// Hashes the next piece.
  NITRO_INLINE void update(std::span<const std::byte> bytes) noexcept;
  /// Hashes the next piece: `n` bytes at `data`.
  void update(const void* data, std::size_t n) noexcept { update({static_cast<const std::byte*>(data), n}); }

  /// The hash of everything given so far; more may be given after.
  [[nodiscard]] NITRO_INLINE std::uint64_t digest() const noexcept;

 private:
  std::uint64_t acc_[8];
  std::uint64_t total_ = 0;
  std::size_t in_block_ = 0;  // stripes of the current block consumed
  std::size_t buffered_ = 0;
  unsigned char buffer_[detail::xxh3_buffer] = {};
};

// ---- POSIX files ---------------------------------------------------------------------------------

/// Closes a POSIX file descriptor on scope exit.
class Fd {
 public:
  /// Owns `fd` (-1: none).
  NITRO_INLINE explicit Fd(int fd = -1) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  NITRO_INLINE ~Fd();
  /// The descriptor, still owned; -1 when none.
  [[nodiscard]] int get() const noexcept { return fd_; }
  /// Closes the descriptor held (ignoring close's error) and owns `fd` instead.
  NITRO_INLINE void reset(int fd) noexcept;
  /// Whether a descriptor is held (>= 0).
  [[nodiscard]] explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Closes now, reporting the error close can give (a delayed write failure on some file systems).
  bool close() noexcept { return ::close(std::exchange(fd_, -1)) == 0; }

 private:
  int fd_;
};

/// Unmaps a mapping at the end of its scope unless released: a constructor that maps a file and then
/// refuses it (throws) leaves no mapping behind.
/// @code
///   base_ = ::mmap(...);  io::UnmapOnThrow guard(base_, size_);  ...checks...;  guard.release();
/// @endcode
class UnmapOnThrow {
 public:
  /// Guards the mapping of `size` bytes at `base`; on scope exit, munmaps it and sets `base` to null.
  UnmapOnThrow(void*& base, std::size_t size) noexcept : base_(&base), size_(size) {}
  UnmapOnThrow(const UnmapOnThrow&) = delete;
  UnmapOnThrow& operator=(const UnmapOnThrow&) = delete;
  ~UnmapOnThrow() {
    if (base_ != nullptr && *base_ != nullptr) {
      ::munmap(*base_, size_);
      *base_ = nullptr;
    }
  }
  /// Keeps the mapping: the destructor does nothing.
  void release() noexcept { base_ = nullptr; }

 private:
  void** base_;
  std::size_t size_;
};

/// Writes n bytes, retrying short writes and EINTR; false on an error (errno says which).
NITRO_INLINE bool write_all(int fd, const void* data, std::size_t n) noexcept;

/// Reads n bytes from the file position, retrying short reads and EINTR; false on an error or an early end.
NITRO_INLINE bool read_all(int fd, void* data, std::size_t n) noexcept;

/// Reads n bytes at `offset` (the file position is not used); false on an error or an early end.
NITRO_INLINE bool pread_all(int fd, void* data, std::size_t n, std::uint64_t offset) noexcept;

/// The system's message for errno value `err` ("No such file or directory").
inline std::string os_error(int err) { return std::error_code(err, std::generic_category()).message(); }


/// fsyncs a directory, so that a rename or an unlink in it is on disk. Returns false on failure.
NITRO_INLINE bool sync_directory(const std::filesystem::path& directory) noexcept;

/// Whether a file name is an AtomicFile's temporary name (".<target>.<pid>.<n>.tmp").
NITRO_INLINE bool is_temp_name(std::string_view name) noexcept;

/// A file written under a temporary name in the target's directory and renamed over the target by
/// commit(); removed if never committed. Every failure throws nitro::Error naming the file, the
/// system's reason and what to do; after a failure the target is what it was before (a failed fsync
/// of the directory after the rename is commit()'s false, not a throw: the target is new by then).
class AtomicFile {
 public:
  /// Whether an AtomicFile fsyncs.
  struct Options {
    /// fsync the file before the rename and the directory after it (a machine crash then loses
    /// neither). Off only for files that can be made again (the cache's spills).
    bool fsync = true;
  };

  /// A file for `target` with the default Options; see below.
  NITRO_INLINE explicit AtomicFile(std::filesystem::path target);
  /// Creates the temporary file next to `target` (".<name>.<pid>.<n>.tmp"). Throws nitro::Error when
  /// `target` names no file, or when the temporary file cannot be created (no such directory, no
  /// permission).
  NITRO_INLINE AtomicFile(std::filesystem::path target, Options options);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() { abandon(); }

  /// Appends n bytes. Throws nitro::Error (disk full, I/O error), removing the temporary file.
  NITRO_INLINE void write(const void* data, std::size_t n);
  /// Appends `bytes`; throws as the overload above.
  void write(std::span<const std::byte> bytes) { write(bytes.data(), bytes.size()); }

  /// fsync (Options::fsync) and close: the contents are final. commit() does it when not done; a
  /// caller that renames under a lock of its own calls it first, outside that lock.
  NITRO_INLINE void finish();

  /// finish(), then rename over the target and fsync the directory (Options::fsync). Throws
  /// nitro::Error and leaves the target as it was when the write, the fsync of the file or the rename
  /// fails. Once renamed, the target is the new file: returns false when the fsync of the directory
  /// then failed (the new name may not survive a machine crash), true otherwise.
  [[nodiscard]] NITRO_INLINE bool commit();

  /// Gives up: closes and removes the temporary file (the target is untouched). Idempotent.
  NITRO_INLINE void abandon() noexcept;

  /// The path the file is renamed to by commit().
  [[nodiscard]] const std::filesystem::path& target() const noexcept { return target_; }
  /// The temporary file's path.
  [[nodiscard]] const std::filesystem::path& temp_path() const noexcept { return temp_; }
  /// Bytes written so far.
  [[nodiscard]] std::uint64_t bytes_written() const noexcept { return written_; }

 private:
  [[noreturn]] NITRO_INLINE void failed(const char* what);
  [[nodiscard]] NITRO_INLINE std::filesystem::path directory() const;

  std::filesystem::path target_;
  Options o_;
  std::filesystem::path temp_;
  Fd fd_;
  std::uint64_t written_ = 0;
  bool finished_ = false;
  bool committed_ = false;
  bool removed_ = false;
};


// ---- Removing a tree --------------------------------------------------------------------------------
// Not std::filesystem::remove_all: libtorch.so (2.11) exports its own copy of it (and of most of
// std::filesystem's operations), built with GCC 13, and the dynamic linker binds a program's call to
// that copy, because libtorch.so comes before libstdc++.so.6 in the program's DT_NEEDED list. The copy
// calls recursive_directory_iterator::__erase, which libtorch.so references weakly and which only
// GCC 13's libstdc++ and later define: with an older libstdc++ (Debian 12's GCC 12) the reference is
// null, and remove_all of any directory that is not empty is a call through a null pointer (SIGSEGV).

}  // namespace nitro::io

namespace nitro::detail {

/// A directory on the way down from the path given to io::remove_tree: its name in its parent (the
/// path as given for the top one). Read only to name the entry that failed.
struct TreeFrame {
  const TreeFrame* parent;
  const char* name;
};

/// The first failure of a removal: errno, what was being done, the entries removed before it, and
/// (when `where` is given) the path.
struct TreeFailure {
  int err = 0;
  const char* action = "";
  std::uintmax_t removed = 0;
  std::string* where = nullptr;
};

NITRO_INLINE void tree_failed(TreeFailure& failure, int err, const char* action, const TreeFrame* dir,
                        const char* name) noexcept;

/// Removes everything in the directory open at `fd` (taken over and closed), counting into `removed`.
/// A symlink is an entry like a file (unlinkat): it is never followed. False on the first failure.
NITRO_INLINE bool remove_directory_contents(int fd, const TreeFrame& here, std::uintmax_t& removed,
                                      TreeFailure& failure) noexcept;

/// io::remove_tree's work: the number of entries removed, or -1 (as uintmax_t) after a failure.
NITRO_INLINE std::uintmax_t remove_tree_at(const std::filesystem::path& path, TreeFailure& failure) noexcept;

}  // namespace nitro::detail

namespace nitro::io {

/// Removes `path` and, when it is a directory, everything under it, as std::filesystem::remove_all
/// does: returns the number of entries removed (the path itself included), 0 when `path` does not
/// exist. A symlink, at the top or inside, is removed and never followed (its target stays, in the
/// tree or out of it). The first failure stops it (what was removed before stays removed) and throws
/// nitro::Error naming the entry and the system's reason. Safe where remove_all is not (see above).
///   nitro::io::remove_tree(metrics / "tensorboard" / "basic");   // the last run's event files
NITRO_INLINE std::uintmax_t remove_tree(const std::filesystem::path& path);

/// The same without exceptions, like std::filesystem::remove_all(path, ec): on a failure `ec` holds
/// the system's error (std::generic_category) and the result is static_cast<std::uintmax_t>(-1).
NITRO_INLINE std::uintmax_t remove_tree(const std::filesystem::path& path, std::error_code& ec) noexcept;

}  // namespace nitro::io

#if !NITRO_COMPILED
#include <nitro/io/file-inl.hpp>
#endif
