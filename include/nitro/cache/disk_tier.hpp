#pragma once
// A second tier under a memory cache: values spilled to files in a directory, under a byte budget.
//
//   nitro::DiskTier                   one file per key in a directory, a byte budget on the files, least
//                                     recently stored or loaded file removed first; thread safe
//   nitro::BasicDiskTier<Key, Value>  the same for any batch value (an Example, a tuple, a user struct)
//   nitro::TieredCache<Policy, Value> a memory Cache<Policy> in front of a disk tier: what memory evicts
//                                     or refuses is spilled to disk, a disk hit moves back into memory
//                                     when memory keeps it; locks striped by key, so file I/O of
//                                     different keys runs at once
//   nitro::TieredCache_mt<Policy>     TieredCache in Cache_mt's shape, to be CachedDataset's cache
//                                     (nitro::cached_tiered in cached_dataset.hpp)
//
//   nitro::TieredCache<nitro::evict::Lru> samples{{.memory_capacity_bytes = 4_GiB,
//                                                  .disk = {.directory = "/scratch/spill", .capacity_bytes = 64_GiB}}};
//   if (auto x = samples.get(i)) use(*x); else samples.put(i, decode(i));
//
// Values: a tensor (the default), or any nitro::Batch (core/device.hpp): a torch::data::Example, a
// tuple, pair, vector or optional of them, a user struct with `nitro_map_tensors`. A value's file
// holds its tensors in for_each_tensor order, each with its own checksummed header (dtype, shape);
// what is not a tensor (a user struct's id or name, a vector's length, whether an optional is
// engaged) stays in memory with the tier's books (outside its byte budget), as the value with its
// tensors left undefined (its "shell"), and a load puts the file's tensors back into a copy of the
// shell through map_tensors. So a user struct round-trips exactly, with no prototype and no default
// value, provided its nitro_map_tensors applies f to every tensor member, defined or not, in one
// fixed order (checked when it is stored). An undefined tensor inside a value is kept as undefined;
// a value that is one undefined tensor is refused.
//
// A spill is a cache entry, re-creatable from its source, so a file is never trusted: each tensor
// carries a checksummed header (magic, format version, key, its place in the value, dtype, shape,
// payload size) and an XXH64 checksum of its payload, and a missing, truncated or corrupt file reads
// as a miss (the file is removed and counted), never as a wrong value. Files are written under a
// temporary name and renamed, so a crashed process never leaves a half file under a final name. Files
// are in the host's byte order: a spill directory belongs to one machine and one run. A DiskTier
// starts empty: it removes the spill files a previous run left in its directory, and its own files
// when it is destroyed. One DiskTier per directory.
//
// POSIX only (open/rename/fsync).
#include <nitro/core/config.hpp>
#include <nitro/cache/cache.hpp>
#include <nitro/core/concepts.hpp>
#include <nitro/core/device.hpp>
#include <nitro/core/error.hpp>
#include <nitro/io/file.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nitro {

namespace cache::detail {

// The checksum and the POSIX file helpers are io/file.hpp's, shared with snapshots.
using io::Fd;
using io::os_error;
using io::read_all;
using io::write_all;
using io::xxh64;

// ---- the file format -----------------------------------------------------------------------------
//
//   per tensor of the value, in for_each_tensor order:
//     FileHeader (48 bytes) | int64 sizes[ndim] | uint64 XXH64(everything before it, of this tensor) | payload
//
// Each header has its own checksum so a flipped bit in a shape or a dtype is caught like one in the
// payload; the payload is the raw bytes of a contiguous CPU tensor. A tensor's header names the key
// and the tensor's place in the value, so a file of another key, or tensors out of order, do not pass.
// A tensor value's file is one such record.

inline constexpr char file_magic[8] = {'N', 'I', 'T', 'R', 'O', 'T', 'N', 'S'};
inline constexpr std::uint32_t file_version = 2;  // 2: a value of several tensors, `index` (was reserved, 0)
inline constexpr std::uint32_t max_file_ndim = 1024;  // bounds what a corrupt header can make us read
inline constexpr std::string_view file_suffix = ".nitro";
inline constexpr std::int32_t undefined_dtype = -1;  // an undefined tensor inside a value: no shape, no payload

struct FileHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t ndim;
  std::uint64_t key;
  std::int32_t dtype;  // c10::ScalarType, or undefined_dtype
  std::uint32_t index;  // the tensor's place in the value (for_each_tensor order)
  std::uint64_t payload_bytes;
  std::uint64_t payload_checksum;
};
static_assert(sizeof(FileHeader) == 48 && std::is_trivially_copyable_v<FileHeader>);

inline std::size_t header_bytes(std::size_t ndim) noexcept { return sizeof(FileHeader) + 8 * ndim + 8; }

/// Parses "<integer>.nitro", the name of a spill file; anything else is not ours.
NITRO_INLINE bool is_spill_file_name(std::string_view name) noexcept;

/// The header bytes of tensor `index` of a value (`t` contiguous on the CPU, or undefined).
NITRO_INLINE std::vector<std::byte> encode_header(std::uint64_t key, std::uint32_t index, const at::Tensor& t);

