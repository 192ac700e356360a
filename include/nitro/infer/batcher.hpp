#pragma once
// A latency-bounded dynamic batcher: callers on many threads submit single inputs and get futures; one
// worker gathers up to `max_batch` of them, or what came within `max_delay` of the oldest, runs them as
// one batch and hands each caller its own row.
//
//   nitro::infer::Runner<nitro::infer::level::Basic> runner{nitro::infer::module_model(model)};
//   nitro::infer::DynamicBatcher batcher{std::move(runner), {.max_batch = 32, .max_delay = 2ms}};
//   std::future<at::Tensor> f = batcher.submit(image);       // image: one sample, no batch dimension
//   at::Tensor logits = f.get();                              // its row of the batch's output
//
// The model is any callable `at::Tensor(const at::Tensor& batch)` whose output's first dimension is the
// batch (an infer::Runner, a module's forward in a lambda); it runs on the worker thread only, under
// c10::InferenceMode.
//
// What a caller gets, exactly once per request:
//  - its row of the output: a view of the batch's output tensor, made under c10::InferenceMode (an
//    inference tensor: it cannot be changed in place or enter autograd outside that mode); `.clone()`
//    it to keep it alone or to change it;
//  - infer::RequestExpired if its deadline passed before its batch was formed (no late answer); an
//    expired request leaves the queue before the batch is formed and takes no place in it, so a batch
//    holds max_batch requests whenever that many live ones are queued;
//  - the model's exception if its batch failed (other batches are not touched);
//  - infer::BatcherStopped if the batcher was shut down with `Shutdown::fail_pending` before it ran.
// submit itself throws nitro::Error for a full queue (`when_full = Reject`; `Block` waits for room, and
// throws RequestExpired if the request's deadline passes first), an input whose shape, dtype or device
// differs from the first one's or that is not dense, and after shutdown.
//
// A deadline also shortens the gathering: a batch is formed no later than 200 us before the earliest
// deadline in the queue, so a lone request with a deadline shorter than max_delay is run, not expired.
//
// Shutdown (`shutdown()`, or the destructor) by default answers every pending request, then joins the
// worker; `shutdown(Shutdown::fail_pending)` fails them with BatcherStopped instead.
#include <nitro/core/config.hpp>
#include <nitro/core/error.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/stack.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace nitro::infer {

/// A request whose deadline passed before it was run.
class RequestExpired : public Error {
 public:
  using Error::Error;
};
/// A request still queued when the batcher was shut down with Shutdown::fail_pending.
class BatcherStopped : public Error {
 public:
  using Error::Error;
};

/// Options of DynamicBatcher.
struct BatcherOptions {
  /// The largest batch, >= 1.
  int64_t max_batch = 32;
  /// How long the oldest queued request may wait for others before its batch runs, >= 0.
  std::chrono::microseconds max_delay{2000};
  /// Requests queued at most, >= max_batch.
  size_t queue_capacity = 1024;
  /// A full queue: Reject (submit throws nitro::Error) or Block (submit waits for room).
  enum class WhenFull { Reject, Block } when_full = WhenFull::Reject;
  /// @var when_full
  /// What submit does when the queue is full (WhenFull); default Reject.

  /// Latency percentiles are taken over the last this many requests, >= 1.
  size_t stats_window = 65536;
};

/// How shutdown treats requests still queued.
enum class Shutdown { answer_pending, fail_pending };

/// What the batcher has done (DynamicBatcher::stats()).
struct BatcherStats {
  uint64_t requests = 0;        ///< answered with a row
  uint64_t expired = 0;         ///< failed with RequestExpired
  uint64_t failed = 0;          ///< failed by the model's exception or by shutdown
  uint64_t rejected = 0;        ///< refused by submit (queue full)
  uint64_t batches = 0;         ///< batches run
  std::vector<uint64_t> batch_sizes;  ///< batch_sizes[n]: batches of n requests (index 0 unused)
  double queue_wait_p50_ms = 0, queue_wait_p99_ms = 0;  ///< submit to the batch's start
  double latency_p50_ms = 0, latency_p99_ms = 0;        ///< submit to the answer
  /// @var queue_wait_p50_ms
  /// The median time from submit to the start of the request's batch, over the last stats_window
  /// requests; queue_wait_p99_ms the 99th percentile.
  /// @var latency_p50_ms
  /// The median time from submit to the answer, over the last stats_window requests; latency_p99_ms
  /// the 99th percentile.

