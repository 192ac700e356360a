#pragma once
// Snapshots: the whole state of a training run in one checked file, written so that a crash at any
// moment never costs the last good snapshot, and loaded so that the run continues bit for bit.
//
//   // save (between steps, or let snapshot::Policy do it every N steps / T minutes / on SIGTERM):
//   nitro::snapshot::save(std::filesystem::path("runs/a") / nitro::snapshot::file_name(loop.optimizer_steps(), 0),
//                         loop, {.sampler = &sampler, .extras = &extras});
//   // resume, in a new process, after building the same model, optimizer, loop and sampler:
//   if (auto file = nitro::snapshot::latest("runs/a")) nitro::snapshot::load(*file, loop, {.sampler = &sampler});
//
// What a snapshot holds (each a part with its own checksum):
//   model      every parameter and buffer, by name
//   grads      the gradients the parameters hold (those of an accumulation window under way)
//   optimizer  each group's options, each parameter's state (SGD, Adam, AdamW, Adagrad, RMSprop field
//              by field, as memory::StateBackup copies them; another optimizer in LibTorch's own
//              serialised form)
//   loop       the TrainingLoop's State: counters, the micro-batch inside the window, the loss
//              scaler, Adaptive's split, and every hook policy's state_dict (parts "hook/<name>")
//   rng        the CPU generator and every CUDA device's generator
//   data       a data::ResumableSampler's (seed, epoch, index)
//   extras     the caller's own StateDict (named tensors, integers, numbers, strings)
//
// The file: a header (a magic, the format version, 4 zero bytes), the parts, then a text manifest
// (format version, LibTorch and Nitro versions, the time in UTC, the loop's step, and each part's
// offset, size and checksum), then a footer (the manifest's offset, size and XXH64 checksum, and a
// magic). Parts are checked with XXH3 in format version 2 and with XXH64 in version 1 (with XXH64,
// hashing took half as long as reading the file from the page cache); this Nitro writes version 2
// (SaveOptions::format_version = 1 for an older Nitro) and reads both. It is written through
// io::AtomicFile (a temporary name in the same directory, fsync, rename, fsync of the directory): a
// reader, or a process after a crash, sees the old snapshot or the new one, never a part of one.
//
// Loading checks everything before it changes anything: the header, the footer, the manifest, the
// format version, every part's checksum, then the names, shapes and dtypes of the model's
// parameters, buffers and gradients, the optimizer's type, groups, options and state (each state
// tied to its parameter's name), the loop's AMP, accumulation and clip policies and its hook
// policies' states, and the sampler's size. A corrupt, truncated or foreign file, another format
// version, or a model or optimizer that does not match, throws nitro::Error naming the part and what
// differs, and leaves the model, the optimizer, the loop, the sampler, the generators and the file as
// they were. The file is read once: a tensor's bytes go from the file into a new tensor in pieces,
// each hashed while it is in the cache; once everything checks, the model's are copied into its live
// tensors and the optimizer's new tensors become its state. So a load needs memory for one copy of
// what it loads besides the live objects.
//
// Not saved: a learning-rate scheduler object (the rate itself is in the optimizer's options, which
// are saved, but LibTorch's schedulers count their steps in the scheduler: set the rate from the
// loop's optimizer_steps(), which is saved, as examples/regression.cpp does, or put the scheduler's
// own state into `.extras`), the monitor's timings, and
// random augmentation drawn from the global generator on prefetching workers (it runs ahead of the
// consumer, so it cannot be replayed exactly: draw it from (seed, epoch, index) instead).
//
// Exactness: with the same program, deterministic kernels and the same number of intra-op threads,
// a run resumed from a snapshot reaches bitwise the parameters, optimizer state and loss scale of
// the run that was not interrupted (tests/snapshot/snapshot.cpp trains in a new process to check it).
// Tensors are stored in the host's byte order with their dtype: a snapshot moves between machines
// of one byte order, and from GPU to CPU and back (tensors are loaded onto the device of the live
// tensor they replace).
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>
#include <nitro/core/rank.hpp>
#include <nitro/core/state_dict.hpp>
#include <nitro/data/sampler.hpp>
#include <nitro/io/file.hpp>
#include <nitro/memory/batch_size.hpp>
#include <nitro/train/hooks.hpp>
#include <nitro/version.hpp>

