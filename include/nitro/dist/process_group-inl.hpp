#pragma once
// The definitions of nitro/dist/process_group.hpp's non-template functions: included by process_group.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/dist/process_group.hpp>

namespace nitro::dist::detail {

NITRO_INLINE std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

NITRO_INLINE std::int64_t env_integer(const char* name, const std::string& value, std::int64_t low, std::int64_t high) {
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

NITRO_INLINE void rethrow_collective(std::string_view what, int rank, int size, std::chrono::milliseconds timeout) {
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

}  // namespace nitro::dist::detail

namespace nitro::dist {

NITRO_INLINE Environment environment() {
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

NITRO_INLINE c10::intrusive_ptr<c10d::Store> file_store(const std::string& path, int world_size) {
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

NITRO_INLINE c10::intrusive_ptr<c10d::Store> tcp_store(const std::string& host, std::uint16_t port, int world_size, bool server, std::chrono::milliseconds timeout) {
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

NITRO_INLINE ProcessGroup ProcessGroup::from_environment(const Options& options) {
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

NITRO_INLINE ProcessGroup ProcessGroup::with_store(c10::intrusive_ptr<c10d::Store> store, int rank, int size) {
  return with_store(std::move(store), rank, size, Options{});
}

NITRO_INLINE ProcessGroup ProcessGroup::with_store(c10::intrusive_ptr<c10d::Store> store, int rank, int size, const Options& options, int local_rank) {
  validate(options);
  NITRO_CHECK(store, "nitro::dist::ProcessGroup::with_store: the store is null");
  NITRO_CHECK(size >= 1, "nitro::dist::ProcessGroup: size must be >= 1, got ", size);
  NITRO_CHECK(rank >= 0 && rank < size, "nitro::dist::ProcessGroup: rank ", rank, " is outside [0, ", size, ")");
  return ProcessGroup(std::move(store), rank, size, local_rank < 0 ? rank : local_rank, options);
}

NITRO_INLINE bool ProcessGroup::serves(c10::DeviceType type) const noexcept {
  return type == c10::kCPU ? s_->gloo : type == c10::kCUDA ? s_->nccl : false;
}

NITRO_INLINE void ProcessGroup::barrier() const {
  try {
    c10d::BarrierOptions o;
    o.timeout = s_->options.timeout;
    s_->group->barrier(o)->wait(s_->options.timeout);
  } catch (...) {
    detail::rethrow_collective("barrier", s_->rank, s_->size, s_->options.timeout);
  }
}

NITRO_INLINE at::Tensor ProcessGroup::all_reduce_mean(const at::Tensor& value) const {
  NITRO_CHECK(value.defined(), "nitro::dist::all_reduce_mean: the tensor is undefined");
  NITRO_CHECK(serves(value.device().type()), "nitro::dist::all_reduce_mean: no backend here for ",
              value.device(), " tensors (Gloo serves CPU tensors, NCCL CUDA tensors: Options::nccl)");
  NITRO_CHECK(at::isFloatingType(value.scalar_type()), "nitro::dist::all_reduce_mean: the tensor is ",
              value.scalar_type(), "; a mean needs a floating-point tensor (convert it first)");
  std::vector<at::Tensor> tensors{value.clone()};
  all_reduce_sum(tensors, "all_reduce_mean");
  return tensors[0].div_(static_cast<double>(s_->size));
}

NITRO_INLINE double ProcessGroup::all_reduce_mean(double value) const {
  return all_reduce_mean(at::scalar_tensor(value, at::TensorOptions().dtype(at::kDouble))).template item<double>();
}

NITRO_INLINE int ProcessGroup::average(const std::vector<at::Tensor>& tensors, std::string_view what) const {
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

NITRO_INLINE void ProcessGroup::all_reduce_sum(std::vector<at::Tensor>& tensors, std::string_view what) const {
  try {
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = s_->options.timeout;
    s_->group->allreduce(tensors, o)->wait(s_->options.timeout);
  } catch (...) {
    detail::rethrow_collective(what, s_->rank, s_->size, s_->options.timeout);
  }
}

NITRO_INLINE void ProcessGroup::broadcast(std::vector<at::Tensor>& tensors, int root, std::string_view what) const {
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

NITRO_INLINE void ProcessGroup::Shared::shutdown() noexcept {
  if (down) return;
  down = true;
  try {
    if (group) group->shutdown();
  } catch (...) {  // a backend whose peers are gone may complain; nothing is left to do
  }
}

NITRO_INLINE ProcessGroup::Shared::~Shared() {
  shutdown();
  if (owner) {
    ::nitro::detail::set_agreement_factory(nullptr);
    ::nitro::detail::process_rank.store(0, std::memory_order_relaxed);
    ::nitro::detail::process_count.store(1, std::memory_order_relaxed);
    ::nitro::detail::process_groups_owner.store(0);
  }
}

NITRO_INLINE void ProcessGroup::validate(const Options& o) {
  NITRO_CHECK(o.timeout.count() > 0, "nitro::dist::ProcessGroup: timeout must be > 0 ms, got ", o.timeout.count());
  NITRO_CHECK(o.gloo_threads >= 1 && o.gloo_threads <= 256, "nitro::dist::ProcessGroup: gloo_threads must be in "
              "[1, 256], got ", o.gloo_threads);
#if !NITRO_DIST_NCCL
  NITRO_CHECK(!o.nccl, "nitro::dist::ProcessGroup: Options::nccl needs NCCL, which this build lacks (a LibTorch with "
              "CUDA, nccl.h on the include path: link nitro::dist)");
#endif
}

NITRO_INLINE bool ProcessGroup::is_loopback(const std::string& host) {
  return host.empty() || host == "localhost" || host == "127.0.0.1" || host == "::1" || host.starts_with("127.");
}

NITRO_INLINE ProcessGroup::ProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size, int local_rank, const Options& options) : s_(std::make_shared<Shared>()) {
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

NITRO_INLINE ProcessGroup::ProcessGroup(std::shared_ptr<Shared> shared) noexcept : s_(std::move(shared)) {}

}  // namespace nitro::dist

namespace nitro::dist::detail {

NITRO_INLINE GroupAgreement::GroupAgreement(ProcessGroup group) : group_(std::move(group)) {
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

NITRO_INLINE GroupAgreement::~GroupAgreement() {
  try {
    if (work_) work_->wait(group_.timeout());
  } catch (...) {  // a rank is gone: nothing to wait for
  }
}

NITRO_INLINE void GroupAgreement::begin(bool flag) {
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

NITRO_INLINE bool GroupAgreement::end() {
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

}  // namespace nitro::dist::detail

namespace nitro::dist {

NITRO_INLINE std::unique_ptr<Agreement> ProcessGroup:: ProcessGroup::make_agreement() const {
  return std::make_unique<detail::GroupAgreement>(*this);
}

}  // namespace nitro::dist
