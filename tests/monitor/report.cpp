#include <nitro/monitor/report.hpp>

#include "testing.hpp"

using nitro::Phase;
using nitro::monitor::Bottleneck;

namespace {

// A summary made by hand: data, forward, backward, optimizer means in ms.
nitro::monitor::Summary made(double data, double forward, double backward, double optimizer) {
  nitro::monitor::Summary s;
  s.steps = 100;
  s.samples = 3200;
  const double step = data + forward + backward + optimizer;
  s.step.mean_ms = step;
  s.step.share = 1.0;
  s.seconds = step * 100 / 1000.0;
  const double means[] = {data, forward, backward, optimizer};
  for (int p = 0; p < nitro::phase_count; ++p) {
    s.phases[static_cast<size_t>(p)].mean_ms = means[p];
    s.phases[static_cast<size_t>(p)].share = means[p] / step;
  }
  s.peak_memory_bytes = 1 << 30;
  s.memory_limit_bytes = 8LL << 30;
  return s;
}

bool has(const std::vector<nitro::monitor::Advice>& advice, Bottleneck kind) {
  for (const auto& a : advice)
    if (a.kind == kind) return true;
  return false;
}

}  // namespace

TEST_CASE("bottleneck advice from hand-made figures") {
  // Data wait 31% of the step: data-bound, and only that.
  auto data = nitro::monitor::bottlenecks(made(31, 30, 30, 9));
  CHECK(data.size() == 1);
  CHECK(data[0].kind == Bottleneck::data);
  CHECK(data[0].finding.find("31.0 ms") != std::string::npos);
  // 29%: not.
  CHECK_FALSE(has(nitro::monitor::bottlenecks(made(29, 30, 30, 11)), Bottleneck::data));
  // Balanced: compute-bound, one entry.
  const auto compute = nitro::monitor::bottlenecks(made(1, 30, 60, 9));
  CHECK(compute.size() == 1);
  CHECK(compute[0].kind == Bottleneck::compute);
  // Peak at 95% of the limit: memory-bound.
  auto m = made(1, 30, 60, 9);
  m.peak_memory_bytes = m.memory_limit_bytes / 100 * 95;
  const auto memory = nitro::monitor::bottlenecks(m);
  CHECK(has(memory, Bottleneck::memory));
  CHECK_FALSE(has(memory, Bottleneck::compute));
  CHECK(memory[0].suggestion.find("checkpoint") != std::string::npos);
  // The optimizer at half of the compute.
  CHECK(has(nitro::monitor::bottlenecks(made(1, 10, 10, 20)), Bottleneck::optimizer));
}

TEST_CASE("launch-bound only on a GPU with short steps and an idle device") {
  auto s = made(0.1, 0.5, 1.0, 0.4);
  s.device_idle_fraction = 0.9;
  CHECK_FALSE(has(nitro::monitor::bottlenecks(s), Bottleneck::launch));  // a CPU summary
  s.device = c10::DeviceType::CUDA;
  CHECK(has(nitro::monitor::bottlenecks(s), Bottleneck::launch));
  s.device_idle_fraction = 0.2;  // the GPU is kept busy
  CHECK_FALSE(has(nitro::monitor::bottlenecks(s), Bottleneck::launch));
  auto long_steps = made(1, 50, 100, 20);
  long_steps.device = c10::DeviceType::CUDA;
  long_steps.device_idle_fraction = 0.9;
  CHECK_FALSE(has(nitro::monitor::bottlenecks(long_steps), Bottleneck::launch));
  // Thresholds are options.
  CHECK(has(nitro::monitor::bottlenecks(long_steps, {.launch_step_ms = 1000}), Bottleneck::launch));
}

TEST_CASE("no steps: says so instead of advising") {
  nitro::monitor::Summary empty;
  const auto a = nitro::monitor::bottlenecks(empty);
  REQUIRE(a.size() == 1);
  CHECK(a[0].finding == "no steps were counted");
}

TEST_CASE("the summary table shows every phase with its share") {
  const auto text = nitro::monitor::format(made(25, 25, 40, 10));
  for (const char* word : {"data", "forward", "backward", "optimizer", "step", "25.0%", "40.0%", "100.0%", "1024.0 MiB"})
    CHECK(text.find(word) != std::string::npos);
  const auto lines = nitro::monitor::format(nitro::monitor::bottlenecks(made(50, 20, 20, 10)));
  CHECK(lines.rfind("  - data-bound", 0) == 0);
}