#include <ATen/Parallel.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <torch/headeronly/version.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

namespace nitro::snapshot {

/// The version of the file layout this Nitro writes: 2, whose parts' checksums are XXH3. It reads
/// versions 1 (XXH64) and 2.
inline constexpr std::uint32_t format_version = 2;
/// The oldest file layout this Nitro reads.
inline constexpr std::uint32_t oldest_format_version = 1;

/// What a snapshot's manifest says about it.
struct Manifest {
  /// One part of the file, as the manifest lists it.
  struct Part {
    std::string name;            ///< its name: "model", "optimizer", "loop", "hook/<name>", "<loop name>/model", ...
    std::uint64_t offset = 0;    ///< where its bytes begin in the file
    std::uint64_t bytes = 0;     ///< its length in bytes
    std::uint64_t checksum = 0;  ///< XXH3 of the part's bytes (format version 1: XXH64)
  };
  std::uint32_t format_version = 0;  ///< the file layout's version (1 or 2)
  std::string libtorch;              ///< the LibTorch version that wrote it, e.g. "2.11.0"
  std::string nitro;                 ///< the Nitro version that wrote it, e.g. "0.1.0"
  std::string time;                  ///< when it was written: UTC, ISO 8601
  std::int64_t step = 0;             ///< the step saved at: the loop's optimizer steps by default (0 without a loop)
  std::int64_t micro_step = 0;       ///< micro-batches into the accumulation window
  std::vector<Part> parts;           ///< every part, in file order

  /// The part named `part`; null when the snapshot has none.
  [[nodiscard]] NITRO_INLINE const Part* find(std::string_view part) const noexcept;
};

/// What to save besides a loop's own model, optimizer and state (or, without a loop, what to save).
/// A null pointer is not saved; on load, a part the snapshot has and the caller gives no object for
/// is left unread, and an object given whose part the snapshot lacks is an error.
struct Contents {
  torch::nn::Module* model = nullptr;            ///< the model's parameters and buffers (and gradients), by name
  torch::optim::Optimizer* optimizer = nullptr;  ///< the optimizer's groups, options and state
  data::ResumableSampler* sampler = nullptr;     ///< the sampler's position (seed, epoch, index)
  /// The caller's own state: saved as it is; loading replaces *extras with what was saved.
  StateDict* extras = nullptr;
  /// The CPU and CUDA random generators.
  bool rng = true;
};

/// How to write a snapshot.
struct SaveOptions {
  /// fsync the file and its directory before save() returns (off only for tests and benchmarks
  /// that measure the write alone).
  bool fsync = true;
  /// The layout to write: 2, or 1 for a Nitro that reads only version 1 (its parts are checked with
  /// XXH64, which makes loading slower).
  std::uint32_t format_version = snapshot::format_version;
  /// The step the manifest records (and snapshot::file_name is given by snapshot::Run): by default
  /// the loop's optimizer steps (the first loop's, of several), 0 without a loop.
  std::optional<std::int64_t> step;
};

namespace detail {

inline constexpr char footer_magic[8] = {'N', 'I', 'T', 'R', 'O', 'S', 'N', 'P'};
inline constexpr char header_magic[8] = {'N', 'I', 'T', 'R', 'O', 'S', 'N', '1'};
inline constexpr std::size_t header_bytes = 16;  // magic, u32 format version, u32 zero (reserved)
inline constexpr std::size_t footer_bytes = 32;  // u64 offset, u64 size, u64 XXH64 of the manifest, magic
inline constexpr std::uint64_t max_manifest_bytes = 64ull << 20;
inline constexpr std::uint32_t max_ndim = 64;
inline constexpr std::size_t max_parts = 1u << 16;

[[noreturn, gnu::cold]] NITRO_INLINE void corrupt(const std::filesystem::path& file, std::string_view part,
                                            std::string_view what);

NITRO_INLINE std::string libtorch_version();

NITRO_INLINE std::string utc_now();

// ---- encoding a StateDict --------------------------------------------------------------------------
//
//   u64 n, n x { str name, i32 dtype, u32 ndim, i64 sizes[ndim], u64 nbytes, bytes }   tensors
//   u64 n, n x { str name, i64 }                                                      integers
//   u64 n, n x { str name, f64 }                                                      numbers
//   u64 n, n x { str name, str value }                                                strings
//   str = u64 length, bytes

/// A part's checksum: XXH3 in format version 2, XXH64 in version 1.
class PartHash {
 public:
  NITRO_INLINE explicit PartHash(std::uint32_t version) noexcept;
  NITRO_INLINE void update(const void* data, std::size_t n) noexcept;
  [[nodiscard]] std::uint64_t digest() const noexcept { return xxh3_ ? xxh3_hash_.digest() : xxh64_hash_.digest(); }

