#pragma once
// nitro::stability::Guard: a TrainingLoop hook policy that watches for non-finite losses and
// parameters and for loss spikes, and acts: restores the last good state, lowers the learning rate,
// or stops the run with a nitro::Error that says where it went wrong.
//
//   using Loop = nitro::TrainingLoop<nitro::amp::Bf16, nitro::stability::Guard>;
//   Loop loop{model, optimizer, {.hooks = {nitro::stability::Guard::Options{
//       .on_nonfinite = nitro::stability::Action::restore_scale_lr, .check_every = 10, .backup_every = 100}}}};
//   auto r = loop.step(batch, loss_fn);   // r.nonfinite_found, r.spikes_found, r.restores
//   loop.hook<nitro::stability::Guard>().counts();
//
// No host-device synchronisation on the steps in between: each micro-batch's loss is kept (detached,
// on the device), and every `check_every` optimizer steps one copy to the host brings those losses
// and one flag saying whether every parameter is finite (a norm per parameter, foreach). A NaN or
// inf gradient shows there too: the optimizer step it fed made its parameter non-finite. So a
// problem is seen at most check_every steps late, and the actions are those that work after the
// fact:
//   restore            the last good state (parameters, buffers, optimizer state, RNGs: a
//                      memory::StateBackup on the host, taken every backup_every steps at a check
//                      that found nothing wrong) is put back; the steps since are lost
//   restore_scale_lr   the same, then every parameter group's learning rate times lr_factor
//   raise              a nitro::Error naming the optimizer step, the first non-finite parameter
//                      and the last good loss (the run stops; the state is left as it is)
//   skip               the loop itself skips a step whose gradients are non-finite (amp::Fp16, or
//                      TrainingLoop::Options::skip_nonfinite: one flag read per step): the guard counts those
//                      steps (a non-finite loss makes its gradients non-finite, so it is one of them);
//                      a non-finite parameter it still finds then raises
//   none               count only (spikes' default): the check otherwise goes on as a clean one
// A restore that is followed by another before any clean check counts towards max_restores; past it
// the guard raises. Spikes: a finite loss more than spike_z standard deviations above the mean of the
// last spike_window finite losses (once spike_min losses are in the window) is a spike, acted on by
// on_spike; a spike does not enter the window, but spike_min spikes in a row are a new level of the
// loss and become the window. The losses are those StepResult carries (every step(), micro-batches
// included, and graph::Capture's replays).
//
// With check_every = 1 the guard reads one small tensor per optimizer step (what TrainingLoop::Options::
// skip_nonfinite costs); the default 10 reads one every 10 (bench_monitor's guard_overhead).
#include <nitro/core/config.hpp>
#include <nitro/core/concepts.hpp>
#include <nitro/core/error.hpp>
#include <nitro/core/state_dict.hpp>
#include <nitro/memory/batch_size.hpp>
#include <nitro/train/hooks.hpp>

#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nitro::stability {

/// `none`: count only; `skip`: the loop skips the step (amp::Fp16 or skip_nonfinite), the guard counts
/// it; `restore`: put back the last good state; `restore_scale_lr`: restore, then scale every group's
/// learning rate by lr_factor; `raise`: throw nitro::Error naming the step and the first non-finite
/// parameter.
/// What the guard does about what it finds (see the top of this file).
enum class Action { none, skip, restore, restore_scale_lr, raise };

/// The guard's knobs.
struct GuardOptions {
  /// On a non-finite loss or parameter: skip (counts the loop's skipped steps), restore,
  /// restore_scale_lr or raise; not none.
  Action on_nonfinite = Action::restore;
  /// On a loss spike: none (count), restore, restore_scale_lr or raise.
  Action on_spike = Action::none;
  /// Optimizer steps between two checks (one host read each), >= 1.
  std::int64_t check_every = 10;
  /// Optimizer steps between two host copies of the last good state, a multiple of check_every
  /// (restore actions only).
  std::int64_t backup_every = 100;
  /// restore_scale_lr: the learning rate is multiplied by this, in (0, 1].
  double lr_factor = 0.5;
  /// Finite losses in the spike detector's window, >= 2.
  std::int64_t spike_window = 100;
  /// Losses needed in the window before spikes are looked for, in [2, spike_window]. So many spikes
  /// in a row are a new level, not spikes: the window starts again from them.
  std::int64_t spike_min = 20;
  /// A spike is a loss more than this many standard deviations above the window's mean, > 0 (the
  /// deviation counted as at least 1e-3 of the mean, and 1e-8: a flat loss is no hair trigger).
  double spike_z = 6.0;
  /// Restores in a row (no clean check between them) before the guard gives up and raises, >= 1:
  /// a run that diverges again from its last good state does not spin for ever.
  std::int64_t max_restores = 3;
};

