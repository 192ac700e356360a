#pragma once
// graph::Capture: a TrainingLoop hook policy that records a whole training step (forward, backward,
// the loss scaler, clipping and a fused optimizer's step) into a CUDA graph once, then replays it for
// every batch of the same shape: one launch per step instead of one per kernel.
//
//   nitro::optim::FusedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   nitro::TrainingLoop<nitro::amp::Bf16, nitro::graph::Capture> loop{model, optimizer};   // or level::Max
//   for (auto& batch : prefetcher) auto r = loop.step(batch, loss_fn);                    // batches on the GPU
//
// What happens at each step, for the shape of the step: the sizes, strides and dtypes of the batch's
// tensors, the batch's type and the loss function's type (two lambdas are two shapes; one loss
// function in a std::function, or one whose captured values change, is the one captured):
//   - the first `warmup` steps of a shape (default 3) run eagerly on a side stream: they are real
//     training steps, and they make what a capture cannot (cuBLAS and cuDNN workspaces and autotuning,
//     the optimizer's state, the loss scale); a capture that finds state still missing (every warm-up
//     step skipped for inf/NaN while amp::Fp16's scale settles, a parameter group added, amsgrad
//     turned on) runs that step eagerly instead, which makes it, and captures at the next;
//   - the next one is captured (on the side stream, with a private memory pool, capture mode
//     thread-local so that a Prefetcher's threads go on working) and replayed at once;
//   - from then on the batch's tensors are copied into the graph's static input tensors and the graph
//     is replayed on the current stream.
//   Each shape gets its own graph, up to `max_graphs` (default 2: the batches of an epoch and its
//   smaller last batch); the steps of any other shape run eagerly. Graphs may update different
//   parameters (one loss function per shape, one leaving some without a gradient): each graph keeps
//   the optimizer's record of its own step (optim::FusedStep::device_step_record), made current
//   again before each of its replays, so that a replay advances the host step counters of its own
//   graph's parameters and the checks below are each graph's own. Each graph holds its own memory
//   pool (the step's activations and gradients) for as long as it lives; a capture made again (see
//   below) takes a new pool, and the old one returns to the device when the caching allocator frees
//   its cache (on a failed allocation, or c10::cuda::CUDACachingAllocator::emptyCache()). StepResult (loss, loss_scale,
//   grad_norm, stepped/skipped), the loop's counters, the hooks' after_optimizer_step and on_step_end,
//   and the monitor keep working (a replayed step's time is all in the monitor's optimizer phase: its
//   forward and backward cannot be timed apart).
//
// Requirements, checked (nitro::Error or static_assert saying what to change):
//   - a fused optimizer, optim::FusedAdam, FusedAdamW or FusedSGD: torch::optim's optimizers keep the
//     step count and bias correction on the host. The learning rate may change between steps (the
//     kernels read it from a device tensor, refreshed before each replay: set it before step() or in
//     a hook's on_step_begin; a double parameter's rate is a number in the graph: a change captures
//     again); a
//     change of any other option or of the optimizer's state tensors is seen before the next replay
//     of each graph whose step it concerns, and that graph is captured again (no warm-up needed); a
//     change of the parameters' storage (a snapshot or torch::load into the model), of which
//     parameters require gradients or of the model's train/eval mode (its root module's flag) is
//     seen before the next replay, and every graph is captured again;
//   - accumulate::Off and checkpoint::Off; hook policies with after_forward, after_backward or
//     before_optimizer_step are refused (they would run once, at capture); the clip policy is
//     captured with the step, the monitor runs around it;
//   - the model and every tensor of the batch on one GPU (a Prefetcher<Cuda> delivers them there); a
//     batch with a tensor elsewhere or an undefined tensor is an error at every step (not an eager
//     step: the cost would be silent). What else a batch holds (an int id, a string) is the captured
//     batch's at every replay: only its tensors are copied in.
//
// amp::Fp16: the inf check, the unscale (folded into the fused kernels when no clip policy reads the
// gradients first), the skip (decided on the device: the kernels leave everything as it was when
// found_inf is 1, as Python's fused optimizers do) and the scale's update are all in the graph. The
// host reads found_inf once per step after the replay, as an eager Fp16 step does, to count skipped
// steps and the optimizer's host step counters; amp::Off and Bf16 read nothing (unless skip_nonfinite).
//
// What cannot be captured (the capture fails with a nitro::Error naming the cause, and that shape
// runs eagerly from then on; any other error at a capture does the same, except running out of
// memory, which reaches the caller as it is and is tried again at the next step): anything that synchronises the host with the GPU inside the loss
// function or the model (.item(), printing or testing a CUDA tensor, torch::nonzero, boolean-mask
// indexing, copying a CUDA tensor to the CPU), CPU work whose result the GPU reads, and shapes that
// depend on the data. What the loss function reads from the host (a number captured by reference) is
// frozen at capture. The loss scaler's options (growth factor, backoff, interval) are baked in too:
// change them only through a new loop. Random numbers (dropout) come from the default CUDA
// generator, which capture_begin registers for graph-safe replay (each replay draws new numbers);
// another generator used inside the step must be listed in Options::generators.
//
// After memory::find_max_batch_size on a loop with this policy, call reset(): each trial size is a
// shape of its own. On a LibTorch built without CUDA (NITRO_WITH_CUDA 0) the policy is a compile-time
// error.
#include <nitro/core/concepts.hpp>
#include <nitro/core/config.hpp>
#include <nitro/core/device.hpp>
#include <nitro/core/error.hpp>
#include <nitro/memory/oom.hpp>
#include <nitro/optim/fused_step.hpp>
#include <nitro/train/hooks.hpp>
#include <nitro/train/training_loop.hpp>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

