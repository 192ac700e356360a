#pragma once
// nitro::monitor::ProgressBar: a tqdm-like progress line for a training loop, cheap enough to call
// on every step.
//
//   nitro::monitor::ProgressBar bar{{.total = steps, .desc = "epoch 1", .loss_every = 50}};
//   for (auto& batch : batches) {
//     nitro::StepResult result = loop.step(batch, loss_fn);
//     bar.update(1, result);                   // keeps result.loss; reads the last 50 every 50th call
//   }
//   bar.close();                               // final state and a newline (also done by the destructor)
//
// update(n, loss) takes a StepResult (its loss), a one-element tensor, or a number.
//
// On a terminal it rewrites one line at most every refresh_s seconds:
//
//   epoch 1: 45%|#########           | 450/1000 [00:12<00:15, 37.1 it/s, loss=0.4321]
//
// Elsewhere (a log file, a pipe, CI) it writes a plain line at most every plain_every_s seconds and
// one at close:
//
//   epoch 1: 450/1000 (45%) elapsed 00:12 eta 00:15 37.1 it/s loss 0.4321
//
// The loss shown is the mean of the losses of the last loss_window updates (50) that passed one,
// every one of them counted, taken at the last read (and by close(), so the final line shows the
// window as it ends). Why the losses are read only every loss_every
// calls: on a GPU, .item() waits for every kernel queued so far, which stalls the pipeline of
// asynchronous launches the training step relies on. So update() only keeps the loss tensor (a
// reference, not a copy: pass a tensor the step made, not one it changes in place later), and each
// read sums the kept ones. A GPU loss is never read with .item(): the window's sum is computed on the
// device and copied to pinned host memory without blocking, and the value is taken once that copy
// has completed (looked at on each later read and at a draw), so the mean lags the GPU by at most
// loss_every steps and the bar never waits for the device; close() waits for the last copy.
//
// update() costs one compare of n, one add, one clock read and one compare while no draw is due,
// and with a loss a few more: its checks and the swap of one kept tensor in the window.
// Not thread-safe: update a bar from one thread.
#include <nitro/core/error.hpp>
#include <nitro/core/rank.hpp>
#include <nitro/core/step_result.hpp>

#include <nitro/core/config.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDAEvent.h>  // at::cuda::CUDAEvent (ATen/cuda/CUDAEvent.h adds cuBLAS, cuSPARSE, cuSOLVER)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nitro::monitor {

/// How a ProgressBar counts, reads the loss and draws.
struct ProgressOptions {
  /// Draw in every process; false: only in rank 0 (nitro::is_main_process(), core/rank.hpp), the
  /// others count silently, so that a run of several processes shows one bar.
  bool every_rank = false;
  /// Expected number of units (steps, samples); 0: unknown, then no percentage, bar or ETA.
  std::int64_t total = 0;
  /// Shown first on the line.
  std::string desc = "train";
  /// Read the kept losses (on a GPU: their sum, copied without blocking) on the 1st, (K+1)th,
  /// (2K+1)th... update that passes one. Must be >= 1.
  std::int64_t loss_every = 50;
  /// The loss shown is the mean of the losses passed to the last loss_window updates that passed
  /// one (fewer before there are that many), as of the last read; 1 shows the last loss read. With
  /// loss_window = loss_every (both 50 by default) each read covers exactly the steps since the
  /// last one. Must be >= 1; the bar keeps that many loss tensors (one element each).
  std::int64_t loss_window = 50;
  /// On a terminal: the least seconds between two redraws (0: redraw on every update).
  double refresh_s = 0.1;
  /// Not on a terminal: the least seconds between two plain lines (0: a line on every update);
  /// one more line is written at close.
  double plain_every_s = 10.0;
  /// Where to draw; not owned, not closed.
  std::FILE* stream = stderr;
  /// The name of what is counted, in the rate ("37.1 it/s").
  std::string unit = "it";
  /// Columns of the terminal line; 0: asked of the terminal (TIOCGWINSZ) at each draw, 80 if it
  /// does not say.
  int width = 0;
  /// Draw as on a terminal (true) or in plain lines (false); nullopt: isatty(fileno(stream)).
  std::optional<bool> terminal;
  /// Seconds on any fixed origin; empty: std::chrono::steady_clock. For tests and replays.
  std::function<double()> clock;
};

/// "mm:ss" below an hour, "h:mm:ss" from one hour on, as tqdm; fractions of a second are dropped.
/// "??:??" for a negative or non-finite duration.
///   format_duration(65) == "01:05", format_duration(3725) == "1:02:05"
[[nodiscard]] inline std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds >= 1e15) return "??:??";
  const auto total = static_cast<long long>(seconds);
  const long long h = total / 3600;
  const long long m = total / 60 % 60;
  const long long s = total % 60;
  char text[48];
  if (h > 0) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", h, m, s);
  } else {
    std::snprintf(text, sizeof text, "%02lld:%02lld", m, s);
  }
  return text;
}