  /// The mean number of requests per batch run; 0 before any batch.
  [[nodiscard]] NITRO_INLINE double mean_batch() const;
};

/// Gathers single inputs submitted from many threads into batches for `model`, a callable
/// `at::Tensor(const at::Tensor& batch)` whose output's first dimension is the batch, run on one worker
/// thread under c10::InferenceMode (see the top of this file).
/// @tparam Fn the model's type; inferred from the constructor.
template <class Fn>
class DynamicBatcher {
 public:
  /// The clock of deadlines and latencies.
  using clock = std::chrono::steady_clock;
  /// How long before a queued request's deadline its batch is formed at the latest.
  static constexpr std::chrono::microseconds kDeadlineMargin{200};

  /// Starts the worker thread. Throws nitro::Error when max_batch < 1, max_delay is not in [0, 1 h],
  /// queue_capacity < max_batch, or stats_window < 1.
  explicit DynamicBatcher(Fn model, BatcherOptions options = {}) : model_(std::move(model)), options_(options) {
    NITRO_CHECK(options_.max_batch >= 1, "infer::DynamicBatcher: max_batch must be >= 1, got ", options_.max_batch);
    NITRO_CHECK(options_.max_delay.count() >= 0 && options_.max_delay <= std::chrono::hours(1),
                "infer::DynamicBatcher: max_delay must be in [0, 1 h], got ", options_.max_delay.count(), " us");
    NITRO_CHECK(options_.queue_capacity >= static_cast<size_t>(options_.max_batch),
                "infer::DynamicBatcher: queue_capacity (", options_.queue_capacity, ") must be >= max_batch (",
                options_.max_batch, ")");
    NITRO_CHECK(options_.stats_window >= 1, "infer::DynamicBatcher: stats_window must be >= 1");
    batch_sizes_.assign(static_cast<size_t>(options_.max_batch) + 1, 0);
    worker_ = std::thread([this] { work(); });
  }
  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;
  ~DynamicBatcher() { shutdown(Shutdown::answer_pending); }

  /// Queues one sample (no batch dimension); its row of the output arrives through the future.
  /// `deadline`: past it, the request is failed with RequestExpired instead of being run.
  std::future<at::Tensor> submit(at::Tensor input, std::optional<clock::time_point> deadline = std::nullopt) {
    NITRO_CHECK(input.defined(), "infer::DynamicBatcher::submit: the input tensor is undefined");
    Request r{std::move(input), {}, clock::now(), deadline};
    auto future = r.promise.get_future();
    std::unique_lock lock(mutex_);
    NITRO_CHECK(!stopping_, "infer::DynamicBatcher::submit: the batcher has been shut down");
    NITRO_CHECK(r.input.layout() == c10::kStrided,
                "infer::DynamicBatcher::submit: the input must be a dense (strided) tensor, got layout ",
                r.input.layout(), "; call .to_dense() first");
    if (!shape_known_) {
      shape_ = r.input.sizes().vec();
      dtype_ = r.input.scalar_type();
      device_ = r.input.device();
      shape_known_ = true;
    }
    // Checked here, so that one caller's odd input cannot fail the other requests of its batch.
    NITRO_CHECK(r.input.sizes().vec() == shape_ && r.input.scalar_type() == dtype_ && r.input.device() == device_,
                "infer::DynamicBatcher::submit: every input must have the first one's shape, dtype and device (",
                c10::IntArrayRef(shape_), " ", c10::toString(dtype_), " on ", device_, "), got ", r.input.sizes(), " ",
                c10::toString(r.input.scalar_type()), " on ", r.input.device(), "; one batcher per input shape");
    if (queue_.size() >= options_.queue_capacity) {
      if (options_.when_full == BatcherOptions::WhenFull::Reject) {
        ++stats_.rejected;
        nitro::detail::fail("infer::DynamicBatcher::submit: the queue is full (", options_.queue_capacity,
                            " requests waiting); retry later, raise queue_capacity, or set when_full = Block");
      }
      const auto has_room = [&] { return queue_.size() < options_.queue_capacity || stopping_; };
      if (r.deadline) {
        if (!room_.wait_until(lock, *r.deadline, has_room)) {
          ++stats_.expired;
          throw RequestExpired("infer::DynamicBatcher::submit: the deadline passed while waiting for room in the "
                               "full queue (when_full = Block)");
        }
      } else {
        room_.wait(lock, has_room);
      }
      NITRO_CHECK(!stopping_, "infer::DynamicBatcher::submit: the batcher was shut down while waiting for room");
    }
    queue_.push_back(std::move(r));
    // The worker waits for the first request (which starts the max_delay clock) and then for a full
    // batch: only those two moments wake it, not every submit (16 clients: 2 wake-ups a batch, not 16).
    // A deadline may end the gathering earlier than the wait in progress assumed.
    const bool wake = queue_.size() == 1 || queue_.size() >= static_cast<size_t>(options_.max_batch) ||
                      queue_.back().deadline.has_value();
    lock.unlock();
    if (wake) arrived_.notify_one();
    return future;
  }