#if NITRO_WITH_CUDA
#include <ATen/autocast_mode.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDAEvent.h>  // at::cuda::CUDAEvent (ATen/cuda/CUDAEvent.h adds cuBLAS, cuSPARSE, cuSOLVER)
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

namespace nitro::graph {

namespace detail {

/// How a captured step is run again: a CUDA graph (graph::Capture), or, for tests on machines
/// without a GPU, the step's device work called again at each "replay" (everything but the graph).
enum class Engine { cuda_graph, direct };

template <class T>
inline constexpr bool always_false = false;

/// The tensors of a batch as a graph reads them: sizes, strides, dtype, device.
struct TensorShape {
  std::vector<std::int64_t> sizes, strides;
  c10::ScalarType dtype;
  c10::Device device;
  NITRO_INLINE bool matches(const at::Tensor& t) const;
};

#if NITRO_WITH_CUDA
/// at::cuda::CUDAGraph that can also give up a capture that threw, wherever it threw (capture_begin,
/// the step, capture_end), leaving the stream, the caching allocators and the generators as before.
class Graph final : public at::cuda::CUDAGraph {
 public:
  NITRO_INLINE void abandon(cudaStream_t stream, c10::DeviceIndex device, c10::MempoolId_t pool) noexcept;

 private:
  template <class F>
  static void quietly(F&& f) noexcept {
    try {
      f();
    } catch (...) {
    }
  }
};
#endif

#if NITRO_WITH_CUDA
/// For a scope: the side stream waits for the current stream's work so far and becomes current; at
/// the end (also by an exception) the current stream is restored and waits for the side stream's work.
class SideStream {
 public:
  NITRO_INLINE SideStream(const c10::cuda::CUDAStream& current, const c10::cuda::CUDAStream& side);
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  NITRO_INLINE ~SideStream();

 private:
  c10::cuda::CUDAStream current_, side_;
  c10::cuda::CUDAStreamGuard guard_;
};
#endif

template <Engine E>
class CaptureImpl {
  static_assert(E != Engine::cuda_graph || NITRO_WITH_CUDA,
                "graph::Capture needs a LibTorch built with CUDA (NITRO_WITH_CUDA is 0): CUDA graphs capture GPU "
                "work; leave the policy out of CPU builds");

 public:
  using family = nitro::family::Hook;
  static constexpr std::string_view name = "graph_capture";
  static constexpr bool enabled = true;
  static constexpr bool runs_steps = true;

  struct Options {
    /// Eager steps of a shape before it is captured (>= 1): they make workspaces, autotuning and state.
    std::int64_t warmup = 3;
    /// Shapes captured at most (>= 1); the steps of any other shape run eagerly.
    std::int64_t max_graphs = 2;
    /// CUDA generators besides the default one that the step draws from (registered with each graph).
    std::vector<at::Generator> generators{};
  };

