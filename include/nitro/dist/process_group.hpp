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

namespace nitro::dist {

/// Where this process stands, as torchrun says it (or as given).
struct Environment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;  // empty for a group of one
  std::uint16_t master_port = 0;
  /// torchrun serves the store (TORCHELASTIC_USE_AGENT_STORE=True): every rank is a client.
  bool agent_store = false;
  /// TORCHELASTIC_RESTART_COUNT: part of the store's prefix, so that a restarted job starts afresh.
  std::string restart_count = "0";
};

namespace detail {

inline std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

inline std::int64_t env_integer(const char* name, const std::string& value, std::int64_t low, std::int64_t high) {
  std::size_t used = 0;
  long long parsed = 0;
  try {
    parsed = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  NITRO_CHECK(used == value.size() && !value.empty(), "nitro::dist: ", name, "=\"", value,
              "\" is not an integer; torchrun sets it, or set it yourself");
  NITRO_CHECK(parsed >= low && parsed <= high, "nitro::dist: ", name, "=", parsed, " is outside [", low, ", ", high, "]");
  return parsed;
}

/// A c10d failure (DistBackendError, DistNetworkError, DistStoreError, a Gloo error) as a nitro::Error
/// that says which rank saw it and what to look at.
[[noreturn]] inline void rethrow_collective(std::string_view what, int rank, int size, std::chrono::milliseconds timeout) {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    ::nitro::detail::fail("nitro::dist: ", what, " failed on rank ", rank, " of ", size,
                          ": another rank died, stopped calling collectives, or did not answer within the timeout (",
                          timeout.count(), " ms); see that rank's error. c10d said: ", e.what());
  }
}

/// Groups of several processes made so far by this process (their store keys' prefix).
inline std::atomic<int> groups_made{0};

}  // namespace detail

/// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE and
/// TORCHELASTIC_RESTART_COUNT, checked: WORLD_SIZE without RANK (or the reverse), RANK >= WORLD_SIZE, or
/// a group of several without MASTER_ADDR/MASTER_PORT is a nitro::Error. Neither RANK nor WORLD_SIZE:
/// a group of one.
[[nodiscard]] inline Environment environment() {
  Environment e;
  const auto rank = detail::env("RANK"), world = detail::env("WORLD_SIZE");
  NITRO_CHECK(rank.has_value() == world.has_value(), "nitro::dist: ", world ? "WORLD_SIZE is set but RANK is not"
              : "RANK is set but WORLD_SIZE is not", "; launch with torchrun, which sets both, or set both (or neither, "
              "for one process)");
  if (!world) return e;
  e.world_size = static_cast<int>(detail::env_integer("WORLD_SIZE", *world, 1, 1 << 20));
  e.rank = static_cast<int>(detail::env_integer("RANK", *rank, 0, 1 << 20));
  NITRO_CHECK(e.rank < e.world_size, "nitro::dist: RANK=", e.rank, " but WORLD_SIZE=", e.world_size,
              "; a rank is in [0, WORLD_SIZE)");
  e.local_rank = e.rank;
  if (const auto local = detail::env("LOCAL_RANK")) e.local_rank = static_cast<int>(detail::env_integer("LOCAL_RANK", *local, 0, 1 << 20));
  if (e.world_size > 1) {
    const auto addr = detail::env("MASTER_ADDR"), port = detail::env("MASTER_PORT");
    NITRO_CHECK(addr.has_value() && !addr->empty() && port.has_value(), "nitro::dist: WORLD_SIZE=", e.world_size,
                " but ", addr ? "MASTER_PORT" : "MASTER_ADDR", " is not set; torchrun sets it (the host and port of "
                "rank 0's store), or set MASTER_ADDR and MASTER_PORT yourself");
    e.master_addr = *addr;
    e.master_port = static_cast<std::uint16_t>(detail::env_integer("MASTER_PORT", *port, 1, 65535));
  }
  e.agent_store = detail::env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  if (const auto restarts = detail::env("TORCHELASTIC_RESTART_COUNT")) e.restart_count = *restarts;
  return e;
}

