#pragma once
// Where a Prefetcher (data/prefetcher.hpp) gets its batches. Every source is read through two steps:
// `claim()`, called by one worker at a time in batch order, which says what the next batch is (or
// that the epoch ended), and `produce(ticket)`, which makes it and may run on several workers at
// once. The prefetcher delivers batches in claim order whatever order the workers finish in.
//
//   CallableSource      a callable returning std::optional<Batch> (empty: the epoch ended); read by one
//                       worker, since each call depends on the last. `nitro::from_callable(f)`, or pass f.
//   LoaderSource        a torch::data data loader (it has its own workers); `nitro::from_loader(loader)`.
//   DatasetSource       a torch::data data set and a sampler: the sampler's index batches are claimed in
//                       order, and the data set's get_batch runs on N workers in parallel, each on its
//                       own copy of the data set (as torch::data's workers do). `nitro::from_dataset(...)`.
#include <nitro/core/concepts.hpp>
#include <nitro/core/error.hpp>

#include <torch/data/datasets/base.h>
#include <torch/data/samplers/base.h>

#include <atomic>
#include <concepts>
#include <cstdint>
#include <cstddef>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace nitro {

/// What a Prefetcher reads: claim() in order (one worker at a time), produce() on any worker.
/// `parallel` says whether produce() may run on several workers at once.
template <class S>
concept PrefetchSource = requires(S& s) {
  typename S::batch_type;
  typename S::ticket_type;
  { s.claim() } -> std::same_as<std::optional<typename S::ticket_type>>;
  { s.produce(std::declval<typename S::ticket_type&&>()) } -> std::same_as<typename S::batch_type>;
  { S::parallel } -> std::convertible_to<bool>;
} && Batch<typename S::batch_type>;

/// A callable returning std::optional<Batch>: the whole work happens in claim(), in order.
template <BatchSource F>
class CallableSource {
 public:
  using batch_type = source_batch_t<F>;  ///< The batch the callable returns (inside its std::optional).
  using ticket_type = batch_type;         ///< A claim is the batch itself.
  static constexpr bool parallel = false;  ///< One worker: each call depends on the last.

  /// A source calling `f` for each batch.
  explicit CallableSource(F f) : f_(std::move(f)) {}
  /// Calls f: its batch, or nothing when the epoch ended. What f throws reaches the consumer.
  std::optional<ticket_type> claim() { return std::invoke(f_); }
  /// Hands back the batch claim() made.
  batch_type produce(ticket_type&& batch) { return std::move(batch); }

 private:
  F f_;
};

/// A callable as a source: `nitro::from_callable([&]() -> std::optional<at::Tensor> { ... })`.
template <BatchSource F>
CallableSource<std::decay_t<F>> from_callable(F&& f) {
  return CallableSource<std::decay_t<F>>(std::forward<F>(f));
}

namespace detail {
// Reaches a torch::data loader's job queue (DataLoaderBase's protected `shuttle_`) through a class
// derived from it that is never made. Its drain() drops the jobs not begun and waits for those
// being made (at most the loader's workers), so the loader can begin a new pass: torch refuses
// begin() while a pass has jobs in flight and gives no other way to end a pass early.
template <class Loader>
struct LoaderInternals : Loader {
  static consteval bool reachable() { return requires(LoaderInternals& l) { l.shuttle_.drain(); }; }
  static std::size_t in_flight(const Loader& loader) { return (loader.*(&LoaderInternals::shuttle_)).in_flight_jobs(); }
  static void drain(Loader& loader) { (loader.*(&LoaderInternals::shuttle_)).drain(); }
};
template <class Loader>
consteval bool torch_loader() {
  if constexpr (std::is_final_v<Loader> || !std::is_class_v<Loader>) {
    return false;
  } else {
    return LoaderInternals<Loader>::reachable();
  }
}
}  // namespace detail