/// The rate of `count` units over `elapsed_s` seconds: "37.1 it/s", or "2.50 s/it" when slower
/// than one a second; "? it/s" before there is a rate to speak of.
///   format_rate(371, 10.0, "it") == "37.1 it/s"
[[nodiscard]] inline std::string format_rate(std::int64_t count, double elapsed_s, const std::string& unit) {
  char text[64];
  if (count <= 0 || !(elapsed_s > 0) || !std::isfinite(elapsed_s)) return "? " + unit + "/s";
  const double rate = static_cast<double>(count) / elapsed_s;
  if (rate >= 1.0) {
    std::snprintf(text, sizeof text, "%.1f ", rate);
    return text + unit + "/s";
  }
  std::snprintf(text, sizeof text, "%.2f s/", 1.0 / rate);
  return text + unit;
}

/// A progress line on a stream: a bar on a terminal, plain lines elsewhere. See the top of this file.
///
///   nitro::monitor::ProgressBar bar{{.total = 1000, .unit = "samples"}};
///   bar.update(64, loss);                    // loss: a StepResult, a one-element tensor or a double
class ProgressBar {
 public:
  explicit ProgressBar(ProgressOptions options) : options_(std::move(options)) {
    const auto& o = options_;
    NITRO_CHECK(o.total >= 0, "ProgressBar: total must be >= 0 (0 when the number of steps is unknown), got ",
                o.total);
    NITRO_CHECK(o.loss_every >= 1, "ProgressBar: loss_every must be >= 1 (1 reads the loss on every update), got ",
                o.loss_every);
    NITRO_CHECK(o.loss_window >= 1,
                "ProgressBar: loss_window must be >= 1 (the number of last losses averaged; 1 shows the last one), got ",
                o.loss_window);
    NITRO_CHECK(o.refresh_s >= 0 && std::isfinite(o.refresh_s),
                "ProgressBar: refresh_s must be a finite number of seconds >= 0, got ", o.refresh_s);
    NITRO_CHECK(o.plain_every_s >= 0 && std::isfinite(o.plain_every_s),
                "ProgressBar: plain_every_s must be a finite number of seconds >= 0, got ", o.plain_every_s);
    NITRO_CHECK(o.stream != nullptr, "ProgressBar: stream is null; pass stderr, stdout or an open FILE*");
    NITRO_CHECK(o.width >= 0, "ProgressBar: width must be >= 0 (0: the terminal's width), got ", o.width);
    window_.resize(static_cast<std::size_t>(o.loss_window));
    terminal_ = o.terminal.value_or(::isatty(::fileno(o.stream)) == 1);
    start_ = now_s();
    if (!o.every_rank && !nitro::is_main_process()) {  // another rank draws: count, never draw
      closed_ = true;
      next_draw_ = std::numeric_limits<double>::infinity();
    } else if (terminal_) {
      draw(start_);
    } else {
      next_draw_ = start_ + o.plain_every_s;
    }
  }

  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// Closes the bar (see close()); never throws.
  ~ProgressBar() {
    try {
      close();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; the line is cosmetic
    }
  }

  /// Counts n more units and redraws if a draw is due. n must be >= 0.
  void update(std::int64_t n = 1) {
    check_n(n);
    advance(n);
  }

  /// As update(n), and keeps the loss: a one-element tensor (any device, dtype, requires_grad or
  /// not; kept detached), one of the last loss_window averaged. The kept losses are read on the 1st,
  /// (K+1)th, (2K+1)th... call (K = loss_every).
  void update(std::int64_t n, const at::Tensor& loss) {
    check_n(n);
    NITRO_CHECK(loss.defined(), "ProgressBar::update: the loss tensor is undefined; pass the loss of the step");
    NITRO_CHECK(loss.numel() == 1, "ProgressBar::update: the loss must have one element, got ", loss.numel(),
                "; pass loss.mean() or the reduced loss");
    keep({loss.requires_grad() ? loss.detach() : loss, 0.0});
    advance(n);
  }

  /// As update(n, result.loss): the loss of a TrainingLoop step.
  ///   bar.update(1, loop.step(batch, loss_fn));
  void update(std::int64_t n, const StepResult& result) { update(n, result.loss); }

  /// As update(n, loss) with a loss already on the host (e.g. loss.item<double>() the program read anyway).
  void update(std::int64_t n, double loss) {
    check_n(n);
    keep({at::Tensor(), loss});
    advance(n);
  }

