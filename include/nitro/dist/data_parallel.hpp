#pragma once
// nitro::dist::DataParallel: PyTorch's DistributedDataParallel for a TrainingLoop, as a hook policy.
//
//   auto world = nitro::dist::ProcessGroup::from_environment();          // torchrun's ranks
//   using Loop = nitro::TrainingLoop<nitro::amp::Bf16, nitro::clip::Norm, nitro::dist::DataParallel>;
//   Loop loop{model, optimizer, {.clip = {.max_norm = 1.0}, .hooks = {{.group = world}}}};
//   // each rank steps on its own shard of the data (dist::DistributedSampler); the gradients are
//   // averaged over the ranks during backward, so every rank steps with the same gradient.
//
// The engine is DDP's own: c10d::Reducer from libtorch_cpu, driven from C++ as Python's
// DistributedDataParallel drives it (torch/nn/parallel/distributed.py). It hooks each parameter's
// gradient accumulator; as soon as every gradient of a bucket is ready during backward, the bucket
// (its gradients copied into one flat tensor) is all-reduced asynchronously while backward goes on,
// and at the end of backward the averaged gradients are written back to .grad. Buckets as DDP makes
// them: the first step runs with one bucket (find_unused_parameters off), then the Reducer rebuilds
// them in the order the gradients really arrived, the first `first_bucket_mib` (1 MiB) so that
// communication starts early, the others up to `bucket_mib` (25 MiB); with find_unused_parameters on,
// those sizes from the start, in reverse registration order. The all-reduce is Nitro's communication
// hook on the Reducer (AllReduceMean below): it divides by the world size and all-reduces, as DDP's
// default does, and also counts the calls and turns a failed collective into a nitro::Error naming
// this rank, which backward() then throws.
//
// At the first step (every rank takes it): the ranks' models are compared by parameter and buffer
// names, shapes and dtypes (a difference fails on every rank, naming the first one), rank 0's
// parameters and buffers are broadcast to all, and c10d's own verify_params_across_processes runs.
// Before the forward that follows a synchronised one (every forward without accumulation, the first
// of each window with it) rank 0's buffers (BatchNorm's statistics) are broadcast, as DDP's
// broadcast_buffers does (Options::broadcast_buffers).
//
// With the loop's other policies:
// - accumulation (accumulate::Fixed, Dynamic): the micro-batches before the last of a window do not
//   synchronise (DDP's no_sync): their gradients add up locally, and the last micro-batch's backward
//   all-reduces the sum, once per optimizer step. loop.flush() on a partial window all-reduces the
//   gradients there (every rank must call it). accumulate::Adaptive is refused (a rank that splits a
//   batch would call backward more often than the others).
// - amp::Fp16: the scaled gradients are averaged, then unscaled and checked: an inf on one rank
//   becomes inf or NaN on all, so every rank skips the step and lowers the scale together.
// - clip::Norm: every rank clips the same averaged gradients: the same norm everywhere.
// - graph::Capture is refused (the Reducer's hooks are host work during backward).
// - snapshots: the hook's state is the world size; resuming with another one is a nitro::Error. Only
//   rank 0 writes snapshots (snapshot::Policy asks is_main_process()); every rank loads the same file.
//
// dist::Local (no data parallelism, the default) is a hook with no members: it costs nothing.
#include <nitro/core/config.hpp>
#include <nitro/core/concepts.hpp>
#include <nitro/core/error.hpp>
#include <nitro/core/state_dict.hpp>
#include <nitro/dist/process_group.hpp>
#include <nitro/train/accumulate.hpp>
#include <nitro/train/hooks.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/nn/module.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstddef>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nitro::dist {

/// No data parallelism: a hook without members, so the loop calls nothing.
struct Local {
  /// The policy family this belongs to (a hook of TrainingLoop).
  using family = nitro::family::Hook;
  /// Name shown in reports (the same as DataParallel's: a loop has one or the other).
  static constexpr std::string_view name = "dist";
  /// Off: the loop never calls it.
  static constexpr bool enabled = false;
  /// No knobs.
  struct Options {};
  /// Made by the loop; does nothing.
  explicit Local(const Options&) noexcept {}
};

