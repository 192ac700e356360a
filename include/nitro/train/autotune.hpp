#pragma once
// Nitro picks the level itself: nitro::autotune<Candidates...> tries candidate loop types on the
// user's own model, batch and machine, puts everything back, and says which is fastest;
// level::Auto<Candidates...> is a loop that does that at its first step and then trains with the
// winner.
//
//   using Loop = nitro::level::Auto<nitro::level::Basic, nitro::level::Advanced>;
//   Loop loop{model, optimizer};                       // nothing tried yet
//   for (auto& b : loader) loop.step(b, loss_fn);      // the first step tunes on b, then trains
//   std::puts(loop.result().table().c_str());          // what it tried, what it measured, what it chose
//
// What it tries: each candidate loop type (level::Basic, Advanced, Ultra, Max on a GPU,
// level::with<...>, any TrainingLoop<...>) with the user's choices left as they are, then, on the
// fastest, the runtime choices one at a time, each kept when it is faster:
//   - channels-last (nitro::to_channels_last) for a model with 4-d parameters (convolutions);
//   - the fused optimizer (optim::FusedSGD / FusedAdam / FusedAdamW) in place of a torch::optim::SGD,
//     Adam or AdamW, with the same parameter groups, options and state;
//   - a candidate that throws with the optimizer as given (level::Max: a CUDA graph needs a fused
//     optimizer) is tried again at once with the fused one, when there is one;
//   - on the CPU, the intra-op thread count (the current one and half of it, or Options::cpu_threads);
//   - for a candidate with accumulate::Dynamic whose step runs out of memory (a GPU's, or the CPU
//     byte budget Options::memory_budget_bytes), micro-batches: each batch split into 2, 4, ... parts
//     (Options::max_micro_batches) with as many accumulation steps more, the same optimizer step.
// Each trial: the candidate's loop built over the model, Options::warmup_steps steps not timed (cuDNN
// autotuning and graph capture happen there), then Options::timed_steps steps each timed with the
// device synchronised; its speed is the median. A trial clearly slower than the best so far stops
// early: its last warm-up step above 2 x Options::prune times the best median, or its median over
// Options::prune_after timed steps above Options::prune times it (the table says so). A trial
// that runs out of memory, throws, or gives a non-finite loss is reported and skipped; a candidate
// type that refuses the model at compile time is not a candidate (its static_assert says why).
//
// Everything is put back after every trial: parameters, buffers (BatchNorm statistics), gradients,
// the optimizer's state and options, the random generators of the CPU and the model's GPUs
// (memory::StateBackup), the model's memory layout, the thread count, and the data's position when
// Options::keep_data is given; every trial steps the same batches (drawn once). So the run
// after tuning is exactly the run the chosen configuration would have made from the start
// (tests/train/autotune.cpp checks it bit for bit).
//
// The decision cache: the choice is written to a small file under Options::cache_dir (default
// $NITRO_AUTOTUNE_CACHE, else $XDG_CACHE_HOME/nitro/autotune, else ~/.cache/nitro/autotune), named
// by a hash of the model's parameter and buffer shapes and dtypes (and which are trained), the
// optimizer's type and options but the learning rate, the batch's shapes and dtypes, the device's
// name, the thread count, the candidate list, the tuning options and the Nitro and LibTorch
// versions; the next run with the same key starts at once. Not in the key: the loss function, the
// candidates' options, module settings that keep the shapes (stride, dropout): after changing those,
// run once with NITRO_AUTOTUNE=force. Batches whose shapes change from run to run miss every time. A damaged or stale file is ignored with a
// message. NITRO_AUTOTUNE=off (no trials: the first candidate as given), =force (tune again and
// rewrite the file), =auto (the default) or Options::mode override it.
//
// Adopting the choice changes what the user gave: the model is converted to channels-last when
// chosen (it stays so), the thread count is set for as long as the Auto loop lives (then put back),
// and with the fused choice the loop steps its own fused copy of the optimizer (loop.optimizer()):
// a learning rate changed on the user's optimizer (a schedule) is copied to it before the next step,
// and snapshot::load writes the rates it restored back into the user's optimizer; other options
// changed later on the user's optimizer are not seen, and its state stays empty. With
// Options::hardware (the default), the winner's level::hardware<L>() holds for the loop's life
// (cuDNN autotuning and TF32 for a bf16 level, overriding the user's; the CPU heap kept, which stays
// set). Several Auto loops with a thread count: destroy them in the reverse order of their choices
// (their settings are scopes).
//
// Cost: tuning runs (candidates + variations) x (warmup + timed) steps; on the demo's CNN on 2 CPU
// cores about a second (bench_autotune). Compile time: a level::Auto of N candidates instantiates N
// loops (bench/compile.sh measures two).
//
// Snapshots: snapshot::save(file, auto_loop) records the choice with the winner's state, and
// snapshot::load(file, auto_loop) takes the same choice without tuning (before the first step).
#include <nitro/core/config.hpp>
#include <nitro/core/device.hpp>
#include <nitro/core/error.hpp>
#include <nitro/core/state_dict.hpp>
#include <nitro/core/step_result.hpp>
#include <nitro/hw/settings.hpp>
#include <nitro/io/file.hpp>
#include <nitro/memory/batch_size.hpp>
#include <nitro/memory/oom.hpp>
#include <nitro/memory/tracking_allocator.hpp>
#include <nitro/optim/fused.hpp>
#include <nitro/train/channels_last.hpp>
#include <nitro/train/levels.hpp>
#include <nitro/train/training_loop.hpp>
#include <nitro/version.hpp>

#include <ATen/Parallel.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/stack.h>
#include <c10/core/GradMode.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace nitro::tune {

/// Whether to tune, or take the cache's choice.
enum class Mode {
  automatic,  ///< the cache's choice when it has one for this key, else tune and write it (the default)
  off,        ///< no trials: the first candidate, the user's choices as they are
  force,      ///< tune even when the cache has a choice, and rewrite it
};