 private:
  bool xxh3_;
  io::Xxh3 xxh3_hash_;
  io::Xxh64 xxh64_hash_;
};

/// Tensor bytes move between the file and memory in pieces of this size, each hashed right after
/// it is copied, while it is still in the cache (the L2 of most CPUs holds it).
inline constexpr std::size_t piece_bytes = 256u << 10;

/// Writes parts into an AtomicFile, hashing each; small fields are gathered in a buffer, tensor
/// bytes go straight from the tensor to the file.
class PartWriter {
 public:
  NITRO_INLINE PartWriter(io::AtomicFile& file, std::uint64_t offset, std::uint32_t version);

  NITRO_INLINE void begin(std::string name);
  NITRO_INLINE Manifest::Part end();

  NITRO_INLINE void put(const void* data, std::size_t n);
  template <class T>
  void put_value(T v) {
    put(&v, sizeof v);
  }
  NITRO_INLINE void put_string(std::string_view s);

  NITRO_INLINE void put_dict(const StateDict& d, std::string_view part);

  NITRO_INLINE void flush();
  [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }

 private:
  io::AtomicFile* file_;
  std::uint64_t offset_;
  std::uint32_t version_;
  Manifest::Part part_;
  PartHash hash_;
  std::vector<char> buffer_;
};

/// Reads one part from the file, checking every length against what is left of the part and
/// hashing every byte; the caller compares the hash once the part is read. Small fields come
/// through a buffer (one read for many of them); a tensor's bytes go from the file straight into the
/// tensor, in pieces each hashed right after it is read, while it is in the cache: each byte is
/// copied from the page cache once and hashed from the cache.
class PartReader {
 public:
  NITRO_INLINE PartReader(int fd, const std::filesystem::path& file, const Manifest::Part& part, std::uint32_t version);

  NITRO_INLINE void get(void* data, std::size_t n);
  template <class T>
  T get_value() {
    T v;
    get(&v, sizeof v);
    return v;
  }
  NITRO_INLINE std::string get_string();
  NITRO_INLINE std::uint64_t get_count(std::uint64_t smallest_entry);

  NITRO_INLINE StateDict get_dict();

  /// Hashes the rest of the part (without consuming it) and checks the checksum now.
  NITRO_INLINE void verify_ahead();

  /// Checks that the whole part was read and that its checksum matches the manifest's.
  NITRO_INLINE void finish();

  /// Reads the rest of the part without keeping it (to check its checksum).
  NITRO_INLINE void skip_rest();

  [[noreturn]] void fail(std::string_view what) const { corrupt(*file_, part_->name, what); }

 private:
  static constexpr std::size_t buffer_bytes = 64u << 10;

  [[nodiscard]] std::size_t buffered() const noexcept { return filled_ - used_; }
  NITRO_INLINE void consumed(std::size_t n) noexcept;
  /// Reads the next bytes of the part (up to the buffer's size) into the empty buffer.
  NITRO_INLINE void refill();

