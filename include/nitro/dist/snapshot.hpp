#pragma once
// Snapshots for ranks that do not share a file system (nodes with disks of their own): rank 0 writes
// the snapshots (snapshot::Policy), so only rank 0's disk holds them. Before resuming, every rank
// calls fetch_latest_snapshot with its own snapshot directory: rank 0 finds its newest good snapshot,
// and each rank that lacks an identical copy receives it over the group and writes it into its own
// directory under the same name (io::AtomicFile: whole or not at all, fsynced); then every rank loads
// its local copy.
//
//   auto world = nitro::dist::ProcessGroup::from_environment();
//   Loop loop{model, optimizer, {.hooks = {{.group = world}, {.directory = "runs/a", .every_steps = 1000}}}};
//   if (auto got = nitro::dist::fetch_latest_snapshot(world, "runs/a"))
//     nitro::snapshot::load(got->file, loop, {.sampler = &sampler});
//
// On a shared file system every rank already sees rank 0's file: a rank whose local file has the same
// name, size and footer (which holds the checksum of the manifest, which holds every part's checksum)
// receives nothing, so the call costs a few small collectives (that local copy is trusted, not read
// again: a copy damaged since it was written is found by snapshot::load, which names the part; remove it
// and fetch again). The bytes go in chunks of
// Options::chunk_bytes (memory stays bounded whatever the snapshot's size), through Gloo on the CPU
// (or NCCL, through the GPU, on a group without Gloo); a received copy is verified (every part's
// checksum) before it takes the snapshot's name. Every rank must call it, with the group it trains
// with. A rank that cannot write or verify its copy (a full disk) still takes part to the end; then
// every rank throws, so that none goes on to train alone; rank 0 failing to read its file tells every
// rank, which all throw.
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>
#include <nitro/dist/process_group.hpp>
#include <nitro/io/file.hpp>
#include <nitro/snapshot/snapshot.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace nitro::dist {

/// What fetch_latest_snapshot / fetch_snapshot gave this rank.
struct FetchedSnapshot {
  /// The snapshot on this rank's file system.
  std::filesystem::path file;
  /// This rank received it over the group (false: rank 0 itself, or an identical copy was already there).
  bool received = false;
  /// Its size in bytes.
  std::uint64_t bytes = 0;
};

/// How a snapshot is sent to the other ranks.
struct FetchOptions {
  /// The bytes sent per collective, in [4096, 2^31] (memory held on each rank while fetching: about twice this).
  std::uint64_t chunk_bytes = 64ull << 20;
  /// fsync the received copy (and its directory).
  bool fsync = true;
};

namespace detail {

// A rank's file identity: size and the last 32 bytes (the snapshot footer). Empty when unreadable.
NITRO_INLINE std::optional<std::pair<std::uint64_t, std::array<std::uint8_t, 32>>> snapshot_identity(const std::filesystem::path& file);

// Collectives on tensors of the group's device (CPU through Gloo; else the GPU through NCCL).
class Channel {
 public:
  NITRO_INLINE explicit Channel(const ProcessGroup& group);
  // Rank 0's host bytes into every rank's `host` (a CPU uint8 tensor; the first n bytes).
  NITRO_INLINE void broadcast(at::Tensor& host, std::int64_t n, std::string_view what);
  NITRO_INLINE std::int64_t sum(std::int64_t value, std::string_view what);

 private:
  const ProcessGroup& group_;
  c10::Device device_{c10::kCPU};
};

}  // namespace detail

/// Rank 0's snapshot `file` on every rank, at the same path on each rank's file system (see the top
/// of this header). Every rank calls it with the same path.
NITRO_INLINE FetchedSnapshot fetch_snapshot(const ProcessGroup& group, const std::filesystem::path& file,
                                      const FetchOptions& options = {});

/// Rank 0's newest good snapshot in `directory` (snapshot::latest there), on every rank under the same
/// name in its own `directory`; nothing when rank 0 has none. Every rank calls it.
NITRO_INLINE std::optional<FetchedSnapshot> fetch_latest_snapshot(const ProcessGroup& group, const std::filesystem::path& directory,
                                                            const FetchOptions& options = {});

}  // namespace nitro::dist

#if !NITRO_COMPILED
#include <nitro/dist/snapshot-inl.hpp>
#endif