  CaptureImpl(const Options& o, const c10::Device& device) : o_(o), device_(device) {
    NITRO_CHECK(o_.warmup >= 1, "graph::Capture: warmup must be >= 1 (eager steps before a capture), got ", o_.warmup);
    NITRO_CHECK(o_.max_graphs >= 1, "graph::Capture: max_graphs must be >= 1, got ", o_.max_graphs);
    if constexpr (E == Engine::cuda_graph) {
      NITRO_CHECK(device_.is_cuda(), "graph::Capture: the model is on ", device_.str(), "; CUDA graphs capture GPU "
                  "work: move the model to a GPU before making the loop, or leave graph::Capture out");
      for (const auto& g : o_.generators)
        NITRO_CHECK(g.defined() && g.device().is_cuda(), "graph::Capture: Options::generators must hold CUDA generators");
    }
  }
  CaptureImpl(const CaptureImpl&) = delete;
  CaptureImpl& operator=(const CaptureImpl&) = delete;
  ~CaptureImpl() {
    in_destructor_ = true;  // the optimizer may be gone already
    drop_graphs();
#if NITRO_WITH_CUDA
    if (side_raw_ != nullptr) (void)cudaStreamDestroy(side_raw_);  // its queued work still completes
#endif
  }

  /// Steps captured (a recapture counts; each ran its batch), replayed, and run eagerly (warm-ups
  /// included): together, every step that returned, and the eager ones that threw.
  std::int64_t captures() const noexcept { return captures_; }
  std::int64_t replays() const noexcept { return replays_; }
  std::int64_t eager_steps() const noexcept { return eager_; }
  /// Graphs held now.
  std::int64_t graphs() const noexcept {
    std::int64_t n = 0;
    for (const auto& e : entries_) n += e->captured ? 1 : 0;
    return n;
  }
  /// Forgets every shape: drops every graph and its memory pool, and the warm-up counts (the next
  /// steps of a shape warm up again). For after memory::find_max_batch_size on this loop: its trials
  /// are steps of shapes of their own, which would otherwise hold graphs (and `max_graphs` slots).
  void reset() noexcept {
    drop_graphs();
    entries_.clear();
  }

  template <class Loop, class Parts>
  StepResult run_step(Loop& loop, Parts& parts) {
    check_loop<Loop>();
    using Batch = std::remove_cvref_t<decltype(parts.batch())>;
    struct Clear {  // the batch's tensors are not held past the step
      std::vector<at::Tensor>& t;
      ~Clear() { t.clear(); }
    } clear{batch_};
    Entry* e = find<Parts>(parts.batch());
    if (e == nullptr || e->failed || (!e->captured && graphs() >= o_.max_graphs)) {
      ++eager_;
      return parts.eager();
    }
    auto* fused = fused_ = dynamic_cast<optim::FusedStep*>(&loop.optimizer());
    NITRO_CHECK(fused != nullptr, "graph::Capture needs a fused optimizer, nitro::optim::FusedAdam, FusedAdamW or "
                "FusedSGD (optim/fused.hpp): torch::optim's optimizers keep the step count and the bias correction "
                "on the host, which a graph cannot replay");
    if (!e->captured && e->seen < o_.warmup) {
      ++e->seen;
      ++eager_;
      return warm_up(parts, /*begun=*/false);
    }
    parts.begin();  // first: a hook's on_step_begin may set the learning rate this step reads
    // This graph's record of the optimizer's step made current: what prepare_device_step checks (are
    // the tensors and options it captured still the optimizer's?) and advance_host advances after the
    // replay. The model changed under it (storage, mode): every graph is stale; the optimizer
    // changed under this graph's step: this graph is.
    fused->use_device_step_record(e->captured ? e->record : nullptr);
    const bool intact = fused->prepare_device_step();  // also brings the device rates and counters up to date
    if (!same_storage(loop)) drop_graphs();
    else if (e->captured && !intact) drop_graph(*e);
    if (!e->captured) {
      // Captures and runs this step (a first replay of the new graph); when state is still missing,
      // nothing was captured: an eager step makes it, and the next step captures.
      if (!capture<Batch>(loop, parts, *e, *fused)) {
        ++eager_;
        return warm_up(parts, /*begun=*/true);
      }
      return parts.finish(e->out);
    }
    return replay<Batch>(loop, parts, *e);
  }

