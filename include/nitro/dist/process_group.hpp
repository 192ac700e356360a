#pragma once
// nitro::dist::ProcessGroup: processes that train together, on PyTorch's own distributed engine
// (c10d, in libtorch_cpu/libtorch_cuda): a Gloo group for CPU tensors, an NCCL group for CUDA
// tensors, met through a c10d store. No transport of Nitro's own.
//
//   // under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment):
//   nitro::dist::ProcessGroup world = nitro::dist::ProcessGroup::from_environment();
//   // or with a store of your own (every rank gives the same file):
//   auto world = nitro::dist::ProcessGroup::with_store(nitro::dist::file_store("/shared/run1.store", 2), rank, 2);
//   world.rank(), world.size(), world.barrier(), world.all_reduce_mean(loss)
//
// Without RANK and WORLD_SIZE, from_environment() makes a group of one process (an in-memory store,
// no network): the same program runs alone or under torchrun.
//
// The store: under torchrun the launcher serves a TCPStore at MASTER_ADDR:MASTER_PORT and says so with
// TORCHELASTIC_USE_AGENT_STORE=True: every rank, rank 0 included, connects to it as a client. Without
// that variable rank 0 serves the store. Either way it is wrapped in a PrefixStore ("nitro", and the
// restart count under torchrun), as torch.distributed does. Every wait on the store fails after the
// group's timeout.
//
// Gloo and its headers. c10d::ProcessGroupGloo is exported by libtorch_cpu, but its header includes five
// gloo headers the wheel does not ship. Nitro uses the gloo headers of Debian's libgloo-dev (a 2022
// snapshot; cmake/deps.sh fetches the package and unpacks its headers, nothing is installed or linked)
// for declarations only: ProcessGroupGloo holds gloo's types through shared_ptr/unique_ptr alone, so
// their layout never enters Nitro's code; Nitro never constructs ProcessGroupGloo::GlooStore (the one
// class deriving from a gloo type) nor calls ProcessGroupGloo::setTimeout (the one inline function
// calling into gloo). Every gloo object is made and used inside libtorch_cpu by its own, newer gloo.
// tests/dist checks the layouts Nitro does touch (ProcessGroupGloo and its Options: sizes and offsets
// equal to the library's) and exercises every call made here. With libgloo-dev's headers absent,
// NITRO_DIST_GLOO is 0 and only NCCL groups can be made. Copying gloo's headers into Nitro was not an
// option (third-party source), and hand-written look-alikes would have to be kept in step with gloo.
//
// Failures: a collective that fails (a rank died: its sockets close; a rank hangs: the timeout) throws
// nitro::Error naming this rank and the timeout, in every surviving rank, instead of hanging.
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>
#include <nitro/core/rank.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/flatten_dense_tensors.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/unflatten_dense_tensors.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

// Gloo: with libgloo-dev's headers on the include path (the nitro::dist CMake target puts them there).
#if !defined(NITRO_DIST_GLOO)
#if __has_include(<gloo/context.h>)
#define NITRO_DIST_GLOO 1
#else
#define NITRO_DIST_GLOO 0
#endif
#endif
#if NITRO_DIST_GLOO
#if !defined(USE_C10D_GLOO)
#define USE_C10D_GLOO 1  // the header's body is compiled only with it
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

// NCCL: a LibTorch built with CUDA, and nccl.h (the wheel's nvidia/nccl/include) on the include path.
#if !defined(NITRO_DIST_NCCL)
#if defined(NITRO_WITH_CUDA) && NITRO_WITH_CUDA && __has_include(<nccl.h>)
#define NITRO_DIST_NCCL 1
#else
#define NITRO_DIST_NCCL 0
#endif
#endif
#if NITRO_DIST_NCCL
#if !defined(USE_C10D_NCCL)
#define USE_C10D_NCCL 1
#endif
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>


// NITRO_COMPILED: dist/ and the image headers have their own library (core/config.hpp).
#if NITRO_COMPILED && !defined(NITRO_COMPILED_SOURCE)
extern "C" int nitro_compiled_dist_library_is_not_linked__link_nitro_compiled_dist() noexcept;
namespace nitro::detail {
[[gnu::used]] inline const int compiled_dist_library_linked =
    nitro_compiled_dist_library_is_not_linked__link_nitro_compiled_dist();
}  // namespace nitro::detail
#endif