namespace detail {

/// The Reducer's communication hook: the bucket divided by the world size and all-reduced (DDP's
/// default), counted, and a failure turned into a nitro::Error that backward() rethrows.
class AllReduceMean final : public c10d::CommHookInterface {
 public:
  NITRO_INLINE AllReduceMean(ProcessGroup group, std::shared_ptr<std::atomic<std::int64_t>> calls);

  NITRO_INLINE c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override;

  NITRO_INLINE at::Tensor parseHookResult(const c10::IValue& result) override;

 private:
  ProcessGroup group_;
  std::shared_ptr<std::atomic<std::int64_t>> calls_;
};

/// "name shape dtype" of every parameter (then buffer) of a model, one per line, for comparing ranks.
NITRO_INLINE std::vector<std::string> model_signature(const torch::nn::Module& model);

NITRO_INLINE std::string join_lines(const std::vector<std::string>& lines);

NITRO_INLINE std::vector<std::string> split_lines(const std::string& text);

inline std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
inline std::string text(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }

inline std::atomic<std::int64_t> data_parallel_started{0};

}  // namespace detail

/// Data parallelism over a ProcessGroup, as a TrainingLoop hook policy; see the top of this header.
class DataParallel {
 public:
  /// The policy family this belongs to (a hook of TrainingLoop).
  using family = nitro::family::Hook;
  /// Name shown in reports, and the key of its state (the world size) in snapshots.
  static constexpr std::string_view name = "dist";
  /// On: the loop calls its hooks.
  static constexpr bool enabled = true;
  /// The knobs.
  struct Options {
    /// The processes training together (required).
    std::optional<ProcessGroup> group;
    /// Bucket size in MiB (DDP's bucket_cap_mb), in (0, 65536].
    double bucket_mib = 25.0;
    /// The first bucket's size in MiB, in (0, bucket_mib] (DDP's 1 MiB).
    double first_bucket_mib = 1.0;
    /// Broadcast rank 0's buffers before the forward that follows a synchronised one (DDP's broadcast_buffers).
    bool broadcast_buffers = true;
    /// Parameters that get no gradient in a step are found by walking the graph from the loss (DDP's
    /// find_unused_parameters; costs a graph walk per step). Off: every parameter that requires a
    /// gradient must get one in every synchronised backward.
    bool find_unused_parameters = false;
  };