  /// Text shown after the loss (e.g. "lr=3e-4"), from the next draw on.
  void set_postfix(std::string postfix) { postfix_ = std::move(postfix); }

  /// Draws the final state once: on a terminal the line and a newline, elsewhere one plain line.
  /// Later calls do nothing; update() still counts but no longer draws.
  void close() {
    if (closed_) return;
    closed_ = true;
    collect_loss(/*wait=*/true);
    if (unread_) {  // losses kept since the last read: the final line shows the window as it ends
      read_window();
      collect_loss(/*wait=*/true);
    }
    next_draw_ = std::numeric_limits<double>::infinity();
    const double now = now_s();
    if (terminal_) {
      write("\r" + terminal_line(now) + "\x1b[K\n");
    } else {
      write(plain_line(now) + "\n");
    }
  }

  /// Units counted so far.
  [[nodiscard]] std::int64_t count() const noexcept { return count_; }
  /// The loss shown: the mean of the last loss_window losses as of the last read; nullopt before the
  /// first. For GPU losses: of the last read whose copy had completed by the last read, draw or close().
  [[nodiscard]] std::optional<double> loss_average() const noexcept { return loss_average_; }
  /// Whether the bar draws as on a terminal.
  [[nodiscard]] bool is_terminal() const noexcept { return terminal_; }
  [[nodiscard]] const ProgressOptions& options() const noexcept { return options_; }

 private:
  static void check_n(std::int64_t n) {
    NITRO_CHECK(n >= 0, "ProgressBar::update: n must be >= 0 (units done since the last update), got ", n);
  }

  void advance(std::int64_t n) {
    count_ += n;
    const double now = now_s();
    if (now >= next_draw_) [[unlikely]] {
      draw(now);
    }
  }