namespace nitro::dist {

/// Where this process stands, as torchrun says it (or as given).
struct Environment {
  int rank = 0;                   ///< this process's rank, in [0, world_size)
  int world_size = 1;             ///< the number of processes
  int local_rank = 0;             ///< the rank among this machine's processes (the GPU it takes with NCCL)
  std::string master_addr;        ///< the store's host; empty for a group of one
  std::uint16_t master_port = 0;  ///< the store's port; 0 for a group of one
  /// torchrun serves the store (TORCHELASTIC_USE_AGENT_STORE=True): every rank is a client.
  bool agent_store = false;
  /// TORCHELASTIC_RESTART_COUNT: part of the store's prefix, so that a restarted job starts afresh.
  std::string restart_count = "0";
};

namespace detail {

NITRO_INLINE std::optional<std::string> env(const char* name);

NITRO_INLINE std::int64_t env_integer(const char* name, const std::string& value, std::int64_t low, std::int64_t high);

/// A c10d failure (DistBackendError, DistNetworkError, DistStoreError, a Gloo error) as a nitro::Error
/// that says which rank saw it and what to look at.
[[noreturn]] NITRO_INLINE void rethrow_collective(std::string_view what, int rank, int size, std::chrono::milliseconds timeout);

/// Groups of several processes made so far by this process (their store keys' prefix).
inline std::atomic<int> groups_made{0};

}  // namespace detail

/// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE and
/// TORCHELASTIC_RESTART_COUNT, checked: WORLD_SIZE without RANK (or the reverse), RANK >= WORLD_SIZE, or
/// a group of several without MASTER_ADDR/MASTER_PORT is a nitro::Error. Neither RANK nor WORLD_SIZE:
/// a group of one.
[[nodiscard]] NITRO_INLINE Environment environment();

/// A store in a file every rank can reach (a shared or local file system); `world_size` ranks use it.
/// One object per file (and world size) while that file lives: every call gives the same one, and the
/// file is removed when the last rank's process ends normally. (c10d's FileStore removes its file when
/// every rank has destroyed one of its objects, and checks that apart from removing it: a group made
/// again on a new FileStore object, as one rank did it while another was still destroying the last
/// group's, lost its keys to that removal and never met. Give groups that share a file the store this
/// function returns, not a FileStore of your own per group.) A file removed or replaced since (a new
/// run on the same path) gets a new object; the old one is kept, never destroyed, since its
/// destructor would count itself out of the new file.
[[nodiscard]] NITRO_INLINE c10::intrusive_ptr<c10d::Store> file_store(const std::string& path, int world_size);

/// A TCP store at host:port: rank 0 serves it when `server` (the other ranks connect); torchrun's agent
/// store is served by the launcher (server = false everywhere). As Python's TCPStore, every rank
/// registers with the store when it connects and the server waits until all `world_size` have (so
/// ranks started by hand, by SLURM or by a Kubernetes job, meet as under torchrun). Unreachable, or not
/// every rank there, within `timeout`: nitro::Error.
[[nodiscard]] NITRO_INLINE c10::intrusive_ptr<c10d::Store> tcp_store(const std::string& host, std::uint16_t port, int world_size,
                                                               bool server, std::chrono::milliseconds timeout);

/// A group of processes; copies share it. The group is shut down when the last copy goes. Every rank
/// makes its groups in the same order (the n-th group of each rank meets under the store's keys
/// "nitro/<n>/"), and the first group made is the one whose rank the writers see (core/rank.hpp).
/// from_environment() twice while the first group lives would serve torchrun-less rank 0's TCPStore
/// twice on one port: make the world group once and copy it. Tested: one group per store at a time (a
/// test of a second group beside a live one hung once and is out until that is understood).
class ProcessGroup {
 public:
  /// How the group waits, and which backends it makes.
  struct Options {
    /// How long a collective or the store may wait for the other ranks before failing.
    std::chrono::milliseconds timeout = std::chrono::minutes(10);
    /// Gloo's worker threads (c10d's default is 2).
    int gloo_threads = 2;
    /// The address Gloo binds: empty for the default (GLOO_SOCKET_IFNAME's interface if set, else the
    /// loopback address when MASTER_ADDR is local, else the host name's address).
    std::string gloo_hostname;
    /// Also make an NCCL group for CUDA tensors (needs NITRO_DIST_NCCL and a GPU per local rank; the
    /// CUDA device becomes cuda:N, N the local rank).
    bool nccl = false;
  };

  /// The group torchrun's environment describes (see environment()).
  [[nodiscard]] static ProcessGroup from_environment() { return from_environment(Options{}); }
  /// As above, with options. Throws nitro::Error for a bad environment (see environment()), options out
  /// of range (timeout <= 0, gloo_threads not in [1, 256], nccl in a build without NCCL), or when the
  /// ranks do not meet within the timeout.
  [[nodiscard]] NITRO_INLINE static ProcessGroup from_environment(const Options& options);

  /// A group met through `store` (file_store, tcp_store, or any c10d::Store): this process is `rank` of `size`.
  [[nodiscard]] NITRO_INLINE static ProcessGroup with_store(c10::intrusive_ptr<c10d::Store> store, int rank, int size);
  /// As above, with options; `local_rank` < 0 means `rank` (one machine). Throws nitro::Error for a null
  /// store, size < 1, rank outside [0, size), options out of range, or when the ranks do not meet within
  /// the timeout.
  [[nodiscard]] NITRO_INLINE static ProcessGroup with_store(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                               const Options& options, int local_rank = -1);