  /// Throws nitro::Error when group is not set, bucket_mib is not in (0, 65536], or first_bucket_mib is
  /// not in (0, bucket_mib].
  NITRO_INLINE explicit DataParallel(const Options& options);
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// Hook, called by the loop before each forward: at the first step compares the ranks' models,
  /// broadcasts rank 0's parameters and buffers and makes the Reducer; then prepares a synchronised step
  /// at the last micro-batch of a window and broadcasts rank 0's buffers. Throws nitro::Error when the
  /// models differ, a collective fails, or find_unused_parameters meets a checkpoint policy.
  template <class Loop>
  void on_step_begin(Loop& loop) {
    static_assert(!detail_has_runner<Loop>(), "dist::DataParallel cannot be combined with graph::Capture: the "
                  "Reducer's gradient hooks are host work during backward, which a captured graph would skip");
    static_assert(!nitro::detail::SplitsOnOom<typename Loop::accumulation_policy>,
                  "dist::DataParallel cannot be combined with accumulate::Adaptive: a rank that splits its batch "
                  "would run more backward passes than the others; use accumulate::Fixed or Dynamic");
    if (!reducer_) {
      // The graph walk of find_unused_parameters marks parameters unused that a checkpointed segment's
      // recomputation then makes ready again: c10d's Reducer fails ("mark a variable ready only once").
      NITRO_CHECK(!(Loop::checkpoint_policy::enabled && o_.find_unused_parameters),
                  "dist::DataParallel: find_unused_parameters cannot be combined with a checkpoint policy (the "
                  "recomputed segments' gradients arrive after the search for unused parameters); use checkpoint::Off "
                  "or give every parameter a gradient in every step");
      start(loop.model());
    }
    // The last synchronised backward never finished (the step threw in between): its reduction is
    // dropped, as the loop drops that window's gradients.
    if (reducing_) {
      reducer_->reset_state();
      reducing_ = false;
    }
    sync_ = loop.pending_micro_batches() + 1 >= loop.accumulation_steps();
    if (!at::GradMode::is_enabled()) sync_ = false;
    guarded("starting a synchronised step", [&] {
      if (sync_) reducer_->prepare_for_forward();
      // As DDP before every forward with gradients: after the first step, one rebuild of the buckets
      // in the order the gradients arrived (two broadcasts from rank 0); later a check that costs nothing.
      if (at::GradMode::is_enabled() && reducer_->rebuild_buckets())
        bucket_count_ = reducer_->get_grad_buckets(/*return_zero_tensors=*/true).size();
    });
    // As DDP: rank 0's buffers before the forward that follows a synchronised one (the first forward
    // of each accumulation window, every forward without accumulation).
    if (o_.broadcast_buffers && !buffers_.empty() && group().size() > 1 && last_synced_) broadcast(buffer_views_);
    last_synced_ = sync_;
  }

  /// Hook, called by the loop after the forward: readies the Reducer for the backward of a synchronised
  /// step (with find_unused_parameters, walking the graph from `loss`).
  template <class Loop>
  void after_forward(Loop&, const at::Tensor& loss) {
    if (!sync_) return;
    guarded("preparing the gradients' all-reduce", [&] {
      if (o_.find_unused_parameters) {
        reducer_->prepare_for_backward({loss});
      } else {
        reducer_->prepare_for_backward({});
      }
    });
    reducing_ = true;
    calls_at_round_ = calls_->load(std::memory_order_relaxed);
    ++rounds_;
  }

  /// Hook, called by the loop after the backward: checks that every bucket was all-reduced. Throws
  /// nitro::Error naming a parameter that got no gradient (or was frozen after the first step).
  template <class Loop>
  void after_backward(Loop&) {
    if (!reducing_) return;
    reducing_ = false;
    // Every bucket all-reduced once in this backward, or a parameter got no gradient: its bucket never
    // became ready, nothing of it was averaged, and the Reducer waits for it (DDP fails only at the next
    // step, with the ranks' weights already apart). Refused here, before the optimizer step.
    if (calls_->load(std::memory_order_relaxed) - calls_at_round_ < static_cast<std::int64_t>(bucket_count_)) {
      reducer_->reset_state();
      std::size_t missing = params_.size();
      for (std::size_t i = 0; i < params_.size() && missing == params_.size(); ++i)
        if (!params_[i].grad().defined()) missing = i;
      if (missing < params_.size() && !params_[missing].requires_grad()) {
        ::nitro::detail::fail("dist::DataParallel: parameter ", names_[missing], " was frozen (requires_grad false) "
                              "after the first step; DataParallel takes its parameters at the first step, so make a new "
                              "loop after freezing or unfreezing layers");
      }
      ::nitro::detail::fail("dist::DataParallel: parameter ", missing < params_.size() ? names_[missing] : "(unknown)",
                            " got no gradient in this step, so the ranks' gradients could not be averaged; set "
                            "DataParallel::Options::find_unused_parameters = true when some parameters take no part in "
                            "a step, or freeze them (requires_grad false) before the first step");
    }
  }