/// What the guard has seen.
struct GuardCounts {
  /// Checks run (each one host read).
  std::int64_t checks = 0;
  /// Checks that found a non-finite loss or parameter, plus the steps the loop skipped.
  std::int64_t nonfinite = 0;
  /// Checks that found a loss spike.
  std::int64_t spikes = 0;
  /// Restores of the last good state.
  std::int64_t restores = 0;
  /// Restores that also scaled the learning rate (restore_scale_lr).
  std::int64_t lr_scalings = 0;
  /// Optimizer steps the loop skipped (non-finite gradients, amp::Fp16 or skip_nonfinite).
  std::int64_t skipped = 0;
  /// The last loss a clean check saw, and the optimizer step of that check (NaN, -1: none yet).
  double last_good_loss = std::numeric_limits<double>::quiet_NaN();
  /// The optimizer step of the check that saw last_good_loss (-1: none yet).
  std::int64_t last_good_step = -1;
};

/// A hook policy that watches for non-finite losses and parameters and for loss spikes, and acts on
/// them (Action): see the top of this file.
class Guard {
 public:
  /// The policy family this belongs to (a hook of TrainingLoop).
  using family = family::Hook;
  /// Name shown in reports, and the key of its state in snapshots.
  static constexpr std::string_view name = "stability_guard";
  /// On: the loop calls its hooks.
  static constexpr bool enabled = true;
  /// The knobs: GuardOptions.
  using Options = GuardOptions;

  /// Throws nitro::Error for options out of range: on_nonfinite none, on_spike skip, check_every < 1,
  /// backup_every not a multiple of check_every, lr_factor not in (0, 1], spike_window < 2, spike_min not
  /// in [2, spike_window], spike_z not finite and > 0, max_restores < 1.
  NITRO_INLINE explicit Guard(const Options& options);

  /// At the end of every step() (each micro-batch; also a step replayed by graph::Capture and a batch
  /// accumulate::Adaptive split): its loss is kept, and after an optimizer step the check may run.
  /// Throws nitro::Error when the action is raise, when a restore is needed before a good state was
  /// kept or more than max_restores times in a row, and (at the first step) when on_nonfinite is skip
  /// but the loop does not skip non-finite steps.
  template <class Loop>
  void on_step_end(Loop& loop, StepResult& r, std::int64_t /*rows*/) {
    if (!checked_setup_) setup(loop);
    if (r.loss.defined()) pending_.push_back(r.loss);  // detached already
    if (r.stepped || r.skipped) {
      if (r.skipped) {
        ++counts_.skipped;
        ++counts_.nonfinite;
      }
      if (++since_check_ >= o_.check_every) {
        since_check_ = 0;
        check(loop);
      }
    }
    r.nonfinite_found = counts_.nonfinite;
    r.spikes_found = counts_.spikes;
    r.restores = counts_.restores;
  }

  /// What the guard has seen so far.
  [[nodiscard]] const GuardCounts& counts() const noexcept { return counts_; }
  /// A line for the monitor's report.
  [[nodiscard]] NITRO_INLINE std::string report() const;
  /// The options the guard was made with.
  [[nodiscard]] const Options& options() const noexcept { return o_; }
  /// Whether a good state is kept on the host to restore.
  [[nodiscard]] bool has_backup() const noexcept { return backup_ != nullptr; }

  /// The counters and the spike window (the backup is not saved: a resumed run takes a new one at
  /// its first clean check).
  [[nodiscard]] NITRO_INLINE StateDict state_dict() const;
  /// Puts back a state_dict(). Throws nitro::Error, changing nothing, for a state these options cannot
  /// hold (a spike window longer than spike_window, a check count out of range).
  NITRO_INLINE void load_state_dict(const StateDict& s);

 private:
  NITRO_INLINE static Options validated(const Options& o);

  static bool restores(Action a) { return a == Action::restore || a == Action::restore_scale_lr; }

  template <class Loop>
  void setup(Loop& loop) {
    checked_setup_ = true;
    if (o_.on_nonfinite == Action::skip) {
      NITRO_CHECK(Loop::amp_policy::scales_loss || loop.options().skip_nonfinite,
                  "stability::Guard: on_nonfinite = skip needs a loop that skips non-finite steps: amp::Fp16, or "
                  "{.skip_nonfinite = true} in the loop's options (one flag read per step); or choose restore");
    }
  }