/// How nitro::autotune and level::Auto tune: trial lengths, what to try, the decision cache, logging.
struct Options {
  /// Steps of each trial not timed (>= 1): allocations, cuDNN autotuning and graph capture.
  int warmup_steps = 2;
  /// Steps of each trial timed, each with the device synchronised (>= 1); the speed is their median.
  int timed_steps = 4;
  /// A trial whose median over its first `prune_after` timed steps is above `prune` times the best
  /// median so far stops there, as does one whose last warm-up step is above 2 x prune times it
  /// (0 for prune_after: never stop early).
  int prune_after = 2;
  /// The factor of the best median above which a trial stops early (see prune_after), > 1.
  double prune = 1.5;
  /// Batches drawn from make_batch (>= 1), once, then stepped in turn by every trial.
  int batches = 1;
  /// Channels-last: unset tries both when the model has 4-d parameters; true or false fixes it.
  std::optional<bool> channels_last;
  /// The fused optimizer: unset tries it when the optimizer has a fused version; true or false fixes it.
  std::optional<bool> fused_optimizer;
  /// Intra-op thread counts to try on the CPU (each >= 1); empty: the current count and half of it.
  std::vector<int> cpu_threads;
  /// Memory a step may allocate, in bytes (0: no limit). On the CPU a budget for the trials' tensor
  /// allocations (memory::ScopedCpuTracking); on a GPU the trial's peak of the caching allocator,
  /// above which it counts as out of memory.
  std::int64_t memory_budget_bytes = 0;
  /// The most micro-batches a batch may be split into for an accumulate::Dynamic candidate that
  /// runs out of memory (a power of 2 >= 1; 1: never split).
  std::int64_t max_micro_batches = 8;
  /// Unset: the environment's NITRO_AUTOTUNE (off, force or auto), else automatic.
  std::optional<Mode> mode;
  /// Where choices are kept (see the top of this file); empty: no cache.
  std::filesystem::path cache_dir = default_cache_dir();
  /// Called before tuning to keep the data's position (a sampler's, a prefetcher's), returning what
  /// puts it back after tuning: `.keep_data = nitro::tune::keep(sampler)`.
  std::function<std::function<void()>()> keep_data;
  /// Where messages and the table go; default: stderr, lines starting "nitro::autotune: ".
  std::function<void(const std::string&)> log;
  /// Print the table (through `log`) after tuning.
  bool print_table = true;
  /// Apply each candidate's level::hardware<L>() in its trial and the winner's for the loop's life
  /// (cuDNN autotuning and TF32 for bf16 levels, the CPU heap kept): false leaves the process's
  /// settings as the user made them (e.g. hw::Settings::reproducible()).
  bool hardware = true;

  /// The default of cache_dir: $NITRO_AUTOTUNE_CACHE, else $XDG_CACHE_HOME/nitro/autotune, else
  /// ~/.cache/nitro/autotune; empty (no cache) when none of them is set.
  NITRO_INLINE static std::filesystem::path default_cache_dir();
};

/// An object with state() and load_state(state) (data::ResumableSampler, a Prefetcher): its position
/// kept before tuning and put back after it.
template <class T>
  requires requires(T& t) { t.load_state(t.state()); }
std::function<std::function<void()>()> keep(T& object) {
  return [&object] { return std::function<void()>([&object, saved = object.state()] { object.load_state(saved); }); };
}

/// One configuration: a candidate and the runtime choices.
struct Choice {
  /// Index into the candidate list.
  std::size_t candidate = 0;
  /// The model converted to channels-last.
  bool channels_last = false;
  /// The loop steps a fused copy of the optimizer (optim/fused.hpp).
  bool fused_optimizer = false;
  /// Intra-op threads (CPU); 0: left as it is.
  int cpu_threads = 0;
  /// Parts each batch is split into (accumulate::Dynamic candidates only), >= 1.
  std::int64_t micro_batches = 1;
  /// Equal when every field is.
  friend bool operator==(const Choice&, const Choice&) = default;
};

/// One trial.
struct Trial {
  /// The configuration tried.
  Choice choice;
  /// The candidate and choices in words: "level::Basic + fused optimizer, 1 thread".
  std::string name;
  /// It ran to the end with a finite loss (and within the memory budget); false for a stopped trial.
  bool ok = false;
  /// Its speed: samples (batch rows) per second at the median step time, 0 when it failed.
  double samples_per_s = 0;
  /// The median step time in milliseconds (a step: one whole accumulation window).
  double step_ms = 0;
  /// Steps timed (the step_ms median is over these); 0 when it failed.
  int steps_timed = 0;
  /// Tensor bytes the steps allocated at most (-1: not measured).
  std::int64_t peak_bytes = -1;
  /// "ok", "slower (stopped after 2 timed steps)", "slower (stopped in its warm-up)", "out of memory",
  /// "non-finite loss", "error: ...".
  std::string verdict;
};

/// What tuning found.
struct Result {
  /// The configuration chosen.
  Choice choice;
  /// The chosen configuration in words.
  std::string name;
  /// "tuned", "cache", "off" (NITRO_AUTOTUNE or Options::mode) or "snapshot", or "given".
  std::string source;
  /// Every trial, in the order run (empty when the choice came from the cache, a snapshot or adopt()).
  std::vector<Trial> trials;
  /// Seconds spent tuning (trials and putting back).
  double seconds = 0;
  /// The cache file read or written; empty when none.
  std::filesystem::path cache_file;

  /// The table: one row per trial (candidate, samples/s, peak MB, verdict), then the choice.
  NITRO_INLINE std::string table() const;
};

