#pragma once
// The definitions of nitro/dist/snapshot.hpp's non-template functions: included by snapshot.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/dist/snapshot.hpp>

namespace nitro::dist::detail {

NITRO_INLINE std::optional<std::pair<std::uint64_t, std::array<std::uint8_t, 32>>> snapshot_identity(const std::filesystem::path& file) {
  io::Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return std::nullopt;
  struct ::stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 32) return std::nullopt;
  std::array<std::uint8_t, 32> tail{};
  if (!io::pread_all(fd.get(), tail.data(), tail.size(), static_cast<std::uint64_t>(st.st_size) - 32)) return std::nullopt;
  return std::pair{static_cast<std::uint64_t>(st.st_size), tail};
}

NITRO_INLINE Channel::Channel(const ProcessGroup& group) : group_(group) {
  if (!group.serves(c10::kCPU)) device_ = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(group.local_rank()));
}

NITRO_INLINE void Channel::broadcast(at::Tensor& host, std::int64_t n, std::string_view what) {
  if (device_.is_cpu()) {
    std::vector<at::Tensor> t{host.narrow(0, 0, n)};
    group_.broadcast(t, 0, what);
    return;
  }
  std::vector<at::Tensor> t{host.narrow(0, 0, n).to(device_)};
  group_.broadcast(t, 0, what);
  host.narrow(0, 0, n).copy_(t[0]);
}

NITRO_INLINE std::int64_t Channel::sum(std::int64_t value, std::string_view what) {
  std::vector<at::Tensor> t{at::full({1}, value, at::TensorOptions().dtype(at::kLong).device(device_))};
  group_.all_reduce_sum(t, what);
  return t[0].cpu().data_ptr<std::int64_t>()[0];
}

}  // namespace nitro::dist::detail