/// A torch::data data loader (stateless or stateful), read one batch at a time from its iterator.
/// The loader is borrowed: it must outlive the source (and so the prefetcher or pipeline reading it).
/// A pass left mid-way (set_epoch, or the source destroyed with its prefetcher or pipeline) is ended
/// at once, so the loader can be read again: its jobs not begun are dropped and those being made
/// are waited for (torch's timeout does not apply) and dropped. Batches torch holds back to keep
/// them in order (enforce_ordering) stay in the loader until its next pass begins. One reader at a time: a pass begun
/// by another reader while this source's pass still had jobs in flight is refused by torch.
template <class Loader>
class LoaderSource {
  static_assert(detail::torch_loader<Loader>(),
                "nitro::LoaderSource: needs a torch::data data loader (what torch::data::make_data_loader returns, "
                "or a class derived from torch::data::DataLoaderBase that is not final)");
  using Iterator = decltype(std::declval<Loader&>().begin());
  using Internals = detail::LoaderInternals<Loader>;

 public:
  using batch_type = std::remove_cvref_t<decltype(*std::declval<Iterator&>())>;  ///< The loader's batch.
  using ticket_type = batch_type;          ///< A claim is the batch itself.
  static constexpr bool parallel = false;  ///< One worker: the loader has its own.
  static_assert(Batch<batch_type>,
                "nitro::LoaderSource: the loader's batches must be a Batch (a tensor, tuple, torch::data::Example, "
                "a vector of them, or a type with nitro_map_tensors; see core/device.hpp). Map the data set with "
                "torch::data::transforms::Stack<>() to get an Example of stacked tensors");

  /// A source reading `loader` (borrowed); the pass begins at the first claim.
  explicit LoaderSource(Loader& loader) : loader_(&loader) {}
  LoaderSource(const LoaderSource&) = delete;  // two readers of one pass
  LoaderSource& operator=(const LoaderSource&) = delete;
  /// Takes over `other`'s pass; `other` is left with none.
  LoaderSource(LoaderSource&& other) noexcept
      : loader_(other.loader_),
        it_(std::exchange(other.it_, std::nullopt)),
        advance_(std::exchange(other.advance_, false)),
        open_(std::exchange(other.open_, false)) {}
  /// Ends this source's pass, then takes over `other`'s; `other` is left with none.
  LoaderSource& operator=(LoaderSource&& other) noexcept {
    if (this != &other) {
      end_pass_quietly();
      loader_ = other.loader_;
      it_ = std::exchange(other.it_, std::nullopt);
      advance_ = std::exchange(other.advance_, false);
      open_ = std::exchange(other.open_, false);
    }
    return *this;
  }
  ~LoaderSource() { end_pass_quietly(); }

  /// The loader's next batch. The iterator is advanced at the next claim, not after this one: a
  /// batch that fails to load then surfaces as the error of its own claim, after the batches before
  /// it were all delivered. The claim after an error asks the loader again: past a failed batch
  /// (torch::data::WorkerException) that is the batch after it; after torch's timeout, the late batch.
  std::optional<ticket_type> claim() {
    if (!it_) {
      it_.emplace(loader_->begin());
      open_ = true;
    }
    // Whether this source's pass has jobs in the loader, once the claim is over (an error too).
    // With none left another reader may begin a pass, which this source must not drain; a claim
    // after an error may queue jobs again (torch refills as it hands out a batch it held back).
    struct NoteJobs {
      LoaderSource& s;
      ~NoteJobs() { s.open_ = Internals::in_flight(*s.loader_) > 0; }
    } note{*this};
    if (advance_) {
      ++*it_;  // may throw the next batch's error; advance_ stays set
      advance_ = false;
    }
    if (*it_ == loader_->end()) return std::nullopt;
    batch_type b = std::move(**it_);
    advance_ = true;
    return b;
  }
  /// Hands back the batch claim() took from the loader.
  batch_type produce(ticket_type&& batch) { return std::move(batch); }
  /// A new epoch: the pass being read is ended and the loader is begun again at the next claim (its
  /// own sampler decides the order; `epoch` is not used).
  void set_epoch(std::int64_t /*epoch*/) { end_pass(); }

