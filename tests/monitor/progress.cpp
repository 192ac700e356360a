#include <nitro/monitor/progress.hpp>

#include "testing.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

using nitro::monitor::ProgressBar;
using nitro::monitor::ProgressOptions;

/// A std::tmpfile that closes itself.
struct TmpFile {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file{std::tmpfile(), &std::fclose};
  std::FILE* get() const { return file.get(); }
  /// Everything written so far; the position stays at the end.
  std::string text() const {
    std::fflush(get());
    std::rewind(get());
    std::string out;
    char buffer[4096];
    std::size_t n = 0;
    while ((n = std::fread(buffer, 1, sizeof buffer, get())) > 0) out.append(buffer, n);
    std::fseek(get(), 0, SEEK_END);
    return out;
  }
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

/// Options that draw into `out` on a clock the test sets by hand.
ProgressOptions manual(const TmpFile& out, const double& now, bool terminal) {
  ProgressOptions o;
  o.stream = out.get();
  o.terminal = terminal;
  o.clock = [&now] { return now; };
  return o;
}

}  // namespace

TEST_CASE("progress format_duration writes mm:ss below an hour and h:mm:ss above") {
  using nitro::monitor::format_duration;
  CHECK(format_duration(0) == "00:00");
  CHECK(format_duration(59.99) == "00:59");
  CHECK(format_duration(65) == "01:05");
  CHECK(format_duration(3599) == "59:59");
  CHECK(format_duration(3600) == "1:00:00");
  CHECK(format_duration(3725) == "1:02:05");
  CHECK(format_duration(36000 + 61) == "10:01:01");
  CHECK(format_duration(-1) == "??:??");
  CHECK(format_duration(std::numeric_limits<double>::quiet_NaN()) == "??:??");
  CHECK(format_duration(std::numeric_limits<double>::infinity()) == "??:??");
}

TEST_CASE("progress format_rate gives units per second and seconds per unit below one a second") {
  using nitro::monitor::format_rate;
  CHECK(format_rate(371, 10.0, "it") == "37.1 it/s");
  CHECK(format_rate(1000, 0.5, "samples") == "2000.0 samples/s");
  CHECK(format_rate(1, 4.0, "it") == "4.00 s/it");
  CHECK(format_rate(0, 4.0, "it") == "? it/s");
  CHECK(format_rate(5, 0.0, "it") == "? it/s");
}

TEST_CASE("progress off a terminal writes plain lines with count and percentage at most every plain_every_s") {
  TmpFile out;
  double now = 100;
  auto o = manual(out, now, false);
  o.total = 1000;
  o.desc = "fit";
  o.plain_every_s = 10;
  {
    ProgressBar bar{o};
    CHECK_FALSE(bar.is_terminal());
    CHECK(out.text().empty());  // nothing at the start off a terminal
    now = 105;
    bar.update(100);
    CHECK(out.text().empty());  // not yet 10 s
    now = 112;
    bar.update(350);
    CHECK(bar.count() == 450);
    // 450 in 12 s: 37.5/s; 550 left at that rate: 14.67 s
    CHECK(out.text() == "fit: 450/1000 (45%) elapsed 00:12 eta 00:14 37.5 it/s\n");
    now = 115;
    bar.update(10);  // next line not before 122
    CHECK(lines_of(out.text()).size() == 1);
    now = 120;
    bar.close();
    bar.close();  // once only
  }  // and the destructor adds nothing after close
  const auto lines = lines_of(out.text());
  REQUIRE(lines.size() == 2);
  // 460 in 20 s: 23/s; 540 left: 23.48 s
  CHECK(lines[1] == "fit: 460/1000 (46%) elapsed 00:20 eta 00:23 23.0 it/s");
}

TEST_CASE("a plain progress line at every update when plain_every_s is 0 on the real clock") {
  TmpFile out;
  ProgressOptions o;
  o.stream = out.get();
  o.total = 4;
  o.plain_every_s = 0;
  ProgressBar bar{o};
  CHECK_FALSE(bar.is_terminal());  // a tmpfile is not a terminal: detected
  for (int i = 0; i < 4; ++i) bar.update();
  bar.close();
  const auto lines = lines_of(out.text());
  REQUIRE(lines.size() == 5);
  CHECK(lines[0].rfind("train: 1/4 (25%) elapsed 00:00 eta ", 0) == 0);
  CHECK(lines[1].rfind("train: 2/4 (50%)", 0) == 0);
  CHECK(lines[3].rfind("train: 4/4 (100%) elapsed 00:00 eta 00:00 ", 0) == 0);
  CHECK(lines[4].rfind("train: 4/4 (100%)", 0) == 0);
}