namespace nitro::dist {

NITRO_INLINE FetchedSnapshot fetch_snapshot(const ProcessGroup& group, const std::filesystem::path& file, const FetchOptions& options) {
  NITRO_CHECK(options.chunk_bytes >= 4096 && options.chunk_bytes <= (1ull << 31),
              "nitro::dist::fetch_snapshot: chunk_bytes must be in [4096, 2^31], got ", options.chunk_bytes);
  NITRO_CHECK(!file.empty() && file.has_filename(), "nitro::dist::fetch_snapshot: give the path of a snapshot file, got \"",
              file.string(), "\"");
  detail::Channel channel(group);
  const bool root = group.rank() == 0;
  // 1. Rank 0 says the size and the footer (or that it cannot read the file).
  at::Tensor meta = at::zeros({8 + 32}, at::kByte);
  std::uint64_t size = 0;
  std::string problem;
  if (root) {
    const auto id = detail::snapshot_identity(file);
    if (!id) {
      problem = "rank 0 cannot read " + file.string() + " (missing, not a regular file, or shorter than a snapshot)";
    } else {
      size = id->first;
      std::memcpy(meta.data_ptr<std::uint8_t>(), &size, 8);
      std::memcpy(meta.data_ptr<std::uint8_t>() + 8, id->second.data(), 32);
    }
  }
  channel.broadcast(meta, meta.numel(), "sharing rank 0's snapshot");
  std::memcpy(&size, meta.data_ptr<std::uint8_t>(), 8);
  if (size == 0) {
    NITRO_CHECK(!root, "nitro::dist::fetch_snapshot: ", problem);
    ::nitro::detail::fail("nitro::dist::fetch_snapshot: rank 0 cannot read ", file.string(), "; every rank gives the path "
                          "of a snapshot that is on rank 0's file system");
  }
  // 2. Who needs the bytes: a rank without an identical copy.
  bool need = false;
  if (!root) {
    const auto mine = detail::snapshot_identity(file);
    need = !mine || mine->first != size || std::memcmp(mine->second.data(), meta.data_ptr<std::uint8_t>() + 8, 32) != 0;
  }
  FetchedSnapshot out{file, false, size};
  if (channel.sum(need ? 1 : 0, "sharing rank 0's snapshot") == 0) return out;
  // 3. The bytes, chunk by chunk, each preceded by rank 0's word that it could read it.
  std::optional<io::AtomicFile> copy;
  std::string failed;  // this rank's first write error: it takes part to the end, then throws
  if (need) {
    try {
      if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
      copy.emplace(file, io::AtomicFile::Options{.fsync = options.fsync});
    } catch (const std::exception& e) {
      failed = e.what();
    }
  }
  io::Fd source;
  if (root) source.reset(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  const std::int64_t chunk = static_cast<std::int64_t>(std::min<std::uint64_t>(options.chunk_bytes, size));
  at::Tensor buffer = at::empty({chunk}, at::kByte);
  at::Tensor status = at::zeros({1}, at::kByte);
  for (std::uint64_t at_byte = 0; at_byte < size; at_byte += static_cast<std::uint64_t>(chunk)) {
    const std::int64_t n = static_cast<std::int64_t>(std::min<std::uint64_t>(static_cast<std::uint64_t>(chunk), size - at_byte));
    if (root) {
      const bool ok = source && io::pread_all(source.get(), buffer.data_ptr<std::uint8_t>(), static_cast<std::size_t>(n), at_byte);
      status.data_ptr<std::uint8_t>()[0] = ok ? 1 : 0;
      if (!ok) problem = "rank 0 could not read " + file.string() + " at byte " + std::to_string(at_byte) + ": " + io::os_error(errno);
    }
    channel.broadcast(status, 1, "sharing rank 0's snapshot");
    if (status.data_ptr<std::uint8_t>()[0] == 0) {
      if (copy) copy->abandon();
      NITRO_CHECK(!root, "nitro::dist::fetch_snapshot: ", problem, "; no rank received it");
      ::nitro::detail::fail("nitro::dist::fetch_snapshot: rank 0 could not read its snapshot ", file.string(),
                            " while sending it; see rank 0's error");
    }
    channel.broadcast(buffer, n, "sharing rank 0's snapshot");
    if (copy && failed.empty()) {
      try {
        copy->write(buffer.data_ptr<std::uint8_t>(), static_cast<std::size_t>(n));
      } catch (const std::exception& e) {
        failed = e.what();
        copy->abandon();
      }
    }
  }
  // 4. Each received copy verified (every part's checksum) before it takes the snapshot's name; then
  // every rank learns whether any rank failed, so that none goes on to train alone.
  if (need && failed.empty()) {
    try {
      copy->finish();
      if (auto bad = snapshot::check(copy->temp_path())) {
        failed = "the received bytes do not verify (" + *bad + ")";
        copy->abandon();
      } else {
        (void)copy->commit();  // false: renamed, but the directory's fsync failed (the copy is there)
        out.received = true;
      }
    } catch (const std::exception& e) {
      failed = e.what();
      copy->abandon();
    }
  }
  const std::int64_t failures = channel.sum(failed.empty() ? 0 : 1, "sharing rank 0's snapshot");
  NITRO_CHECK(failed.empty(), "nitro::dist::fetch_snapshot: rank ", group.rank(), " could not make its copy of rank 0's "
              "snapshot ", file.string(), ": ", failed, "; no copy was left under that name (fix the cause and fetch "
              "again; every rank stops here)");
  NITRO_CHECK(failures == 0, "nitro::dist::fetch_snapshot: ", failures, " rank(s) could not make their copy of rank 0's "
              "snapshot ", file.string(), " (see their errors); every rank stops here");
  return out;
}

NITRO_INLINE std::optional<FetchedSnapshot> fetch_latest_snapshot(const ProcessGroup& group, const std::filesystem::path& directory, const FetchOptions& options) {
  NITRO_CHECK(!directory.empty(), "nitro::dist::fetch_latest_snapshot: the directory is empty; give the snapshots' "
              "directory (snapshot::Policy's Options::directory)");
  detail::Channel channel(group);
  constexpr std::int64_t max_name = 1024;
  at::Tensor name = at::zeros({max_name}, at::kByte);
  if (group.rank() == 0) {
    if (const auto latest = snapshot::latest(directory)) {
      const std::string n = latest->filename().string();
      NITRO_CHECK(static_cast<std::int64_t>(n.size()) < max_name, "nitro::dist::fetch_latest_snapshot: the file name ",
                  n, " is too long");
      std::memcpy(name.data_ptr<std::uint8_t>(), n.data(), n.size());
    }
  }
  channel.broadcast(name, max_name, "finding rank 0's latest snapshot");
  const std::string n(reinterpret_cast<const char*>(name.data_ptr<std::uint8_t>()));
  if (n.empty()) return std::nullopt;
  return fetch_snapshot(group, directory / n, options);
}

}  // namespace nitro::dist