/// Reads and checks tensor `index` at the file's position, of the `left` bytes that remain (lowered
/// by what it reads); nothing when anything about it is wrong. An undefined tensor is an undefined
/// at::Tensor, where `undefined_allowed`.
NITRO_INLINE std::optional<at::Tensor> decode_tensor(int fd, std::uint64_t key, std::uint32_t index, std::uint64_t& left,
                                               bool undefined_allowed);

/// Reads and checks a whole spill file of `count` tensors; nothing when anything about it is wrong
/// (its size is not the indexed one, a tensor does not check, bytes are left over).
NITRO_INLINE std::optional<std::vector<at::Tensor>> decode_file(int fd, std::uint64_t key, std::uint64_t indexed_bytes,
                                                          std::size_t count, bool undefined_allowed);

// ---- values of several tensors ---------------------------------------------------------------------

/// The tensors of a value, in for_each_tensor order.
template <Batch Value>
std::vector<at::Tensor> tensors_of(const Value& value) {
  std::vector<at::Tensor> out;
  for_each_tensor(value, [&](const at::Tensor& t) { out.push_back(t); });
  return out;
}

/// `value` with every tensor undefined: what of it stays in memory when its tensors go to a file.
/// Throws nitro::Error when its tensors cannot be put back in order: a nitro_map_tensors that skips
/// an undefined member would put the file's tensors into the wrong members.
template <Batch Value>
Value shell_of(const Value& value, std::size_t tensors, std::string_view who) {
  Value shell = map_tensors(value, [](const at::Tensor&) { return at::Tensor(); });
  std::size_t n = 0;
  for_each_tensor(shell, [&](const at::Tensor&) { ++n; });
  NITRO_CHECK(n == tensors, who, ": the value has ", tensors, " tensors, but ", n,
              " once they are undefined; its nitro_map_tensors must apply f to every tensor member, defined or "
              "not, in one fixed order (see nitro/core/device.hpp)");
  return shell;
}

/// Throws nitro::Error for a tensor a file cannot hold. `in_value`: the tensor is one of a composite
/// value's, which may be undefined.
NITRO_INLINE void check_spillable(const at::Tensor& t, bool in_value, std::string_view who, std::string_view verb);

}  // namespace cache::detail

// ---- DiskTier --------------------------------------------------------------------------------------

/// Where and how much a DiskTier may write.
struct DiskTierOptions {
  /// The spill directory; created (with its parents) when missing. Give each DiskTier its own.
  std::filesystem::path directory;
  /// The byte budget of the files, headers included, > 0.
  std::size_t capacity_bytes = 0;
  /// fsync each file (and the directory) before it counts as stored. Off by default: a spill is
  /// re-creatable, every file is checked on load, and the rename already keeps a crashed process
  /// from leaving a half file; turn it on to survive a machine crash with the files intact.
  bool fsync = false;
};

/// What a DiskTier has done since it was made (or since reset_stats()).
struct DiskTierStats {
  std::uint64_t hits = 0;        ///< loads that found their file and read it back intact
  std::uint64_t misses = 0;      ///< loads that found nothing usable, corrupt files included
  std::uint64_t stores = 0;      ///< files written
  std::uint64_t rejections = 0;  ///< stores refused: the file would exceed the whole budget
  std::uint64_t evictions = 0;   ///< files removed for room
  std::uint64_t corrupt = 0;     ///< files found missing, truncated or corrupt on load (and removed)
  std::size_t bytes = 0;         ///< file bytes now held
  std::size_t entries = 0;       ///< files now held
  /// hits / (hits + misses), from 0 to 1; 0 before any load.
  [[nodiscard]] NITRO_INLINE double hit_ratio() const noexcept;
};

/// Values in files, one per key, under a byte budget; the least recently stored or loaded file goes
/// first. Thread safe: file contents are written and read outside the lock, only renames, removals
/// and the books are under it.
/// @tparam Key   an integral key (the file is named after it); optional through the alias DiskTier (std::int64_t).
/// @tparam Value a nitro::Batch: its tensors go to the file, the rest of it (its shell, see the top of
///               this file) stays in memory; optional, default at::Tensor.
///
///   nitro::DiskTier disk{{.directory = "/scratch/spill", .capacity_bytes = 64ull << 30}};
///   disk.store(7, tensor);
///   if (auto t = disk.load(7)) use(*t);  // a CPU tensor equal to `tensor`, or nothing
///
///   nitro::BasicDiskTier<std::int64_t, torch::data::Example<>> examples{
///       {.directory = "/scratch/ex", .capacity_bytes = 1ull << 30}};
///   examples.store(7, {image, label});   // both come back as CPU tensors, in their own dtypes and shapes
template <std::integral Key, class Value = at::Tensor>
  requires(!std::same_as<Key, bool>)
class BasicDiskTier {
  static_assert(Batch<Value> && std::same_as<Value, std::remove_cvref_t<Value>>,
                "nitro::BasicDiskTier: Value must be a batch (a tensor, a torch::data::Example, a tuple, pair, "
                "vector or optional of them, or a type with nitro_map_tensors; see nitro/core/device.hpp)");
  static_assert(std::copyable<Value>, "nitro::BasicDiskTier: Value must be copyable (a load copies its shell)");
  static constexpr bool single = std::same_as<Value, at::Tensor>;

