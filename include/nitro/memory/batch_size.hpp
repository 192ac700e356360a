#pragma once
// The largest batch that fits in memory, found by trying: nitro::memory::find_max_batch_size, the
// analogue of Lightning's BatchSizeFinder, without its two known failure modes (a crash when the first
// size already runs out of memory; weights left changed by the trials).
//
//   auto found = nitro::memory::find_max_batch_size(
//       loop, [&](std::int64_t batch) { loop.step(make_batch(batch), loss_fn); },   // one training step
//       {.mode = nitro::memory::SearchMode::binsearch, .min = 8, .max = 4096, .margin = 0.1});
//   std::printf("batch %lld (%d sizes tried)\n", (long long)found.batch_size, found.trials);
//
// A trial runs the callable `trials_per_size` times at one size; it fails when it runs out of memory
// in any form (memory/oom.hpp: the caching allocator's c10::OutOfMemoryError, cuBLAS's and cuDNN's
// allocation failures, "CUDA error: out of memory", the CPU budget of ScopedCpuTracking); any other
// error reaches the caller. Between trials the finder puts back the loop (its counters, its
// accumulation window, its loss scale, its split, the state_dict of each hook policy that has one,
// its monitor's figures), the model's parameters, buffers and gradients, the optimizer's state and
// options and the random generators of the CPU and of every GPU the model is on (and the current
// one), bit for bit (StateBackup: host copies, put back in place), and empties the CUDA cache: the
// first real step after the search is the step it would have been without it. What lives elsewhere
// stays as the trials left it: a data source that make_batch reads on, a learning-rate schedule kept
// outside the optimizer, a hook policy's fields without a state_dict (memory::Watch's counts),
// graph::Capture's graphs (call its reset()), cuDNN's algorithm picks (below).
//
// Several loops stepped by one trial (a GAN's generator and critic): give them all, each is put back
// with its model and optimizer.
//
//   auto both = nitro::memory::find_max_batch_size(
//       std::tie(generator_loop, critic_loop),
//       [&](std::int64_t b) {
//         critic_loop.step(make_batch(b), critic_loss);
//         generator_loop.step(make_batch(b), generator_loss);
//       },
//       {.max = 4096});
//
// Without a TrainingLoop (a step written by hand), give the model and the optimizer to put back:
//
//   auto plain = nitro::memory::find_max_batch_size(
//       [&](std::int64_t b) { optimizer.zero_grad(); loss_fn(make_batch(b)).backward(); optimizer.step(); },
//       {.max = 4096, .model = model.ptr().get(), .optimizer = &optimizer});
//
// A TrainingLoop stepped (or flushed) in a trial whose finder was not given it is a nitro::Error, thrown
// before the loop changes: that form cannot put the loop back, and training after the search would
// differ from training without it. The check is per thread (memory/trial_loops.hpp): a loop stepped
// on another thread inside a trial is not seen.
//
// With cuDNN autotuning on, read memory/oom.hpp on the algorithms picked near the limit.
//
// Modes:
//   power      doubles from min (min, 2 min, 4 min, ..., then max) until a size fails; returns the
//              last that fit. At most ceil(log2(max / min)) + 1 trials.
//   binsearch  the exact largest size in [min, max]: tries min, then bisects between the largest size
//              known to fit and the smallest known to fail (max + 1 until one fails). At most
//              1 + ceil(log2(max - min + 1)) trials; doubling first and then bisecting would take up to
//              twice as many, each a full step at a large batch.
// The answer is then reduced by `margin` (a fraction kept free for fragmentation and longer inputs).
#include <nitro/core/config.hpp>
#include <nitro/core/device.hpp>
#include <nitro/core/error.hpp>
#include <nitro/memory/monitor.hpp>
#include <nitro/memory/oom.hpp>
#include <nitro/memory/trial_loops.hpp>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <mutex>
#include <cstdint>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if NITRO_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace nitro::memory {