  int fd_;
  const std::filesystem::path* file_;
  const Manifest::Part* part_;
  std::uint64_t at_, left_;  // the next byte not consumed, and how many of the part's are left
  PartHash hash_;
  std::unique_ptr<char[]> buffer_;  // bytes from at_ on: [used_, filled_) not consumed yet
  std::size_t used_ = 0, filled_ = 0;
  std::uint64_t decoded_ = 0;
  bool verified_ = false;
};

NITRO_INLINE std::string hex16(std::uint64_t v);

NITRO_INLINE std::string manifest_text(const Manifest& m);

/// Parses a manifest's text; nothing when it is not one. Part names have no spaces.
NITRO_INLINE std::optional<Manifest> parse_manifest(std::string_view text);

/// (step, micro-batch) of a name snapshot::file_name() makes, "snapshot-<digits>-<digits>.nitro";
/// nothing for any other name (temporary files included).
NITRO_INLINE std::optional<std::pair<std::int64_t, std::int64_t>> snapshot_name_numbers(std::string_view name) noexcept;

}  // namespace detail

/// An open snapshot file whose header, footer and manifest are checked; parts are read (and their
/// checksums checked) on demand. Throws nitro::Error for a file that is not a readable snapshot of a
/// format version this Nitro reads (1 or 2).
class Reader {
 public:
  /// Opens `file` and checks its header, footer and manifest. Throws nitro::Error when it is not a
  /// readable snapshot of format version 1 or 2 (the message says what is wrong).
  NITRO_INLINE explicit Reader(std::filesystem::path file);

  /// What the manifest says: versions, time, step, and the parts.
  [[nodiscard]] const Manifest& manifest() const noexcept { return manifest_; }
  /// The file.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return file_; }
  /// The file's format version (1 or 2).
  [[nodiscard]] std::uint32_t format_version() const noexcept { return version_; }
  /// Whether the snapshot has the part `part`.
  [[nodiscard]] bool has(std::string_view part) const noexcept { return manifest_.find(part) != nullptr; }

  /// The part decoded, its checksum checked. Throws nitro::Error naming the part when it is absent or damaged.
  [[nodiscard]] NITRO_INLINE StateDict read(std::string_view part) const;

  /// Checks the checksums of the parts not read (read() checks those it reads). Throws nitro::Error
  /// naming the first damaged part.
  NITRO_INLINE void verify_unread() const;

  /// Reads every part and checks its checksum (no tensor is made). Throws nitro::Error naming the first
  /// damaged part.
  NITRO_INLINE void verify() const;

 private:
  NITRO_INLINE void read_at(void* data, std::size_t n, std::uint64_t offset) const;