  template <class Loop>
  void check(Loop& loop) {
    ++counts_.checks;
    const std::int64_t step = loop.optimizer_steps();
    // One copy to the host: the losses kept since the last check, then 1 if every parameter is finite.
    std::vector<at::Tensor> params;
    for (const auto& p : loop.model().parameters())
      if (p.defined() && p.numel() > 0) params.push_back(p.detach());
    std::vector<at::Tensor> parts;
    if (!pending_.empty()) parts.push_back(at::cat(pending_as_vectors()).to(at::kDouble));
    const c10::Device device = params.empty() ? c10::Device(c10::kCPU) : params.front().device();
    at::Tensor finite = at::ones({1}, at::TensorOptions().dtype(at::kDouble).device(device));
    if (!params.empty()) {
      // Norms per device would need one flag each; the parameters of one loop share a device.
      const auto norms = at::_foreach_norm(params);
      finite = at::stack(norms).isfinite().all().reshape({1}).to(at::kDouble);
    }
    for (auto& part : parts) part = part.to(device);
    parts.push_back(finite);
    const auto host = at::cat(parts).cpu();
    pending_.clear();
    std::vector<double> losses(restored_pending_);
    restored_pending_.clear();
    const auto* v = host.data_ptr<double>();
    const auto n_losses = host.numel() - 1;
    losses.insert(losses.end(), v, v + n_losses);
    const bool params_finite = v[n_losses] > 0.5;
    bool loss_finite = true, spike = false;
    double last = std::numeric_limits<double>::quiet_NaN();
    for (const double x : losses) {
      if (!std::isfinite(x)) {
        loss_finite = false;
        continue;
      }
      if (is_spike(x)) {
        spike = true;
        // So many spikes in a row are a new level of the loss: the window starts again from them.
        recent_spikes_.push_back(x);
        if (static_cast<std::int64_t>(recent_spikes_.size()) >= o_.spike_min) {
          window_.assign(recent_spikes_.begin(), recent_spikes_.end());
          recent_spikes_.clear();
        }
        continue;
      }
      recent_spikes_.clear();
      window_.push_back(x);
      if (static_cast<std::int64_t>(window_.size()) > o_.spike_window) window_.pop_front();
      last = x;
    }
    if (!params_finite) {
      ++counts_.nonfinite;
      if (o_.on_nonfinite == Action::skip)
        raise(loop, step, "a non-finite parameter although the loop skips non-finite steps");
      act(loop, o_.on_nonfinite, step, !loss_finite ? "a non-finite loss" : "a non-finite parameter");
      return;
    }
    // With skip, a non-finite loss is a step the loop skipped (counted there); the parameters are finite.
    if (!loss_finite && o_.on_nonfinite != Action::skip) {
      ++counts_.nonfinite;
      act(loop, o_.on_nonfinite, step, "a non-finite loss");
      return;
    }
    if (spike) {
      ++counts_.spikes;
      if (o_.on_spike != Action::none) {
        act(loop, o_.on_spike, step, "a loss spike");
        return;
      }
    }
    restores_in_a_row_ = 0;
    if (!std::isnan(last)) {
      counts_.last_good_loss = last;
      counts_.last_good_step = step;
    }
    if ((restores(o_.on_nonfinite) || restores(o_.on_spike)) && (backup_ == nullptr || step - backup_step_ >= o_.backup_every)) {
      backup_.reset();  // the old copy goes first: never two on the host at once
      backup_ = std::make_unique<memory::StateBackup>(&loop.model(), &loop.optimizer());
      backup_step_ = step;
    }
  }

  // The kept losses, each flattened (a micro-batch's loss is one element; a user's may be more).
  NITRO_INLINE std::vector<at::Tensor> pending_as_vectors() const;

  NITRO_INLINE bool is_spike(double x) const;

  template <class Loop>
  void act(Loop& loop, Action a, std::int64_t step, const char* what) {
    if (a == Action::none) return;
    if (a == Action::raise) raise(loop, step, what);
    if (backup_ == nullptr)
      raise(loop, step, (std::string(what) + " before any good state was kept to restore (the first clean check "
                         "keeps one)").c_str());
    if (++restores_in_a_row_ > o_.max_restores)
      raise(loop, step, (std::string(what) + " again after " + std::to_string(o_.max_restores) +
                         " restores in a row of the state of step " + std::to_string(backup_step_) +
                         " (max_restores)").c_str());
    backup_->restore();
    ++counts_.restores;
    if (a == Action::restore_scale_lr) {
      for (auto& group : loop.optimizer().param_groups()) group.options().set_lr(group.options().get_lr() * o_.lr_factor);
      ++counts_.lr_scalings;
    }
  }

  template <class Loop>
  [[noreturn]] void raise(Loop& loop, std::int64_t step, const char* what) {
    std::string first = "none (the parameters are finite)";
    for (const auto& item : loop.model().named_parameters()) {
      const auto& p = item.value();
      if (p.defined() && p.numel() > 0 && !p.detach().isfinite().all().template item<bool>()) {
        first = "'" + item.key() + "'";
        break;
      }
    }
    ::nitro::detail::fail("stability::Guard: ", what, " at optimizer step ", step, " (checked every ", o_.check_every,
                          " steps); first non-finite parameter: ", first, "; last good loss ", counts_.last_good_loss,
                          " at step ", counts_.last_good_step,
                          "; lower the learning rate, clip gradients (clip::Norm), or use bf16 rather than fp16");
  }

  Options o_;
  GuardCounts counts_;
  std::vector<at::Tensor> pending_;  // the losses since the last check, on the device
  std::deque<double> window_;
  std::int64_t since_check_ = 0;
  std::unique_ptr<memory::StateBackup> backup_;
  std::int64_t backup_step_ = -1;
  std::vector<double> restored_pending_;  // kept losses read from a state_dict, checked first
  std::vector<double> recent_spikes_;     // spikes in a row
  std::int64_t restores_in_a_row_ = 0;
  bool checked_setup_ = false;
};

}  // namespace nitro::stability

#if !NITRO_COMPILED
#include <nitro/train/stability-inl.hpp>
#endif