 private:
  // Ends the pass being read: drains it if it still has jobs in flight (only with workers: without
  // them begin() resets the sampler or the stateful data set, and nothing is in flight).
  void end_pass() {
    const bool drain = open_ && loader_->options().workers > 0;
    it_.reset();
    advance_ = open_ = false;
    if (drain) Internals::drain(*loader_);
  }
  void end_pass_quietly() noexcept {
    try {
      end_pass();
    } catch (...) {  // a destructor: the loader is left as torch leaves it
    }
  }

  Loader* loader_;
  std::optional<Iterator> it_;
  bool advance_ = false;  // the batch at it_ was handed out: advance before the next one
  bool open_ = false;     // this source's pass still has jobs in the loader
};

/// A torch::data data loader as a source (borrowed: it must outlive the prefetcher).
///   auto loader = torch::data::make_data_loader(dataset.map(torch::data::transforms::Stack<>()), 64);
///   nitro::Prefetcher<nitro::Cuda, nitro::LoaderSource<std::remove_reference_t<decltype(*loader)>>> p{
///       nitro::from_loader(*loader)};
template <class Loader>
LoaderSource<Loader> from_loader(Loader& loader) {
  return LoaderSource<Loader>(loader);
}

/// A torch::data data set and a sampler: claim() asks the sampler for the next `batch_size` indices
/// (in order), produce() calls the data set's get_batch on a worker's own copy of the data set.
///
/// A sampler that tracks deliveries (data/sampler.hpp's ResumableSampler: it has `defer_delivery`,
/// `delivered` and `rewind`) is switched to deferred delivery here, and the Prefetcher reports to it,
/// through delivered() and rewind() below, which claimed batches its consumer received: the sampler's
/// state then counts only those. Other samplers (torch's own) are used unchanged.
template <class Dataset, class Sampler>
class DatasetSource {
 public:
  using batch_type = typename Dataset::BatchType;           ///< What the data set's get_batch returns.
  using ticket_type = typename Sampler::BatchRequestType;  ///< A claim: the sampler's batch of indices.
  static constexpr bool parallel = true;  ///< produce() runs on several workers at once.
  static_assert(Batch<batch_type>,
                "nitro::DatasetSource: the data set's get_batch must return a Batch (e.g. map the data set with "
                "torch::data::transforms::Stack<>(), or return a torch::data::Example of stacked tensors)");
  static_assert(std::copy_constructible<Dataset>,
                "nitro::DatasetSource: the data set must be copyable: each worker reads its own copy");

  /// Reads `dataset` in `batch_size` batches of `sampler`'s indices (a deferring sampler is switched to
  /// deferred delivery) and resets the sampler to the data set's size. Throws nitro::Error when
  /// batch_size is 0, or what the sampler's reset throws (ResumableSampler: a resumed position whose
  /// size is not the data set's).
  DatasetSource(Dataset dataset, Sampler sampler, std::size_t batch_size)
      : dataset_(std::make_shared<Dataset>(std::move(dataset))), sampler_(std::move(sampler)), batch_size_(batch_size) {
    NITRO_CHECK(batch_size_ > 0, "nitro::DatasetSource: batch_size is 0; give the number of samples per batch");
    if constexpr (requires { sampler_.defer_delivery(true); }) sampler_.defer_delivery(true);
    sampler_.reset(dataset_->size());
  }

  /// The sampler's next `batch_size` indices, or nothing when the epoch ended. First brings an
  /// epoch-keyed data set (data::ImageBatches) to the sampler's epoch.
  std::optional<ticket_type> claim() {
    // A data set keyed by the epoch (data::ImageBatches' random crops) follows the sampler's, which a
    // resumed sampler may have moved past 0 where Prefetcher::set_epoch of that same epoch changes nothing.
    if constexpr (requires(Dataset& d, const Sampler& s) {
                    d.set_epoch(s.epoch());
                    { std::as_const(d).epoch() } -> std::convertible_to<std::int64_t>;
                  }) {
      if (dataset_->epoch() != sampler_.epoch()) dataset_->set_epoch(sampler_.epoch());
    }
    return sampler_.next(batch_size_);
  }

