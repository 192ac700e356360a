#pragma once
// This process's place among processes that train together. The first dist::ProcessGroup of the
// process (dist/process_group.hpp) sets it when it is made and puts it back when its last handle goes
// (a group made while that one lives changes nothing: make the world group first); what writes for
// the whole run asks is_main_process(): the progress bar and the metric sinks when they are made,
// snapshot::Policy at each save, so that one process writes, not every rank over the same files. Make
// the ProcessGroup before them. Without a process group it is rank 0 of 1: a single process writes as
// before.
#include <atomic>

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

}  // namespace nitro
