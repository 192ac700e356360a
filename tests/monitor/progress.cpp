#include <nitro/monitor/progress.hpp>

#include "testing.hpp"

#include <nitro/core/step_result.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace nitro_test_monitor_progress {  // one namespace per file: an area is compiled as one translation unit

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

TEST_CASE("progress reads the loss every loss_every updates and shows the mean of the last loss_window") {
  TmpFile out;
  double now = 0;
  auto o = manual(out, now, false);
  o.loss_every = 3;
  o.loss_window = 2;
  o.plain_every_s = 1000;
  ProgressBar bar{o};
  CHECK_FALSE(bar.loss_average().has_value());
  // Losses 1, 2, ..., 11; read at the 1st, 4th, 7th and 10th update, each time the last two kept.
  std::vector<double> averages;
  for (int loss = 1; loss <= 11; ++loss) {
    bar.update(1, torch::tensor(static_cast<double>(loss), torch::kDouble));
    REQUIRE(bar.loss_average().has_value());
    averages.push_back(*bar.loss_average());
  }
  // By hand: 1 (only one kept); (3 + 4) / 2 = 3.5; (6 + 7) / 2 = 6.5; (9 + 10) / 2 = 9.5
  CHECK(averages == std::vector<double>{1, 1, 1, 3.5, 3.5, 3.5, 6.5, 6.5, 6.5, 9.5, 9.5});
  CHECK(bar.count() == 11);
  now = 2;
  bar.set_postfix("lr=0.1");
  bar.close();
  // close() reads what was kept since the last read: the last two, (10 + 11) / 2.
  CHECK(out.text() == "train: 11 it elapsed 00:02 5.5 it/s loss 10.5 lr=0.1\n");
  CHECK(bar.loss_average() == 10.5);
}

TEST_CASE("progress close() shows the mean of the window as it ends, not as of the last read") {
  TmpFile out;
  double now = 0;
  ProgressBar bar{manual(out, now, false)};  // read every 50, the mean of the last 50
  for (int i = 1; i <= 100; ++i) bar.update(1, static_cast<double>(i));
  CHECK(bar.loss_average() == 26.5);  // read at update 51: the mean of 2..51
  bar.close();
  CHECK(bar.loss_average() == 75.5);  // the mean of 51..100
  CHECK(out.text().find("loss 75.5") != std::string::npos);
}

TEST_CASE("the progress loss follows a jump within the window, not a lagging running mean") {
  // The defaults: read every 50 updates, the mean of the last 50. The loss is 1 for 100 updates,
  // then 5 (the issue's bar showed 2.273 long after the loss had jumped to 5.39).
  TmpFile out;
  double now = 0;
  ProgressBar bar{manual(out, now, false)};
  CHECK(bar.options().loss_every == 50);
  CHECK(bar.options().loss_window == 50);
  std::vector<double> read;  // the loss shown after the reads, at updates 1, 51, 101 and 151
  for (int i = 1; i <= 151; ++i) {
    bar.update(1, torch::tensor(i <= 100 ? 1.0 : 5.0));
    if (i % 50 == 1) read.push_back(bar.loss_average().value());
  }
  // By hand: 1; 1; at update 101 updates 52..101: (49 * 1 + 5) / 50 = 1.08; at 151 updates
  // 102..151, all 5: 5. (The former moving average, weight 0.9, showed 1, 1, 1.4, 1.76.)
  REQUIRE(read.size() == 4);
  CHECK(read[0] == 1.0);
  CHECK(read[1] == 1.0);
  CHECK(read[2] == doctest::Approx(1.08).epsilon(1e-12));
  CHECK(read[3] == 5.0);
}

TEST_CASE("progress update takes a StepResult or a number as well as a loss tensor") {
  TmpFile out;
  double now = 0;
  auto o = manual(out, now, false);
  o.loss_every = 1;
  o.loss_window = 4;
  ProgressBar bar{o};
  const auto step = [](double loss) {
    nitro::StepResult r;
    r.loss = torch::tensor(loss, torch::kFloat);
    return r;
  };
  bar.update(1, 1.0);
  bar.update(1, step(1.0));
  bar.update(1, torch::tensor(1.0));
  bar.update(1, 5.0);
  CHECK(bar.loss_average() == 2.0);  // (1 + 1 + 1 + 5) / 4
  bar.update(1, step(5.0));
  CHECK(bar.loss_average() == 3.0);  // (1 + 1 + 5 + 5) / 4
  bar.update(2, step(5.0));
  bar.update(1, 5.0);
  CHECK(bar.loss_average() == 5.0);
  CHECK(bar.count() == 8);
  CHECK_THROWS_WITH_AS(bar.update(-1, 1.0), doctest::Contains("n must be >= 0"), nitro::Error);
  CHECK_THROWS_WITH_AS(bar.update(1, nitro::StepResult{}), doctest::Contains("undefined"), nitro::Error);
}