namespace detail {

template <class T>
inline constexpr bool is_training_loop = false;
template <class... Ps>
inline constexpr bool is_training_loop<TrainingLoop<Ps...>> = true;

template <class... Ts>
inline constexpr bool distinct_types = true;
template <class T, class... Ts>
inline constexpr bool distinct_types<T, Ts...> = (!std::is_same_v<T, Ts> && ...) && distinct_types<Ts...>;

template <class Tuple>
struct any_runs_steps;
template <class... Hs>
struct any_runs_steps<std::tuple<Hs...>> {
  static constexpr bool value = (requires { Hs::runs_steps; } || ...);
};

/// A candidate's name: the level it is (by its AMP, accumulation, checkpoint and clip policies, a
/// hook that runs whole steps meaning level::Max), else its policies.
template <class L>
std::string loop_name() {
  using A = typename L::amp_policy;
  using C = typename L::accumulation_policy;
  using K = typename L::checkpoint_policy;
  using X = typename L::clip_policy;
  constexpr bool graphs = any_runs_steps<typename L::hook_policies>::value;
  constexpr bool plain = std::is_same_v<C, accumulate::Off> && std::is_same_v<K, checkpoint::Off> &&
                         std::is_same_v<X, clip::Off>;
  if constexpr (plain && std::is_same_v<A, amp::Off> && !graphs) return "level::Basic";
  else if constexpr (plain && std::is_same_v<A, amp::Bf16> && !graphs) return "level::Advanced (bf16)";
  else if constexpr (plain && std::is_same_v<A, amp::Bf16> && graphs) return "level::Max (bf16, CUDA graph)";
  else if constexpr (std::is_same_v<A, amp::Bf16> && std::is_same_v<C, accumulate::Dynamic> &&
                     std::is_same_v<K, checkpoint::Sqrt> && std::is_same_v<X, clip::Norm> && !graphs)
    return "level::Ultra (bf16, accum, sqrt ckpt, clip)";
  else
    return ::nitro::detail::concat("TrainingLoop<amp::", A::name, ", accumulate::", C::name, ", checkpoint::", K::name,
                                   ", clip::", X::name, graphs ? ", graphs" : "", ">");
}

NITRO_INLINE std::string describe(const std::string& loop, const Choice& c);

NITRO_INLINE void default_log(const std::string& text);

NITRO_INLINE Mode mode_of(const Options& o);

NITRO_INLINE void validate(const Options& o);

/// The device's name: the CPU's model (Linux /proc/cpuinfo) or the GPU's.
NITRO_INLINE std::string device_name(c10::Device device);

NITRO_INLINE void synchronize(c10::Device device);

NITRO_INLINE bool has_conv_weights(torch::nn::Module& model);

/// A fused copy of `user` (SGD, Adam, AdamW): the same groups, options and state (its tensors copied);
/// null when it has no fused version or is fused already.
NITRO_INLINE std::unique_ptr<torch::optim::Optimizer> make_fused(torch::optim::Optimizer& user);

/// Whether an optimizer of this kind has a fused version make_fused builds.
NITRO_INLINE bool has_fused_version(torch::optim::Optimizer& user);

/// The learning rate of each group of `from` (the user's optimizer) copied to `to` (its fused copy,
/// the same groups) where it changed since `seen` (the rates last taken over): a schedule on the
/// user's optimizer applies, and a rate the loop's hooks set on the copy (stability::Guard) or a
/// snapshot loaded into it stays until the user's rate changes again.
NITRO_INLINE void copy_learning_rates(torch::optim::Optimizer& from, torch::optim::Optimizer& to, std::vector<double>& seen);
NITRO_INLINE std::vector<double> learning_rates(torch::optim::Optimizer& optimizer);

/// The model's 4-d parameters and buffers converted to channels-last, each put back to its layout
/// (a contiguous copy) by undo().
class LayoutChange {
 public:
  NITRO_INLINE explicit LayoutChange(torch::nn::Module& model);
  NITRO_INLINE void undo();

 private:
  std::vector<at::Tensor> changed_;
};

// ---- the decision cache ------------------------------------------------------------------------

NITRO_INLINE std::string hex(std::uint64_t v);
NITRO_INLINE std::uint64_t hash_text(std::string_view text);

NITRO_INLINE std::string choice_lines(const Choice& c, std::string_view name);

/// Reads a cache file; nullopt (with the reason in `why`) when absent, damaged or stale.
NITRO_INLINE std::optional<Choice> read_cache(const std::filesystem::path& file, const std::string& key,
                                        std::size_t candidates, const std::vector<std::string>& names,
                                        bool fusable, std::string& why);

NITRO_INLINE void write_cache(const std::filesystem::path& file, const std::string& key, const Choice& c,
                        const std::string& name, double samples_per_s,
                        const std::function<void(const std::string&)>& log);

// ---- the tuner ---------------------------------------------------------------------------------

/// The model (and its Sequential holder, which TrainingLoop needs for a checkpointed forward).
struct ModelRef {
  std::shared_ptr<torch::nn::Module> module;
  std::optional<torch::nn::Sequential> sequential;

  template <class L, class... Args>
  void build(std::optional<L>& loop, Args&&... args) const {
    if (sequential) loop.emplace(*sequential, std::forward<Args>(args)...);
    else loop.emplace(module, std::forward<Args>(args)...);
  }
};

NITRO_INLINE c10::Device model_device(torch::nn::Module& model);

/// Calls f.template operator()<I>() for the index I == i of a list of N.
template <std::size_t N, class F>
void with_index(std::size_t i, F&& f) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((i == I ? (f.template operator()<I>(), 0) : 0), ...);
  }(std::make_index_sequence<N>{});
}

/// The key of the decision cache (see the top of this file).
/// The optimizer's options but the learning rate, for the cache key (SGD, Adam, AdamW; others by type).
NITRO_INLINE std::string optimizer_options(torch::optim::Optimizer& optimizer);

template <class Batch>
std::string cache_key(torch::nn::Module& model, torch::optim::Optimizer& optimizer, const Batch& batch,
                      const std::vector<std::string>& names, const std::vector<std::string>& types, const Options& o,
                      c10::Device device) {
  std::ostringstream k;
  k << "nitro " << version_string << " libtorch " << TORCH_VERSION_MAJOR << '.' << TORCH_VERSION_MINOR << '.'
    << TORCH_VERSION_PATCH << "\ndevice " << device_name(device) << " threads " << at::get_num_threads()
    << "\noptimizer " << optimizer_options(optimizer) << "\nparams";
  for (const auto& p : model.parameters())
    k << ' ' << p.sizes() << c10::toString(p.scalar_type()) << (p.requires_grad() ? "" : "f");
  k << "\nbuffers";
  for (const auto& b : model.buffers()) k << ' ' << b.sizes() << c10::toString(b.scalar_type());
  k << "\nbatch";
  nitro::for_each_tensor(batch, [&](const at::Tensor& t) {
    if (t.defined()) k << ' ' << t.sizes() << c10::toString(t.scalar_type()) << t.device();
  });
  k << "\ncandidates";
  for (std::size_t i = 0; i < names.size(); ++i) k << " [" << names[i] << ' ' << types[i] << ']';
  k << "\noptions " << o.warmup_steps << ' ' << o.timed_steps << ' ' << o.prune_after << ' ' << o.prune << ' '
    << o.batches << ' ' << (o.channels_last ? int(*o.channels_last) : -1) << ' '
    << (o.fused_optimizer ? int(*o.fused_optimizer) : -1) << ' ' << o.memory_budget_bytes << ' '
    << o.max_micro_batches;
  for (const int t : o.cpu_threads) k << " t" << t;
  return k.str();
}

/// Whether loop type L accumulates a run-time number of micro-batches (the only kind split further).
template <class L>
inline constexpr bool splits_batches = std::is_same_v<typename L::accumulation_policy, accumulate::Dynamic>;

