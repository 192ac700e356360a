// monitor::Trace / TraceScope: the Chrome trace JSON LibTorch's profiler writes holds the recorded
// steps (ProfilerStep#k for k in the window, none outside it) and their operators; parsed with
// Python's json module.
#include <nitro/monitor/trace.hpp>
#include <nitro/train/levels.hpp>

#include "testing.hpp"

#include <cstdio>
#include <string>

namespace nitro_test_monitor_trace {  // one namespace per file: an area is compiled as one translation unit

namespace {

// Runs python's json on the trace: prints the sorted names of the ProfilerStep events, then whether
// each of `ops` occurs among the events' names.
std::string summary_of(const std::filesystem::path& trace, const std::string& ops) {
  const std::string python = std::string(NITRO_TEST_PYTHON).empty() ? "python3" : NITRO_TEST_PYTHON;
  const std::string script =
      "import json,sys\n"
      "d=json.load(open(sys.argv[1]))\n"
      "ev=d['traceEvents'] if isinstance(d,dict) else d\n"
      "names=[e.get('name','') for e in ev]\n"
      "print(' '.join(sorted(n for n in set(names) if n.startswith('ProfilerStep#'))))\n"
      "print(' '.join(o+('=yes' if o in names else '=no') for o in sys.argv[2].split(',')))\n";
  const auto file = trace.parent_path() / "read_trace.py";
  std::FILE* f = std::fopen(file.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fputs(script.c_str(), f);
  std::fclose(f);
  const std::string command = "'" + python + "' '" + file.string() + "' '" + trace.string() + "' '" + ops + "' 2>&1";
  std::FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) out += buffer;
  CHECK(::pclose(pipe) == 0);
  return out;
}

}  // namespace

TEST_CASE("trace: steps 2 and 3 of a loop are in the Chrome trace with their operators, the others are not") {
  nitro::test::TempDir dir("nitro-trace", true);
  torch::nn::Linear model(16, 4);
  torch::optim::SGD optimizer(model->parameters(), 0.01);
  using Loop = nitro::level::with<nitro::level::Basic, nitro::monitor::Trace>;
  Loop loop{model, optimizer, {.hooks = {nitro::monitor::Trace::Options{.path = dir / "trace.json", .start = 2, .steps = 2}}}};
  const auto x = torch::randn({8, 16});
  for (int i = 0; i < 6; ++i) {
    loop.step(x, [&](const at::Tensor& in) { return model->forward(in).pow(2).mean(); });
    CHECK(loop.hook<nitro::monitor::Trace>().done() == (i >= 3));
  }
  REQUIRE(std::filesystem::exists(dir / "trace.json"));
  const auto out = summary_of(dir / "trace.json", "aten::addmm,aten::mse_loss,aten::pow,aten::mean");
  CAPTURE(out);
  CHECK(out.find("ProfilerStep#2 ProfilerStep#3\n") == 0);
  CHECK(out.find("aten::addmm=yes") != std::string::npos);
  CHECK(out.find("aten::pow=yes") != std::string::npos);
  CHECK(out.find("aten::mean=yes") != std::string::npos);
  CHECK(out.find("aten::mse_loss=no") != std::string::npos);  // not called: the check can fail
  CHECK(loop.hook<nitro::monitor::Trace>().report().find("trace: steps 2..3") == 0);
}

TEST_CASE("trace: a scope records its region, refuses a second profiler, and checks its options") {
  nitro::test::TempDir dir("nitro-trace", true);
  {
    nitro::monitor::TraceScope scope{dir / "region.json"};
    CHECK(scope.recording());
    CHECK_THROWS_WITH_AS(nitro::monitor::TraceScope(dir / "second.json"), doctest::Contains("already recording"),
                         nitro::Error);
    (void)torch::matmul(torch::randn({32, 32}), torch::randn({32, 32}));
    scope.stop();
    CHECK(scope.events() > 0);
  }
  const auto out = summary_of(dir / "region.json", "aten::matmul");
  CHECK(out.find("aten::matmul=yes") != std::string::npos);
  CHECK_THROWS_WITH_AS(nitro::monitor::TraceScope(dir / "missing" / "t.json"), doctest::Contains("does not exist"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::monitor::Trace({.steps = 0}), doctest::Contains("steps must be >= 1"), nitro::Error);
}

TEST_CASE("trace: a second loop's trace while one records is skipped, its step does not fail") {
  nitro::test::TempDir dir("nitro-trace", true);
  torch::nn::Linear model(8, 2);
  torch::optim::SGD optimizer(model->parameters(), 0.01);
  using Loop = nitro::level::with<nitro::level::Basic, nitro::monitor::Trace>;
  Loop first{model, optimizer, {.hooks = {nitro::monitor::Trace::Options{.path = dir / "a.json", .start = 0, .steps = 3}}}};
  Loop second{model, optimizer, {.hooks = {nitro::monitor::Trace::Options{.path = dir / "b.json", .start = 0, .steps = 1}}}};
  const auto x = torch::randn({4, 8});
  const auto loss = [&](const at::Tensor& in) { return model->forward(in).mean(); };
  first.step(x, loss);
  CHECK_NOTHROW(second.step(x, loss));
  CHECK(second.hook<nitro::monitor::Trace>().report().find("not recorded: another profiler") != std::string::npos);
  first.step(x, loss);
  first.step(x, loss);
  CHECK(first.hook<nitro::monitor::Trace>().done());
  CHECK(std::filesystem::exists(dir / "a.json"));
  CHECK_FALSE(std::filesystem::exists(dir / "b.json"));
}

}  // namespace nitro_test_monitor_trace
