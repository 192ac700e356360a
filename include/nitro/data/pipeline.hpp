#pragma once
// nitro::data::Pipeline: batches made in stages, each stage with its own worker threads and a bounded
// queue after it, in the order the source gives them, with the time each stage spends busy and
// waiting (data/stage_stats.hpp) so the report can say which stage limits the run.
//
//   auto batches = nitro::data::pipeline(
//       nitro::from_dataset(records, sampler, 64),                         // read: claim + get_batch
//       {.name = "read", .workers = 2, .queue = 4},
//       nitro::data::stage({.name = "augment", .workers = 4, .queue = 4}, augment_batch),
//       nitro::data::stage({.name = "collate", .workers = 1, .queue = 2}, to_example));
//   nitro::Prefetcher<nitro::Cuda, decltype(batches)> on_gpu{std::move(batches), {.transform = normalise}};
//   for (std::int64_t e = 0; e < epochs; ++e) { on_gpu.set_epoch(e); for (auto& b : on_gpu) loop.step(b, loss); }
//   auto summary = nitro::monitor::summarize(loop.monitor(), on_gpu.source().stats());
//
// The stages: `read` is a source of data/source.hpp (or a callable): claim() runs on one read worker
// at a time, in order, and produce() on every read worker; each later stage is a function from the
// previous stage's item to its own, run on that stage's workers. Items are numbered in claim order;
// a stage takes them in that order and its queue holds the items numbered [h, h + queue), h being
// the oldest item the next stage has not taken, so the oldest item in flight can always move on (no
// deadlock whatever the speeds) and at most sum(queue) + sum(workers) items exist at once. The last
// stage's queue is read by the consumer: next(), range-for, or a Prefetcher over the pipeline (a
// Pipeline is a sequential PrefetchSource: the prefetcher's copy stream and transform are then the
// GPU stage).
//
// Errors: what a stage throws travels with its item (the later stages skip it) and is rethrown to the
// consumer at that item's position; the epoch ends there. Epochs: set_epoch(e) as a Prefetcher's (the
// items in flight are dropped, the same threads go on), and a Prefetcher over the pipeline forwards
// its own set_epoch, delivered() and rewind() to it, so a ResumableSampler underneath resumes exactly.
// Destroying the pipeline stops its workers (a worker inside a stage function finishes that call).
#include <nitro/core/concepts.hpp>
#include <nitro/core/error.hpp>
#include <nitro/data/source.hpp>
#include <nitro/data/stage_stats.hpp>