  std::filesystem::path file_;
  io::Fd fd_;
  std::uint64_t size_ = 0;
  std::uint32_t version_ = 0;
  Manifest manifest_;
  mutable std::vector<const Manifest::Part*> read_;  // parts read (and checked) so far
};

/// Whether `file` is a snapshot whose every part checks; the reason when it is not.
[[nodiscard]] NITRO_INLINE std::optional<std::string> check(const std::filesystem::path& file);

/// The snapshot files of a directory, named as snapshot::file_name() names them
/// (snapshot-STEP-MICRO.nitro; other files, temporary ones included, are never listed), newest
/// first by (step, micro-batch).
[[nodiscard]] NITRO_INLINE std::vector<std::filesystem::path> list(const std::filesystem::path& directory);

/// The newest snapshot in `directory` that checks (every part read and its checksum compared),
/// skipping damaged ones; nothing when there is none (or no directory).
[[nodiscard]] NITRO_INLINE std::optional<std::filesystem::path> latest(const std::filesystem::path& directory);

/// Removes the temporary files that writers killed during a save left in `directory` (never a
/// snapshot). Only while no other process is saving into it. Returns how many it removed.
NITRO_INLINE std::size_t remove_temporary_files(const std::filesystem::path& directory);

/// The file name snapshot::Policy gives the snapshot at (optimizer step, micro-batch in the window).
[[nodiscard]] NITRO_INLINE std::string file_name(std::int64_t step, std::int64_t micro_step);

namespace detail {

// ---- the parts: from live objects to StateDicts, and back after every check -------------------------

NITRO_INLINE StateDict model_part(torch::nn::Module& model);

NITRO_INLINE StateDict grads_part(torch::nn::Module& model);

NITRO_INLINE std::string describe(const at::Tensor& t);

/// Checks that `saved` holds exactly the tensors `live` names, with the same shapes and dtypes.
NITRO_INLINE void check_same_tensors(const std::filesystem::path& file, std::string_view part,
                               const std::map<std::string, at::Tensor, std::less<>>& saved,
                               const std::vector<std::pair<std::string, at::Tensor>>& live, std::string_view what);

struct ModelLoad {
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (live, saved)
  std::vector<std::pair<at::Tensor, at::Tensor>> grads;   // (parameter, saved gradient or undefined)
};

NITRO_INLINE ModelLoad prepare_model(const std::filesystem::path& file, torch::nn::Module& model, StateDict&& saved,
                               std::optional<StateDict>&& grads, std::string_view prefix = {});

/// Copies loaded tensors into live ones of their shapes and dtypes (live, loaded). On the CPU, in
/// pieces of 4 MiB that at::get_num_threads() threads take in turn, so that a thread the machine
/// gives no time holds up no other: at::copy_, which gives each thread an equal share, took three
/// times as long as one thread's memcpy on a busy machine. Other devices, and tensors that are not
/// contiguous, through copy_. Throws only as copy_ does (the CPU path does not).
NITRO_INLINE void copy_into(const std::vector<std::pair<at::Tensor, at::Tensor>>& copies);

NITRO_INLINE void apply_model(ModelLoad& load);

NITRO_INLINE std::string serialize_options(const torch::optim::OptimizerOptions& options);

/// The model's name of each parameter (by TensorImpl), to tie optimizer state to names.
NITRO_INLINE std::map<const void*, std::string> parameter_names(torch::nn::Module* model);

NITRO_INLINE std::string optimizer_type(const torch::optim::Optimizer& optimizer);

NITRO_INLINE StateDict optimizer_part(torch::optim::Optimizer& optimizer, torch::nn::Module* model = nullptr);

struct OptimizerLoad {
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;  // per group (null: none)
  std::vector<std::pair<void*, std::unique_ptr<torch::optim::OptimizerParamState>>> states;
  std::optional<std::string> torch_archive;
};

NITRO_INLINE OptimizerLoad prepare_optimizer(const std::filesystem::path& file, torch::optim::Optimizer& optimizer,
                                       const StateDict& saved, torch::nn::Module* model = nullptr,
                                       std::string_view part_prefix = {});

NITRO_INLINE void apply_optimizer(torch::optim::Optimizer& optimizer, OptimizerLoad& load);

NITRO_INLINE StateDict rng_part();

NITRO_INLINE void check_rng(const std::filesystem::path& file, const StateDict& saved);

/// Puts the generators back: the CPU's, and each GPU's that this process has (a snapshot of a
/// machine with more GPUs restores those that exist here).
NITRO_INLINE void apply_rng(const StateDict& saved);

NITRO_INLINE StateDict sampler_part(const data::SamplerState& s);
NITRO_INLINE data::SamplerState sampler_state(const StateDict& d);

/// A loop, seen by save and load through its state (so that this header needs no TrainingLoop type).
struct LoopAccess {
  using Hooks = std::map<std::string, StateDict, std::less<>>;
  /// The loop's part and its hooks' states now.
  std::function<std::pair<StateDict, Hooks>()> save;
  /// Loads a loop part and hook states; validates first, throws changing nothing.
  std::function<void(const StateDict&, const Hooks&)> load;
  /// The loop's policies that decide its numbers: a snapshot of another loop type is refused.
  std::string policies;
  std::int64_t step = 0, micro_step = 0;
};

template <class Loop>
std::string loop_policies() {
  return ::nitro::detail::concat("amp=", Loop::amp_policy::name, " accumulate=", Loop::accumulation_policy::name,
                                 " clip=", Loop::clip_policy::name);
}

template <class State>
StateDict loop_part(const State& s) {
  StateDict d;
  d.integers["accumulation_steps"] = s.accumulation_steps;
  d.integers["pending_micro_batches"] = s.pending_micro_batches;
  d.integers["optimizer_steps"] = s.optimizer_steps;
  d.integers["skipped_steps"] = s.skipped_steps;
  d.integers["split"] = s.split;
  d.integers["splits_made"] = s.splits_made;
  if (s.loss_scale) {
    d.numbers["loss_scale/scale"] = s.loss_scale->scale;
    d.numbers["loss_scale/growth_factor"] = s.loss_scale->growth_factor;
    d.numbers["loss_scale/backoff_factor"] = s.loss_scale->backoff_factor;
    d.integers["loss_scale/growth_interval"] = s.loss_scale->growth_interval;
    d.integers["loss_scale/growth_tracker"] = s.loss_scale->growth_tracker;
  }
  return d;
}

template <class State>
State loop_state(const StateDict& d) {
  constexpr std::string_view owner = "nitro::snapshot: part \"loop\"";
  State s;
  s.accumulation_steps = d.integer("accumulation_steps", owner);
  s.pending_micro_batches = d.integer("pending_micro_batches", owner);
  s.optimizer_steps = d.integer("optimizer_steps", owner);
  s.skipped_steps = d.integer("skipped_steps", owner);
  s.split = d.integer("split", owner);
  s.splits_made = d.integer("splits_made", owner);
  if (d.numbers.contains("loss_scale/scale")) {
    s.loss_scale = LossScaleState{d.number("loss_scale/scale", owner), d.number("loss_scale/growth_factor", owner),
                                  d.number("loss_scale/backoff_factor", owner),
                                  d.integer("loss_scale/growth_interval", owner),
                                  d.integer("loss_scale/growth_tracker", owner)};
  }
  return s;
}

// One model, optimizer and loop of a snapshot, its parts named "<prefix>model", "<prefix>grads",
// "<prefix>optimizer", "<prefix>loop" and "<prefix>hook/<name>" (prefix "" for a run of one loop,
// "<name>/" for each loop of a run of several).
struct Unit {
  std::string prefix;
  torch::nn::Module* model = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;
  const LoopAccess* loop = nullptr;
};

NITRO_INLINE void save(const std::filesystem::path& file, std::span<const Unit> units, const Contents& c,
                 const SaveOptions& options);

NITRO_INLINE void save(const std::filesystem::path& file, const Contents& c, const LoopAccess* loop,
                 const SaveOptions& options);

// What load reads and checks of one unit before anything changes.
struct UnitLoad {
  std::optional<ModelLoad> model;
  std::optional<OptimizerLoad> optimizer;
  std::optional<StateDict> loop_dict;
  LoopAccess::Hooks hooks;
  std::optional<std::pair<StateDict, LoopAccess::Hooks>> loop_before;
};

/// Reads and checks every part first, then changes the objects: the loops (their own checks may
/// refuse their states), then the models, the gradients, the optimizers, the sampler, the
/// generators, the extras.
NITRO_INLINE Manifest load(const std::filesystem::path& file, std::span<const Unit> units, const Contents& c);

NITRO_INLINE Manifest load(const std::filesystem::path& file, const Contents& c, const LoopAccess* loop);

}  // namespace detail

/// Saves model, optimizer, sampler, extras and generators (those given) into `file`, atomically.
NITRO_INLINE void save(const std::filesystem::path& file, const Contents& contents, const SaveOptions& options = {});

/// Loads what `contents` names from `file`, after checking all of it; see the top of this header.
/// Returns the snapshot's manifest.
NITRO_INLINE Manifest load(const std::filesystem::path& file, const Contents& contents);


namespace detail {
template <class Loop>
LoopAccess loop_access(Loop& loop) {
  if constexpr (requires { loop.snapshot_choice(); }) {
    // level::Auto (train/autotune.hpp): its winner's access, with the choice in the loop part.
    LoopAccess access = loop.visit([](auto& winner) { return loop_access(winner); });
    access.save = [inner = std::move(access.save), &loop] {
      auto saved = inner();
      const StateDict choice = loop.snapshot_choice();
      saved.first.integers.insert(choice.integers.begin(), choice.integers.end());
      saved.first.strings.insert(choice.strings.begin(), choice.strings.end());
      return saved;
    };
    return access;
  } else {
    LoopAccess access;
    access.policies = loop_policies<Loop>();
    access.step = loop.optimizer_steps();
    access.micro_step = loop.pending_micro_batches();
    access.save = [&loop] {
      auto s = loop.state();
      auto hooks = std::move(s.hooks);
      return std::pair{loop_part(s), std::move(hooks)};
    };
    access.load = [&loop](const StateDict& d, const LoopAccess::Hooks& hooks) {
      auto s = loop_state<typename Loop::State>(d);
      s.hooks = hooks;
      loop.load_state(s);
    };
    return access;
  }
}
}  // namespace detail

/// Saves a TrainingLoop's whole run: its model, optimizer and State (hook policies' states as parts
/// "hook/<name>"), the generators, and what `contents` adds (sampler, extras). Between steps, or
/// from a hook; in the middle of an accumulation window the gradients so far are saved too.
template <class Loop>
  requires requires(Loop& l) {
    l.state();
    l.model();
    l.optimizer();
  }
void save(const std::filesystem::path& file, Loop& loop, Contents contents = {}, const SaveOptions& options = {}) {
  if (contents.model == nullptr) contents.model = &loop.model();
  if (contents.optimizer == nullptr) contents.optimizer = &loop.optimizer();
  const detail::LoopAccess access = detail::loop_access(loop);
  detail::save(file, contents, &access, options);
}

/// Loads a TrainingLoop's run from `file` (see save above), after checking all of it: a snapshot of
/// another model, optimizer, or loop of other AMP, accumulation or clip policies or hooks is refused
/// with the difference named, and nothing changes. (The monitor and checkpoint policies may differ.)
template <class Loop>
  requires requires(Loop& l) {
    l.state();
    l.model();
    l.optimizer();
  }
Manifest load(const std::filesystem::path& file, Loop& loop, Contents contents = {}) {
  if constexpr (requires(const StateDict& d) { loop.adopt_snapshot_choice(d); }) {
    // level::Auto: the snapshot's choice first (no tuning), so that its optimizer and loop are the
    // ones saved.
    Reader reader(file);
    loop.adopt_snapshot_choice(reader.read("loop"));
  }
  if (contents.model == nullptr) contents.model = &loop.model();
  if (contents.optimizer == nullptr) contents.optimizer = &loop.optimizer();
  const detail::LoopAccess access = detail::loop_access(loop);
  auto manifest = detail::load(file, contents, &access);
  if constexpr (requires { loop.after_snapshot_load(); }) loop.after_snapshot_load();
  return manifest;
}

// ---- several loops in one snapshot ---------------------------------------------------------------

/// A loop of a run that trains several models (a GAN's generator and discriminator, a teacher and a
/// student): snapshot::save and load of a list of them keep every loop in one file, one step number,
/// its parts under its name ("generator/model", "generator/optimizer", "generator/loop",
/// "generator/hook/<name>", ...), and the run's generators, sampler and extras once.
///
///   nitro::snapshot::save(dir / nitro::snapshot::file_name(iteration, 0),
///                         {{"generator", g_loop}, {"discriminator", d_loop}},
///                         {.sampler = &sampler, .extras = &extras}, {.step = iteration});
///   nitro::snapshot::load(file, {{"generator", g_loop}, {"discriminator", d_loop}}, {.sampler = &sampler});
///
/// snapshot::Run (snapshot/policy.hpp) does this every N iterations, every T minutes and on SIGTERM,
/// at the point of the outer loop the caller chooses. The name: 1 to 64 of [A-Za-z0-9_.-].
class Named {
 public:
  /// `loop` (a TrainingLoop or level::Auto, kept by reference) under `name`. Throws nitro::Error when
  /// the name is not 1 to 64 of [A-Za-z0-9_.-].
  template <class Loop>
    requires requires(Loop& l) {
      l.state();
      l.model();
      l.optimizer();
    }
  Named(std::string name, Loop& loop)
      : name_(std::move(name)), model_(&loop.model()),
        optimizer_([&loop]() -> torch::optim::Optimizer& { return loop.optimizer(); }),
        access_([&loop] { return detail::loop_access(loop); }) {
    if constexpr (requires(const StateDict& d) { loop.adopt_snapshot_choice(d); }) {
      // level::Auto (train/autotune.hpp): its choice comes from the snapshot before anything loads.
      adopt_ = [&loop](const StateDict& d) { loop.adopt_snapshot_choice(d); };
      after_load_ = [&loop] { loop.after_snapshot_load(); };
    }
    NITRO_CHECK(!name_.empty() && name_.size() <= 64 &&
                    std::all_of(name_.begin(), name_.end(),
                                [](char ch) {
                                  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                                         ch == '_' || ch == '.' || ch == '-';
                                }),
                "nitro::snapshot::Named: the loop's name \"", name_, "\" must be 1 to 64 of [A-Za-z0-9_.-] "
                "(it prefixes the loop's parts in the file), e.g. \"generator\"");
  }
  /// The loop's name, the prefix of its parts.
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// The loop's model.
  [[nodiscard]] torch::nn::Module& model() const noexcept { return *model_; }
  /// The optimizer the loop steps now (a level::Auto's can change when it adopts its choice).
  [[nodiscard]] torch::optim::Optimizer& optimizer() const { return optimizer_(); }
  /// The loop as save and load see it, now.
  [[nodiscard]] detail::LoopAccess access() const { return access_(); }
  /// level::Auto only: takes the choice its loop part records (before load); empty for any other loop.
  [[nodiscard]] const std::function<void(const StateDict&)>& adopt() const noexcept { return adopt_; }
  /// level::Auto only: what it does after a load (empty for any other loop).
  [[nodiscard]] const std::function<void()>& after_load() const noexcept { return after_load_; }