/// A store in a file every rank can reach (a shared or local file system); `world_size` ranks use it.
/// One object per file (and world size) while that file lives: every call gives the same one, and the
/// file is removed when the last rank's process ends normally. (c10d's FileStore removes its file when
/// every rank has destroyed one of its objects, and checks that apart from removing it: a group made
/// again on a new FileStore object, as one rank did it while another was still destroying the last
/// group's, lost its keys to that removal and never met. Give groups that share a file the store this
/// function returns, not a FileStore of your own per group.) A file removed or replaced since (a new
/// run on the same path) gets a new object; the old one is kept, never destroyed, since its
/// destructor would count itself out of the new file.
[[nodiscard]] inline c10::intrusive_ptr<c10d::Store> file_store(const std::string& path, int world_size) {
  NITRO_CHECK(!path.empty(), "nitro::dist::file_store: the path is empty; give a file every rank can reach");
  NITRO_CHECK(world_size >= 1, "nitro::dist::file_store: world_size must be >= 1, got ", world_size);
  struct Entry {
    c10::intrusive_ptr<c10d::Store> store;
    ::dev_t device = 0;
    ::ino_t inode = 0;
  };
  static std::mutex mutex;
  static std::map<std::pair<std::string, int>, Entry> stores;
  std::lock_guard lock(mutex);
  Entry& e = stores[{path, world_size}];
  struct ::stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (e.store && exists && st.st_dev == e.device && st.st_ino == e.inode) return e.store;
  if (e.store) (void)e.store.release();  // the file it counted itself in is gone: never destroyed
  e.store = c10::make_intrusive<c10d::FileStore>(path, world_size);  // creates the file
  if (::stat(path.c_str(), &st) == 0) {
    e.device = st.st_dev;
    e.inode = st.st_ino;
  }
  return e.store;
}

/// A TCP store at host:port: rank 0 serves it when `server` (the other ranks connect); torchrun's agent
/// store is served by the launcher (server = false everywhere). As Python's TCPStore, every rank
/// registers with the store when it connects and the server waits until all `world_size` have (so
/// ranks started by hand, by SLURM or by a Kubernetes job, meet as under torchrun). Unreachable, or not
/// every rank there, within `timeout`: nitro::Error.
[[nodiscard]] inline c10::intrusive_ptr<c10d::Store> tcp_store(const std::string& host, std::uint16_t port, int world_size,
                                                               bool server, std::chrono::milliseconds timeout) {
  NITRO_CHECK(world_size >= 1, "nitro::dist::tcp_store: world_size must be >= 1, got ", world_size);
  c10d::TCPStoreOptions o;
  o.port = port;
  o.isServer = server;
  o.numWorkers = static_cast<std::size_t>(world_size);
  // Every rank, not only the server: a client that does not register leaves the server waiting for
  // it until the timeout ("1/2 clients joined").
  o.waitWorkers = true;
  o.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, o);
  } catch (const std::exception& e) {
    ::nitro::detail::fail("nitro::dist: the store at ", host, ":", port,
                          server ? " could not be served, or not all " : " could not be reached, or not all ", world_size,
                          " ranks joined it, within ", timeout.count(), " ms (", e.what(), "); check MASTER_ADDR and "
                          "MASTER_PORT, that every rank started with the same WORLD_SIZE, that rank 0 started, and that "
                          "the port is free on rank 0's host");
  }
}

/// A group of processes; copies share it. The group is shut down when the last copy goes. Every rank
/// makes its groups in the same order (the n-th group of each rank meets under the store's keys
/// "nitro/<n>/"), and the first group made is the one whose rank the writers see (core/rank.hpp).
/// from_environment() twice while the first group lives would serve torchrun-less rank 0's TCPStore
/// twice on one port: make the world group once and copy it. Tested: one group per store at a time (a
/// test of a second group beside a live one hung once and is out until that is understood).
class ProcessGroup {
 public:
  struct Options {
    /// How long a collective or the store may wait for the other ranks before failing.
    std::chrono::milliseconds timeout = std::chrono::minutes(10);
    /// Gloo's worker threads (c10d's default is 2).
    int gloo_threads = 2;
    /// The address Gloo binds: empty for the default (GLOO_SOCKET_IFNAME's interface if set, else the
    /// loopback address when MASTER_ADDR is local, else the host name's address).
    std::string gloo_hostname;
    /// Also make an NCCL group for CUDA tensors (needs NITRO_DIST_NCCL and a GPU per local rank; the
    /// CUDA device becomes cuda:<local_rank>).
    bool nccl = false;
  };