 private:
  struct Entry {
    std::type_index type = typeid(void);  // the step's batch and loss function types
    std::vector<TensorShape> shape;
    std::int64_t seen = 0;
    bool failed = false;
    bool captured = false;
    std::shared_ptr<const void> batch;        // the static batch (a Batch): what the graph reads
    std::vector<at::Tensor> inputs;           // its tensors, in for_each_tensor order
    std::vector<at::Tensor> grads;            // the gradients the graph writes, kept alive
    DeviceStep out;                           // the graph's outputs
    std::shared_ptr<const optim::DeviceStepRecord> record;  // the optimizer's record of the captured step
#if NITRO_WITH_CUDA
    std::unique_ptr<Graph> graph;
#endif
    void drop() {
      captured = false;
      batch.reset();
      inputs.clear(), grads.clear();
      out = {};
      record.reset();
#if NITRO_WITH_CUDA
      graph.reset();  // after the tensors above: its pool is released with it
#endif
    }
  };

  template <class Loop>
  static void check_loop() {
    static_assert(!Loop::accumulation_policy::enabled,
                  "graph::Capture replays one whole optimizer step per batch: use accumulate::Off (a larger batch "
                  "instead of accumulation)");
    static_assert(!Loop::checkpoint_policy::enabled,
                  "graph::Capture: activation checkpointing saves and restores RNG state on the host, which a graph "
                  "cannot replay; use checkpoint::Off");
    []<class... Hs>(std::tuple<Hs...>*) {
      static_assert(((std::is_same_v<Hs, CaptureImpl> ||
                      (!nitro::detail::HasAfterForward<Hs, Loop> && !nitro::detail::HasAfterBackward<Hs, Loop> &&
                       !nitro::detail::HasBeforeOptimizerStep<Hs, Loop>)) && ...),
                    "graph::Capture: a hook policy with after_forward, after_backward or before_optimizer_step would "
                    "run once, when the step is captured, not at each replay; keep such hooks out of a loop with "
                    "graph::Capture (on_step_begin, after_optimizer_step, on_step_end and state are fine)");
    }(static_cast<typename Loop::hook_policies*>(nullptr));
  }

  // The entry of the batch's shape, made on first sight (a bounded number: beyond it, eager steps).
  // The batch's tensors into batch_ (one pass), and the entry of their shape and of the step's types
  // (Key: the loop's StepParts<Batch, LossFn>), made on first sight (a bounded number: beyond it, eager
  // steps).
  template <class Key, class Batch>
  Entry* find(const Batch& batch) {
    nitro::for_each_tensor(batch, [&](const at::Tensor& t) { batch_.push_back(t); });
    for (auto& e : entries_) {
      if (e->type != std::type_index(typeid(Key)) || e->shape.size() != batch_.size()) continue;
      bool same = true;
      for (std::size_t i = 0; same && i < batch_.size(); ++i) same = e->shape[i].matches(batch_[i]);
      if (same) return e.get();
    }
    for (const auto& t : batch_) {
      NITRO_CHECK(t.defined(), "graph::Capture: the batch holds an undefined tensor; a graph copies every tensor of "
                  "the batch into its own");
      NITRO_CHECK(t.device() == device_, "graph::Capture: a tensor of the batch is on ", t.device().str(),
                  ", the model on ", device_.str(), "; a graph reads its inputs from the GPU: deliver batches there "
                  "(Prefetcher<Cuda>) or move them before step()");
    }
    NITRO_CHECK(!batch_.empty(), "graph::Capture: the batch holds no tensor");
    if (entries_.size() >= static_cast<std::size_t>(o_.max_graphs) + 16) return nullptr;
    auto e = std::make_unique<Entry>();
    e->type = typeid(Key);
    for (const auto& t : batch_) e->shape.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type(), t.device()});
    return entries_.emplace_back(std::move(e)).get();
  }

  // The model as the graphs saw it: parameters and buffers where they were, the same parameters
  // requiring gradients, the same train/eval mode.
  template <class Loop>
  bool same_storage(Loop& loop) const {
    if (storage_.empty()) return true;  // no graph yet
    if (loop.model().is_training() != training_) return false;
    for (const auto& s : storage_)
      if (s.tensor.data_ptr() != s.data || s.tensor.requires_grad() != s.requires_grad) return false;
    return true;
  }