  /// Stops taking requests, answers (or fails) the queued ones, joins the worker. Idempotent.
  void shutdown(Shutdown how = Shutdown::answer_pending) {
    {
      std::lock_guard lock(mutex_);
      if (!stopping_) {
        stopping_ = true;
        fail_pending_ = how == Shutdown::fail_pending;
      }
    }
    arrived_.notify_all();
    room_.notify_all();
    std::lock_guard join_lock(join_mutex_);
    if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
  }

  /// A copy of the counters and the percentiles over the last `stats_window` requests.
  [[nodiscard]] BatcherStats stats() const {
    BatcherStats s;
    std::vector<double> waits, latencies;
    {
      std::lock_guard lock(mutex_);  // copied under the lock, sorted outside it
      s = stats_;
      s.batch_sizes = batch_sizes_;
      waits = waits_;
      latencies = latencies_;
    }
    s.queue_wait_p50_ms = percentile(waits, 0.50);
    s.queue_wait_p99_ms = percentile(waits, 0.99);
    s.latency_p50_ms = percentile(latencies, 0.50);
    s.latency_p99_ms = percentile(latencies, 0.99);
    return s;
  }

  /// The options the batcher was made with.
  [[nodiscard]] const BatcherOptions& options() const { return options_; }

 private:
  struct Request {
    at::Tensor input;
    std::promise<at::Tensor> promise;
    clock::time_point submitted;
    std::optional<clock::time_point> deadline;
  };

  /// When gathering must stop: the oldest request's max_delay, or the earliest deadline in the queue
  /// less a margin for waking up and forming the batch (a request is run only if its deadline has not
  /// passed when its batch is formed).
  clock::time_point gather_until() const {
    auto until = queue_.front().submitted + options_.max_delay;
    for (const auto& r : queue_)
      if (r.deadline && *r.deadline - kDeadlineMargin < until) until = *r.deadline - kDeadlineMargin;
    return until;
  }