 public:
  /// The key type, an integer the file is named after.
  using key_type = Key;
  /// The value type.
  using value_type = Value;
  /// Where and how much it may write: DiskTierOptions.
  using Options = DiskTierOptions;

  /// Creates the directory if missing, checks that it is writable, and removes the spill files a
  /// previous run left there. Throws nitro::Error when the directory cannot be used.
  explicit BasicDiskTier(Options options)
      : directory_(std::move(options.directory)), capacity_(options.capacity_bytes), fsync_(options.fsync) {
    NITRO_CHECK(capacity_ > 0, "nitro::DiskTier: capacity_bytes is 0; give the byte budget of the spill files, e.g. "
                               "{.directory = \"/scratch/spill\", .capacity_bytes = 64ull << 30} for 64 GiB");
    NITRO_CHECK(!directory_.empty(), "nitro::DiskTier: directory is empty; give the spill directory, e.g. "
                                     "{.directory = \"/scratch/spill\"}");
    std::error_code ec;
    const bool existed = std::filesystem::is_directory(directory_, ec);
    if (!existed) {
      std::filesystem::create_directories(directory_, ec);
      NITRO_CHECK(!ec && std::filesystem::is_directory(directory_), "nitro::DiskTier: cannot create the spill "
                  "directory ", directory_, ": ", ec ? ec.message() : "it exists and is not a directory",
                  "; give a directory on a writable local disk");
      created_directory_ = true;
    }
    probe_writable();
    remove_stale_files();
  }

  BasicDiskTier(const BasicDiskTier&) = delete;
  BasicDiskTier& operator=(const BasicDiskTier&) = delete;

  /// Removes its files, and the directory when it made it and nothing else is in it.
  ~BasicDiskTier() {
    try {
      clear();
      std::error_code ec;
      if (created_directory_ && std::filesystem::is_empty(directory_, ec) && !ec)
        std::filesystem::remove(directory_, ec);
    } catch (...) {  // a destructor cleans up what it can
    }
  }

  /// Writes `value`'s tensors (any device, any layout in memory: a contiguous CPU copy of each is what
  /// is written) under `key`, replacing what was there, and removes the least recently used files
  /// until the budget holds. Returns false, storing nothing and dropping the old file, when the file
  /// alone would exceed the budget. Throws nitro::Error for a tensor that cannot be spilled (sparse,
  /// quantized, nested; undefined, unless it is one of a composite value's), for a user type whose
  /// nitro_map_tensors cannot put its tensors back (see the top of this file), or when the file cannot
  /// be written (disk full, directory removed).
  ///   disk.store(i, image);
  bool store(Key key, const Value& value) {
    std::vector<at::Tensor> tensors = cache::detail::tensors_of(value);
    for (at::Tensor& t : tensors) t = spillable(t);
    Shell shell = shell_for(value, tensors.size());
    NITRO_CHECK(tensors.size() <= std::numeric_limits<std::uint32_t>::max(), "nitro::DiskTier: a value of ",
                tensors.size(), " tensors; at most 2^32 - 1 (split it)");
    std::vector<std::vector<std::byte>> heads;
    heads.reserve(tensors.size());
    std::size_t file_bytes = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      heads.push_back(
          cache::detail::encode_header(static_cast<std::uint64_t>(key), static_cast<std::uint32_t>(i), tensors[i]));
      file_bytes += heads.back().size() + (tensors[i].defined() ? tensors[i].nbytes() : 0);
    }
    if (file_bytes > capacity_) {
      std::lock_guard guard(mutex_);
      if (const auto it = index_.find(key); it != index_.end()) drop(it);
      ++stats_.rejections;
      return false;
    }