  /// The group torchrun's environment describes (see environment()).
  [[nodiscard]] static ProcessGroup from_environment() { return from_environment(Options{}); }
  [[nodiscard]] static ProcessGroup from_environment(const Options& options) {
    validate(options);
    const Environment e = environment();
    c10::intrusive_ptr<c10d::Store> store;
    if (e.world_size == 1) {
      store = c10::make_intrusive<c10d::HashStore>();
    } else {
      store = tcp_store(e.master_addr, e.master_port, e.world_size, !e.agent_store && e.rank == 0, options.timeout);
      if (e.agent_store) store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + e.restart_count, store);
    }
    Options o = options;
    if (o.gloo_hostname.empty() && is_loopback(e.master_addr)) o.gloo_hostname = "127.0.0.1";
    return ProcessGroup(std::move(store), e.rank, e.world_size, e.local_rank, o);
  }

  /// A group met through `store` (file_store, tcp_store, or any c10d::Store): this process is `rank` of `size`.
  [[nodiscard]] static ProcessGroup with_store(c10::intrusive_ptr<c10d::Store> store, int rank, int size) {
    return with_store(std::move(store), rank, size, Options{});
  }
  [[nodiscard]] static ProcessGroup with_store(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                               const Options& options, int local_rank = -1) {
    validate(options);
    NITRO_CHECK(store, "nitro::dist::ProcessGroup::with_store: the store is null");
    NITRO_CHECK(size >= 1, "nitro::dist::ProcessGroup: size must be >= 1, got ", size);
    NITRO_CHECK(rank >= 0 && rank < size, "nitro::dist::ProcessGroup: rank ", rank, " is outside [0, ", size, ")");
    return ProcessGroup(std::move(store), rank, size, local_rank < 0 ? rank : local_rank, options);
  }

  [[nodiscard]] int rank() const noexcept { return s_->rank; }
  [[nodiscard]] int size() const noexcept { return s_->size; }
  [[nodiscard]] int local_rank() const noexcept { return s_->local_rank; }
  [[nodiscard]] bool is_main() const noexcept { return s_->rank == 0; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return s_->options.timeout; }
  /// c10d's group (for c10d's own functions: Reducer, broadcast_coalesced, ...).
  [[nodiscard]] const c10::intrusive_ptr<c10d::ProcessGroup>& group() const noexcept { return s_->group; }
  [[nodiscard]] const c10::intrusive_ptr<c10d::Store>& store() const noexcept { return s_->store; }
  /// Whether collectives on tensors of this device type have a backend here (Gloo: CPU; NCCL: CUDA).
  [[nodiscard]] bool serves(c10::DeviceType type) const noexcept {
    return type == c10::kCPU ? s_->gloo : type == c10::kCUDA ? s_->nccl : false;
  }

  /// Waits until every rank has called barrier().
  void barrier() const {
    try {
      c10d::BarrierOptions o;
      o.timeout = s_->options.timeout;
      s_->group->barrier(o)->wait(s_->options.timeout);
    } catch (...) {
      detail::rethrow_collective("barrier", s_->rank, s_->size, s_->options.timeout);
    }
  }

  /// The mean of `value` over the ranks (a new tensor on value's device; value is unchanged).
  [[nodiscard]] at::Tensor all_reduce_mean(const at::Tensor& value) const {
    NITRO_CHECK(value.defined(), "nitro::dist::all_reduce_mean: the tensor is undefined");
    NITRO_CHECK(serves(value.device().type()), "nitro::dist::all_reduce_mean: no backend here for ",
                value.device(), " tensors (Gloo serves CPU tensors, NCCL CUDA tensors: Options::nccl)");
    NITRO_CHECK(at::isFloatingType(value.scalar_type()), "nitro::dist::all_reduce_mean: the tensor is ",
                value.scalar_type(), "; a mean needs a floating-point tensor (convert it first)");
    std::vector<at::Tensor> tensors{value.clone()};
    all_reduce_sum(tensors, "all_reduce_mean");
    return tensors[0].div_(static_cast<double>(s_->size));
  }
  /// The mean of a number over the ranks.
  [[nodiscard]] double all_reduce_mean(double value) const {
    return all_reduce_mean(at::scalar_tensor(value, at::TensorOptions().dtype(at::kDouble))).template item<double>();
  }

  /// Averages the tensors in place over the ranks: flattened into one tensor per dtype, one
  /// all-reduce each (what a gradient all-reduce after backward does). Returns the collectives made.
  int average(const std::vector<at::Tensor>& tensors, std::string_view what = "average") const {
    std::map<c10::ScalarType, std::vector<at::Tensor>> by_dtype;
    for (const auto& t : tensors) {
      NITRO_CHECK(t.defined() && at::isFloatingType(t.scalar_type()), "nitro::dist::ProcessGroup::average: every tensor "
                  "must be defined and floating-point");
      by_dtype[t.scalar_type()].push_back(t);
    }
    for (auto& [dtype, group] : by_dtype) {
      std::vector<at::Tensor> flat{at::flatten_dense_tensors(group)};
      all_reduce_sum(flat, what);
      flat[0].div_(static_cast<double>(s_->size));
      const auto parts = at::unflatten_dense_tensors(flat[0], group);
      for (std::size_t i = 0; i < group.size(); ++i) group[i].copy_(parts[i]);
    }
    return static_cast<int>(by_dtype.size());
  }

  /// Sums the tensors in place over the ranks (one collective).
  void all_reduce_sum(std::vector<at::Tensor>& tensors, std::string_view what = "all_reduce") const {
    try {
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp::SUM;
      o.timeout = s_->options.timeout;
      s_->group->allreduce(tensors, o)->wait(s_->options.timeout);
    } catch (...) {
      detail::rethrow_collective(what, s_->rank, s_->size, s_->options.timeout);
    }
  }

  /// Rank `root`'s tensors, in place, on every rank (one collective per tensor, each waited for).
  void broadcast(std::vector<at::Tensor>& tensors, int root = 0, std::string_view what = "broadcast") const {
    NITRO_CHECK(root >= 0 && root < s_->size, "nitro::dist::ProcessGroup::broadcast: root ", root, " is outside [0, ",
                s_->size, ")");
    try {
      for (auto& t : tensors) {
        c10d::BroadcastOptions o;
        o.rootRank = root;
        o.timeout = s_->options.timeout;
        std::vector<at::Tensor> one{t};
        s_->group->broadcast(one, o)->wait(s_->options.timeout);
      }
    } catch (...) {
      detail::rethrow_collective(what, s_->rank, s_->size, s_->options.timeout);
    }
  }

  /// A vote among the ranks (core/rank.hpp's Agreement) on this group: a one-element all-reduce
  /// begun without waiting, on the CPU through Gloo; on a group with NCCL only, on the GPU, read one
  /// vote late (end() returns the vote begun before the last) so that reading it never waits for the GPU.
  [[nodiscard]] std::unique_ptr<Agreement> make_agreement() const;

  /// Shuts the backends down now (later collectives fail); the last copy's destruction does it too.
  void shutdown() const { s_->shutdown(); }

 private:
  struct Shared {
    c10::intrusive_ptr<c10d::Store> store;
    c10::intrusive_ptr<c10d::ProcessGroup> group;
    int rank = 0, size = 1, local_rank = 0;
    Options options;
    bool gloo = false, nccl = false, down = false;
    void shutdown() noexcept {
      if (down) return;
      down = true;
      try {
        if (group) group->shutdown();
      } catch (...) {  // a backend whose peers are gone may complain; nothing is left to do
      }
    }
    bool owner = false;  // set the process-wide rank (core/rank.hpp)
    ~Shared() {
      shutdown();
      if (owner) {
        ::nitro::detail::set_agreement_factory(nullptr);
        ::nitro::detail::process_rank.store(0, std::memory_order_relaxed);
        ::nitro::detail::process_count.store(1, std::memory_order_relaxed);
        ::nitro::detail::process_groups_owner.store(0);
      }
    }
  };

  static void validate(const Options& o) {
    NITRO_CHECK(o.timeout.count() > 0, "nitro::dist::ProcessGroup: timeout must be > 0 ms, got ", o.timeout.count());
    NITRO_CHECK(o.gloo_threads >= 1 && o.gloo_threads <= 256, "nitro::dist::ProcessGroup: gloo_threads must be in "
                "[1, 256], got ", o.gloo_threads);
#if !NITRO_DIST_NCCL
    NITRO_CHECK(!o.nccl, "nitro::dist::ProcessGroup: Options::nccl needs NCCL, which this build lacks (a LibTorch with "
                "CUDA, nccl.h on the include path: link nitro::dist)");
#endif
  }

  static bool is_loopback(const std::string& host) {
    return host.empty() || host == "localhost" || host == "127.0.0.1" || host == "::1" || host.starts_with("127.");
  }

  ProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size, int local_rank, const Options& options)
      : s_(std::make_shared<Shared>()) {
    // Every wait on the store (a key another rank sets) fails after the group's timeout, whatever
    // store it is (a FileStore keeps c10d's 5 minutes otherwise).
    store->setTimeout(options.timeout);
    // The n-th group of several processes this process makes: its keys apart from those of earlier
    // groups on the same store (a group made again, a second group), as every rank makes its groups
    // in the same order (as torch.distributed's new_group asks).
    const int n = size > 1 ? detail::groups_made.fetch_add(1) : 0;
    s_->store = c10::make_intrusive<c10d::PrefixStore>("nitro/" + std::to_string(n), std::move(store));
    s_->store->setTimeout(options.timeout);
    s_->rank = rank;
    s_->size = size;
    s_->local_rank = local_rank;
    s_->options = options;
    try {
      s_->group = c10::make_intrusive<c10d::ProcessGroup>(s_->store, rank, size);
#if NITRO_DIST_GLOO
      auto o = c10d::ProcessGroupGloo::Options::create(options.timeout);
      const auto interface = detail::env("GLOO_SOCKET_IFNAME");
      if (!options.gloo_hostname.empty()) {
        o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.gloo_hostname));
      } else if (interface && !interface->empty()) {
        o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(*interface));
      } else {
        o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      o->threads = options.gloo_threads;
      auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", s_->store),
                                                              rank, size, o);
      s_->group->setBackend(c10::kCPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
      s_->group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
      s_->gloo = true;
#endif
#if NITRO_DIST_NCCL
      if (options.nccl) {
        c10::cuda::set_device(static_cast<c10::DeviceIndex>(local_rank));
        auto o = c10d::ProcessGroupNCCL::Options::create();
        o->timeout = options.timeout;
        auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl", s_->store),
                                                                rank, size, o);
        s_->group->setBackend(c10::kCUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
        if (!s_->gloo) s_->group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
        s_->nccl = true;
      }
#endif
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      ::nitro::detail::fail("nitro::dist::ProcessGroup: rank ", rank, " of ", size, " could not join the group within ",
                            options.timeout.count(), " ms: ", e.what(), "; check that every rank started with the same "
                            "world size and store");
    }
    NITRO_CHECK(s_->gloo || s_->nccl, "nitro::dist::ProcessGroup: no backend: this build has no Gloo (libgloo-dev's "
                "headers were not found: link nitro::dist, which cmake/deps.sh sets up) and Options::nccl is off");
    // The first group of the process (the world) decides its rank for the writers; a group made
    // while it lives (a sub-group, a group of one) does not.
    int none = 0;
    if (::nitro::detail::process_groups_owner.compare_exchange_strong(none, 1)) {
      s_->owner = true;
      ::nitro::detail::process_rank.store(rank, std::memory_order_relaxed);
      ::nitro::detail::process_count.store(size, std::memory_order_relaxed);
      // The run's votes (snapshot::Policy's stop) go over this group while it lives.
      ::nitro::detail::set_agreement_factory([weak = std::weak_ptr<Shared>(s_)]() -> std::unique_ptr<Agreement> {
        auto shared = weak.lock();
        return shared ? ProcessGroup(std::move(shared)).make_agreement() : nullptr;
      });
    }
  }
  explicit ProcessGroup(std::shared_ptr<Shared> shared) noexcept : s_(std::move(shared)) {}

  std::shared_ptr<Shared> s_;
};