  double now_s() const {
    if (options_.clock) return options_.clock();
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  // A loss: a tensor (value unused), or a number (tensor undefined).
  struct Kept {
    at::Tensor tensor;
    double value = 0;
  };

  // Puts `loss` in the window, over the oldest, and reads the window when a read is due.
  void keep(Kept loss) {
    window_[next_] = std::move(loss);
    if (++next_ == window_.size()) next_ = 0;
    kept_ = std::min(kept_ + 1, window_.size());
    unread_ = true;
    if (loss_calls_++ % options_.loss_every == 0) [[unlikely]] {
      read_window();
    }
  }

  // The mean of the kept losses: at once when all are on the host; for GPU losses, their sum on the
  // newest one's device, copied to pinned memory without blocking (collect_loss takes it).
  [[gnu::noinline]] void read_window() {
    unread_ = false;
    double host_sum = 0;
    std::vector<at::Tensor> on_cpu, on_gpu;
    for (std::size_t i = 0; i < kept_; ++i) {
      const Kept& k = window_[i];
      if (!k.tensor.defined()) {
        host_sum += k.value;
      } else {
        (k.tensor.is_cuda() ? on_gpu : on_cpu).push_back(k.tensor.reshape({}));  // a view
      }
    }
    if (!on_cpu.empty()) host_sum += at::stack(on_cpu).sum(at::kDouble).item<double>();  // one sum, not one .item() each
#if NITRO_WITH_CUDA
    if (!on_gpu.empty()) {
      collect_loss(/*wait=*/false);
      if (copy_pending_) return;  // the last copy is still in flight (rare: loss_every steps ago): skip this read
      // The newest GPU loss's device (the one before next_ that is on a GPU).
      c10::Device device = on_gpu.front().device();
      for (std::size_t back = 1; back <= kept_; ++back) {
        const Kept& k = window_[(next_ + window_.size() - back) % window_.size()];
        if (k.tensor.defined() && k.tensor.is_cuda()) {
          device = k.tensor.device();
          break;
        }
      }
      for (auto& t : on_gpu) t = t.to(device);  // no copy when already there
      if (!host_loss_.defined())
        host_loss_ = at::empty({1}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
      const c10::cuda::CUDAGuard on(device);
      host_loss_.copy_(at::stack(on_gpu).sum(at::kDouble).reshape({1}), /*non_blocking=*/true);
      copied_.record(c10::cuda::getCurrentCUDAStream(device.index()));
      copy_pending_ = true;
      pending_host_sum_ = host_sum;
      pending_count_ = kept_;
      return;
    }
#endif
    loss_average_ = host_sum / static_cast<double>(kept_);
  }

  // Takes the value of the kept GPU loss once its copy has completed (or waits for it).
  void collect_loss(bool wait) {
#if NITRO_WITH_CUDA
    if (!copy_pending_) return;
    if (wait) copied_.synchronize();
    else if (!copied_.query()) return;
    copy_pending_ = false;
    loss_average_ = (host_loss_.data_ptr<double>()[0] + pending_host_sum_) / static_cast<double>(pending_count_);
#else
    (void)wait;
#endif
  }

  [[gnu::noinline]] void draw(double now) {
    collect_loss(/*wait=*/false);
    if (terminal_) {
      write("\r" + terminal_line(now) + "\x1b[K");
      next_draw_ = now + options_.refresh_s;
    } else {
      write(plain_line(now) + "\n");
      next_draw_ = now + options_.plain_every_s;
    }
  }

  void write(const std::string& text) const {
    std::fwrite(text.data(), 1, text.size(), options_.stream);
    std::fflush(options_.stream);
  }

  int columns() const {
    if (options_.width > 0) return options_.width;
    winsize size{};
    if (::ioctl(::fileno(options_.stream), TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
    return 80;
  }

  static std::string number(const char* format, double value) {
    char text[64];
    std::snprintf(text, sizeof text, format, value);
    return text;
  }

  double remaining_s(double elapsed) const {
    if (count_ <= 0 || !(elapsed > 0)) return std::numeric_limits<double>::quiet_NaN();
    return std::max<double>(0, static_cast<double>(options_.total - count_)) * elapsed /
           static_cast<double>(count_);
  }

  int percent() const {
    return static_cast<int>(std::floor(100.0 * static_cast<double>(count_) / static_cast<double>(options_.total)));
  }

  // desc: 45%|#########           | 450/1000 [00:12<00:15, 37.1 it/s, loss=0.4321, postfix]
  std::string terminal_line(double now) const {
    const double elapsed = std::max(0.0, now - start_);
    const bool known = options_.total > 0;
    std::string stats = " " + std::to_string(count_);
    if (known) {
      stats += "/" + std::to_string(options_.total);
    } else {
      stats += " " + options_.unit;
    }
    stats += " [" + format_duration(elapsed);
    if (known) stats += "<" + format_duration(remaining_s(elapsed));
    stats += ", " + format_rate(count_, elapsed, options_.unit);
    if (loss_average_) stats += ", loss=" + number("%.4g", *loss_average_);
    if (!postfix_.empty()) stats += ", " + postfix_;
    stats += "]";

    const int width = columns();
    std::string line = options_.desc + ":";
    if (known) {
      line += " " + std::to_string(percent()) + "%";
      // The last column stays empty: writing into it wraps some terminals to a new line.
      const int bar = width - 1 - static_cast<int>(line.size() + 2 + stats.size());
      if (bar >= 4) {
        const double fraction = std::clamp(static_cast<double>(count_) / static_cast<double>(options_.total), 0.0, 1.0);
        const auto filled = static_cast<std::size_t>(fraction * bar);
        line += "|" + std::string(filled, '#') + std::string(static_cast<std::size_t>(bar) - filled, ' ') + "|";
      }
    }
    line += stats;
    const auto limit = static_cast<std::size_t>(std::max(1, width - 1));
    if (line.size() > limit) line.resize(limit);
    return line;
  }

  // desc: 450/1000 (45%) elapsed 00:12 eta 00:15 37.1 it/s loss 0.4321 postfix
  std::string plain_line(double now) const {
    const double elapsed = std::max(0.0, now - start_);
    std::string line = options_.desc + ": " + std::to_string(count_);
    if (options_.total > 0) {
      line += "/" + std::to_string(options_.total) + " (" + std::to_string(percent()) + "%)";
    } else {
      line += " " + options_.unit;
    }
    line += " elapsed " + format_duration(elapsed);
    if (options_.total > 0) line += " eta " + format_duration(remaining_s(elapsed));
    line += " " + format_rate(count_, elapsed, options_.unit);
    if (loss_average_) line += " loss " + number("%.4g", *loss_average_);
    if (!postfix_.empty()) line += " " + postfix_;
    return line;
  }

  ProgressOptions options_;
  bool terminal_ = false;
  bool closed_ = false;
  bool unread_ = false;  // losses kept since the last read_window()
  double start_ = 0;
  double next_draw_ = 0;
  std::int64_t count_ = 0;
  std::int64_t loss_calls_ = 0;
  std::vector<Kept> window_;  // the last loss_window losses: kept_ of them, the next one goes at next_
  std::size_t next_ = 0, kept_ = 0;
  std::optional<double> loss_average_;
  std::string postfix_;
#if NITRO_WITH_CUDA
  at::Tensor host_loss_;  // pinned, one double
  at::cuda::CUDAEvent copied_;
  bool copy_pending_ = false;
  double pending_host_sum_ = 0;  // the losses of the copied read that were on the host
  std::size_t pending_count_ = 1;
#endif
};

}  // namespace nitro::monitor