/// L's options for a choice of `parts` micro-batches a batch: as many accumulation steps more.
template <class L>
typename L::Options with_micro_batches(typename L::Options options, std::int64_t parts) {
  if constexpr (splits_batches<L>) options.accumulate.steps *= parts;
  return options;
}

/// Steps a loop through a batch split into `parts` micro-batches (rows-weighted mean loss).
template <class L, class Batch, class LossFn>
StepResult step_parts(L& loop, const Batch& batch, LossFn&& loss_fn, std::int64_t parts) {
  if (parts == 1) return loop.step(batch, loss_fn);
  const std::int64_t rows = ::nitro::detail::batch_rows(batch);
  NITRO_CHECK(rows >= parts, "level::Auto: the batch has ", rows, " rows, fewer than the ", parts,
              " micro-batches chosen; give batches of the size it was tuned with");
  StepResult last;
  at::Tensor total;
  for (std::int64_t i = 0; i < parts; ++i) {
    const std::int64_t begin = i * rows / parts, count = (i + 1) * rows / parts - begin;
    last = loop.step(::nitro::detail::batch_slice(batch, rows, begin, count), loss_fn);
    const double share = static_cast<double>(count) / static_cast<double>(rows);
    total = total.defined() ? total.add(last.loss, share) : last.loss.mul(share);
  }
  last.loss = total;
  return last;
}

}  // namespace detail
}  // namespace nitro::tune

namespace nitro {

namespace tune::detail {

/// Tuning over the candidate list Cs: trials, the cache, the table.
template <class... Cs>
class Tuner {
 public:
  static constexpr std::size_t count = sizeof...(Cs);
  using LoopOptions = std::tuple<typename Cs::Options...>;

  static std::vector<std::string> names() { return {loop_name<Cs>()...}; }
  /// Whether candidate i can split its batches (splits_batches).
  static bool accumulates(std::size_t i) {
    bool dynamic = false;
    with_index<count>(i, [&]<std::size_t I>() { dynamic = splits_batches<std::tuple_element_t<I, std::tuple<Cs...>>>; });
    return dynamic;
  }
  static std::vector<std::string> types() { return {std::string(typeid(Cs).name())...}; }

  Tuner(const ModelRef& model, torch::optim::Optimizer& optimizer, const LoopOptions& loops, const Options& o)
      : model_(model), optimizer_(optimizer), loops_(loops), o_(o), names_(names()) {
    if (!o_.log) o_.log = default_log;
  }

  template <class MakeBatch, class LossFn>
  Result run(MakeBatch& make_batch, LossFn& loss_fn) {
    validate(o_);
    const auto start = std::chrono::steady_clock::now();
    const Mode mode = mode_of(o_);
    const auto& list = names_;
    Result r;
    if (mode == Mode::off) {
      r.choice = Choice{};
      r.source = "off";
      r.name = describe(list[0], r.choice);
      o_.log("NITRO_AUTOTUNE or Options::mode is off: " + r.name + ", no trials");
      return r;
    }
    // The batches, drawn once; the data's position and the generators the drawing used put back after.
    memory::StateBackup generators(nullptr, nullptr);
    std::function<void()> put_data_back;
    if (o_.keep_data) put_data_back = o_.keep_data();
    using Batch = std::remove_cvref_t<std::invoke_result_t<MakeBatch&>>;
    std::vector<Batch> batches;
    for (int i = 0; i < o_.batches; ++i) {
      try {
        batches.push_back(make_batch());
      } catch (const std::exception& e) {
        if (put_data_back) put_data_back();
        generators.restore();
        ::nitro::detail::fail("nitro::autotune: the batch maker threw while drawing batch ", i + 1, " of ",
                              o_.batches, ": ", e.what(), "; give a make_batch() that returns a batch");
      }
    }
    if (put_data_back) put_data_back();
    generators.restore();
    torch::nn::Module& model = *model_.module;
    device_ = model_device(model);
    rows_ = ::nitro::detail::batch_rows(batches.front());
    NITRO_CHECK(rows_ >= 1, "nitro::autotune: the batch has no tensor with rows (dimension 0); give the batch a step "
                "trains on");
    const std::string key = cache_key(model, optimizer_, batches.front(), list, types(), o_, device_);
    if (!o_.cache_dir.empty()) r.cache_file = o_.cache_dir / (hex(hash_text(key)) + ".txt");
    if (mode == Mode::automatic && !r.cache_file.empty()) {
      std::string why;
      if (auto cached = read_cache(r.cache_file, key, count, list, has_fused_version(optimizer_), why)) {
        r.choice = *cached;
        r.source = "cache";
        r.name = describe(list[r.choice.candidate], r.choice);
        o_.log("the cached choice for this model, batch and machine: " + r.name + " (" + r.cache_file.string() +
               "; NITRO_AUTOTUNE=force tunes again)");
        return r;
      }
      if (!why.empty())
        o_.log("ignored the cache file " + r.cache_file.string() + ": " + why + "; tuning again");
    }
    tune(batches, loss_fn, r);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.source = "tuned";
    if (o_.print_table) o_.log(r.table());
    if (!r.cache_file.empty()) {
      double best = 0;
      for (const auto& t : r.trials)
        if (t.ok && t.choice == r.choice) best = t.samples_per_s;
      write_cache(r.cache_file, key, r.choice, list[r.choice.candidate], best, o_.log);
    }
    return r;
  }