    // Written and fsynced (Options::fsync) outside the lock; renamed under it, so the books and the
    // files agree. A failure throws and leaves no temporary file and the old file as it was.
    io::AtomicFile file(path_of(key), {.fsync = fsync_});
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      file.write(heads[i].data(), heads[i].size());
      if (tensors[i].defined() && tensors[i].nbytes() > 0) file.write(tensors[i].data_ptr(), tensors[i].nbytes());
    }
    file.finish();

    std::lock_guard guard(mutex_);
    (void)file.commit();  // renamed (or thrown); a failed fsync of the directory leaves a file a crash may lose, as without fsync
    // The rename replaced the old file; only the books of the old entry remain to drop.
    if (const auto it = index_.find(key); it != index_.end()) forget(it);
    order_.push_back(key);
    index_.emplace(key, Entry{file_bytes, ++generation_, std::prev(order_.end()), tensors.size(), std::move(shell)});
    bytes_ += file_bytes;
    ++stats_.stores;
    while (bytes_ > capacity_) {
      drop(index_.find(order_.front()));
      ++stats_.evictions;
    }
    return true;
  }

  /// The value under `key`, its tensors on the CPU, or nothing when it is absent or its file is
  /// missing, truncated or corrupt (that file is then removed and counted in stats().corrupt).
  ///   if (auto t = disk.load(i)) use(*t);
  [[nodiscard]] std::optional<Value> load(Key key) {
    cache::detail::Fd fd;
    std::uint64_t generation = 0, file_bytes = 0;
    std::size_t count = 0;
    std::optional<Shell> shell;
    {
      std::lock_guard guard(mutex_);
      const auto it = index_.find(key);
      if (it == index_.end()) {
        ++stats_.misses;
        return std::nullopt;
      }
      // Opened under the lock so the file is the one the entry describes; once open, a rename over
      // it or its removal leaves what this reads intact (POSIX keeps an unlinked file's contents).
      fd.reset(::open(path_of(key).c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd) {
        drop(it);
        ++stats_.corrupt;
        ++stats_.misses;
        return std::nullopt;
      }
      generation = it->second.generation;
      file_bytes = it->second.bytes;
      count = it->second.tensors;
      shell.emplace(it->second.shell);
      order_.splice(order_.end(), order_, it->second.position);
    }
    std::optional<std::vector<at::Tensor>> tensors =
        cache::detail::decode_file(fd.get(), static_cast<std::uint64_t>(key), file_bytes, count, !single);
    std::lock_guard guard(mutex_);
    if (!tensors) {
      // Remove the bad file unless a store has replaced it since.
      if (const auto it = index_.find(key); it != index_.end() && it->second.generation == generation) drop(it);
      ++stats_.corrupt;
      ++stats_.misses;
      return std::nullopt;
    }
    ++stats_.hits;
    if constexpr (single) {
      return std::move(tensors->front());
    } else {
      // The shell was checked when stored to take back exactly `count` tensors, in order.
      std::size_t i = 0;
      return map_tensors(*shell, [&](const at::Tensor&) {
        return i < count ? std::move((*tensors)[i++]) : at::Tensor();
      });
    }
  }

  /// Removes `key`'s file; false when it was not held.
  bool erase(Key key) {
    std::lock_guard guard(mutex_);
    const auto it = index_.find(key);
    if (it == index_.end()) return false;
    drop(it);
    return true;
  }

  /// Whether a file is held for `key` (it is not read: load() may still find it corrupt).
  [[nodiscard]] bool contains(Key key) const {
    std::lock_guard guard(mutex_);
    return index_.contains(key);
  }

  /// Removes every file it holds; the statistics stay.
  void clear() {
    std::lock_guard guard(mutex_);
    for (const auto& [key, entry] : index_) ::unlink(path_of(key).c_str());
    index_.clear();
    order_.clear();
    bytes_ = 0;
  }

  /// The number of files held.
  [[nodiscard]] std::size_t size() const {
    std::lock_guard guard(mutex_);
    return index_.size();
  }
  /// File bytes held, headers included; never more than capacity().
  [[nodiscard]] std::size_t bytes() const {
    std::lock_guard guard(mutex_);
    return bytes_;
  }
  /// The byte budget of the files (DiskTierOptions::capacity_bytes).
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// The spill directory.
  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return directory_; }
  /// The file that holds (or would hold) `key`.
  [[nodiscard]] std::filesystem::path path_of(Key key) const {
    return directory_ / (std::to_string(key) + std::string(cache::detail::file_suffix));
  }
  /// The counters since construction or reset_stats(), with the bytes and files held now.
  [[nodiscard]] DiskTierStats stats() const {
    std::lock_guard guard(mutex_);
    DiskTierStats s = stats_;
    s.bytes = bytes_;
    s.entries = index_.size();
    return s;
  }
  /// Sets hits, misses, stores, rejections, evictions and corrupt back to 0.
  void reset_stats() {
    std::lock_guard guard(mutex_);
    stats_ = {};
  }

 private:
  struct NoShell {};
  // What of a value is not in its file; nothing for a tensor.
  using Shell = std::conditional_t<single, NoShell, Value>;
  struct Entry {
    std::size_t bytes;
    std::uint64_t generation;  // tells a file apart from the one a later store put under the same name
    typename std::list<Key>::iterator position;
    std::size_t tensors;  // in the file
    [[no_unique_address]] Shell shell;
  };
  using Index = std::unordered_map<Key, Entry>;

  static Shell shell_for(const Value& value, std::size_t tensors) {
    if constexpr (single) return {};
    else return cache::detail::shell_of(value, tensors, "nitro::DiskTier");
  }

  static at::Tensor spillable(const at::Tensor& tensor) {
    cache::detail::check_spillable(tensor, !single, "nitro::DiskTier", "store");
    if (!tensor.defined()) return tensor;
    // Conjugate and negative views are lazy flags over the same bytes: resolve them so the bytes
    // written are the values.
    at::Tensor t = tensor.resolve_conj().resolve_neg();
    if (!t.device().is_cpu()) t = t.cpu();
    return t.contiguous();
  }



  // Drops the books of an entry whose file is already gone or replaced. Under the lock.
  void forget(typename Index::iterator it) {
    bytes_ -= it->second.bytes;
    order_.erase(it->second.position);
    index_.erase(it);
  }
  // Removes an entry's file and its books. Under the lock, so a store of the same key cannot slip in
  // between and lose its new file.
  void drop(typename Index::iterator it) {
    ::unlink(path_of(it->first).c_str());
    forget(it);
  }


  void probe_writable() const {
    const std::filesystem::path probe = directory_ / (".nitro-probe." + std::to_string(::getpid()));
    cache::detail::Fd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    const int err = errno;
    NITRO_CHECK(fd, "nitro::DiskTier: the spill directory ", directory_, " is not writable (creating ", probe,
                " failed: ", cache::detail::os_error(err), "); give a directory on a writable local disk");
    fd.close();
    ::unlink(probe.c_str());
  }

  // A previous run's spills cannot be trusted to match this run's sources: start empty. Only files
  // named like ours are touched, and a spill file only when it begins with our magic.
  void remove_stale_files() const {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(directory_, ec)) {
      const std::string name = e.path().filename().string();
      std::error_code ignored;
      if (io::is_temp_name(name)) {  // an io::AtomicFile a crashed run left
        std::filesystem::remove(e.path(), ignored);
      } else if (cache::detail::is_spill_file_name(name) && e.is_regular_file(ignored)) {
        cache::detail::Fd fd(::open(e.path().c_str(), O_RDONLY | O_CLOEXEC));
        char magic[sizeof cache::detail::file_magic] = {};
        const bool short_or_ours = fd && (!cache::detail::read_all(fd.get(), magic, sizeof magic) ||
                                          std::memcmp(magic, cache::detail::file_magic, sizeof magic) == 0);
        if (short_or_ours) std::filesystem::remove(e.path(), ignored);
      }
    }
  }

  const std::filesystem::path directory_;
  const std::size_t capacity_;
  const bool fsync_;
  bool created_directory_ = false;
  mutable std::mutex mutex_;
  Index index_;
  std::list<Key> order_;  // least recently stored or loaded first
  std::size_t bytes_ = 0;
  std::uint64_t generation_ = 0;
  DiskTierStats stats_;
};