 private:
  std::string name_;
  torch::nn::Module* model_;
  std::function<torch::optim::Optimizer&()> optimizer_;
  std::function<detail::LoopAccess()> access_;
  std::function<void(const StateDict&)> adopt_;
  std::function<void()> after_load_;
};

namespace detail {
// Units of named loops: distinct names, distinct models and optimizers (one object saved twice
// would be loaded twice, the second time over the first).
struct NamedUnits {
  std::vector<LoopAccess> access;
  std::vector<Unit> units;
  NITRO_INLINE NamedUnits(std::string_view what, const std::filesystem::path& file, std::span<const Named> loops);
};
}  // namespace detail

/// Saves several loops (see Named) and what `contents` adds (sampler, extras; .model and .optimizer
/// must be null) into one file, atomically. The manifest's step is options.step, else the first
/// loop's optimizer steps.
NITRO_INLINE void save(const std::filesystem::path& file, std::span<const Named> loops, const Contents& contents = {},
                 const SaveOptions& options = {});
/// As above, for a brace list: `save(file, {{"generator", g_loop}, {"discriminator", d_loop}})`.
NITRO_INLINE void save(const std::filesystem::path& file, std::initializer_list<Named> loops, const Contents& contents = {},
                 const SaveOptions& options = {});

/// Loads several loops saved by save above, after checking all of it (every loop's model, optimizer,
/// policies and hooks, under its name); a snapshot of other loops changes nothing and throws
/// nitro::Error naming the part. Returns the manifest (its step: the one saved).
NITRO_INLINE Manifest load(const std::filesystem::path& file, std::span<const Named> loops, const Contents& contents = {});
/// As above, for a brace list: `load(file, {{"generator", g_loop}, {"discriminator", d_loop}})`.
NITRO_INLINE Manifest load(const std::filesystem::path& file, std::initializer_list<Named> loops, const Contents& contents = {});

}  // namespace nitro::snapshot

#if !NITRO_COMPILED
#include <nitro/snapshot/snapshot-inl.hpp>
#endif