 private:
  template <class Batch, class LossFn>
  void tune(const std::vector<Batch>& batches, LossFn& loss_fn, Result& r) {
    torch::nn::Module& model = *model_.module;
    const auto& list = names_;
    const int threads_now = at::get_num_threads();
    const bool conv = has_conv_weights(model);
    const bool fusable = has_fused_version(optimizer_);
    NITRO_CHECK(!(o_.fused_optimizer.value_or(false) && !fusable), "nitro::autotune: fused_optimizer is true, but the "
                "optimizer has no fused version (optim/fused.hpp has SGD, Adam and AdamW) or is fused already");
    Choice base;
    base.channels_last = o_.channels_last.value_or(false);
    base.fused_optimizer = o_.fused_optimizer.value_or(false);
    memory::StateBackup backup(&model, &optimizer_);
    double best_ms = 0;
    const auto better = [&](const Trial& t) { return t.ok && (best_ms == 0 || t.step_ms < best_ms); };
    std::optional<Choice> best;
    // Each candidate as given.
    for (std::size_t i = 0; i < count; ++i) {
      Choice c = base;
      c.candidate = i;
      Trial t = trial(c, batches, loss_fn, backup, best_ms);
      // A Dynamic candidate that ran out of memory: split the batch.
      if (t.verdict == "out of memory" && accumulates(i)) {
        r.trials.push_back(t);
        for (c.micro_batches = 2; c.micro_batches <= std::min(o_.max_micro_batches, rows_); c.micro_batches *= 2) {
          t = trial(c, batches, loss_fn, backup, best_ms);
          if (t.verdict != "out of memory") break;
          r.trials.push_back(t);
        }
        if (t.verdict == "out of memory") continue;
      }
      // A candidate that cannot step the optimizer as given (graph::Capture, level::Max, needs a fused
      // one): tried again with the fused copy, unless Options::fused_optimizer says otherwise.
      if (t.verdict.rfind("error: ", 0) == 0 && fusable && !o_.fused_optimizer && !c.fused_optimizer) {
        r.trials.push_back(t);
        c.fused_optimizer = true;
        t = trial(c, batches, loss_fn, backup, best_ms);
      }
      if (better(t)) best_ms = t.step_ms, best = c;
      r.trials.push_back(std::move(t));
    }
    if (!best) {
      ::nitro::detail::fail("nitro::autotune: no candidate could train this model on ", device_name(device_),
                            " (each ran out of memory, threw or gave a non-finite loss):\n",
                            Result{Choice{count}, "none", "tuned", r.trials}.table());
    }
    // The runtime choices on the fastest, one at a time, each kept when faster.
    const auto vary = [&](auto change) {
      Choice c = *best;
      change(c);
      if (c == *best) return;
      Trial t = trial(c, batches, loss_fn, backup, best_ms);
      if (better(t)) best_ms = t.step_ms, best = c;
      r.trials.push_back(std::move(t));
    };
    if (conv && !o_.channels_last) vary([](Choice& c) { c.channels_last = !c.channels_last; });
    if (fusable && !o_.fused_optimizer) vary([](Choice& c) { c.fused_optimizer = true; });
    if (device_.is_cpu()) {
      std::vector<int> threads = o_.cpu_threads;
      if (threads.empty() && threads_now >= 2) threads = {threads_now / 2};
      for (const int n : threads)
        if (n != threads_now) vary([&](Choice& c) { c.cpu_threads = n; });
    }
    r.choice = *best;
    r.name = describe(list[r.choice.candidate], r.choice);
  }


  template <class Batch, class LossFn>
  Trial trial(const Choice& c, const std::vector<Batch>& batches, LossFn& loss_fn, memory::StateBackup& backup,
              double best_ms) {
    Trial t;
    t.choice = c;
    const auto& list = names_;
    t.name = describe(list[c.candidate], c);
    with_index<count>(c.candidate, [&]<std::size_t I>() {
      using L = std::tuple_element_t<I, std::tuple<Cs...>>;
      run_trial<L>(std::get<I>(loops_), t, batches, loss_fn, backup, best_ms);
    });
    return t;
  }

  template <class L, class Batch, class LossFn>
  void run_trial(typename L::Options options, Trial& t, const std::vector<Batch>& batches, LossFn& loss_fn,
                 memory::StateBackup& backup, double best_ms) {
    using Clock = std::chrono::steady_clock;
    torch::nn::Module& model = *model_.module;
    const Choice& c = t.choice;
    const int threads_before = at::get_num_threads();
    std::optional<LayoutChange> layout;
    std::unique_ptr<torch::optim::Optimizer> fused;
    std::vector<double> ms;
    std::vector<at::Tensor> losses;
    std::int64_t samples_per_unit = rows_;
    try {
      options = with_micro_batches<L>(std::move(options), c.micro_batches);
      if (c.cpu_threads > 0) at::set_num_threads(c.cpu_threads);
      std::optional<hw::ScopedSettings> hardware;
      if (o_.hardware) hardware.emplace(level::hardware<L>());
      if (c.channels_last) layout.emplace(model);
      if (c.fused_optimizer) fused = make_fused(optimizer_);
      torch::optim::Optimizer& opt = fused ? *fused : optimizer_;
      // The CPU peak (and budget): every thread's allocations count while it is open (a prefetcher's too).
      std::optional<memory::ScopedCpuTracking> tracking;
      if (device_.is_cpu()) tracking.emplace(memory::TrackingOptions{.budget_bytes = o_.memory_budget_bytes});
#if NITRO_WITH_CUDA
      if (device_.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
#endif
      std::optional<L> loop;
      model_.build(loop, opt, options);
      // One timed unit: a whole accumulation window (its optimizer step included).
      const std::int64_t window = std::max<std::int64_t>(1, loop->accumulation_steps() / c.micro_batches);
      std::size_t next = 0;
      const auto one = [&] {
        at::Tensor loss;
        for (std::int64_t k = 0; k < window; ++k)
          loss = step_parts(*loop, batches[next++ % batches.size()], loss_fn, c.micro_batches).loss;
        return loss;
      };
      samples_per_unit = rows_ * window;
      bool stopped = false;
      for (int i = 0; i < o_.warmup_steps && !stopped; ++i) {
        const auto t0 = Clock::now();
        losses.push_back(one());
        synchronize(device_);
        // The last warm-up step already far slower than the best (twice the prune factor): stop.
        const double step_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (i + 1 == o_.warmup_steps && i > 0 && o_.prune_after > 0 && best_ms > 0 && step_ms > 2 * o_.prune * best_ms) {
          ms.push_back(step_ms);
          t.verdict = "slower (stopped in its warm-up)";
          stopped = true;
        }
      }
      for (int i = 0; i < o_.timed_steps && !stopped; ++i) {
        const auto t0 = Clock::now();
        losses.push_back(one());
        synchronize(device_);
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        if (o_.prune_after > 0 && i + 1 == o_.prune_after && best_ms > 0 && i + 1 < o_.timed_steps &&
            median(ms) > o_.prune * best_ms) {
          t.verdict = "slower (stopped after " + std::to_string(i + 1) + " timed steps)";
          break;
        }
      }
      if (tracking) t.peak_bytes = tracking->stats().peak_bytes;
#if NITRO_WITH_CUDA
      if (device_.is_cuda()) {
        const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
        t.peak_bytes = stats.allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
        if (o_.memory_budget_bytes > 0 && t.peak_bytes > o_.memory_budget_bytes) t.verdict = "out of memory";
      }
#endif
      const bool finite = at::stack(losses).isfinite().all().item<bool>();
      t.steps_timed = static_cast<int>(ms.size());
      t.step_ms = median(ms);
      t.samples_per_s = static_cast<double>(samples_per_unit) / (t.step_ms / 1000.0);
      if (!finite) t.verdict = "non-finite loss";
      else if (t.verdict.empty()) t.verdict = "ok", t.ok = true;
    } catch (const std::exception& e) {
      t.ok = false;
      t.steps_timed = 0;
      if (memory::is_out_of_memory(e)) {
        t.verdict = "out of memory";
      } else {
        std::string what = e.what();
        what = what.substr(0, what.find('\n'));
        if (what.size() > 160) what = what.substr(0, 157) + "...";
        t.verdict = "error: " + what;
      }
    }
    // Put back: the loop is gone; the layout, the state, the threads.
    if (layout) layout->undo();
    backup.restore();
    at::set_num_threads(threads_before);
    memory::detail::release_cached_memory();
  }

  static double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  }