/// A DiskTier of tensors keyed by sample index.
using DiskTier = BasicDiskTier<std::int64_t>;

// ---- TieredCache -----------------------------------------------------------------------------------

namespace cache {
/// A value of TieredCache's memory tier: the value, and the version it holds it under (the clock
/// value of the put that wrote it, or for a value read back from disk the key's stamp then). A spill
/// of an evicted value goes by it: it is written only while no put or erase has touched the key since.
template <class Value>
struct Versioned {
  Value value{};              ///< the value held
  std::uint64_t version = 0;  ///< the clock value it is held under
};
/// Versioned<at::Tensor>: the memory tier's value for tensors (the name from before TieredCache took a value type).
using VersionedTensor = Versioned<at::Tensor>;
/// The memory tier's weigher: the value's bytes, as TensorBytes counts them (the version is books).
struct VersionedBytes {
  template <class Value>
  /// TensorBytes of `v.value`.
  std::int64_t operator()(const Versioned<Value>& v) const {
    return TensorBytes{}(v.value);
  }
};
/// The name VersionedBytes had before TieredCache took a value type.
using VersionedTensorBytes = VersionedBytes;

namespace detail {
/// A lock type, as opposed to a value type: what TieredCache<Policy, Lock>, the spelling from before
/// TieredCache took a value type, passes second.
template <class T>
concept LockType = !Batch<T> && requires(T& m) {
  m.lock();
  m.unlock();
};
template <class ValueOrLock, class Lock>
struct TieredArgs {
  using value = ValueOrLock;
  using lock = Lock;
};
template <LockType L, class Lock>
struct TieredArgs<L, Lock> {
  static_assert(std::same_as<Lock, std::mutex>,
                "nitro::TieredCache<Policy, Lock, ...>: a lock as the second argument means at::Tensor values "
                "and takes no third; write TieredCache<Policy, Value, Lock>");
  using value = at::Tensor;
  using lock = L;
};
}  // namespace detail
}  // namespace cache

/// Both tiers' statistics. Every get() is one memory hit or miss, and every memory miss is one disk
/// hit or miss: memory.misses == disk.hits + disk.misses.
struct TieredCacheStats {
  CacheStats memory;   ///< the memory tier's counters (every get() is a memory hit or miss)
  DiskTierStats disk;  ///< the disk tier's counters (every memory miss is a disk hit or miss)
  /// Gets answered by either tier: memory hits plus disk hits.
  [[nodiscard]] std::uint64_t hits() const noexcept { return memory.hits + disk.hits; }
  /// Gets answered by neither tier: the disk misses.
  [[nodiscard]] std::uint64_t misses() const noexcept { return disk.misses; }
  /// hits() / gets, from 0 to 1; 0 before any get.
  [[nodiscard]] NITRO_INLINE double hit_ratio() const noexcept;
};