namespace detail {

NITRO_INLINE at::Tensor host_copy(const at::Tensor& t);
// Puts `saved` (a host copy) back into `live` without allocating when the shapes match; else
// returns a new tensor on `device` for the caller to set.
NITRO_INLINE std::optional<at::Tensor> put_back(const at::Tensor& live, const at::Tensor& saved, c10::Device device);

// The tensors of the optimizer states LibTorch ships, as (getter, setter) pairs, and their step.
template <class S, class F>
void for_each_state_tensor(S& s, F&& f) {
  using namespace torch::optim;
  if constexpr (std::is_same_v<std::remove_const_t<S>, AdamParamState> ||
                std::is_same_v<std::remove_const_t<S>, AdamWParamState>) {
    f(s.exp_avg(), [&s](at::Tensor t) { s.exp_avg(std::move(t)); });
    f(s.exp_avg_sq(), [&s](at::Tensor t) { s.exp_avg_sq(std::move(t)); });
    f(s.max_exp_avg_sq(), [&s](at::Tensor t) { s.max_exp_avg_sq(std::move(t)); });
  } else if constexpr (std::is_same_v<std::remove_const_t<S>, SGDParamState>) {
    f(s.momentum_buffer(), [&s](at::Tensor t) { s.momentum_buffer(std::move(t)); });
  } else if constexpr (std::is_same_v<std::remove_const_t<S>, AdagradParamState>) {
    f(s.sum(), [&s](at::Tensor t) { s.sum(std::move(t)); });
  } else if constexpr (std::is_same_v<std::remove_const_t<S>, RMSpropParamState>) {
    f(s.square_avg(), [&s](at::Tensor t) { s.square_avg(std::move(t)); });
    f(s.momentum_buffer(), [&s](at::Tensor t) { s.momentum_buffer(std::move(t)); });
    f(s.grad_avg(), [&s](at::Tensor t) { s.grad_avg(std::move(t)); });
  }
}

// Calls f.template operator()<S>() with the state's type, among those above; false for another type.
template <class F>
bool with_state_type(const torch::optim::OptimizerParamState& state, F&& f) {
  using namespace torch::optim;
  const auto is = [&]<class S>() { return dynamic_cast<const S*>(&state) != nullptr; };
  if (is.template operator()<AdamWParamState>()) return f.template operator()<AdamWParamState>(), true;
  if (is.template operator()<AdamParamState>()) return f.template operator()<AdamParamState>(), true;
  if (is.template operator()<SGDParamState>()) return f.template operator()<SGDParamState>(), true;
  if (is.template operator()<AdagradParamState>()) return f.template operator()<AdagradParamState>(), true;
  if (is.template operator()<RMSpropParamState>()) return f.template operator()<RMSpropParamState>(), true;
  return false;
}

/// The name a snapshot stores a state type under (snapshot/snapshot.hpp), for the types above.
template <class S>
inline constexpr std::string_view state_type_name = std::is_same_v<S, torch::optim::AdamWParamState> ? "adamw"
                                                    : std::is_same_v<S, torch::optim::AdamParamState>  ? "adam"
                                                    : std::is_same_v<S, torch::optim::SGDParamState>   ? "sgd"
                                                    : std::is_same_v<S, torch::optim::AdagradParamState> ? "adagrad"
                                                                                                         : "rmsprop";

/// Calls f.template operator()<S>() with the state type named `name` (state_type_name); false for
/// another name.
template <class F>
bool with_state_type_named(std::string_view name, F&& f) {
  using namespace torch::optim;
  bool found = false;
  const auto one = [&]<class S>() {
    if (!found && name == state_type_name<S>) found = true, f.template operator()<S>();
  };
  one.template operator()<AdamWParamState>();
  one.template operator()<AdamParamState>();
  one.template operator()<SGDParamState>();
  one.template operator()<AdagradParamState>();
  one.template operator()<RMSpropParamState>();
  return found;
}

/// Whether the state type has a step counter (all of the above but SGD's).
template <class S>
inline constexpr bool state_has_step = !std::is_same_v<S, torch::optim::SGDParamState>;

}  // namespace detail

/// A copy of a model's parameters, buffers and gradients, an optimizer's state and options (and the
/// values and gradients of its parameters the model does not own), and the random generators, to
/// put back exactly. Copies are kept in host memory, so a search on a GPU does
/// not lose device memory to them, and are put back in place (no device allocation) when the shapes
/// still match. The states of SGD, Adam, AdamW, Adagrad and RMSprop are copied field by field; another
/// optimizer's state is serialised in LibTorch's format and loaded back, which allocates anew.
class StateBackup {
 public:
  /// Either pointer may be null (nothing of it is saved).
  NITRO_INLINE StateBackup(torch::nn::Module* model, torch::optim::Optimizer* optimizer);

