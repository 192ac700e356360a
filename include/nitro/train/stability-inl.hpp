#pragma once
// The definitions of nitro/train/stability.hpp's non-template functions: included by stability.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/train/stability.hpp>

namespace nitro::stability {

NITRO_INLINE Guard::Guard(const Options& options) : o_(validated(options)) {}

NITRO_INLINE std::string Guard::report() const {
  std::string out = "stability guard: " + std::to_string(counts_.checks) + " checks (every " +
                    std::to_string(o_.check_every) + " steps), " + std::to_string(counts_.nonfinite) +
                    " non-finite, " + std::to_string(counts_.spikes) + " spikes, " +
                    std::to_string(counts_.restores) + " restores";
  if (counts_.lr_scalings > 0) out += ", learning rate scaled " + std::to_string(counts_.lr_scalings) + " times";
  if (counts_.skipped > 0) out += ", " + std::to_string(counts_.skipped) + " steps skipped by the loop";
  return out;
}

NITRO_INLINE StateDict Guard::state_dict() const {
  StateDict s;
  s.integers["checks"] = counts_.checks;
  s.integers["nonfinite"] = counts_.nonfinite;
  s.integers["spikes"] = counts_.spikes;
  s.integers["restores"] = counts_.restores;
  s.integers["lr_scalings"] = counts_.lr_scalings;
  s.integers["skipped"] = counts_.skipped;
  s.numbers["last_good_loss"] = counts_.last_good_loss;
  s.integers["last_good_step"] = counts_.last_good_step;
  s.integers["since_check"] = since_check_;
  std::vector<double> w(window_.begin(), window_.end());
  s.tensors["window"] = at::tensor(w, at::kDouble);
  // The losses kept since the last check (one read from the device, as saving a snapshot does anyway).
  std::vector<double> kept(restored_pending_);
  if (!pending_.empty()) {
    const auto host = at::cat(pending_as_vectors()).to(at::kDouble).cpu().contiguous();
    kept.insert(kept.end(), host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
  }
  s.tensors["kept_losses"] = at::tensor(kept, at::kDouble);
  return s;
}

NITRO_INLINE void Guard::load_state_dict(const StateDict& s) {
  GuardCounts c;
  c.checks = s.integer("checks", name);
  c.nonfinite = s.integer("nonfinite", name);
  c.spikes = s.integer("spikes", name);
  c.restores = s.integer("restores", name);
  c.lr_scalings = s.integer("lr_scalings", name);
  c.skipped = s.integer("skipped", name);
  c.last_good_loss = s.number("last_good_loss", name);
  c.last_good_step = s.integer("last_good_step", name);
  const auto since = s.integer("since_check", name);
  NITRO_CHECK(since >= 0 && since < o_.check_every, "stability::Guard::load_state_dict: since_check is ", since,
              ", outside [0, check_every = ", o_.check_every, "); load a state saved with the same check_every");
  const auto w = s.tensor("window", name).to(at::kDouble).contiguous();
  NITRO_CHECK(w.dim() == 1 && w.numel() <= o_.spike_window, "stability::Guard::load_state_dict: the spike window "
              "holds ", w.numel(), " losses, more than spike_window = ", o_.spike_window,
              "; load a state saved with the same options");
  std::vector<double> kept;
  if (const auto it = s.tensors.find("kept_losses"); it != s.tensors.end()) {
    const auto k = it->second.to(at::kDouble).contiguous();
    kept.assign(k.data_ptr<double>(), k.data_ptr<double>() + k.numel());
  }
  counts_ = c;
  since_check_ = since;
  window_.assign(w.data_ptr<double>(), w.data_ptr<double>() + w.numel());
  pending_.clear();
  restored_pending_ = std::move(kept);
  recent_spikes_.clear();
  restores_in_a_row_ = 0;
  // A state from another point of the run: the kept good state is not its own.
  backup_.reset();
  backup_step_ = -1;
}

NITRO_INLINE auto Guard::validated(const Options& o) -> Options {
  NITRO_CHECK(o.on_nonfinite != Action::none, "stability::Guard: on_nonfinite is none; choose skip, restore, "
              "restore_scale_lr or raise (a guard that ignores NaNs guards nothing)");
  NITRO_CHECK(o.on_spike != Action::skip, "stability::Guard: on_spike cannot be skip (a spike is seen after its step "
              "was taken); choose none, restore, restore_scale_lr or raise");
  NITRO_CHECK(o.check_every >= 1, "stability::Guard: check_every must be >= 1, got ", o.check_every);
  NITRO_CHECK(o.backup_every >= o.check_every && o.backup_every % o.check_every == 0,
              "stability::Guard: backup_every (", o.backup_every, ") must be a multiple of check_every (",
              o.check_every, "): backups are taken at checks");
  NITRO_CHECK(o.lr_factor > 0 && o.lr_factor <= 1, "stability::Guard: lr_factor must be in (0, 1], got ", o.lr_factor);
  NITRO_CHECK(o.spike_window >= 2, "stability::Guard: spike_window must be >= 2, got ", o.spike_window);
  NITRO_CHECK(o.spike_min >= 2 && o.spike_min <= o.spike_window, "stability::Guard: spike_min must be in [2, ",
              "spike_window = ", o.spike_window, "], got ", o.spike_min);
  NITRO_CHECK(o.spike_z > 0 && std::isfinite(o.spike_z), "stability::Guard: spike_z must be > 0, got ", o.spike_z);
  NITRO_CHECK(o.max_restores >= 1, "stability::Guard: max_restores must be >= 1, got ", o.max_restores);
  return o;
}

NITRO_INLINE std::vector<at::Tensor> Guard::pending_as_vectors() const {
  std::vector<at::Tensor> out;
  out.reserve(pending_.size());
  for (const auto& l : pending_) out.push_back(l.reshape({-1}).to(pending_.front().device()));
  return out;
}

NITRO_INLINE bool Guard::is_spike(double x) const {
  const auto n = static_cast<std::int64_t>(window_.size());
  if (n < o_.spike_min) return false;
  double mean = 0;
  for (double w : window_) mean += w;
  mean /= static_cast<double>(n);
  double var = 0;
  for (double w : window_) var += (w - mean) * (w - mean);
  const double sd = std::sqrt(var / static_cast<double>(n - 1));
  return x > mean + o_.spike_z * std::max({sd, 1e-3 * std::abs(mean), 1e-8});
}

}  // namespace nitro::stability