  void drop_graphs() noexcept {
    for (auto& e : entries_) e->drop();
    storage_.clear();
    // No graph reads what the optimizer's device steps used any more: let it go (a state replaced by
    // a load is not kept alive by it).
    if (fused_ != nullptr && !in_destructor_) fused_->release_device_step();
  }
  // One graph stale (the optimizer changed under its step): every other graph whose step the change
  // concerns (a load replaces the state of every parameter) is dropped now too, so that no graph's
  // record keeps the replaced state tensors alive until its shape comes again; the others live on.
  void drop_graph(Entry& e) {
    e.drop();
    for (auto& other : entries_)
      if (other->captured) {
        fused_->use_device_step_record(other->record);
        if (!fused_->prepare_device_step()) other->drop();
      }
    fused_->release_device_step();
  }
  struct Storage {
    at::Tensor tensor;
    const void* data;
    bool requires_grad;
  };


  // An eager step (on the side stream, where later captures run); `begun`: begin() was called.
  template <class Parts>
  StepResult warm_up(Parts& parts, bool begun) {
    const auto eager = [&] { return begun ? parts.eager_after_begin() : parts.eager(); };
    if constexpr (E == Engine::cuda_graph) {
#if NITRO_WITH_CUDA
      c10::cuda::CUDAGuard device_guard(device_);
      const auto current = c10::cuda::getCurrentCUDAStream(device_.index());
      const auto side = side_stream();
      const SideStream on_side(current, side);
      return eager();
#endif
    } else {
      return eager();
    }
  }

  // False when the optimizer is not ready (optim::DeviceStepNotReady): nothing captured, nothing run.
  template <class Batch, class Loop, class Parts>
  bool capture(Loop& loop, Parts& parts, Entry& e, optim::FusedStep& fused) {
    const Batch& batch = parts.batch();
    loop.optimizer().zero_grad(/*set_to_none=*/true);  // the graph's backward makes its own gradients
    e.inputs.clear();
    auto statics = std::make_shared<const Batch>(nitro::map_tensors(batch, [&](const at::Tensor& t) {
      auto s = at::empty_like(t, c10::MemoryFormat::Preserve);
      s.copy_(t);
      e.inputs.push_back(s);
      return s;
    }));
    (void)fused.prepare_device_step();  // learning rates and counters on the device before capture
    if constexpr (E == Engine::cuda_graph) {
#if NITRO_WITH_CUDA
      if (!capture_graph(loop, parts, e, *statics)) return false;
#endif
    } else {
      try {
        e.out = parts.on_device(*statics);
      } catch (const optim::DeviceStepNotReady&) {
        e.drop();
        return false;
      } catch (const std::exception& error) {
        e.drop();
        e.failed = !memory::is_out_of_memory(error);  // out of memory: tried again at the next step
        throw;
      }
    }
    e.batch = std::move(statics);
    // The gradients the graph writes stay allocated; the parameters' .grad are set to none, as after
    // an eager step, so that an eager step of another shape does not add to them.
    e.grads.clear();
    for (const auto& group : loop.optimizer().param_groups())
      for (const auto& p : group.params())
        if (p.grad().defined()) e.grads.push_back(p.grad());
    loop.optimizer().zero_grad(/*set_to_none=*/true);
    e.record = fused.device_step_record();  // the captured step's, made current again before each replay
    if (storage_.empty()) {
      for (const auto& t : loop.model().parameters()) storage_.push_back({t, t.data_ptr(), t.requires_grad()});
      for (const auto& t : loop.model().buffers()) storage_.push_back({t, t.data_ptr(), t.requires_grad()});
      training_ = loop.model().is_training();
    }
    e.captured = true;
    ++captures_;
    return true;
  }


  template <class Batch, class Loop, class Parts>
  StepResult replay(Loop& loop, Parts& parts, Entry& e) {
    for (std::size_t i = 0; i < batch_.size(); ++i) e.inputs[i].copy_(batch_[i], /*non_blocking=*/true);
    if constexpr (E == Engine::cuda_graph) {
#if NITRO_WITH_CUDA
      e.graph->replay();
#endif
    } else {
      e.out = parts.on_device(*static_cast<const Batch*>(e.batch.get()));
      loop.optimizer().zero_grad(/*set_to_none=*/true);  // a graph's backward writes fresh gradients
      // A graph's replay runs no host code: the current record stays the graph's. Here the step ran
      // again and made a record of its own: the graph's is made current again, as a replay leaves it.
      fused_->use_device_step_record(e.record);
    }
    ++replays_;
    return parts.finish(e.out);
  }

#if NITRO_WITH_CUDA
  // A stream of its own (not one of LibTorch's pool streams, which a Prefetcher may also draw: its
  // copies would then join a capture).
  c10::cuda::CUDAStream side_stream() {
    if (side_raw_ == nullptr) {
      c10::cuda::CUDAGuard guard(device_);
      C10_CUDA_CHECK(cudaStreamCreateWithFlags(&side_raw_, cudaStreamNonBlocking));
    }
    return c10::cuda::getStreamFromExternal(side_raw_, device_.index());
  }