  /// The devices of the model's parameters and buffers and of the optimizer's parameters, each once.
  NITRO_INLINE std::vector<c10::Device> devices() const;

  /// Puts everything back as it was when the backup was made.
  NITRO_INLINE void restore();

 private:
  struct Saved {
    at::Tensor live, value, grad;
  };
  struct SavedParamState {
    void* key;
    c10::Device device;
    std::unique_ptr<torch::optim::OptimizerParamState> state;  // its tensors are host copies
  };
  struct CpuRng {
    at::mt19937 engine;
    std::optional<float> next_float;
    std::optional<double> next_double;
  };

  NITRO_INLINE void save_optimizer();

  NITRO_INLINE void restore_optimizer();

  torch::nn::Module* model_;
  torch::optim::Optimizer* optimizer_;
  std::vector<Saved> params_, buffers_;
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options_;
  std::vector<SavedParamState> states_;
  std::optional<std::string> serialized_;
  CpuRng cpu_rng_;
  std::vector<std::pair<c10::DeviceIndex, at::Tensor>> cuda_rng_;
};

/// How find_max_batch_size searches.
enum class SearchMode { power, binsearch };

/// How find_max_batch_size searches: the mode, the range, the margin, the trials per size, and what
/// to put back after each trial.
struct BatchSizeOptions {
  SearchMode mode = SearchMode::binsearch;  ///< power (doubling) or binsearch (the exact largest size; see the top).
  /// The smallest size to consider, >= 1. If it does not fit, the finder throws nitro::Error.
  std::int64_t min = 1;
  /// The largest size to consider, >= min.
  std::int64_t max = 4096;
  /// Fraction taken off the largest fitting size, in [0, 1): 0.1 returns 90% of it (never below min).
  double margin = 0.0;
  /// Calls of the trial per size, >= 1; all must fit. Two catch what the first step allocates lazily
  /// (optimizer state, cuDNN workspaces) that the second then needs on top.
  int trials_per_size = 2;
  /// Put back after every trial (either may be null: the caller then owns what the trials change).
  torch::nn::Module* model = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;  ///< Put back after every trial, as `model` (null: not put back).
};

/// One size tried.
struct BatchSizeTrial {
  std::int64_t batch_size = 0;  ///< The size tried.
  bool fit = false;             ///< Every call at that size ran without running out of memory.
  double seconds = 0;           ///< Wall time of the size's calls, the state put back included.
};

/// What find_max_batch_size found, and how.
struct BatchSizeResult {
  /// The answer: the largest fitting size found, less the margin.
  std::int64_t batch_size = 0;
  /// The largest size that fit (before the margin).
  std::int64_t largest_fit = 0;
  /// The smallest size that ran out of memory; -1 when none did (max fits).
  std::int64_t first_failure = -1;
  /// Sizes tried, and trial calls made.
  int trials = 0;
  int calls = 0;        ///< Calls of the trial callable, all sizes together.
  double seconds = 0;   ///< Wall time of the whole search.
  std::vector<BatchSizeTrial> history;  ///< Every size tried, in the order tried.
};

namespace detail {
NITRO_INLINE void release_cached_memory();
}  // namespace detail