  ModelRef model_;
  torch::optim::Optimizer& optimizer_;
  const LoopOptions& loops_;
  Options o_;
  c10::Device device_{c10::kCPU};
  std::int64_t rows_ = 0;
  std::vector<std::string> names_;  // the candidates' names, in order
};

template <class M>
ModelRef model_ref(const M& model) {
  if constexpr (std::is_convertible_v<const M&, std::shared_ptr<torch::nn::Module>>) {
    return {std::shared_ptr<torch::nn::Module>(model), std::nullopt};
  } else if constexpr (std::is_base_of_v<torch::nn::SequentialImpl, typename M::ContainedType>) {
    return {model.ptr(), torch::nn::Sequential(model.ptr())};
  } else {
    return {model.ptr(), std::nullopt};
  }
}

}  // namespace tune::detail

/// Tries the candidate loop types (and the runtime choices, see the top of this file) on the model
/// with batches from `make_batch()` and `loss_fn` as TrainingLoop::step takes it, puts everything
/// back, and returns what it measured and chose. `model` as a TrainingLoop takes it.
///   auto r = nitro::autotune<nitro::level::Basic, nitro::level::Advanced>(model, optimizer,
///                                                                          [&] { return batch; }, loss_fn);
template <class... Candidates, class Model, class MakeBatch, class LossFn>
tune::Result autotune(const Model& model, torch::optim::Optimizer& optimizer, MakeBatch&& make_batch, LossFn&& loss_fn,
                      const tune::Options& options = {},
                      const std::tuple<typename Candidates::Options...>& loop_options = {}) {
  static_assert(sizeof...(Candidates) >= 1, "nitro::autotune<Candidates...>: the candidate list is empty; give the "
                "loop types to try, e.g. nitro::autotune<nitro::level::Basic, nitro::level::Advanced>(...)");
  static_assert((tune::detail::is_training_loop<Candidates> && ...),
                "nitro::autotune<Candidates...>: each candidate must be a TrainingLoop type (level::Basic, "
                "level::Advanced, level::Ultra, level::with<...>, TrainingLoop<...>)");
  static_assert(std::is_invocable_v<MakeBatch&>, "nitro::autotune: make_batch must be callable with no arguments and "
                "return a batch, e.g. [&] { return batch; }");
  tune::detail::Tuner<Candidates...> tuner(tune::detail::model_ref(model), optimizer, loop_options, options);
  return tuner.run(make_batch, loss_fn);
}

namespace level {

/// The loop that picks its level (see the top of this file): holds the winner among Candidates, a
/// std::variant of the loop types, and forwards step, flush, state, monitor, hooks to it (one
/// std::visit a step).
template <class... Candidates>
class Auto {
  static_assert(sizeof...(Candidates) >= 1, "level::Auto<Candidates...>: the candidate list is empty; give the loop "
                "types to try, e.g. level::Auto<level::Basic, level::Advanced>");
  static_assert((tune::detail::is_training_loop<Candidates> && ...),
                "level::Auto<Candidates...>: each candidate must be a TrainingLoop type (level::Basic, "
                "level::Advanced, level::Ultra, level::with<...>, TrainingLoop<...>)");
  static_assert(tune::detail::distinct_types<Candidates...>, "level::Auto<Candidates...>: a candidate is listed twice");
  using Tuner = tune::detail::Tuner<Candidates...>;
  static constexpr bool same_monitor =
      (std::is_same_v<typename Candidates::monitor_policy,
                      typename std::tuple_element_t<0, std::tuple<Candidates...>>::monitor_policy> &&
       ...);

 public:
  /// The number of candidates.
  static constexpr std::size_t candidates = sizeof...(Candidates);
  /// The loop types, in order (the index of tune::Choice::candidate).
  using candidate_types = std::tuple<Candidates...>;

  /// The loop's knobs: tuning, and each candidate's own options.
  struct Options {
    /// How to tune (tune::Options).
    tune::Options tune{};
    /// Each candidate's options, in the order of the list.
    std::tuple<typename Candidates::Options...> loops{};
  };
  /// The winner's State (std::monostate before it is chosen).
  using State = std::variant<std::monostate, typename Candidates::State...>;

  /// A loop over `model` stepping `optimizer` (the user's; the loop may step a fused copy), with
  /// default Options; nothing is tried until the first step. Throws nitro::Error when the model is null.
  Auto(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer)
      : Auto(std::move(model), optimizer, Options{}) {}
  /// As above, with Options.
  Auto(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer, Options options)
      : model_{std::move(model), std::nullopt}, user_(&optimizer), o_(std::move(options)) {
    NITRO_CHECK(model_.module != nullptr, "level::Auto: the model is null");
  }
  template <class Impl>
  /// A loop over a module holder (e.g. a torch::nn::Sequential, which a checkpointed candidate needs),
  /// with default Options; nothing is tried until the first step.
  Auto(const torch::nn::ModuleHolder<Impl>& model, torch::optim::Optimizer& optimizer)
      : Auto(model, optimizer, Options{}) {}
  template <class Impl>
  /// As above, with Options.
  Auto(const torch::nn::ModuleHolder<Impl>& model, torch::optim::Optimizer& optimizer, Options options)
      : model_(tune::detail::model_ref(model)), user_(&optimizer), o_(std::move(options)) {}

  Auto(const Auto&) = delete;
  Auto& operator=(const Auto&) = delete;