/// A memory cache in front of a disk tier: what the memory tier evicts or refuses is written to disk,
/// and a get() that misses memory reads the disk, moving a hit into memory when memory keeps it.
/// @tparam Policy the memory tier's eviction policy (cache/evict/), required
/// @tparam Value  what it holds: a nitro::Batch (a tensor, a torch::data::Example, a tuple, pair,
///                vector or optional of them, a user struct with nitro_map_tensors), default
///                constructible and copyable; optional, default at::Tensor. On disk, its tensors are
///                in the file and the rest of it in memory (see the top of this file).
/// @tparam Lock   a BasicLockable for the memory tier and for each of the key stripes; optional,
///                default std::mutex (NullMutex for one thread). TieredCache<Policy, Lock>, a lock
///                second, is TieredCache<Policy, at::Tensor, Lock> (the spelling from before Value).
///
/// What is locked, and what runs at once:
///  - A memory hit takes only the memory tier's lock; it never waits on a file.
///  - Every key belongs to one of 32 stripes (by its hash), each with its own lock. put(k), erase(k)
///    and a get(k) that misses memory hold k's stripe, and no other, for their whole work on k: the
///    disk read, the promotion, the file of a value memory refused. So operations on one key are
///    ordered, while those on keys of different stripes run at once, file reads and writes included
///    (the DiskTier itself writes and reads files outside its lock).
///  - What a put or a promotion evicts from memory is spilled afterwards under the evicted key's own
///    stripe, once the first stripe is released: a thread holds one stripe at a time, so two stripes
///    never wait on each other. An evicted key of the same stripe is spilled at once, still under it.
///  - clear() takes every stripe.
///
/// Versions: every put of k takes a version from a clock and stamps it on k's slot (one of 4096, by
/// hash; an erase stamps too), both under k's stripe, and memory holds the value with its version. A
/// spill done later under another stripe is written only when the slot's stamp still equals the
/// value's version (no put or erase of the slot since) and the value is newer than the last clear().
///
/// Guarantees: a value erased or replaced never comes back. Once put(k, v) has returned, get(k) gives
/// v, a later put's value, or nothing; once erase(k) has returned, a later put's value or nothing. A
/// value that was neither replaced nor erased is not dropped by a concurrent eviction: it is in memory,
/// or its spill is written (unless the disk tier refuses it or evicts it for room). The one exception
/// is a put or erase of another key of the same slot (1 key in 4096 shares it) between the eviction
/// and the spill, which drops the spill: a later miss, never a wrong value. A get racing a put of the
/// same key or the spill of its value may miss: a cache miss, never a wrong value. A disk hit that
/// memory refuses (NoEvict when full) stays in its file, not written again; one that memory keeps
/// leaves the disk.
///
///   nitro::TieredCache<nitro::evict::Lru> cache{{.memory_capacity_bytes = 1ull << 30,
///                                                .disk = {.directory = "/tmp/spill", .capacity_bytes = 8ull << 30}}};
///   cache.put(i, tensor);
///   auto t = cache.get(i);  // from memory, or from disk when memory evicted it
///
///   nitro::TieredCache<nitro::evict::NoEvict, torch::data::Example<>> samples{{...}};
///   samples.put(i, dataset.get(i));  // data and target, each back exactly from either tier
template <EvictionPolicy Policy, class Value = at::Tensor, class Lock = std::mutex>
class TieredCache {
  using Args = cache::detail::TieredArgs<Value, Lock>;

 public:
  /// The value type.
  using value_type = typename Args::value;
  /// The lock of the memory tier and of each key stripe.
  using lock_type = typename Args::lock;
  static_assert(Batch<value_type> && std::same_as<value_type, std::remove_cvref_t<value_type>>,
                "nitro::TieredCache: Value must be a batch (a tensor, a torch::data::Example, a tuple, pair, vector "
                "or optional of them, or a type with nitro_map_tensors; see nitro/core/device.hpp)");
  static_assert(std::default_initializable<value_type> && std::copyable<value_type>,
                "nitro::TieredCache: Value must be default constructible and copyable (the memory tier's Cache "
                "holds it in a table and returns copies)");
  /// The memory tier: its values are the values with the versions the spills go by
  /// (cache::Versioned), weighed by their tensors' bytes.
  using memory_type = Cache<Policy, std::int64_t, cache::Versioned<value_type>, cache::VersionedBytes, lock_type>;
  /// The disk tier.
  using disk_type = BasicDiskTier<std::int64_t, value_type>;

  /// What a tiered cache is made from.
  struct Options {
    /// The memory tier's byte budget (TensorBytes), > 0.
    std::size_t memory_capacity_bytes = 0;
    /// The memory tier's policy knobs.
    typename Policy::Options policy{};
    /// The disk tier: directory and byte budget.
    DiskTierOptions disk{};
  };

  /// Makes the disk tier (creating its directory, removing a previous run's spill files) and the memory
  /// tier. Throws nitro::Error when memory_capacity_bytes or disk.capacity_bytes is 0, disk.directory is
  /// empty, or the directory cannot be created or written.
  explicit TieredCache(Options options)
      : disk_(std::move(options.disk)),
        memory_({.capacity_bytes = checked_memory_capacity(options.memory_capacity_bytes),
                 .policy = std::move(options.policy)}),
        write_stamps_(std::make_unique<std::uint64_t[]>(stamp_slots)) {}

  TieredCache(const TieredCache&) = delete;
  TieredCache& operator=(const TieredCache&) = delete;