namespace detail {

// The search; `restore_more()` runs after every trial, after the StateBackup. `loops`: those the
// trials may step (TrainingLoop::step checks), the ones restore_more() puts back.
template <class Trial, class RestoreMore>
BatchSizeResult search_batch_size(Trial& trial, const BatchSizeOptions& o, const TrialLoops& loops,
                                  RestoreMore&& restore_more) {
  NITRO_CHECK(o.min >= 1, "find_max_batch_size: min must be >= 1, got ", o.min);
  NITRO_CHECK(o.max >= o.min, "find_max_batch_size: max (", o.max, ") must be >= min (", o.min, ")");
  NITRO_CHECK(o.margin >= 0.0 && o.margin < 1.0, "find_max_batch_size: margin must be in [0, 1) (a fraction), got ",
              o.margin);
  NITRO_CHECK(o.trials_per_size >= 1, "find_max_batch_size: trials_per_size must be >= 1, got ", o.trials_per_size);

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  BatchSizeResult result;
  StateBackup backup(o.model, o.optimizer);
  std::string first_error;
  const auto put_back = [&] {
    backup.restore();
    restore_more();
  };

  // Runs one size; true when it fit.
  const auto fits = [&](std::int64_t size) {
    const auto t0 = Clock::now();
    bool fit = true;
    try {
      const TrialScope in_trial(loops);  // ends before the state is put back, on every exit
      for (int i = 0; i < o.trials_per_size; ++i) {
        ++result.calls;
        trial(size);
      }
    } catch (const std::exception& e) {
      if (!is_out_of_memory(e)) {  // a shape error, a bug: the caller's, after the state is put back
        put_back();
        throw;
      }
      fit = false;
      if (first_error.empty()) first_error = error_message(e);
    } catch (...) {
      put_back();
      throw;
    }
    put_back();
    release_cached_memory();
    ++result.trials;
    result.history.push_back({size, fit, std::chrono::duration<double>(Clock::now() - t0).count()});
    if (fit) {
      result.largest_fit = std::max(result.largest_fit, size);
    } else if (result.first_failure < 0 || size < result.first_failure) {
      result.first_failure = size;
    }
    return fit;
  };

  if (!fits(o.min)) {
    // The memory of the model's GPU, not of whichever is current.
    std::optional<int> gpu;
    for (const auto& d : backup.devices())
      if (d.is_cuda() && !gpu) gpu = d.index();
    const auto first_line = first_error.substr(0, first_error.find('\n'));
    ::nitro::detail::fail("find_max_batch_size: the smallest batch size, min = ", o.min,
                 ", already runs out of memory (", first_line, "); memory now: ", to_string(snapshot(gpu)),
                 ". Lower min, free memory held elsewhere, or make a step need less (checkpoint::Sqrt, bf16)");
  }
  if (o.mode == SearchMode::power) {
    std::int64_t size = o.min;
    while (size < o.max) {
      size = size > o.max / 2 ? o.max : size * 2;
      if (!fits(size)) break;
    }
  } else {
    std::int64_t lo = o.min, hi = o.max + 1;  // lo fits; hi is the smallest size known (or assumed) to fail
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (fits(mid)) lo = mid;
      else hi = mid;
    }
  }
  const auto reduced = static_cast<std::int64_t>(static_cast<double>(result.largest_fit) * (1.0 - o.margin));
  result.batch_size = std::max(o.min, reduced);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace detail

/// The largest batch size in [min, max] for which `trial(batch_size)` does not run out of memory.
/// `trial` is callable with a std::int64_t; it should run what training runs (forward, backward and
/// an optimizer step). Exceptions other than out-of-memory reach the caller (after the state is put
/// back). Throws nitro::Error when an option is invalid or min already runs out of memory.
/// For a step written by hand. A TrainingLoop stepped in a trial is a nitro::Error: this form does not
/// know the loop's state; use the overload that takes the loop.
template <class Trial>
BatchSizeResult find_max_batch_size(Trial&& trial, const BatchSizeOptions& o) {
  static_assert(std::is_invocable_v<Trial&, std::int64_t>,
                "find_max_batch_size(trial, options): trial must be callable as trial(std::int64_t batch_size)");
  return detail::search_batch_size(trial, o, detail::TrialLoops{}, [] {});
}

/// What find_max_batch_size(loop, ...) needs of the loop: its model and optimizer, and its own
/// state to save and put back (nitro::TrainingLoop).
template <class L>
concept RestorableLoop = requires(L& loop) {
  { loop.model() } -> std::convertible_to<torch::nn::Module&>;
  { loop.optimizer() } -> std::convertible_to<torch::optim::Optimizer&>;
  loop.load_state(loop.state());
};

namespace detail {

// A loop with accumulate::Adaptive: it splits a batch instead of running out of memory.
template <class L>
concept AdaptiveLoop = requires(L& loop) { loop.splits_made(); };

template <RestorableLoop... Loops, class Trial>
BatchSizeResult search_with_loops(Trial& trial, BatchSizeOptions o, Loops&... loops) {
  static_assert(std::is_invocable_v<Trial&, std::int64_t>,
                "find_max_batch_size(loop, trial, options): trial must be callable as trial(std::int64_t batch_size)");
  static_assert((!AdaptiveLoop<Loops> && ...),
                "find_max_batch_size(loop, ...): this loop has accumulate::Adaptive, which splits a batch that runs "
                "out of memory instead of failing, so every size would seem to fit; search with the same loop "
                "type without Adaptive, or let Adaptive find its split by itself");
  // The first loop's model and optimizer fill the options' empty ones (the search's own backup);
  // each other model and optimizer, once, gets a backup of its own.
  auto& first = std::get<0>(std::tie(loops...));
  if (o.model == nullptr) o.model = &first.model();
  if (o.optimizer == nullptr) o.optimizer = &first.optimizer();
  std::vector<const torch::nn::Module*> models{o.model};
  std::vector<const torch::optim::Optimizer*> optimizers{o.optimizer};
  std::vector<std::unique_ptr<StateBackup>> others;
  const auto back_up = [&](auto& loop) {
    torch::nn::Module* model = &loop.model();
    torch::optim::Optimizer* optimizer = &loop.optimizer();
    const auto seen = [](const auto& list, const auto* p) {
      return std::find(list.begin(), list.end(), p) != list.end();
    };
    if (seen(models, model)) model = nullptr;
    else models.push_back(model);
    if (seen(optimizers, optimizer)) optimizer = nullptr;
    else optimizers.push_back(optimizer);
    if (model != nullptr || optimizer != nullptr) others.push_back(std::make_unique<StateBackup>(model, optimizer));
  };
  (back_up(loops), ...);
  // Each loop's own state, and its monitor's figures, so trial steps count nowhere.
  std::vector<std::function<void()>> put_back;
  const auto keep = [&](auto& loop) {
    if constexpr (requires { loop.monitor().load_state(loop.monitor().state()); }) {
      put_back.push_back([&loop, saved = loop.state(), monitor = loop.monitor().state()] {
        loop.load_state(saved);
        loop.monitor().load_state(monitor);
      });
    } else {
      put_back.push_back([&loop, saved = loop.state()] { loop.load_state(saved); });
    }
  };
  (keep(loops), ...);
  const void* const addresses[] = {static_cast<const void*>(&loops)...};
  return search_batch_size(trial, o, TrialLoops{addresses, sizeof...(Loops)}, [&] {
    for (auto& backup : others) backup->restore();
    for (auto& f : put_back) f();
  });
}

}  // namespace detail

/// The same search around a TrainingLoop: after every trial the loop's model and optimizer (and the
/// options', if they are others) and the loop's own state are put back (and its monitor's figures, so
/// trial steps count nowhere). The trial may step and flush this loop only (others are a nitro::Error).
///   auto found = find_max_batch_size(loop, [&](std::int64_t b) { loop.step(batch_of(b), loss_fn); }, {.max = 1024});
template <RestorableLoop Loop, class Trial>
BatchSizeResult find_max_batch_size(Loop& loop, Trial&& trial, BatchSizeOptions o) {
  return detail::search_with_loops(trial, std::move(o), loop);
}

/// The same around several TrainingLoops that one trial steps (a GAN's generator and critic), given
/// as std::tie(loop_a, loop_b): every loop, its model and its optimizer (and the options', if they are
/// others) are put back after every trial, each model and optimizer once.
///   auto found = find_max_batch_size(std::tie(g, d), [&](std::int64_t b) { d.step(...); g.step(...); }, {.max = 1024});
template <RestorableLoop... Loops, class Trial>
  requires(sizeof...(Loops) >= 1)
BatchSizeResult find_max_batch_size(std::tuple<Loops&...> loops, Trial&& trial, BatchSizeOptions o) {
  return std::apply([&](Loops&... each) { return detail::search_with_loops(trial, std::move(o), each...); }, loops);
}

}  // namespace nitro::memory

#if !NITRO_COMPILED
#include <nitro/memory/batch_size-inl.hpp>
#endif