  /// Tunes now with batches from make_batch() (see nitro::autotune) and adopts the choice. Once only:
  /// a tuned loop is a nitro::Error.
  template <class MakeBatch, class LossFn>
  const tune::Result& tune(MakeBatch&& make_batch, LossFn&& loss_fn) {
    NITRO_CHECK(!chosen(), "level::Auto::tune: the loop has chosen already (", result_.name, "); tune a new one");
    Tuner tuner(model_, *user_, o_.loops, o_.tune);
    auto result = tuner.run(make_batch, loss_fn);
    adopt(result.choice);
    result_ = std::move(result);
    return result_;
  }

  /// Takes a choice without trials (one a tune::Result or a snapshot holds). Before the first step only.
  void adopt(const tune::Choice& c) {
    NITRO_CHECK(!chosen(), "level::Auto::adopt: the loop has chosen already (", result_.name, "); adopt into a new one");
    NITRO_CHECK(c.candidate < candidates, "level::Auto::adopt: candidate ", c.candidate, " is not in the list of ",
                candidates);
    NITRO_CHECK(c.cpu_threads >= 0 && c.micro_batches >= 1, "level::Auto::adopt: cpu_threads must be >= 0 and "
                "micro_batches >= 1, got ", c.cpu_threads, " and ", c.micro_batches);
    const auto list = Tuner::names();
    NITRO_CHECK(c.micro_batches == 1 || Tuner::accumulates(c.candidate), "level::Auto::adopt: micro_batches > 1 "
                "needs a candidate with accumulate::Dynamic; ", list[c.candidate], " has none");
    std::unique_ptr<torch::optim::Optimizer> fused;
    if (c.fused_optimizer) {
      fused = tune::detail::make_fused(*user_);
      NITRO_CHECK(fused != nullptr, "level::Auto::adopt: the choice takes the fused optimizer, but this optimizer has "
                  "no fused version (SGD, Adam, AdamW) or is fused already");
    }
    hw::Settings settings;
    if (o_.tune.hardware) {
      tune::detail::with_index<candidates>(c.candidate, [&]<std::size_t I>() {
        settings = level::hardware<std::tuple_element_t<I, candidate_types>>();
      });
    }
    if (c.cpu_threads > 0) settings.intra_op_threads = c.cpu_threads;
    hardware_.emplace(settings);
    if (c.channels_last) to_channels_last(*model_.module);
    fused_ = std::move(fused);
    if (fused_) seen_lr_ = tune::detail::learning_rates(*user_);
    torch::optim::Optimizer& opt = fused_ ? *fused_ : *user_;
    tune::detail::with_index<candidates>(c.candidate, [&]<std::size_t I>() {
      using L = std::tuple_element_t<I, candidate_types>;
      const auto options = tune::detail::with_micro_batches<L>(std::get<I>(o_.loops), c.micro_batches);
      if (model_.sequential) loop_.template emplace<I + 1>(*model_.sequential, opt, options);
      else loop_.template emplace<I + 1>(model_.module, opt, options);
    });
    parts_ = c.micro_batches;
    if (result_.source.empty()) {
      result_.choice = c;
      result_.source = "given";
      result_.name = tune::detail::describe(list[c.candidate], c);
    }
  }

  /// One step (TrainingLoop::step). The first step of a loop that has not chosen tunes on this batch.
  template <class Batch, class LossFn>
  StepResult step(const Batch& batch, LossFn&& loss_fn) {
    if (loop_.index() == 0) [[unlikely]]
      tune([&batch]() -> const Batch& { return batch; }, loss_fn);
    if (fused_) [[unlikely]] tune::detail::copy_learning_rates(*user_, *fused_, seen_lr_);
    return visit([&](auto& loop) {
      if (parts_ == 1) [[likely]] return loop.step(batch, loss_fn);
      return tune::detail::step_parts(loop, batch, loss_fn, parts_);
    });
  }

  /// Steps on a partial accumulation window (TrainingLoop::flush); nothing before the loop has chosen, or
  /// when the window is empty.
  std::optional<StepResult> flush() {
    if (!chosen()) return std::nullopt;
    if (fused_) tune::detail::copy_learning_rates(*user_, *fused_, seen_lr_);
    return visit([](auto& loop) { return loop.flush(); });
  }