namespace detail {

/// ProcessGroup::make_agreement's vote: a one-element int32 all-reduce (sum) of the ranks' flags.
class GroupAgreement final : public Agreement {
 public:
  explicit GroupAgreement(ProcessGroup group) : group_(std::move(group)) {
    on_gpu_ = !group_.serves(c10::kCPU);
#if NITRO_DIST_NCCL
    if (on_gpu_) {
      // The group's GPU (cuda:<local rank>, as the NCCL group was made), whatever thread votes.
      const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(group_.local_rank()));
      for (auto& slot : slots_) {
        slot.flag = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device));
        slot.host = at::zeros({1}, at::TensorOptions().dtype(at::kInt).pinned_memory(true));
      }
    }
#endif
    if (!on_gpu_) slots_[0].flag = at::zeros({1}, at::TensorOptions().dtype(at::kInt));
  }
  GroupAgreement(const GroupAgreement&) = delete;
  GroupAgreement& operator=(const GroupAgreement&) = delete;
  ~GroupAgreement() override {
    try {
      if (work_) work_->wait(group_.timeout());
    } catch (...) {  // a rank is gone: nothing to wait for
    }
  }

  void begin(bool flag) override {
    if (pending_) (void)end();
    Slot& slot = slots_[next_];
    try {
      if (!on_gpu_) {
        *slot.flag.data_ptr<std::int32_t>() = flag ? 1 : 0;
      } else {
#if NITRO_DIST_NCCL
        const c10::cuda::CUDAGuard on(slot.flag.device());
#endif
        slot.flag.fill_(flag ? 1 : 0);  // on the flag's device's current stream, no host buffer to race with
      }
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp::SUM;
      o.timeout = group_.timeout();
      tensors_.assign(1, slot.flag);
      work_ = group_.group()->allreduce(tensors_, o);
#if NITRO_DIST_NCCL
      if (on_gpu_) {
        const c10::cuda::CUDAGuard on(slot.flag.device());
        work_->wait();  // the flag's stream waits for NCCL's; the host does not (no timeout given)
        slot.host.copy_(slot.flag, /*non_blocking=*/true);
        slot.done.record(c10::cuda::getCurrentCUDAStream(slot.flag.device().index()));
        slot.used = true;
        work_.reset();
      }
#endif
    } catch (...) {
      work_.reset();
      rethrow_collective("the ranks' vote", group_.rank(), group_.size(), group_.timeout());
    }
    pending_ = true;
  }

  bool end() override {
    NITRO_CHECK(pending_, "nitro::Agreement::end: no vote was begun; call begin(flag) first");
    pending_ = false;
    if (!on_gpu_) {
      try {
        work_->wait(group_.timeout());
      } catch (...) {
        work_.reset();
        rethrow_collective("the ranks' vote", group_.rank(), group_.size(), group_.timeout());
      }
      work_.reset();
      return *slots_[0].flag.data_ptr<std::int32_t>() > 0;
    }
#if NITRO_DIST_NCCL
    // The vote begun before the last: its copy to the host finished long ago.
    const std::size_t previous = 1 - next_;
    next_ = previous;
    Slot& slot = slots_[previous];
    if (!slot.used) return false;
    slot.done.synchronize();
    return *slot.host.data_ptr<std::int32_t>() > 0;
#else
    return false;
#endif
  }

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

inline std::unique_ptr<Agreement> ProcessGroup::make_agreement() const {
  return std::make_unique<detail::GroupAgreement>(*this);
}

}  // namespace nitro::dist