  /// The oldest claimed batch reached the consumer (the Prefetcher calls it; only for a sampler that
  /// tracks deliveries).
  void delivered()
    requires requires(Sampler& s) { s.delivered(); }
  {
    sampler_.delivered();
  }
  /// The claimed batches not delivered will not be: the sampler hands them out again (the
  /// Prefetcher's destructor calls it; only for a sampler that tracks deliveries).
  void rewind()
    requires requires(Sampler& s) { s.rewind(); }
  {
    sampler_.rewind();
  }

  /// A new epoch: the sampler's epoch is set where it has one (ResumableSampler, torch's
  /// DistributedSampler) and the sampler is reset (torch's RandomSampler draws a new order). A data set
  /// with set_epoch (data::ImageBatches: its random crops are keyed by the epoch) is told too; its
  /// workers' copies share the epoch it holds.
  void set_epoch(std::int64_t epoch) {
    if constexpr (requires(Sampler& s) { s.set_epoch(epoch); }) sampler_.set_epoch(epoch);
    if constexpr (requires(Dataset& d) { d.set_epoch(epoch); }) dataset_->set_epoch(epoch);
    sampler_.reset(dataset_->size());
  }
  /// The sampler's epoch, for a sampler that says (ResumableSampler).
  [[nodiscard]] std::int64_t epoch() const
    requires requires(const Sampler& s) { { s.epoch() } -> std::convertible_to<std::int64_t>; }
  {
    return sampler_.epoch();
  }

  /// Runs on a worker: each worker thread has its own copy of the data set.
  batch_type produce(ticket_type&& indices) {
    thread_local std::pair<std::uint64_t, std::shared_ptr<Dataset>> mine;
    if (mine.first != id_ || !mine.second) mine = {id_, std::make_shared<Dataset>(*dataset_)};
    return mine.second->get_batch(std::move(indices));
  }

 private:
  static std::uint64_t next_id() {
    static std::atomic<std::uint64_t> ids{1};
    return ids++;
  }

  std::shared_ptr<Dataset> dataset_;
  Sampler sampler_;
  std::size_t batch_size_;
  std::uint64_t id_ = next_id();  // tells a worker's copy of this source's data set from another's
};

/// A data set and a sampler as a parallel source:
///   nitro::from_dataset(images.map(torch::data::transforms::Stack<>()),
///                       torch::data::samplers::RandomSampler(images.size().value()), 64)
template <class Dataset, class Sampler>
DatasetSource<std::decay_t<Dataset>, std::decay_t<Sampler>> from_dataset(Dataset&& dataset, Sampler&& sampler,
                                                                          std::size_t batch_size) {
  return {std::forward<Dataset>(dataset), std::forward<Sampler>(sampler), batch_size};
}

namespace detail {
/// Range-for over anything with `std::optional<batch_type> next()` (a Prefetcher, a data::Pipeline):
/// one pass; the iterator owns the current item.
template <class P>
class PullIterator {
 public:
  using value_type = typename P::batch_type;
  using difference_type = std::ptrdiff_t;
  PullIterator() = default;
  explicit PullIterator(P* p) : p_(p) { ++*this; }
  value_type& operator*() const { return *current_; }
  PullIterator& operator++() {
    current_ = p_->next();
    return *this;
  }
  void operator++(int) { ++*this; }
  friend bool operator==(const PullIterator& it, std::default_sentinel_t) { return !it.current_; }

 private:
  P* p_ = nullptr;
  mutable std::optional<value_type> current_;
};

template <class S>
struct as_source {
  using type = S;
};
template <class S>
  requires(!PrefetchSource<S> && BatchSource<S>)
struct as_source<S> {
  using type = CallableSource<S>;
};
}  // namespace detail

/// The PrefetchSource a Prefetcher makes of S: S itself, or a CallableSource around a callable.
template <class S>
using as_prefetch_source_t = typename detail::as_source<std::decay_t<S>>::type;

}  // namespace nitro