  template <class Loop, class Parts, class Batch>
  bool capture_graph(Loop& loop, Parts& parts, Entry& e, const Batch& statics) {
    c10::cuda::CUDAGuard device_guard(device_);
    const auto current = c10::cuda::getCurrentCUDAStream(device_.index());
    const auto side = side_stream();
    const auto pool = at::cuda::graph_pool_handle();
    auto graph = std::make_unique<Graph>();
    for (const auto& g : o_.generators) graph->register_generator_state(g);
    // Cast weights cached by autocast outside the graph must not be read inside it.
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    struct RestoreCache {
      bool on;
      ~RestoreCache() { at::autocast::set_autocast_cache_enabled(on); }
    } restore{cache};
    {
      // After the static inputs' copies and the prepared rates and counters; joined back, also on failure.
      const SideStream on_side(current, side);
      try {
        graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
        e.out = parts.on_device(statics);
        graph->capture_end();
      } catch (const optim::DeviceStepNotReady&) {
        graph->abandon(side.stream(), device_.index(), pool);
        graph.reset();
        loop.optimizer().zero_grad(/*set_to_none=*/true);
        e.drop();
        return false;
      } catch (const std::exception& error) {
        graph->abandon(side.stream(), device_.index(), pool);
        graph.reset();
        loop.optimizer().zero_grad(/*set_to_none=*/true);
        e.drop();
        if (memory::is_out_of_memory(error)) throw;  // as it was (its type too); tried again at the next step
        e.failed = true;
        NITRO_CHECK(false, "graph::Capture: the training step could not be captured into a CUDA graph (", error.what(),
                    "). A graph records GPU work only: a step that synchronises the host with the GPU (.item(), "
                    "printing or testing a CUDA tensor, torch::nonzero, boolean-mask indexing, a CUDA tensor copied "
                    "to the CPU), CPU work the GPU reads, or shapes made from the data cannot be replayed. Remove it "
                    "from the loss function and the model, or train without graph::Capture; batches of this shape "
                    "run eagerly from now on");
      }
    }
    e.graph = std::move(graph);
    e.graph->replay();  // a capture runs nothing: this step's batch (in the static inputs) is its first replay
    return true;
  }

  cudaStream_t side_raw_ = nullptr;
#endif

  Options o_;
  c10::Device device_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::vector<Storage> storage_;
  bool training_ = true;
  std::vector<at::Tensor> batch_;  // the tensors of the step's batch, during run_step
  std::int64_t captures_ = 0, replays_ = 0, eager_ = 0;
  optim::FusedStep* fused_ = nullptr;  // the loop's optimizer, once a step needed it
  bool in_destructor_ = false;
};

}  // namespace detail

/// The CUDA-graph step policy (see the banner).
using Capture = detail::CaptureImpl<detail::Engine::cuda_graph>;

}  // namespace nitro::graph

namespace nitro::level {

/// level::Advanced plus graph::Capture: bf16 autocast, cuDNN autotuning and TF32, and each step
/// replayed from a CUDA graph. Needs a fused optimizer (optim/fused.hpp) and batches on the GPU;
/// convert a convolutional model with nitro::to_channels_last (train/channels_last.hpp) first.
/// Not yet measured on a GPU (bench_graphs).
using Max = TrainingLoop<amp::Bf16, accumulate::Off, checkpoint::Off, graph::Capture>;


}  // namespace nitro::level

#if NITRO_COMPILED && NITRO_WITH_CUDA
// level::Max's members defined out of the class are compiled in Nitro's library (src/train.cpp).
NITRO_DETAIL_LOOP_MEMBERS(extern template, nitro::level::Max);
#endif


// Held by the library only where LibTorch has CUDA.
template <>
inline constexpr bool nitro::detail::is_predefined_level<nitro::level::Max> = NITRO_WITH_CUDA != 0;

#if !NITRO_COMPILED
#include <nitro/graph/capture-inl.hpp>
#endif
