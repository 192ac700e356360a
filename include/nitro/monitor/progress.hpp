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
[[nodiscard]] NITRO_INLINE std::string format_duration(double seconds);

/// The rate of `count` units over `elapsed_s` seconds: "37.1 it/s", or "2.50 s/it" when slower
/// than one a second; "? it/s" before there is a rate to speak of.
///   format_rate(371, 10.0, "it") == "37.1 it/s"
[[nodiscard]] NITRO_INLINE std::string format_rate(std::int64_t count, double elapsed_s, const std::string& unit);

/// A progress line on a stream: a bar on a terminal, plain lines elsewhere. See the top of this file.
///
///   nitro::monitor::ProgressBar bar{{.total = 1000, .unit = "samples"}};
///   bar.update(64, loss);                    // loss: a StepResult, a one-element tensor or a double
class ProgressBar {
 public:
  /// Throws nitro::Error for options out of range: total, width < 0; loss_every, loss_window < 1;
  /// refresh_s or plain_every_s negative or not finite; a null stream.
  NITRO_INLINE explicit ProgressBar(ProgressOptions options);

  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// Closes the bar (see close()); never throws.
  NITRO_INLINE ~ProgressBar();

  /// Counts n more units and redraws if a draw is due. n must be >= 0.
  NITRO_INLINE void update(std::int64_t n = 1);

  /// As update(n), and keeps the loss: a one-element tensor (any device, dtype, requires_grad or
  /// not; kept detached), one of the last loss_window averaged. The kept losses are read on the 1st,
  /// (K+1)th, (2K+1)th... call (K = loss_every).
  NITRO_INLINE void update(std::int64_t n, const at::Tensor& loss);

  /// As update(n, result.loss): the loss of a TrainingLoop step.
  ///   bar.update(1, loop.step(batch, loss_fn));
  void update(std::int64_t n, const StepResult& result) { update(n, result.loss); }

  /// As update(n, loss) with a loss already on the host (e.g. loss.item<double>() the program read anyway).
  NITRO_INLINE void update(std::int64_t n, double loss);

  /// Text shown after the loss (e.g. "lr=3e-4"), from the next draw on.
  void set_postfix(std::string postfix) { postfix_ = std::move(postfix); }

  /// Draws the final state once: on a terminal the line and a newline, elsewhere one plain line.
  /// Later calls do nothing; update() still counts but no longer draws.
  NITRO_INLINE void close();

  /// Units counted so far.
  [[nodiscard]] std::int64_t count() const noexcept { return count_; }
  /// The loss shown: the mean of the last loss_window losses as of the last read; nullopt before the
  /// first. For GPU losses: of the last read whose copy had completed by the last read, draw or close().
  [[nodiscard]] std::optional<double> loss_average() const noexcept { return loss_average_; }
  /// Whether the bar draws as on a terminal.
  [[nodiscard]] bool is_terminal() const noexcept { return terminal_; }
  /// The options the bar was made with.
  [[nodiscard]] const ProgressOptions& options() const noexcept { return options_; }

 private:
  NITRO_INLINE static void check_n(std::int64_t n);

  NITRO_INLINE void advance(std::int64_t n);

  NITRO_INLINE double now_s() const;

  // A loss: a tensor (value unused), or a number (tensor undefined).
  struct Kept {
    at::Tensor tensor;
    double value = 0;
  };

  // Puts `loss` in the window, over the oldest, and reads the window when a read is due.
  NITRO_INLINE void keep(Kept loss);

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
  NITRO_INLINE void collect_loss(bool wait);

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

  NITRO_INLINE void write(const std::string& text) const;

  NITRO_INLINE int columns() const;

  NITRO_INLINE static std::string number(const char* format, double value);

  NITRO_INLINE double remaining_s(double elapsed) const;

  NITRO_INLINE int percent() const;

  // desc: 45%|#########           | 450/1000 [00:12<00:15, 37.1 it/s, loss=0.4321, postfix]
  NITRO_INLINE std::string terminal_line(double now) const;

  // desc: 450/1000 (45%) elapsed 00:12 eta 00:15 37.1 it/s loss 0.4321 postfix
  NITRO_INLINE std::string plain_line(double now) const;

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

#if !NITRO_COMPILED
#include <nitro/monitor/progress-inl.hpp>
#endif