#include <chrono>
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
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace nitro::data {

/// A stage's knobs.
struct StageOptions {
  /// Shown in the stats and the report; empty: "stage <k>" ("read" for the first).
  std::string name{};
  /// Worker threads, >= 1. A sequential read source (a callable, a loader) is read by one.
  std::size_t workers = 1;
  /// Items the queue after the stage holds, >= 1.
  std::size_t queue = 2;
};

/// What a stage function may take besides its item: `fn(item, const StageContext&)` (e.g. the epoch
/// for data::augment's Keys), or just `fn(item)`.
struct StageContext {
  /// The epoch the item belongs to (the pipeline's set_epoch).
  std::int64_t epoch = 0;
  /// The item's number since the pipeline last (re)started: 0, 1, ... from each set_epoch or rewind.
  /// After a resume mid-epoch it counts from the resumed point, not from the epoch's start, so do not
  /// key random draws on it: use the samples' own indices (e.g. data::RecordBatch::index).
  std::uint64_t position = 0;
};

/// A stage after the read stage: a function of the previous stage's item, and its knobs.
template <class F>
struct Stage {
  StageOptions options;  ///< The stage's name, workers and queue.
  F fn;                  ///< Called as fn(item) or fn(item, const StageContext&); returns the next item.
};

/// A stage: `nitro::data::stage({.name = "augment", .workers = 4}, [](Example b) { ...; return b; })`.
template <class F>
[[nodiscard]] Stage<std::decay_t<F>> stage(StageOptions options, F&& fn) {
  return {std::move(options), std::forward<F>(fn)};
}

namespace detail {
template <class F, class T>
struct stage_result {
  using type = std::invoke_result_t<F&, T&&>;
};
template <class F, class T>
  requires std::is_invocable_v<F&, T&&, const StageContext&>
struct stage_result<F, T> {
  using type = std::invoke_result_t<F&, T&&, const StageContext&>;
};

// The items' types stage by stage: T0 the read stage's, then what each function returns.
template <class Tuple, class T, class... Fs>
struct stage_types;
template <class... Ts, class T>
struct stage_types<std::tuple<Ts...>, T> {
  using type = std::tuple<Ts..., T>;
};
template <class... Ts, class T, class F, class... Fs>
struct stage_types<std::tuple<Ts...>, T, F, Fs...> {
  static_assert(std::is_invocable_v<F&, T&&> || std::is_invocable_v<F&, T&&, const StageContext&>,
                "nitro::data::Pipeline: a stage's function cannot be called with the previous stage's item (and "
                "optionally a const StageContext&); take the type the stage before returns (by value or rvalue "
                "reference)");
  using type = typename stage_types<std::tuple<Ts..., T>, std::decay_t<typename stage_result<F, T>::type>, Fs...>::type;
};

template <class T>
struct PipeItem {
  std::optional<T> value;
  std::exception_ptr error;
};

// Items numbered [head, head + slots.size()) wait here for the next stage, each in its slot.
template <class T>
struct Ring {
  std::vector<std::optional<PipeItem<T>>> slots;
  std::uint64_t head = 0;  // the next item the next stage takes
  [[nodiscard]] bool fits(std::uint64_t s) const noexcept { return s < head + slots.size(); }
  [[nodiscard]] bool ready() const noexcept { return slots[head % slots.size()].has_value(); }
  void clear() {
    for (auto& s : slots) s.reset();
    head = 0;
  }
};
}  // namespace detail

/// Batches made in stages, each with its own workers and a bounded queue, delivered in the source's
/// order (see the top of this header); make one with data::pipeline(). Not copyable; movable.
/// \tparam Source the read stage: a PrefetchSource (from_dataset, from_loader) or a callable returning
///         std::optional<Batch>.
/// \tparam Fs the later stages' functions, in order.
template <class Source, class... Fs>
class Pipeline {
 public:
  /// The read stage as a PrefetchSource (a callable is wrapped in a CallableSource).
  using source_type = as_prefetch_source_t<Source>;
  static_assert(PrefetchSource<source_type>,
                "nitro::data::Pipeline: the read stage must be a source of data/source.hpp (from_dataset, "
                "from_loader) or a callable returning std::optional<Batch>");
  /// The items' types stage by stage: std::tuple of the read stage's batch, then each function's result.
  using types = typename detail::stage_types<std::tuple<>, typename source_type::batch_type, Fs...>::type;
  /// The number of stages, the read stage included.
  static constexpr std::size_t stage_count = sizeof...(Fs) + 1;
  /// What the consumer gets: the last stage's item.
  using batch_type = std::tuple_element_t<stage_count - 1, types>;
  static_assert(Batch<batch_type>,
                "nitro::data::Pipeline: the last stage must return a Batch (a tensor, a torch::data::Example, a "
                "tuple or vector of them, or a type with nitro_map_tensors)");
  // As a PrefetchSource: claim() hands out finished items in order, produce() passes them on.
  using ticket_type = batch_type;          ///< A claim is the finished item itself.
  static constexpr bool parallel = false;  ///< Read by one prefetcher worker: the stages have their own.

  /// Starts every stage's workers, which begin reading epoch 0 at once. Throws nitro::Error when a
  /// stage has workers or queue 0.
  Pipeline(Source source, StageOptions read, Stage<Fs>... stages)
      : impl_(std::make_unique<Impl>(std::move(source), std::move(read), std::move(stages)...)) {
    impl_->start();
  }
  /// Takes over `other`'s workers; `other` is left empty (only destroyable).
  Pipeline(Pipeline&&) noexcept = default;
  Pipeline& operator=(Pipeline&&) = delete;
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;
  ~Pipeline() {
    if (impl_) impl_->shutdown();
  }

  /// The next item, or nothing at the end of the epoch; rethrows what a stage threw for it. Used
  /// directly (not under a Prefetcher), it also reports the item delivered to the source.
  std::optional<batch_type> next() {
    auto item = claim();
    if (item) delivered();
    return item;
  }

  /// PrefetchSource: the next finished item (blocks), not yet reported delivered.
  std::optional<ticket_type> claim() { return impl_->take(); }
  /// PrefetchSource: hands back the item claim() took.
  batch_type produce(ticket_type&& item) { return std::move(item); }
  /// The consumer received the oldest item claimed (forwarded to the source's sampler).
  void delivered() {
    if constexpr (requires(source_type& s) { s.delivered(); }) impl_->source.delivered();
  }
  /// The items claimed and not delivered will not be: the items in flight are dropped and the
  /// source rewound (its sampler hands them out again).
  void rewind() { impl_->restart(std::nullopt); }
  /// Ends what is left of this epoch and starts `epoch` (see Prefetcher::set_epoch); the same
  /// threads go on. Needs a source that can start an epoch. If the source cannot (its set_epoch
  /// throws), the error propagates and the pipeline stays between epochs until a set_epoch succeeds.
  void set_epoch(std::int64_t epoch) {
    static_assert(requires(source_type& s) { s.set_epoch(epoch); },
                  "nitro::data::Pipeline::set_epoch: the read source cannot start a new epoch (a callable is read "
                  "once); use from_dataset or from_loader");
    NITRO_CHECK(epoch >= 0, "nitro::data::Pipeline::set_epoch: epoch is ", epoch, "; give one >= 0");
    impl_->restart(epoch);
  }
  /// The epoch being read (0 until set_epoch).
  [[nodiscard]] std::int64_t epoch() const {
    std::lock_guard guard(impl_->mutex);
    return impl_->epoch;
  }

  /// Each stage's time and the consumer's waits since the pipeline was made or reset_stats().
  [[nodiscard]] PipelineStats stats() const { return impl_->read_stats(); }
  /// Zeroes the stats and restarts their clock.
  void reset_stats() { impl_->reset_stats(); }
  /// Worker threads, all stages together (started when the pipeline is made).
  [[nodiscard]] std::size_t threads_started() const noexcept { return impl_->threads.size(); }

  /// Range-for over the rest of this epoch.
  using Iterator = ::nitro::detail::PullIterator<Pipeline>;
  /// Takes the first item of the rest of this epoch (blocks; may rethrow a stage's error).
  Iterator begin() { return Iterator(this); }
  /// The end of the epoch.
  std::default_sentinel_t end() { return {}; }

 private:
  using Clock = std::chrono::steady_clock;
  static double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
  template <std::size_t K>
  using item_t = std::tuple_element_t<K, types>;
  static constexpr std::uint64_t no_end = std::numeric_limits<std::uint64_t>::max();

  template <class T>
  struct RingOf;
  template <class... Ts>
  struct RingOf<std::tuple<Ts...>> {
    using type = std::tuple<detail::Ring<Ts>...>;
  };

  struct Impl {
    source_type source;
    std::tuple<Fs...> fns;
    typename RingOf<types>::type rings;
    std::vector<StageStats> stats;
    Clock::time_point stats_since = Clock::now();
    double consumer_wait_s = 0;
    std::int64_t delivered_count = 0;

    std::mutex mutex;
    std::mutex claim_mutex;  // read workers claim one at a time, in order
    std::condition_variable changed;
    std::uint64_t next_claim = 0, end = no_end;
    bool restart_failed = false;  // the last set_epoch threw: the next one restarts the source whatever the epoch
    std::uint64_t generation = 0;  // a restart drops the items of older generations
    std::size_t busy = 0;          // workers holding an item outside the rings
    std::int64_t epoch = 0;
    bool fresh = true;     // nothing taken or rewound since the epoch started
    bool draining = false; // a restart waits for the busy workers: nothing is taken meanwhile
    bool stop = false;
    std::vector<std::thread> threads;  // joined by shutdown()

    Impl(Source src, StageOptions read, Stage<Fs>... stages)
        : source(std::move(src)), fns(std::move(stages.fn)...) {
      if constexpr (!source_type::parallel) read.workers = 1;
      if (read.name.empty()) read.name = "read";
      std::vector<StageOptions> all{std::move(read), std::move(stages.options)...};
      for (std::size_t k = 0; k < all.size(); ++k) {
        auto& o = all[k];
        if (o.name.empty()) o.name = "stage " + std::to_string(k);
        NITRO_CHECK(o.workers >= 1, "nitro::data::Pipeline: stage '", o.name,
                    "' has 0 workers; give the number of worker threads, >= 1");
        NITRO_CHECK(o.queue >= 1, "nitro::data::Pipeline: stage '", o.name,
                    "' has a queue of 0; give the number of items its queue holds, >= 1");
        stats.push_back({.name = o.name, .workers = o.workers, .queue = o.queue});
      }
      std::apply([&](auto&... ring) {
        std::size_t k = 0;
        ((ring.slots.resize(all[k++].queue)), ...);
      }, rings);
      if constexpr (requires(const source_type& s) { s.epoch(); }) epoch = source.epoch();
    }

    void start() {
      try {
        for (std::size_t w = 0; w < stats[0].workers; ++w) threads.emplace_back([this] { read_worker(); });
        start_stages(std::make_index_sequence<sizeof...(Fs)>{});
      } catch (...) {
        shutdown();
        throw;
      }
    }
    template <std::size_t... K>
    void start_stages(std::index_sequence<K...>) {
      (start_stage<K + 1>(), ...);
    }
    template <std::size_t K>
    void start_stage() {
      for (std::size_t w = 0; w < stats[K].workers; ++w) threads.emplace_back([this] { stage_worker<K>(); });
    }

    void shutdown() {
      {
        std::lock_guard guard(mutex);
        stop = true;
      }
      changed.notify_all();
      for (auto& t : threads)
        if (t.joinable()) t.join();
      if constexpr (requires(source_type& s) { s.rewind(); }) source.rewind();
    }

    // Stores item s of stage K's queue unless a restart or an earlier error made it stale.
    template <std::size_t K>
    void deposit(std::uint64_t s, std::uint64_t gen, detail::PipeItem<item_t<K>>&& item) {
      if (gen == generation && s < end) {
        if (item.error && s + 1 < end) {
          end = s + 1;
          drop_past_end(std::make_index_sequence<stage_count>{});
        }
        std::get<K>(rings).slots[s % std::get<K>(rings).slots.size()] = std::move(item);
      }
      --busy;
    }
    // Items already made past a lowered end (after an error) are freed now, not at the next restart.
    template <std::size_t... K>
    void drop_past_end(std::index_sequence<K...>) {
      const auto drop = [this](auto& ring) {
        for (auto k = std::max(end, ring.head); k < ring.head + ring.slots.size(); ++k)
          ring.slots[k % ring.slots.size()].reset();
      };
      (drop(std::get<K>(rings)), ...);
    }

    void read_worker() {
      auto& ring = std::get<0>(rings);
      for (;;) {
        const auto waiting = Clock::now();
        std::unique_lock claim(claim_mutex);
        std::unique_lock lock(mutex);
        stats[0].wait_input_s += since(waiting);
        const auto blocked = Clock::now();
        changed.wait(lock, [&] { return stop || (next_claim < end && ring.fits(next_claim)); });
        stats[0].wait_output_s += since(blocked);
        if (stop) return;
        const std::uint64_t s = next_claim++;
        const std::uint64_t gen = generation;
        ++busy;
        lock.unlock();

        const auto working = Clock::now();
        detail::PipeItem<item_t<0>> item;
        std::optional<typename source_type::ticket_type> ticket;
        try {
          ticket = source.claim();
        } catch (...) {
          item.error = std::current_exception();
        }
        if (!ticket && !item.error) {  // the epoch ended at s
          lock.lock();
          if (gen == generation) end = std::min(end, s);
          --busy;
          lock.unlock();
          changed.notify_all();
          continue;
        }
        claim.unlock();
        if (!item.error) {
          try {
            item.value.emplace(source.produce(std::move(*ticket)));
          } catch (...) {
            item.error = std::current_exception();
          }
        }
        const double busy_s = since(working);
        lock.lock();
        stats[0].busy_s += busy_s;
        ++stats[0].items;
        deposit<0>(s, gen, std::move(item));
        lock.unlock();
        changed.notify_all();
      }
    }

    template <std::size_t K>
    void stage_worker() {
      auto& in = std::get<K - 1>(rings);
      auto& out = std::get<K>(rings);
      auto& fn = std::get<K - 1>(fns);
      for (;;) {
        std::unique_lock lock(mutex);
        const auto waiting = Clock::now();
        changed.wait(lock, [&] { return stop || (!draining && in.head < end && in.ready()); });
        stats[K].wait_input_s += since(waiting);
        if (stop) return;
        const std::uint64_t s = in.head++;
        auto& slot = in.slots[s % in.slots.size()];
        detail::PipeItem<item_t<K - 1>> taken = std::move(*slot);
        slot.reset();
        const std::uint64_t gen = generation;
        const StageContext context{.epoch = epoch, .position = s};
        ++busy;
        lock.unlock();
        changed.notify_all();  // room in `in`

        const auto working = Clock::now();
        detail::PipeItem<item_t<K>> made;
        made.error = taken.error;
        if (!made.error) {
          try {
            if constexpr (std::is_invocable_v<decltype(fn), item_t<K - 1>&&, const StageContext&>)
              made.value.emplace(std::invoke(fn, std::move(*taken.value), context));
            else
              made.value.emplace(std::invoke(fn, std::move(*taken.value)));
          } catch (...) {
            made.error = std::current_exception();
          }
        }
        taken.value.reset();
        const double busy_s = since(working);
        lock.lock();
        stats[K].busy_s += busy_s;
        ++stats[K].items;
        const auto blocked = Clock::now();
        changed.wait(lock, [&] { return stop || gen != generation || s >= end || out.fits(s); });
        stats[K].wait_output_s += since(blocked);
        deposit<K>(s, gen, std::move(made));
        lock.unlock();
        changed.notify_all();
      }
    }

    std::optional<batch_type> take() {
      auto& out = std::get<stage_count - 1>(rings);
      std::unique_lock lock(mutex);
      const auto waiting = Clock::now();
      changed.wait(lock, [&] { return out.head >= end || out.ready(); });
      consumer_wait_s += since(waiting);
      if (out.head >= end) return std::nullopt;
      auto& slot = out.slots[out.head % out.slots.size()];
      detail::PipeItem<batch_type> item = std::move(*slot);
      slot.reset();
      ++out.head;
      fresh = false;
      lock.unlock();
      changed.notify_all();
      if (item.error) std::rethrow_exception(item.error);
      {
        std::lock_guard guard(mutex);
        ++delivered_count;
      }
      return std::move(item.value);
    }

    // set_epoch (epoch given) or rewind (not): drops the items in flight, restarts the source.
    void restart(std::optional<std::int64_t> new_epoch) {
      std::unique_lock lock(mutex);
      // Nothing of it taken: keep it (not after a restart that failed).
      if (new_epoch && *new_epoch == epoch && fresh && !restart_failed) return;
      ++generation;
      end = std::min(end, next_claim);  // no new claims
      draining = true;
      changed.notify_all();
      changed.wait(lock, [&] { return busy == 0; });
      draining = false;
      fresh = new_epoch.has_value();
      std::apply([](auto&... ring) { (ring.clear(), ...); }, rings);
      next_claim = end = 0;
      // Nothing is claimed meanwhile (end == next_claim), nor after if the source fails to restart.
      if (new_epoch) restart_failed = true;  // until the source has started the epoch (its rewind may throw too)
      if constexpr (requires(source_type& s) { s.rewind(); }) source.rewind();
      if (new_epoch) {
        if constexpr (requires(source_type& s) { s.set_epoch(*new_epoch); }) source.set_epoch(*new_epoch);
        restart_failed = false;
        epoch = *new_epoch;
      }
      // A rewind after a set_epoch that failed does not reopen the old epoch: only a set_epoch does.
      end = restart_failed ? 0 : no_end;
      lock.unlock();
      changed.notify_all();
    }

    PipelineStats read_stats() {
      std::lock_guard guard(mutex);
      return {.stages = stats, .consumer_wait_s = consumer_wait_s, .seconds = since(stats_since),
              .delivered = delivered_count};
    }
    void reset_stats() {
      std::lock_guard guard(mutex);
      for (auto& s : stats) s.items = 0, s.busy_s = s.wait_input_s = s.wait_output_s = 0;
      consumer_wait_s = 0;
      delivered_count = 0;
      stats_since = Clock::now();
    }
  };

  std::unique_ptr<Impl> impl_;
};

/// A pipeline: the read source and its knobs, then the stages in order (see the top of this header).
template <class Source, class... Fs>
[[nodiscard]] Pipeline<std::decay_t<Source>, Fs...> pipeline(Source&& source, StageOptions read, Stage<Fs>... stages) {
  return Pipeline<std::decay_t<Source>, Fs...>(std::forward<Source>(source), std::move(read), std::move(stages)...);
}

}  // namespace nitro::data