  /// loop.flush() on a partial window: its micro-batches did not synchronise, so the gradients are
  /// averaged here (every rank must flush together).
  template <class Loop>
  void before_flush(Loop&) {
    if (!reducer_ || group().size() == 1) return;
    // Which parameters have a gradient on some rank: those are averaged (a rank without one counts
    // zeros); one that has none anywhere keeps none, so the optimizer skips it as it would alone.
    std::vector<float> has(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) has[i] = params_[i].grad().defined() ? 1.0f : 0.0f;
    std::vector<at::Tensor> flags{at::tensor(has)};
    group().all_reduce_sum(flags, "the gradients' all-reduce at flush()");
    const auto anywhere = flags[0].contiguous();
    std::vector<at::Tensor> grads;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (anywhere.data_ptr<float>()[i] == 0.0f) continue;
      if (!params_[i].grad().defined()) params_[i].mutable_grad() = at::zeros_like(params_[i]);
      grads.push_back(params_[i].grad());
    }
    if (!grads.empty())
      calls_->fetch_add(group().average(grads, "the gradients' all-reduce at flush()"), std::memory_order_relaxed);
    ++rounds_;
  }

  /// The world size, to check on resume.
  NITRO_INLINE StateDict state_dict() const;
  /// Checks that a saved state's world size is this run's. Throws nitro::Error when it is not.
  NITRO_INLINE void load_state_dict(const StateDict& s);

  /// The process group (Options::group).
  [[nodiscard]] const ProcessGroup& group() const noexcept { return *o_.group; }
  /// All-reduce calls made so far (one per bucket per synchronised step, one per dtype at a flush).
  [[nodiscard]] std::int64_t all_reduce_calls() const noexcept { return calls_->load(std::memory_order_relaxed); }
  /// Synchronised backward passes (and flushes) so far.
  [[nodiscard]] std::int64_t sync_rounds() const noexcept { return rounds_; }
  /// The Reducer's buckets now (one until the first step is done; rebuilt by size after it).
  [[nodiscard]] std::size_t buckets() const noexcept { return bucket_count_; }
  /// Whether the first step has set up the Reducer.
  [[nodiscard]] bool started() const noexcept { return reducer_ != nullptr; }

 private:
  template <class Loop>
  static constexpr bool detail_has_runner() {
    return []<class... Hs>(std::tuple<Hs...>*) { return (nitro::detail::RunsSteps<Hs> || ...); }(
        static_cast<typename Loop::hook_policies*>(nullptr));
  }

  NITRO_INLINE void start(torch::nn::Module& model);

  // Every rank's model against rank 0's, through the store: names, shapes, dtypes. Each rank posts its
  // verdict, and every rank fails if any rank differs (naming the first difference), so that none is
  // left waiting in the broadcast that follows.
  NITRO_INLINE void compare_models(const torch::nn::Module& model);

  // In place into `tensors` (detached views: broadcast_coalesced writes them).
  NITRO_INLINE void broadcast(const std::vector<at::Tensor>& tensors);

  Options o_;
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> buffers_;
  std::vector<at::Tensor> buffer_views_;
  std::shared_ptr<std::atomic<std::int64_t>> calls_ = std::make_shared<std::atomic<std::int64_t>>(0);
  std::shared_ptr<c10d::Reducer> reducer_;  // its hooks hold `this` of the Reducer: kept while they may run
  std::shared_ptr<c10d::Logger> logger_;
  std::int64_t rounds_ = 0;
  bool sync_ = false;
  bool reducing_ = false;  // a synchronised backward was prepared and has not finished
  bool last_synced_ = true;  // the last forward was synchronised (DDP's require_forward_param_sync)
  std::int64_t calls_at_round_ = 0;
  std::size_t bucket_count_ = 0;

  template <class F>
  void guarded(std::string_view what, F&& f) {
    try {
      f();
    } catch (const Error&) {
      throw;
    } catch (...) {
      const ProcessGroup& g = group();
      ::nitro::dist::detail::rethrow_collective(what, g.rank(), g.size(), g.timeout());
    }
  }
};

}  // namespace nitro::dist

#if !NITRO_COMPILED
#include <nitro/dist/data_parallel-inl.hpp>
#endif
