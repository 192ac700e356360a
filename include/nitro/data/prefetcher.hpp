#pragma once
// nitro::Prefetcher<Device, Source>: the next batches are made by background workers, and, for
// Prefetcher<Cuda>, staged in pinned memory and copied to the GPU on a copy stream, before the
// training step asks for them. Iterate it with range-for; batches come in the source's order.
//
//   auto loader = nitro::from_dataset(images.map(torch::data::transforms::Stack<>()),
//                                     torch::data::samplers::RandomSampler(n), 64);
//   nitro::Prefetcher<nitro::Cuda, decltype(loader)> batches{std::move(loader), {.depth = 4, .workers = 4}};
//   for (auto& batch : batches) loop.step(batch, loss_fn);        // already on the GPU
//
// Guarantees: batches arrive in claim order, each exactly once; an exception thrown by the source
// reaches the consumer at that batch's position (and ends the epoch); at most depth + workers
// batches exist at once besides the one the consumer holds; destroying the prefetcher stops its
// workers (a worker inside a source call finishes that call first).
//
// Exact resume: with a sampler that tracks deliveries (data/sampler.hpp's ResumableSampler, through
// from_dataset), each batch handed to the consumer is reported to it (source.delivered()), so its
// state() counts only batches the consumer received, not those made ahead; a batch whose production
// threw is not reported (it was not consumed: a resumed run makes it again). The destructor, once
// the workers are joined, rewinds the sampler (source.rewind()): batches made ahead and not consumed
// are made again by the next prefetcher over the same sampler.
//
// Many epochs, one prefetcher: set_epoch(e) ends what is left of the current epoch (batches made
// ahead of it are dropped, and a sampler that tracks deliveries hands them out again) and starts
// epoch e with the same worker threads, the same copy stream and each worker's same copy of the
// data set. The source must say how to start an epoch (source.set_epoch(e)): DatasetSource selects
// the sampler's epoch (ResumableSampler, torch's DistributedSampler) and resets it (RandomSampler
// draws a new order), LoaderSource begins its loader again; a callable cannot be restarted. A
// prefetcher starts reading its first epoch as soon as it is made: set_epoch(e) with the epoch it is
// already reading, before anything of it was taken, keeps what was made ahead (and a resumed
// sampler's position), so a loop may call set_epoch(e) at the top of every epoch:
//   for (std::int64_t e = start; e < epochs; ++e) { batches.set_epoch(e); for (auto& b : batches) ...; }
// Once an epoch ended, next() keeps returning nothing until set_epoch.
//
// Prefetcher<Auto> takes its device at run time, as a program that picks CUDA when it is there:
//   const c10::Device device = torch::cuda::is_available() ? c10::Device(c10::kCUDA) : c10::Device(c10::kCPU);
//   nitro::Prefetcher<nitro::Auto, decltype(loader)> batches{std::move(loader), {.device = device}};
// Given a CUDA device it is Prefetcher<Cuda> (pinned staging, the copy stream, events, record_stream),
// given the CPU it is Prefetcher<Cpu> (no copies); unset, the device is Auto::device() (the current
// GPU when one is available, else the CPU). The choice is fixed when the prefetcher is made; a CUDA
// device where none is available, or in a build without CUDA (NITRO_WITH_CUDA 0), throws nitro::Error.
// Prefetcher<Cpu> and Prefetcher<Cuda> test nothing at run time: they choose at compile time, as before.
//
// Prefetcher<Cuda> works on one concrete GPU: Options::device (the model's, e.g. cuda:1), or the
// device current when it is made. The consumer's stream on that GPU waits on an event for each
// batch's copy (no host synchronisation), and each tensor is record_stream'ed on the consumer's
// stream so the caching allocator does not reuse it early. Ordering with other streams:
//   - work the constructing thread queued before the prefetcher was made (constants a transform
//     captured, the model's buffers) happens before any copy or transform;
//   - CUDA tensors a source returns are read after the work queued on the worker thread's current
//     stream of their device when the source returned (the default stream, unless the source made
//     another current): a source that fills them on a stream of its own makes the current stream
//     wait for it (an event) before returning;
//   - with pin_memory (the default) every CPU tensor, pinned or not, is copied into pinned memory of
//     LibTorch's caching host allocator first (data/pinned_pool.hpp), so a source may refill its tensors in place as soon as it has
//     returned them; with pin_memory = false a tensor the source pinned itself is copied
//     synchronously by the worker (it waits, the consumer does not), for the same reason.
#include <nitro/core/concepts.hpp>
#include <nitro/core/config.hpp>
#include <nitro/core/device.hpp>
#include <nitro/core/error.hpp>
#include <nitro/data/pinned_pool.hpp>
#include <nitro/data/source.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDAEvent.h>  // at::cuda::CUDAEvent (ATen/cuda/CUDAEvent.h adds cuBLAS, cuSPARSE, cuSOLVER)
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace nitro {

/// A Prefetcher's knobs.
template <class B>
struct PrefetchOptions {
  /// Batches made ahead of the consumer, >= 1.
  std::size_t depth = 2;
  /// Worker threads, >= 1. A sequential source (a callable, a loader) is read by one of them.
  std::size_t workers = 1;
  /// Prefetcher<Cuda>: stage batches in pinned host memory (LibTorch's caching host allocator, which
  /// reuses a block once its copy is done) so copies are asynchronous.
  bool pin_memory = true;
  /// Prefetcher<Cuda>: copy without blocking the host.
  bool non_blocking = true;
  /// Prefetcher<Cuda>: four-dimensional tensors arrive in channels-last layout.
  bool channels_last = false;
  /// Run on each batch on the device, on the copy stream (e.g. uint8 -> float and normalise).
  std::function<B(B)> transform{};
  /// Prefetcher<Cuda>: the GPU batches go to (the model's, e.g. cuda:1); unset, or `cuda` without an
  /// index: the device current when the prefetcher is made. Prefetcher<Cpu>: unset or cpu.
  /// Prefetcher<Auto>: the CPU or a CUDA device, chosen at run time; unset: Auto::device() (the
  /// current GPU when one is available, else the CPU). The options marked Prefetcher<Cuda> apply
  /// when it is a CUDA device.
  std::optional<c10::Device> device{};
};

/// Makes the next batches on background workers and, for Prefetcher<Cuda>, copies them to the GPU on
/// a copy stream, before the consumer asks (see the top of this header). Not copyable or movable.
/// \tparam Device Cpu, Cuda, or Auto (the device chosen at run time from Options::device).
/// \tparam Source a PrefetchSource (from_dataset, from_loader, a data::Pipeline) or a callable
///         returning std::optional<Batch>.
template <DeviceTag Device, class Source>
class Prefetcher {
 public:
  /// The source as a PrefetchSource (a callable is wrapped in a CallableSource).
  using source_type = as_prefetch_source_t<Source>;
  static_assert(PrefetchSource<source_type>,
                "nitro::Prefetcher: Source must be a callable returning std::optional<Batch>, or a source of "
                "data/source.hpp (from_loader, from_dataset); a user batch type needs the customization point "
                "nitro_map_tensors (core/device.hpp)");
  using batch_type = typename source_type::batch_type;  ///< What next() returns: the source's batch.
  using Options = PrefetchOptions<batch_type>;          ///< The knobs (PrefetchOptions).

  /// A prefetcher with the default Options; see below.
  explicit Prefetcher(Source source) : Prefetcher(std::move(source), Options{}) {}
  /// Starts the workers, which begin reading the first epoch at once. Throws nitro::Error when depth
  /// or workers is 0, when the device is not of Device's kind (Cpu, Cuda), or when a CUDA device is
  /// asked for where none is available or in a build without CUDA.
  Prefetcher(Source source, Options options) : source_(std::move(source)), o_(std::move(options)) {
    detail::check_library_version();
    NITRO_CHECK(o_.depth >= 1, "nitro::Prefetcher: depth is 0; give the number of batches to make ahead, >= 1");
    NITRO_CHECK(o_.workers >= 1, "nitro::Prefetcher: workers is 0; give the number of worker threads, >= 1");
    if constexpr (run_time_device) {
      const c10::Device device = o_.device.value_or(Auto::device());
      require_available(device, "nitro::Prefetcher<Auto>");
      if (device.is_cuda()) start_copies(device, "nitro::Prefetcher<Auto>");  // from now on, Prefetcher<Cuda>
    } else {
      NITRO_CHECK(!o_.device || o_.device->type() == Device::type, "nitro::Prefetcher<", Device::name,
                  ">: device is ", o_.device.value_or(c10::Device(c10::kCPU)), ", not a ", Device::name,
                  " device; give one of that kind, or leave it unset (or use nitro::Auto to choose at run time)");
    }
    if constexpr (Device::type == c10::DeviceType::CUDA) {
      require_available<Device>("nitro::Prefetcher<Cuda>");
      start_copies(o_.device.value_or(Cuda::device()), "nitro::Prefetcher<Cuda>");
    }
    if constexpr (requires(const source_type& src) { src.epoch(); }) epoch_ = source_.epoch();
    const std::size_t workers = source_type::parallel ? o_.workers : 1;
    window_ = o_.depth + workers;
    ring_.resize(window_);
    threads_.reserve(workers);
    for (std::size_t i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
  }

  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  ~Prefetcher() {
    {
      std::lock_guard guard(mutex_);
      stop_ = true;
    }
    space_.notify_all();
    for (auto& t : threads_) t.join();
    if constexpr (requires { source_.rewind(); }) source_.rewind();
  }

  /// The next batch, or nothing at the end of the epoch; rethrows what the source threw for it.
  std::optional<batch_type> next() {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return next_out_ >= end_ || ring_[next_out_ % window_].has_value(); });
    if (next_out_ >= end_) return std::nullopt;  // batches made past an error are dropped
    auto& slot = ring_[next_out_ % window_];
    Item item = std::move(*slot);
    slot.reset();
    ++next_out_;
    lock.unlock();
    space_.notify_all();
    if (item.error) std::rethrow_exception(item.error);  // not consumed: not reported as delivered
    // Workers may be claiming meanwhile (under claim_mutex_, not mutex_): the sampler's own mutex orders the two.
    if constexpr (requires { source_.delivered(); }) source_.delivered();
#if NITRO_WITH_CUDA
    if (item.copied) {
      const auto consumer = c10::cuda::getCurrentCUDAStream(device_.index());
      item.copied->block(consumer);  // the consumer's stream waits for the copy; the host does not
      for_each_tensor(*item.batch, [&](const at::Tensor& t) {
        if (t.defined() && t.is_cuda()) t.record_stream(consumer);
      });
    }
#endif
    return std::move(item.batch);
  }

  /// Starts epoch `epoch` with the same workers (see the top of this header): what is left of the
  /// current epoch is dropped, unless `epoch` is the one being read and nothing of it was taken yet.
  /// Call it from the consumer's thread, between batches. Throws nitro::Error for a negative epoch.
  /// If the source cannot start the epoch (its set_epoch throws), the error propagates and the
  /// prefetcher stays between epochs (next() returns nothing) until a set_epoch succeeds.
  void set_epoch(std::int64_t epoch) {
    static_assert(requires(source_type& src) { src.set_epoch(epoch); },
                  "nitro::Prefetcher::set_epoch: this source cannot start a new epoch (a callable source is read "
                  "once); use from_dataset or from_loader, or make a new prefetcher per epoch");
    NITRO_CHECK(epoch >= 0, "nitro::Prefetcher::set_epoch: epoch is ", epoch, "; give one >= 0");
    std::unique_lock lock(mutex_);
    // Nothing of it taken: keep what was made ahead (not after a restart that failed).
    if (epoch == epoch_ && next_out_ == 0 && !restart_failed_) return;
    end_ = std::min(end_, next_task_);  // no new claims
    space_.notify_all();
    idle_.wait(lock, [&] { return busy_ == 0; });  // the batches being made are finished (then dropped)
    for (auto& slot : ring_) slot.reset();
    next_task_ = next_out_ = end_ = 0;
    // The workers wait (end_ == next_task_) while the source is restarted, and after, if it fails.
    restart_failed_ = true;  // until the source has started the epoch (its rewind may throw too)
    if constexpr (requires { source_.rewind(); }) source_.rewind();
    source_.set_epoch(epoch);
    restart_failed_ = false;
    epoch_ = epoch;
    end_ = no_end;
    lock.unlock();
    space_.notify_all();
  }
  /// The epoch being read: the last set_epoch's, or the source's when the prefetcher was made (0 if
  /// it does not say).
  [[nodiscard]] std::int64_t epoch() const {
    std::lock_guard guard(mutex_);
    return epoch_;
  }
  /// Worker threads this prefetcher has started (all at construction: set_epoch starts none).
  [[nodiscard]] std::size_t threads_started() const noexcept { return threads_.size(); }

  /// Range-for: `for (auto& batch : prefetcher)`. One pass; the iterator owns the current batch.
  using Iterator = detail::PullIterator<Prefetcher>;
  /// Takes the first batch of the rest of this epoch (blocks; may rethrow the source's error).
  Iterator begin() { return Iterator(this); }
  /// The end of the epoch.
  std::default_sentinel_t end() { return {}; }

  /// The options the prefetcher was made with.
  [[nodiscard]] const Options& options() const noexcept { return o_; }
  /// The source (e.g. a data::Pipeline, for its stats()). Changing its position while the workers
  /// read it is the prefetcher's job: use set_epoch.
  [[nodiscard]] const source_type& source() const noexcept { return source_; }
  /// Batches made and not yet taken, plus those being made: never more than depth + workers.
  [[nodiscard]] std::size_t in_flight() const {
    std::lock_guard guard(mutex_);
    return static_cast<std::size_t>(next_task_ - next_out_);
  }
  /// The device batches are delivered on (Prefetcher<Cuda>, and Prefetcher<Auto> given a GPU: a
  /// concrete GPU, e.g. cuda:1).
  [[nodiscard]] c10::Device device() const noexcept {
#if NITRO_WITH_CUDA
    if constexpr (Device::type == c10::DeviceType::CUDA || run_time_device) return device_;
#endif
    return c10::Device(c10::kCPU);
  }
#if NITRO_WITH_CUDA
  /// The pool that stages CPU tensors in pinned memory (with pin_memory), for its counts.
  [[nodiscard]] const PinnedPool& pinned_pool() const noexcept { return pool_; }
  /// Prefetcher<Cuda>, and Prefetcher<Auto> on a GPU: the stream the copies (and the transform) run
  /// on. Throws nitro::Error for a Prefetcher<Auto> on the CPU, which has none.
  [[nodiscard]] c10::cuda::CUDAStream copy_stream() const {
    if constexpr (run_time_device)
      NITRO_CHECK(copy_stream_.has_value(), "nitro::Prefetcher<Auto>::copy_stream: the device is ", device_,
                  ", which has no copy stream; ask only when device().is_cuda()");
    return *copy_stream_;
  }
#endif

 private:
  struct Item {
    std::optional<batch_type> batch;
    std::exception_ptr error;
#if NITRO_WITH_CUDA
    std::shared_ptr<at::cuda::CUDAEvent> copied;
#endif
  };
  static constexpr std::uint64_t no_end = std::numeric_limits<std::uint64_t>::max();
  // Prefetcher<Auto>: whether batches are copied to a GPU is decided at construction (copies()).
  static constexpr bool run_time_device = std::is_same_v<Device, Auto>;

  // Prefetcher<Auto>: whether it was given a GPU, so that batches are staged and copied to device_ on
  // the copy stream. Fixed by the constructor (the copy stream is made there, or never).
  // Prefetcher<Cuda> always copies and Prefetcher<Cpu> never does: make() knows at compile time.
  [[nodiscard]] bool copies() const noexcept {
#if NITRO_WITH_CUDA
    return copy_stream_.has_value();
#else
    return false;
#endif
  }

  // The device and copy stream of a prefetcher that copies to a GPU (`device`: CUDA, available).
  void start_copies([[maybe_unused]] c10::Device device, [[maybe_unused]] std::string_view who) {
#if NITRO_WITH_CUDA
    device_ = concrete_device(device);
    const auto count = static_cast<int>(c10::cuda::device_count());
    NITRO_CHECK(device_.index() < count, who, ": device ", device_, " does not exist (this process sees ", count,
                " GPU(s)); give an index in [0, ", count, ")");
    copy_stream_.emplace(c10::cuda::getStreamFromPool(false, device_.index()));
    // What the constructing thread queued so far (constants a transform captured) comes first.
    at::cuda::CUDAEvent made;
    made.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    made.block(*copy_stream_);
#else
    NITRO_CHECK(false, who, ": Nitro was built without CUDA (NITRO_WITH_CUDA is 0), so it cannot copy to ", device,
                "; use the CPU, or build against a LibTorch with CUDA");
#endif
  }

  void work() {
    for (;;) {
      // Claims are taken one at a time, and numbered in the order they are taken.
      std::unique_lock claim(claim_mutex_);
      std::uint64_t s;
      {
        // Between epochs (next_task_ >= end_) the worker waits for set_epoch, or for the end.
        std::unique_lock lock(mutex_);
        space_.wait(lock, [&] { return stop_ || (next_task_ < end_ && next_task_ < next_out_ + window_); });
        if (stop_) return;
        s = next_task_++;
        ++busy_;
      }
      Item item;
      std::optional<typename source_type::ticket_type> ticket;
      try {
        ticket = source_.claim();
      } catch (...) {
        item.error = std::current_exception();
      }
      if (!ticket && !item.error) {  // the epoch ended at s
        finish(s, std::nullopt, s);
        continue;
      }
      if (item.error) {
        finish(s, std::move(item), s + 1);
        continue;
      }
      claim.unlock();
      try {
        make(item, source_.produce(std::move(*ticket)));
      } catch (...) {
        item.error = std::current_exception();
      }
      const bool failed = static_cast<bool>(item.error);
      finish(s, std::move(item), failed ? s + 1 : no_end);
    }
  }

  void make(Item& item, batch_type&& batch) {
    if constexpr (Device::type == c10::DeviceType::CUDA) {
      make_on_device(item, std::move(batch));
    } else if constexpr (run_time_device) {
      if (copies()) make_on_device(item, std::move(batch));
      else make_on_host(item, std::move(batch));
    } else {
      make_on_host(item, std::move(batch));
    }
  }

  // Prefetcher<Cpu>, and Prefetcher<Auto> on the CPU: the batch as the source made it, transformed.
  void make_on_host(Item& item, batch_type&& batch) {
    item.batch.emplace(o_.transform ? o_.transform(std::move(batch)) : std::move(batch));
  }

  // Prefetcher<Cuda>, and Prefetcher<Auto> on a GPU: staged, copied on the copy stream, transformed there.
  void make_on_device(Item& item, [[maybe_unused]] batch_type&& batch) {
#if NITRO_WITH_CUDA
    // CUDA tensors of the source: the copy stream waits for what the worker's current stream of
    // their device had queued (the source's kernels), and the allocator for the copy stream's reads.
    bool source_pinned = false;
    for_each_tensor(batch, [&](const at::Tensor& t) {
      if (!t.defined()) return;
      source_pinned = source_pinned || (t.device().is_cpu() && t.is_pinned());
      if (!t.is_cuda()) return;
      at::cuda::CUDAEvent produced;
      produced.record(c10::cuda::getCurrentCUDAStream(t.device().index()));
      produced.block(*copy_stream_);
      t.record_stream(*copy_stream_);
    });
    // Staged tensors are dropped at the end of this call, their copies queued: LibTorch's caching
    // host allocator reuses them once the copies are done (data/pinned_pool.hpp).
    batch_type host = o_.pin_memory ? pool_.stage(batch) : std::move(batch);
    c10::cuda::CUDAStreamGuard on_copy_stream(*copy_stream_);
    // Without the pool, memory the source pinned itself is copied synchronously: the source may
    // refill it once this returns.
    const bool async = o_.non_blocking && (o_.pin_memory || !source_pinned);
    batch_type on_device = to_device(host, device_, {.non_blocking = async, .channels_last = o_.channels_last});
    if (o_.transform) on_device = o_.transform(std::move(on_device));
    item.copied = std::make_shared<at::cuda::CUDAEvent>();
    item.copied->record(*copy_stream_);
    item.batch.emplace(std::move(on_device));
#else
    (void)item;  // not reached: the constructor threw (start_copies)
#endif
  }

  // Stores item s (if any; not past the epoch's end, which set_epoch may have moved) and, when `end`
  // is given, ends the epoch there.
  // Batches already made past a lowered end are dropped now, not kept until set_epoch (freed outside
  // the lock).
  void finish(std::uint64_t s, std::optional<Item> item, std::uint64_t end) {
    std::vector<Item> dropped;
    {
      std::lock_guard guard(mutex_);
      if (item && s < end_) ring_[s % window_] = std::move(*item);
      if (end < end_) {
        const auto last = std::min(end_, next_out_ + window_);
        for (auto k = std::max(end, next_out_); k < last; ++k) {
          if (auto& slot = ring_[k % window_]) {
            dropped.push_back(std::move(*slot));
            slot.reset();
          }
        }
        end_ = end;
      }
      if (--busy_ == 0) idle_.notify_all();
    }
    ready_.notify_all();
    space_.notify_all();
  }

  source_type source_;
  Options o_;
  std::size_t window_ = 1;
  mutable std::mutex mutex_;
  std::mutex claim_mutex_;
  std::condition_variable ready_, space_, idle_;
  std::vector<std::optional<Item>> ring_;
  std::uint64_t next_task_ = 0, next_out_ = 0, end_ = no_end;
  bool restart_failed_ = false;  // the last set_epoch threw: the next one restarts the source whatever the epoch
  std::size_t busy_ = 0;  // workers between taking a task and finish()
  std::int64_t epoch_ = 0;
  bool stop_ = false;
#if NITRO_WITH_CUDA
  c10::Device device_{c10::kCPU};
  std::optional<c10::cuda::CUDAStream> copy_stream_;
  PinnedPool pool_;
#endif
  std::vector<std::thread> threads_;  // last: started after everything they use, joined first
};

/// A prefetcher over `source` (a callable or a source of data/source.hpp), its Device named:
///   auto batches = nitro::prefetch<nitro::Cpu>(nitro::from_loader(*loader), {.depth = 4});
template <DeviceTag Device, class Source>
Prefetcher<Device, std::decay_t<Source>> prefetch(Source&& source,
                                                  PrefetchOptions<typename Prefetcher<Device, std::decay_t<Source>>::batch_type> options = {}) {
  return Prefetcher<Device, std::decay_t<Source>>(std::forward<Source>(source), std::move(options));
}

}  // namespace nitro