  static double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0.0;
    const auto k = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return v[k];
  }

  static double ms(clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

  void record(std::vector<double>& ring, size_t& next, double value) {
    if (ring.size() < options_.stats_window) {
      ring.push_back(value);
    } else {
      ring[next] = value;
      next = (next + 1) % options_.stats_window;
    }
  }

  /// Moves every queued request whose deadline is before `at` to `out` (with `at`, for its message),
  /// keeping the others in their order.
  void take_expired(clock::time_point at, std::vector<std::pair<Request, clock::time_point>>& out) {
    auto kept = queue_.begin();
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->deadline && *it->deadline < at) {
        out.emplace_back(std::move(*it), at);
      } else {
        if (kept != it) *kept = std::move(*it);
        ++kept;
      }
    }
    queue_.erase(kept, queue_.end());
  }

  void work() {
    c10::InferenceMode inference;  // thread-local: the model runs on this thread only
    std::vector<Request> batch;
    batch.reserve(static_cast<size_t>(options_.max_batch));
    std::vector<std::pair<Request, clock::time_point>> expired;  // each with the moment it was found expired
    std::vector<at::Tensor> inputs;
    inputs.reserve(static_cast<size_t>(options_.max_batch));
    for (;;) {
      clock::time_point formed{};
      {
        std::unique_lock lock(mutex_);
        arrived_.wait(lock, [&] { return !queue_.empty() || stopping_; });
        if (queue_.empty()) return;  // stopping, nothing left
        if (stopping_ && fail_pending_) {
          std::deque<Request> pending;
          pending.swap(queue_);
          stats_.failed += pending.size();
          lock.unlock();
          room_.notify_all();
          for (auto& r : pending)
            r.promise.set_exception(std::make_exception_ptr(
                BatcherStopped("infer::DynamicBatcher: shut down before this request ran")));
          continue;
        }
        // Requests whose deadline passed while the last batch ran leave now: they take no place in
        // this batch and do not count toward a full one.
        const auto gather_start = clock::now();
        take_expired(gather_start, expired);
        // Wait for a full batch, but not past the oldest request's max_delay, nor so long that a queued
        // request's deadline passes while it waits (nor on shutdown). A submit with a deadline wakes
        // this wait, which then looks again. (Nothing to gather if every request had expired; while
        // this thread gathers, the queue only grows.)
        // `formed`: the moment deadlines are checked against. When the gathering ends on its own
        // timer, the moment it was due, not the moment this thread was scheduled again: the worker's
        // wake-up latency does not expire a request that the wait itself was timed to serve.
        while (!queue_.empty()) {
          if (queue_.size() >= static_cast<size_t>(options_.max_batch) || stopping_) {
            formed = clock::now();
            break;
          }
          const auto until = gather_until();
          const auto now = clock::now();
          if (now >= until) {
            formed = std::max(gather_start, std::min(now, until));
            break;
          }
          arrived_.wait_until(lock, until);
        }
        // Failed with BatcherStopped on the next turn (fail_pending); else the batch: what expired
        // while it gathered (a late wake-up, a deadline already near at submit) leaves first, then up
        // to max_batch of the rest, oldest first.
        if (!(stopping_ && fail_pending_) && !queue_.empty()) {
          take_expired(formed, expired);
          const size_t n = std::min(queue_.size(), static_cast<size_t>(options_.max_batch));
          for (size_t i = 0; i < n; ++i) {
            batch.push_back(std::move(queue_.front()));
            queue_.pop_front();
          }
        }
        stats_.expired += expired.size();  // counted before any answer, as in run()
      }
      room_.notify_all();
      for (auto& [r, at] : expired) {
        r.promise.set_exception(std::make_exception_ptr(RequestExpired(
            "infer::DynamicBatcher: the request's deadline passed " + std::to_string(ms(at - *r.deadline)) +
            " ms before its batch was formed")));
      }
      expired.clear();
      if (!batch.empty()) run(batch, inputs);
      batch.clear();
      inputs.clear();
    }
  }

  // A batch of live requests (the expired ones left the queue before it was formed). Counters are
  // updated before any promise is fulfilled, so a caller holding its answer sees them.
  void run(std::vector<Request>& batch, std::vector<at::Tensor>& inputs) {
    const auto start = clock::now();
    for (const auto& r : batch) inputs.push_back(r.input);
    std::exception_ptr error;
    at::Tensor out;
    try {
      out = model_(at::stack(inputs));
      NITRO_CHECK(out.defined() && out.dim() >= 1 && out.size(0) == static_cast<int64_t>(inputs.size()),
                  "infer::DynamicBatcher: the model returned ",
                  out.defined() ? std::to_string(out.dim() >= 1 ? out.size(0) : 0) : std::string("no"),
                  " rows for a batch of ", inputs.size(), "; its output's first dimension must be the batch");
    } catch (...) {
      error = std::current_exception();
    }
    const auto done = clock::now();
    {
      std::lock_guard lock(mutex_);
      ++stats_.batches;
      ++batch_sizes_[inputs.size()];
      (error ? stats_.failed : stats_.requests) += inputs.size();
      for (const auto& r : batch) {
        record(waits_, next_wait_, ms(start - r.submitted));
        record(latencies_, next_latency_, ms(done - r.submitted));
      }
    }
    int64_t row = 0;
    for (auto& r : batch) {
      // The promise goes at once, so the caller usually holds the last reference to what it gets.
      std::promise<at::Tensor> promise = std::move(r.promise);
      if (error) {
        promise.set_exception(error);
      } else {
        promise.set_value(out[row++]);
      }
    }
  }

  Fn model_;
  BatcherOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::condition_variable room_;
  std::deque<Request> queue_;
  bool stopping_ = false;
  bool fail_pending_ = false;
  bool shape_known_ = false;
  std::vector<int64_t> shape_;
  c10::ScalarType dtype_ = c10::ScalarType::Undefined;
  c10::Device device_{c10::kCPU};
  std::mutex join_mutex_;  // two threads shutting down at once: one joins, the other waits for it
  BatcherStats stats_;
  std::vector<uint64_t> batch_sizes_;
  std::vector<double> waits_, latencies_;
  size_t next_wait_ = 0, next_latency_ = 0;
  std::thread worker_;
};

}  // namespace nitro::infer

#if !NITRO_COMPILED
#include <nitro/infer/batcher-inl.hpp>
#endif