TEST_CASE("the progress bar destructor closes the bar with a final line") {
  TmpFile out;
  double now = 0;
  {
    auto o = manual(out, now, false);
    ProgressBar bar{o};
    now = 2;
    bar.update(5);
  }
  // unknown total: no percentage, no eta
  CHECK(out.text() == "train: 5 it elapsed 00:02 2.5 it/s\n");
}

TEST_CASE("the terminal progress form rewrites one line with a carriage return and a bar of the given width") {
  TmpFile out;
  double now = 0;
  auto o = manual(out, now, true);
  o.total = 1000;
  o.width = 80;
  o.refresh_s = 0;
  ProgressBar bar{o};
  CHECK(bar.is_terminal());
  now = 12;
  bar.update(450);
  bar.close();
  const auto text = out.text();
  CHECK(text.back() == '\n');
  CHECK(occurrences(text, "\n") == 1);
  CHECK(occurrences(text, "\r") == 3);  // at the start, at the update and at close
  CHECK(occurrences(text, "\x1b[K") == 3);
  CHECK(text.rfind("\x1b[K\n") == text.size() - 4);
  // The last redraw, without its '\r' and the clear to end of line.
  const auto last = text.substr(text.rfind('\r') + 1, text.rfind("\x1b[K") - text.rfind('\r') - 1);
  const std::string stats = "| 450/1000 [00:12<00:14, 37.5 it/s]";
  CHECK(last.rfind("train: 45%|", 0) == 0);
  CHECK(last.size() == 79);  // the width, less the last column
  REQUIRE(last.size() > stats.size());
  CHECK(last.substr(last.size() - stats.size()) == stats);
  const auto bar_text = last.substr(11, last.size() - 11 - stats.size());
  const auto hashes = occurrences(bar_text, "#");
  CHECK(bar_text.size() == 79 - 11 - stats.size());
  CHECK(hashes == static_cast<std::size_t>(0.45 * static_cast<double>(bar_text.size())));
  CHECK(bar_text.find_first_not_of('#') == hashes);  // filled from the left, then spaces
  CHECK(bar_text.find_first_not_of(' ', hashes) == std::string::npos);
  // The redraw at the update shows the same state as the final one.
  const auto first_update = text.find('\r', 1);
  CHECK(text.substr(first_update, text.rfind('\r') - first_update) == "\r" + last + "\x1b[K");
}

TEST_CASE("on a terminal a progress redraw comes at most every refresh_s") {
  TmpFile out;
  double now = 0;
  auto o = manual(out, now, true);
  o.refresh_s = 1.0;
  o.width = 60;
  ProgressBar bar{o};  // draws the empty state at once
  for (int i = 1; i <= 9; ++i) {
    now = 0.1 * i;
    bar.update();
  }
  CHECK(occurrences(out.text(), "\r") == 1);
  now = 1.0;
  bar.update();
  CHECK(occurrences(out.text(), "\r") == 2);
  const auto text = out.text();
  // unknown total: no percentage, no bar, no remaining time
  CHECK(text.substr(text.rfind('\r')) == "\rtrain: 10 it [00:01, 10.0 it/s]\x1b[K");
}

TEST_CASE("a long progress line is cut to the width and the bar is dropped when there is no room") {
  TmpFile out;
  double now = 0;
  auto o = manual(out, now, true);
  o.total = 10;
  o.width = 30;
  o.refresh_s = 0;
  o.desc = "a rather long description";
  ProgressBar bar{o};
  now = 1;
  bar.update(5);
  const auto text = out.text();
  const auto last = text.substr(text.rfind('\r') + 1, text.rfind("\x1b[K") - text.rfind('\r') - 1);
  CHECK(last == std::string("a rather long description: 50% 5/10 [00:01<00:01, 5.0 it/s]").substr(0, 29));
}

TEST_CASE("progress reads the loss every loss_every updates and averages it with the smoothing") {
  TmpFile out;
  double now = 0;
  auto o = manual(out, now, false);
  o.loss_every = 3;
  o.loss_smoothing = 0.5;
  o.plain_every_s = 1000;
  ProgressBar bar{o};
  CHECK_FALSE(bar.loss_average().has_value());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Read: the 1st, 4th, 7th and 10th. The others are NaN: had one been read, the average would be NaN.
  const std::vector<double> losses{1, nan, nan, 4, nan, nan, 7, nan, nan, 10, nan};
  std::vector<double> averages;
  for (const double loss : losses) {
    bar.update(1, torch::tensor(loss, torch::kDouble));
    REQUIRE(bar.loss_average().has_value());
    averages.push_back(*bar.loss_average());
  }
  // By hand: 1; 0.5 * 1 + 0.5 * 4 = 2.5; 0.5 * 2.5 + 0.5 * 7 = 4.75; 0.5 * 4.75 + 0.5 * 10 = 7.375
  CHECK(averages == std::vector<double>{1, 1, 1, 2.5, 2.5, 2.5, 4.75, 4.75, 4.75, 7.375, 7.375});
  CHECK(bar.count() == 11);
  now = 2;
  bar.set_postfix("lr=0.1");
  bar.close();
  CHECK(out.text() == "train: 11 it elapsed 00:02 5.5 it/s loss 7.375 lr=0.1\n");
}