  /// Stores `value` under `key` in memory (replacing it in both tiers); what memory evicts for room,
  /// or `value` itself when memory refuses it, goes to disk. Returns whether `value` is held in
  /// either tier. Throws nitro::Error for a value the disk tier could not hold (a sparse, quantized
  /// or nested tensor; an undefined one, unless inside a composite value; a nitro_map_tensors that
  /// cannot put the tensors back) or when a spill cannot be written (what was not yet spilled is
  /// dropped).
  ///   cache.put(i, image);
  bool put(std::int64_t key, value_type value) {
    check_spillable(value);
    const std::size_t slot = slot_of(key);
    Removed removed;
    bool held = false;
    {
      std::lock_guard guard(stripes_[stripe_of(slot)].lock);
      disk_.erase(key);  // memory holds the new value now, or refuses it and it is written below
      // Stamped before the memory put, so the value goes in with its version; no spill of this slot
      // can look at the stamp in between, as spills take the stripe held here.
      const bool kept = memory_.put(key, {std::move(value), stamp(slot)}, removed);
      spill_in_stripe(removed, stripe_of(slot));  // `value` itself when memory refused it
      held = kept || disk_.contains(key);
    }
    spill_in_other_stripes(removed, stripe_of(slot));
    return held;
  }

  /// The value under `key`: from memory, else from disk (its tensors on the CPU, moved into memory
  /// when memory keeps it, else left in its file as it is), else nothing.
  ///   if (auto t = cache.get(i)) use(*t);
  [[nodiscard]] std::optional<value_type> get(std::int64_t key) {
    if (auto hit = memory_.get(key)) return std::move(hit->value);
    const std::size_t slot = slot_of(key);
    Removed removed;
    std::optional<value_type> value;
    {
      std::lock_guard guard(stripes_[stripe_of(slot)].lock);
      value = disk_.load(key);
      if (!value || static_cast<std::size_t>(TensorBytes{}(*value)) > memory_.capacity()) return value;
      // Memory first, then the file goes: memory shadows disk for a key it holds, so a get in
      // between reads the same value. Not stamped: the value moves, it does not change, so it keeps
      // the slot's stamp as its version and a later spill of it is written unless the slot is
      // written first.
      if (memory_.put(key, {*value, write_stamps_[slot]}, removed)) disk_.erase(key);
      // Refused: its file already holds it. Writing it again is what made every disk hit of a full
      // NoEvict tier a file write.
      std::erase_if(removed, [&](const auto& r) { return std::get<0>(r) == key; });
      spill_in_stripe(removed, stripe_of(slot));
    }
    spill_in_other_stripes(removed, stripe_of(slot));
    return value;
  }

  /// Removes `key` from both tiers; false when neither held it.
  bool erase(std::int64_t key) {
    const std::size_t slot = slot_of(key);
    std::lock_guard guard(stripes_[stripe_of(slot)].lock);
    const bool in_memory = memory_.erase(key);
    const bool on_disk = disk_.erase(key);
    stamp(slot);
    return in_memory || on_disk;
  }

  /// Whether either tier holds `key`; not an access.
  [[nodiscard]] bool contains(std::int64_t key) const { return memory_.contains(key) || disk_.contains(key); }

