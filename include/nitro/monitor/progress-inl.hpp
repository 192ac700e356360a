#pragma once
// The definitions of nitro/monitor/progress.hpp's non-template functions: included by progress.hpp when Nitro is
// header-only, compiled once into the library with NITRO_COMPILED (core/config.hpp).
#include <nitro/monitor/progress.hpp>

namespace nitro::monitor {

NITRO_INLINE std::string format_duration(double seconds) {
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

NITRO_INLINE std::string format_rate(std::int64_t count, double elapsed_s, const std::string& unit) {
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

NITRO_INLINE ProgressBar::ProgressBar(ProgressOptions options) : options_(std::move(options)) {
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

NITRO_INLINE ProgressBar::~ProgressBar() {
  try {
    close();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; the line is cosmetic
  }
}

NITRO_INLINE void ProgressBar::update(std::int64_t n) {
  check_n(n);
  advance(n);
}

NITRO_INLINE void ProgressBar::update(std::int64_t n, const at::Tensor& loss) {
  check_n(n);
  NITRO_CHECK(loss.defined(), "ProgressBar::update: the loss tensor is undefined; pass the loss of the step");
  NITRO_CHECK(loss.numel() == 1, "ProgressBar::update: the loss must have one element, got ", loss.numel(),
              "; pass loss.mean() or the reduced loss");
  keep({loss.requires_grad() ? loss.detach() : loss, 0.0});
  advance(n);
}

NITRO_INLINE void ProgressBar::update(std::int64_t n, double loss) {
  check_n(n);
  keep({at::Tensor(), loss});
  advance(n);
}

NITRO_INLINE void ProgressBar::close() {
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

NITRO_INLINE void ProgressBar::check_n(std::int64_t n) {
  NITRO_CHECK(n >= 0, "ProgressBar::update: n must be >= 0 (units done since the last update), got ", n);
}

NITRO_INLINE void ProgressBar::advance(std::int64_t n) {
  count_ += n;
  const double now = now_s();
  if (now >= next_draw_) [[unlikely]] {
    draw(now);
  }
}

NITRO_INLINE double ProgressBar::now_s() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

NITRO_INLINE void ProgressBar::keep(Kept loss) {
  window_[next_] = std::move(loss);
  if (++next_ == window_.size()) next_ = 0;
  kept_ = std::min(kept_ + 1, window_.size());
  unread_ = true;
  if (loss_calls_++ % options_.loss_every == 0) [[unlikely]] {
    read_window();
  }
}

NITRO_INLINE void ProgressBar::collect_loss(bool wait) {
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

NITRO_INLINE void ProgressBar::write(const std::string& text) const {
  std::fwrite(text.data(), 1, text.size(), options_.stream);
  std::fflush(options_.stream);
}

NITRO_INLINE int ProgressBar::columns() const {
  if (options_.width > 0) return options_.width;
  winsize size{};
  if (::ioctl(::fileno(options_.stream), TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

NITRO_INLINE std::string ProgressBar::number(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

NITRO_INLINE double ProgressBar::remaining_s(double elapsed) const {
  if (count_ <= 0 || !(elapsed > 0)) return std::numeric_limits<double>::quiet_NaN();
  return std::max<double>(0, static_cast<double>(options_.total - count_)) * elapsed /
         static_cast<double>(count_);
}

NITRO_INLINE int ProgressBar::percent() const {
  return static_cast<int>(std::floor(100.0 * static_cast<double>(count_) / static_cast<double>(options_.total)));
}

NITRO_INLINE std::string ProgressBar::terminal_line(double now) const {
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

NITRO_INLINE std::string ProgressBar::plain_line(double now) const {
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

}  // namespace nitro::monitor