// The example at the top of progress.hpp, as written there (the test below checks that it is).
namespace banner {
struct Loop {
  int steps = 0;
  template <class Batch, class LossFn>
  nitro::StepResult step(const Batch&, LossFn&&) {
    nitro::StepResult r;
    r.loss = torch::tensor(static_cast<double>(++steps));
    return r;
  }
};
double example(std::FILE* stream) {
  const std::int64_t steps = 3;
  const std::vector<int> batches{1, 2, 3};
  const auto loss_fn = [](const at::Tensor& x) { return x; };
  Loop loop;
  nitro::monitor::ProgressBar bar{{.total = steps, .desc = "epoch 1", .loss_every = 50, .stream = stream}};
  for (auto& batch : batches) {
    nitro::StepResult result = loop.step(batch, loss_fn);
    bar.update(1, result);                   // keeps result.loss; reads the last 50 every 50th call
  }
  bar.close();                               // final state and a newline (also done by the destructor)
  return bar.loss_average().value();
}
}  // namespace banner

TEST_CASE("the example at the top of progress.hpp compiles and runs as written") {
  TmpFile out;
  CHECK(banner::example(out.get()) == 2.0);  // read at the first update, then by close(): (1 + 2 + 3) / 3
  CHECK(lines_of(out.text()).back().rfind("epoch 1: 3/3 (100%)", 0) == 0);
  // Its lines (but the options, which differ by the stream) are in this file as they are in the header.
  const auto read = [](const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "r");
    REQUIRE(f != nullptr);
    std::string text;
    char buffer[4096];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, f)) > 0;) text.append(buffer, n);
    std::fclose(f);
    return text;
  };
  const auto header = read(std::string(NITRO_SOURCE_DIR) + "/include/nitro/monitor/progress.hpp");
  const auto self = read(std::string(NITRO_SOURCE_DIR) + "/tests/monitor/progress.cpp");
  const auto start = header.find("//   for (auto& batch : batches) {");
  const auto end = header.find("//   bar.close();", start);
  REQUIRE(start != std::string::npos);
  REQUIRE(end != std::string::npos);
  const auto example = lines_of(header.substr(start, header.find('\n', end) - start));
  CHECK(example.size() == 5);
  for (const auto& line : example) {
    CAPTURE(line);
    REQUIRE(line.rfind("//   ", 0) == 0);
    CHECK(self.find("\n  " + line.substr(5) + "\n") != std::string::npos);
  }
  CHECK(header.find("//   nitro::monitor::ProgressBar bar{{.total = steps, .desc = \"epoch 1\", .loss_every = 50}};") !=
        std::string::npos);
}

TEST_CASE("a progress loss window of 1 shows the last value read and a float tensor works") {
  TmpFile out;
  double now = 0;
  auto o = manual(out, now, true);
  o.loss_every = 2;
  o.loss_window = 1;
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
  CHECK_THROWS_WITH_AS(ProgressBar{with([](auto& o) { o.loss_window = 0; })},
                       doctest::Contains("loss_window must be >= 1"), nitro::Error);
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

TEST_CASE("gpu: GPU losses are summed on the device, copied without blocking and averaged once the copy is done" * nitro::test::needs_gpu()) {
  auto out = std::shared_ptr<std::FILE>(std::tmpfile(), &std::fclose);
  ProgressOptions o;
  o.stream = out.get();
  o.terminal = false;
  o.loss_every = 1;
  o.loss_window = 3;
  ProgressBar bar{o};
  const auto device = nitro::Cuda::device();
  for (int v = 1; v <= 4; ++v) {
    torch::cuda::synchronize();  // the previous copy is done: none is skipped
    bar.update(1, torch::tensor(static_cast<double>(v), torch::TensorOptions().device(device)) * 1.0f);
  }
  torch::cuda::synchronize();
  bar.update(1, 8.0);  // a number on the host joins the GPU losses of the window
  bar.close();         // waits for the last copy
  REQUIRE(bar.loss_average().has_value());
  CHECK(*bar.loss_average() == doctest::Approx((3.0 + 4.0 + 8.0) / 3));
}

}  // namespace nitro_test_monitor_progress
