#pragma once
// This process's place among processes that train together. The first dist::ProcessGroup of the
// process (dist/process_group.hpp) sets it when it is made and puts it back when its last handle goes
// (a group made while that one lives changes nothing: make the world group first); what writes for
// the whole run asks is_main_process(): the progress bar and the metric sinks when they are made,
// snapshot::Policy at each save, so that one process writes, not every rank over the same files. Make
// the ProcessGroup before them. Without a process group it is rank 0 of 1: a single process writes as
// before.
//
// The processes also take decisions together through it: make_agreement() gives a vote among the
// ranks of that group (snapshot::Policy uses one to stop every rank at the same step on SIGTERM), or
// nothing for a single process. core/ names the interface only; dist::ProcessGroup provides it.
#include <nitro/core/config.hpp>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

namespace nitro {

namespace detail {
inline std::atomic<int> process_rank{0};
inline std::atomic<int> process_count{1};
inline std::atomic<int> process_groups_owner{0};  // 1 while a group owns the values above
}  // namespace detail

/// This process's rank (0 without a process group).
[[nodiscard]] inline int process_rank() noexcept { return detail::process_rank.load(std::memory_order_relaxed); }
/// The number of processes training together (1 without a process group).
[[nodiscard]] inline int process_count() noexcept { return detail::process_count.load(std::memory_order_relaxed); }
/// Rank 0: the process that draws the progress bar and writes snapshots and metric files.
[[nodiscard]] inline bool is_main_process() noexcept { return process_rank() == 0; }

/// A yes/no decision the processes of a run take together, over and over: at the same point of its
/// run every rank calls begin(flag), later end(), which says whether any rank's flag was set. Every
/// rank must make the same calls in the same order (they are collectives). Reused from call to call.
class Agreement {
 public:
  virtual ~Agreement() = default;
  /// Starts a vote with this rank's flag; returns at once (the vote goes on in the background).
  virtual void begin(bool flag) = 0;
  /// Whether any rank's flag was set. Waits for the vote begun last (on a group of GPU tensors only:
  /// the vote begun the time before, so that reading it never waits for the GPU; see
  /// dist::ProcessGroup). Throws nitro::Error when a rank is gone.
  [[nodiscard]] virtual bool end() = 0;
  /// A vote was begun and not yet ended.
  [[nodiscard]] virtual bool pending() const noexcept = 0;
};

namespace detail {
inline std::mutex agreement_mutex;
inline std::function<std::unique_ptr<Agreement>()> agreement_factory;  // set while a group owns the rank
NITRO_INLINE void set_agreement_factory(std::function<std::unique_ptr<Agreement>()> f);
}  // namespace detail

/// A new Agreement among the processes of the run (the group that set process_rank()), or nullptr
/// for a single process.
[[nodiscard]] NITRO_INLINE std::unique_ptr<Agreement> make_agreement();

}  // namespace nitro

#if !NITRO_COMPILED
#include <nitro/core/rank-inl.hpp>
#endif