  /// This process's rank in the group, in [0, size()).
  [[nodiscard]] int rank() const noexcept { return s_->rank; }
  /// The number of processes in the group.
  [[nodiscard]] int size() const noexcept { return s_->size; }
  /// The rank among this machine's processes (the CUDA device with NCCL).
  [[nodiscard]] int local_rank() const noexcept { return s_->local_rank; }
  /// Whether this is rank 0.
  [[nodiscard]] bool is_main() const noexcept { return s_->rank == 0; }
  /// How long a collective or the store waits before failing (Options::timeout).
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return s_->options.timeout; }
  /// c10d's group (for c10d's own functions: Reducer, broadcast_coalesced, ...).
  [[nodiscard]] const c10::intrusive_ptr<c10d::ProcessGroup>& group() const noexcept { return s_->group; }
  /// The store the ranks met through (prefixed with "nitro/<n>/" for this group).
  [[nodiscard]] const c10::intrusive_ptr<c10d::Store>& store() const noexcept { return s_->store; }
  /// Whether collectives on tensors of this device type have a backend here (Gloo: CPU; NCCL: CUDA).
  [[nodiscard]] NITRO_INLINE bool serves(c10::DeviceType type) const noexcept;

  /// Waits until every rank has called barrier().
  NITRO_INLINE void barrier() const;

  /// The mean of `value` over the ranks (a new tensor on value's device; value is unchanged).
  [[nodiscard]] NITRO_INLINE at::Tensor all_reduce_mean(const at::Tensor& value) const;
  /// The mean of a number over the ranks.
  [[nodiscard]] NITRO_INLINE double all_reduce_mean(double value) const;

  /// Averages the tensors in place over the ranks: flattened into one tensor per dtype, one
  /// all-reduce each (what a gradient all-reduce after backward does). Returns the collectives made.
  NITRO_INLINE int average(const std::vector<at::Tensor>& tensors, std::string_view what = "average") const;

  /// Sums the tensors in place over the ranks (one collective).
  NITRO_INLINE void all_reduce_sum(std::vector<at::Tensor>& tensors, std::string_view what = "all_reduce") const;

  /// Rank `root`'s tensors, in place, on every rank (one collective per tensor, each waited for).
  NITRO_INLINE void broadcast(std::vector<at::Tensor>& tensors, int root = 0, std::string_view what = "broadcast") const;

  /// A vote among the ranks (core/rank.hpp's Agreement) on this group: a one-element all-reduce
  /// begun without waiting, on the CPU through Gloo; on a group with NCCL only, on the GPU, read one
  /// vote late (end() returns the vote begun before the last) so that reading it never waits for the GPU.
  [[nodiscard]] NITRO_INLINE std::unique_ptr<Agreement> make_agreement() const;

  /// Shuts the backends down now (later collectives fail); the last copy's destruction does it too.
  void shutdown() const { s_->shutdown(); }

 private:
  struct Shared {
    c10::intrusive_ptr<c10d::Store> store;
    c10::intrusive_ptr<c10d::ProcessGroup> group;
    int rank = 0, size = 1, local_rank = 0;
    Options options;
    bool gloo = false, nccl = false, down = false;
    NITRO_INLINE void shutdown() noexcept;
    bool owner = false;  // set the process-wide rank (core/rank.hpp)
    NITRO_INLINE ~Shared();
  };

  NITRO_INLINE static void validate(const Options& o);

  NITRO_INLINE static bool is_loopback(const std::string& host);

  NITRO_INLINE ProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size, int local_rank, const Options& options);
  NITRO_INLINE explicit ProcessGroup(std::shared_ptr<Shared> shared) noexcept;

  std::shared_ptr<Shared> s_;
};

namespace detail {

/// ProcessGroup::make_agreement's vote: a one-element int32 all-reduce (sum) of the ranks' flags.
class GroupAgreement final : public Agreement {
 public:
  NITRO_INLINE explicit GroupAgreement(ProcessGroup group);
  GroupAgreement(const GroupAgreement&) = delete;
  GroupAgreement& operator=(const GroupAgreement&) = delete;
  NITRO_INLINE ~GroupAgreement() override;

  NITRO_INLINE void begin(bool flag) override;

  NITRO_INLINE bool end() override;

  [[nodiscard]] bool pending() const noexcept override { return pending_; }

 private:
  struct Slot {
    at::Tensor flag, host;
#if NITRO_DIST_NCCL
    at::cuda::CUDAEvent done;
#endif
    bool used = false;
  };
  ProcessGroup group_;
  bool on_gpu_ = false;
  bool pending_ = false;
  std::size_t next_ = 0;
  Slot slots_[2];
  std::vector<at::Tensor> tensors_;
  c10::intrusive_ptr<c10d::Work> work_;
};

}  // namespace detail


}  // namespace nitro::dist

#if !NITRO_COMPILED
#include <nitro/dist/process_group-inl.hpp>
#endif