  /// Empties both tiers (no spills); the statistics stay.
  void clear() {
    AllStripes all(stripes_);
    memory_.clear();
    disk_.clear();
    cleared_ = clock_.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  /// Entries in both tiers.
  [[nodiscard]] std::size_t size() const { return memory_.size() + disk_.size(); }
  /// Both tiers' counters.
  [[nodiscard]] TieredCacheStats stats() const { return {memory_.stats(), disk_.stats()}; }
  /// Resets both tiers' counters.
  void reset_stats() {
    memory_.reset_stats();
    disk_.reset_stats();
  }
  /// The tiers, to inspect (size, bytes, contains, stats); change them through the TieredCache only.
  /// The memory tier's values are cache::Versioned (the value and its version): read values through
  /// get().
  [[nodiscard]] const memory_type& memory() const noexcept { return memory_; }
  /// The disk tier (see memory()).
  [[nodiscard]] const disk_type& disk() const noexcept { return disk_; }

 private:
  using Removed = typename memory_type::Removed;

  // 32 stripes of locks, and 128 stamp slots per stripe (a slot's keys all share its stripe, so a
  // slot's stamp is read and written under that stripe's lock). Not more stripes: clear() holds them
  // all, with the tiers' own locks, and ThreadSanitizer follows at most 64 locks held by one thread.
  static constexpr std::size_t stripe_count = 32;
  static constexpr std::size_t stamp_slots = 4096;
  static constexpr std::size_t slots_per_stripe = stamp_slots / stripe_count;
  struct alignas(64) Stripe {  // a cache line each, so two threads on two stripes share none
    lock_type lock;
  };
  // Locks every stripe in index order; safe because no other thread ever waits for a second stripe.
  class AllStripes {
   public:
    explicit AllStripes(std::array<Stripe, stripe_count>& stripes) : all_(stripes) {
      for (auto& s : all_) s.lock.lock();
    }
    AllStripes(const AllStripes&) = delete;
    AllStripes& operator=(const AllStripes&) = delete;
    ~AllStripes() {
      for (auto& s : all_) s.lock.unlock();
    }

   private:
    std::array<Stripe, stripe_count>& all_;
  };

  static std::size_t slot_of(std::int64_t key) noexcept {
    return static_cast<std::size_t>(cache::KeyHash<std::int64_t>{}(key) & (stamp_slots - 1));
  }
  static std::size_t stripe_of(std::size_t slot) noexcept { return slot / slots_per_stripe; }

  // Stamps a key's slot with a new version for a put or erase of it, under the key's stripe, and
  // returns it. Each stamp is a new clock value, so a slot never gets an old stamp back: an evicted
  // value whose version still equals its slot's stamp was written by the last put of the slot (or
  // read back from disk since), and nothing has replaced or erased it. Deciding by equality rather
  // than by a clock read before the eviction is what keeps a value put just before another thread's
  // eviction: that thread's clock read once came before the put's stamp, and the value was dropped.
  // Relaxed is enough: the stamps are read and written under the stripe's lock, and the versions
  // travel through the memory tier's.
  std::uint64_t stamp(std::size_t slot) noexcept {
    return write_stamps_[slot] = clock_.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  // Spills the entries of `removed` in the stripe the caller holds and has held since before the
  // memory put that removed them, so no put or erase of their keys can have come in between and each
  // is its key's latest value. Not checked against the stamps: the caller's own put may have stamped
  // a slot one of them shares, which would drop it for nothing.
  void spill_in_stripe(const Removed& removed, std::size_t held) {
    for (const auto& [key, entry, cause] : removed)
      if (stripe_of(slot_of(key)) == held) disk_.store(key, entry.value);
  }

  // Spills the other entries, each under its key's stripe, taken after the caller released its own.
  // An entry whose slot's stamp no longer equals its version is dropped: a put or erase of its key
  // has come since the value went into memory, and the value is stale. A put or erase of another
  // key of the slot (1 key in 4096 shares it) drops it too: a later miss, never a wrong value. An
  // entry not newer than the last clear() is dropped: clear() leaves the stamps as they are.
  void spill_in_other_stripes(const Removed& removed, std::size_t held) {
    for (const auto& [key, entry, cause] : removed) {
      const std::size_t slot = slot_of(key);
      if (stripe_of(slot) == held) continue;
      std::lock_guard guard(stripes_[stripe_of(slot)].lock);
      if (write_stamps_[slot] == entry.version && entry.version > cleared_) disk_.store(key, entry.value);
    }
  }

  static std::size_t checked_memory_capacity(std::size_t capacity) {
    NITRO_CHECK(capacity > 0, "nitro::TieredCache<", Policy::name, ">: memory_capacity_bytes is 0; give the memory "
                "tier's byte budget, e.g. {.memory_capacity_bytes = 1ull << 30} for 1 GiB");
    return capacity;
  }
  // Checked before the put, so a value that could never be spilled is refused at the door rather than
  // failing later inside another key's eviction.
  static void check_spillable(const value_type& value) {
    constexpr bool composite = !std::same_as<value_type, at::Tensor>;
    std::size_t tensors = 0;
    for_each_tensor(value, [&](const at::Tensor& t) {
      cache::detail::check_spillable(t, composite, "nitro::TieredCache", "put");
      ++tensors;
    });
    if constexpr (composite) (void)cache::detail::shell_of(value, tensors, "nitro::TieredCache");
  }

  disk_type disk_;
  memory_type memory_;
  std::array<Stripe, stripe_count> stripes_;
  std::atomic<std::uint64_t> clock_{0};                // counts puts, erases and clears
  std::unique_ptr<std::uint64_t[]> write_stamps_;      // [slot]: the version of the slot's last put or erase
  std::uint64_t cleared_ = 0;                          // clock_ after the last clear(); under every stripe
};

namespace cache::detail {
template <class Policy, class Key, class Value, class Weigher, class Lock>
struct TieredAs {
  static_assert(std::same_as<Key, std::int64_t>,
                "nitro::TieredCache_mt: the key must be std::int64_t (a sample index; the spill file is named "
                "after it)");
  static_assert(std::same_as<Weigher, TensorBytes>,
                "nitro::TieredCache_mt: the memory tier weighs values by TensorBytes; another weigher is not "
                "supported");
  using type = TieredCache<Policy, Value, Lock>;
};
}  // namespace cache::detail

/// TieredCache in the shape of Cache_mt (Policy, Key, Value, Weigher), thread safe: the cache template
/// of a CachedDataset with memory and disk (nitro::cached_tiered). Key must be std::int64_t and
/// Weigher TensorBytes (they are there for the shape).
///   nitro::CachedDataset<nitro::evict::NoEvict, MyDataset, nitro::TieredCache_mt> samples{...};
template <EvictionPolicy Policy, class Key = std::int64_t, class Value = at::Tensor, class Weigher = TensorBytes>
using TieredCache_mt = typename cache::detail::TieredAs<Policy, Key, Value, Weigher, std::mutex>::type;
/// The same for one thread: no locks.
template <EvictionPolicy Policy, class Key = std::int64_t, class Value = at::Tensor, class Weigher = TensorBytes>
using TieredCache_st = typename cache::detail::TieredAs<Policy, Key, Value, Weigher, NullMutex>::type;

}  // namespace nitro

#if !NITRO_COMPILED
#include <nitro/cache/disk_tier-inl.hpp>
#endif