  /// Calls f with the winner (the TrainingLoop it is). nitro::Error before the loop has chosen.
  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit(
        [&](auto& alternative) -> decltype(auto) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(alternative)>, std::monostate>) {
            not_chosen();
            return f(std::get<1>(loop_));  // not reached: the same return type as the candidates'
          } else {
            return f(alternative);
          }
        },
        loop_);
  }
  /// visit() on a const loop.
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit(
        [&](const auto& alternative) -> decltype(auto) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(alternative)>, std::monostate>) {
            not_chosen();
            return f(std::get<1>(loop_));
          } else {
            return f(alternative);
          }
        },
        loop_);
  }

  /// Whether the loop has chosen (tuned, adopted, or loaded from a snapshot).
  bool chosen() const noexcept { return loop_.index() != 0; }
  /// The winner's index in the list (tune::Choice::candidate).
  std::size_t winner() const {
    if (!chosen()) not_chosen();
    return loop_.index() - 1;
  }
  /// The winner as loop type L (one of the candidates); nitro::Error when another won.
  template <class L>
  L& as() {
    auto* l = std::get_if<L>(&loop_);
    NITRO_CHECK(l != nullptr, "level::Auto::as<L>: the loop chose ", result_.name, ", not this candidate");
    return *l;
  }
  /// What was tried and chosen (after the first step, tune() or adopt()).
  const tune::Result& result() const noexcept { return result_; }
  /// The choice made (result().choice).
  const tune::Choice& choice() const noexcept { return result_.choice; }
  /// The choice in a few words, for a progress line: "auto: level::Basic + fused optimizer (cache)".
  std::string describe() const {
    return chosen() ? "auto: " + result_.name + " (" + result_.source + ")" : "auto: not chosen yet";
  }

  /// The winner's state (TrainingLoop::State) in the variant, at the winner's index + 1. nitro::Error
  /// before the loop has chosen.
  State state() const {
    State s;
    visit([&](const auto& loop) {
      constexpr std::size_t I = index_of<std::remove_cvref_t<decltype(loop)>>();
      s.template emplace<I + 1>(loop.state());
    });
    return s;
  }
  /// Puts back a state() of this loop. Throws nitro::Error when it is of another candidate (or the loop
  /// has not chosen), or the winner's load_state refuses it.
  void load_state(const State& s) {
    NITRO_CHECK(s.index() == loop_.index(), "level::Auto::load_state: the state is of another candidate (",
                s.index(), " against ", loop_.index(), "; 0 is none)");
    visit([&](auto& loop) {
      constexpr std::size_t I = index_of<std::remove_cvref_t<decltype(loop)>>();
      loop.load_state(std::get<I + 1>(s));
    });
  }

  /// The model the loop trains.
  torch::nn::Module& model() noexcept { return *model_.module; }
  /// The optimizer the winner steps: the user's, or its fused copy (the fused choice).
  torch::optim::Optimizer& optimizer() noexcept { return fused_ ? *fused_ : *user_; }
  /// Whether the winner steps a fused optimizer. nitro::Error before the loop has chosen, as the four below.
  bool fused_optimizer() const { return visit([](const auto& loop) { return loop.fused_optimizer(); }); }
  /// The winner's optimizer steps taken (TrainingLoop::optimizer_steps).
  std::int64_t optimizer_steps() const { return visit([](const auto& l) { return l.optimizer_steps(); }); }
  /// Micro-batches since the winner's last optimizer step.
  std::int64_t pending_micro_batches() const { return visit([](const auto& l) { return l.pending_micro_batches(); }); }
  /// Optimizer steps the winner skipped (inf or NaN gradients).
  std::int64_t skipped_steps() const { return visit([](const auto& l) { return l.skipped_steps(); }); }
  /// Micro-batches per optimizer step of the winner (a split choice counts each part).
  std::int64_t accumulation_steps() const { return visit([](const auto& l) { return l.accumulation_steps(); }); }

  /// The monitor's recorder, when every candidate has the same monitor policy.
  auto& monitor()
    requires(same_monitor && std::tuple_element_t<0, candidate_types>::monitor_policy::enabled)
  {
    return visit([](auto& loop) -> auto& { return loop.monitor(); });
  }
  /// Calls f on each hook object of the winner.
  template <class F>
  void for_each_hook(F&& f) {
    visit([&](auto& loop) { loop.for_each_hook(f); });
  }
  /// The winner's hook policy P; every candidate must have it.
  template <class P>
  P& hook() {
    return visit([](auto& loop) -> P& { return loop.template hook<P>(); });
  }

  // For snapshot::save and load (snapshot/snapshot.hpp): the choice as a part of the loop's.
  /// For snapshot::save, not for direct use: the choice as StateDict entries under "autotune/".
  StateDict snapshot_choice() const {
    StateDict d;
    const auto& c = result_.choice;
    d.integers["autotune/candidate"] = static_cast<std::int64_t>(c.candidate);
    d.integers["autotune/channels_last"] = c.channels_last;
    d.integers["autotune/fused_optimizer"] = c.fused_optimizer;
    d.integers["autotune/cpu_threads"] = c.cpu_threads;
    d.integers["autotune/micro_batches"] = c.micro_batches;
    d.strings["autotune/name"] = Tuner::names()[c.candidate];
    return d;
  }
  /// After snapshot::load: with the fused choice, the rates the snapshot put into the fused copy are
  /// written to the user's optimizer too, so that the next step does not take the user's older ones.
  void after_snapshot_load() {
    if (!fused_) return;
    auto& from = fused_->param_groups();
    auto& to = user_->param_groups();
    for (std::size_t i = 0; i < from.size() && i < to.size(); ++i) to[i].options().set_lr(from[i].options().get_lr());
    seen_lr_ = tune::detail::learning_rates(*user_);
  }
  /// For snapshot::load, not for direct use: takes the choice a snapshot holds, without tuning (adopt()). Throws
  /// nitro::Error when the snapshot holds none, holds a candidate not in this list, or this loop has
  /// chosen differently already.
  void adopt_snapshot_choice(const StateDict& d) {
    constexpr std::string_view owner = "level::Auto: the snapshot's loop part";
    NITRO_CHECK(d.integers.contains("autotune/candidate"), "level::Auto: the snapshot holds no autotune choice: it was "
                "saved from a TrainingLoop, not a level::Auto; load it into that loop type");
    tune::Choice c;
    const auto candidate = d.integer("autotune/candidate", owner);
    NITRO_CHECK(candidate >= 0 && static_cast<std::size_t>(candidate) < candidates && d.strings.contains("autotune/name") &&
                    d.string("autotune/name", owner) == Tuner::names()[static_cast<std::size_t>(candidate)],
                "level::Auto: the snapshot's choice (", d.strings.contains("autotune/name") ?
                d.string("autotune/name", owner) : std::string("?"), ", candidate ", candidate,
                ") is not one of this loop's candidates; load it into a level::Auto of the same list");
    c.candidate = static_cast<std::size_t>(candidate);
    c.channels_last = d.integer("autotune/channels_last", owner) != 0;
    c.fused_optimizer = d.integer("autotune/fused_optimizer", owner) != 0;
    c.cpu_threads = static_cast<int>(d.integer("autotune/cpu_threads", owner));
    c.micro_batches = d.integer("autotune/micro_batches", owner);
    if (chosen()) {
      NITRO_CHECK(c == result_.choice, "level::Auto: the snapshot was saved with ",
                  tune::detail::describe(Tuner::names()[c.candidate], c), ", this loop has chosen ", result_.name,
                  "; load it into a level::Auto before its first step");
      return;
    }
    result_ = {};
    result_.source = "snapshot";
    result_.choice = c;
    result_.name = tune::detail::describe(Tuner::names()[c.candidate], c);
    adopt(c);
  }

 private:

  template <class L>
  static constexpr std::size_t index_of() {
    std::size_t i = 0, found = 0;
    ((std::is_same_v<L, Candidates> ? (found = i, ++i) : ++i), ...);
    return found;
  }

  [[noreturn, gnu::cold]] static void not_chosen() {
    ::nitro::detail::fail("level::Auto: the loop has not chosen its candidate yet; step() (which tunes on the "
                          "first batch), tune(make_batch, loss_fn) or adopt(choice) first");
  }

  tune::detail::ModelRef model_;
  torch::optim::Optimizer* user_;
  Options o_;
  std::unique_ptr<torch::optim::Optimizer> fused_;
  std::vector<double> seen_lr_;  // the user's rates last copied to fused_
  std::optional<hw::ScopedSettings> hardware_;
  std::variant<std::monostate, Candidates...> loop_;
  std::int64_t parts_ = 1;
  tune::Result result_;
};

namespace detail {
template <class... Cs, class... More>
struct with_policies<Auto<Cs...>, More...> {
  using type = Auto<typename with_policies<Cs, More...>::type...>;
};
}  // namespace detail

}  // namespace level
}  // namespace nitro

#if !NITRO_COMPILED
#include <nitro/train/autotune-inl.hpp>
#endif