TEST_CASE("the progress loss average with smoothing 0 is the last value read and a float tensor works") {
  TmpFile out;
  double now = 0;
  auto o = manual(out, now, true);
  o.loss_every = 2;
  o.loss_smoothing = 0;
  o.refresh_s = 0;
  o.width = 200;
  o.total = 4;
  ProgressBar bar{o};
  bar.update(1, torch::full({1}, 0.25f).requires_grad_());  // read
  bar.update(1, torch::full({1}, 9.0f));                     // not read
  bar.update(1, torch::full({}, 0.75f));                     // read
  CHECK(bar.loss_average() == 0.75);
  bar.set_postfix("scale=65536");
  now = 1;
  bar.update(1, torch::full({}, 9.0f));
  CHECK(out.text().find("4/4 [00:01<00:00, 4.0 it/s, loss=0.75, scale=65536]\x1b[K") != std::string::npos);
}

TEST_CASE("bad progress options and bad updates throw nitro::Error naming the problem") {
  TmpFile out;
  const auto with = [&](auto change) {
    ProgressOptions o;
    o.stream = out.get();
    change(o);
    return o;
  };
  CHECK_THROWS_WITH_AS(ProgressBar{with([](auto& o) { o.total = -1; })}, doctest::Contains("total must be >= 0"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(ProgressBar{with([](auto& o) { o.loss_every = 0; })},
                       doctest::Contains("loss_every must be >= 1"), nitro::Error);
  CHECK_THROWS_WITH_AS(ProgressBar{with([](auto& o) { o.loss_smoothing = 1.0; })},
                       doctest::Contains("loss_smoothing must be in [0, 1)"), nitro::Error);
  CHECK_THROWS_WITH_AS(ProgressBar{with([](auto& o) { o.loss_smoothing = -0.1; })},
                       doctest::Contains("loss_smoothing"), nitro::Error);
  CHECK_THROWS_WITH_AS(ProgressBar{with([](auto& o) { o.refresh_s = -1; })}, doctest::Contains("refresh_s"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(ProgressBar{with([](auto& o) { o.plain_every_s = -1; })},
                       doctest::Contains("plain_every_s"), nitro::Error);
  CHECK_THROWS_WITH_AS(ProgressBar{with([](auto& o) { o.stream = nullptr; })}, doctest::Contains("stream is null"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(ProgressBar{with([](auto& o) { o.width = -5; })}, doctest::Contains("width must be >= 0"),
                       nitro::Error);

  ProgressBar bar{with([](auto& o) { o.loss_every = 1; })};
  CHECK_THROWS_WITH_AS(bar.update(-1), doctest::Contains("n must be >= 0"), nitro::Error);
  CHECK_THROWS_WITH_AS(bar.update(-1, torch::zeros({})), doctest::Contains("n must be >= 0"), nitro::Error);
  CHECK_THROWS_WITH_AS(bar.update(1, at::Tensor{}), doctest::Contains("undefined"), nitro::Error);
  CHECK_THROWS_WITH_AS(bar.update(1, torch::zeros({2})), doctest::Contains("one element"), nitro::Error);
  CHECK(bar.count() == 0);
  CHECK_FALSE(bar.loss_average().has_value());
}

TEST_CASE("gpu: a GPU loss is copied without blocking and averaged once its copy is done" * nitro::test::needs_gpu()) {
  auto out = std::shared_ptr<std::FILE>(std::tmpfile(), &std::fclose);
  ProgressOptions o;
  o.stream = out.get();
  o.terminal = false;
  o.loss_every = 1;
  o.loss_smoothing = 0.5;
  ProgressBar bar{o};
  const auto device = nitro::Cuda::device();
  double expected = 0;
  for (int v = 1; v <= 4; ++v) {
    torch::cuda::synchronize();  // the previous copy is done: none is skipped
    bar.update(1, torch::tensor(static_cast<double>(v), torch::TensorOptions().device(device)) * 1.0f);
    expected = v == 1 ? 1.0 : 0.5 * expected + 0.5 * v;
  }
  bar.close();  // waits for the last copy
  REQUIRE(bar.loss_average().has_value());
  CHECK(*bar.loss_average() == doctest::Approx(expected));
}
