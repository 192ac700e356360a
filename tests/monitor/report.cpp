#include <nitro/monitor/report.hpp>

#include "testing.hpp"

#include <nitro/memory/tracking_allocator.hpp>
#include <nitro/memory/watch.hpp>
#include <nitro/optim/fused.hpp>
#include <nitro/train/channels_last.hpp>
#include <nitro/train/levels.hpp>
#include <nitro/train/stability.hpp>

namespace nitro_test_monitor_report {  // one namespace per file: an area is compiled as one translation unit

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


TEST_CASE("summarize(loop): the advice leaves out what the loop already does, and the hooks' lines are printed") {
  const auto x = torch::randn({8, 3, 8, 8});
  const auto run = [&](auto& loop, auto& model) {
    for (int i = 0; i < 12; ++i) loop.step(x, [&](const at::Tensor& in) { return model->forward(in).mean(); });
  };
  {
    torch::nn::Sequential model(torch::nn::Conv2d(3, 4, 3), torch::nn::Flatten());
    torch::optim::SGD optimizer(model->parameters(), 0.01);
    nitro::level::with<nitro::level::Basic, nitro::monitor::Phases, nitro::stability::Guard> loop{
        model, optimizer, {.monitor = {.warmup_steps = 1}}};
    run(loop, model);
    const auto s = nitro::monitor::summarize(loop);
    REQUIRE(s.loop.has_value());
    CHECK_FALSE(s.loop->mixed_precision);
    CHECK_FALSE(s.loop->fused_optimizer);
    CHECK(s.loop->conv);
    REQUIRE(s.notes.size() == 1);
    CHECK(s.notes[0] == "stability guard: 1 checks (every 10 steps), 0 non-finite, 0 spikes, 0 restores");
    CHECK(nitro::monitor::format(s).find("stability guard: 1 checks") != std::string::npos);
    const auto advice = nitro::monitor::compute_advice(s);
    CHECK(advice.find("bf16 mixed precision") != std::string::npos);
    CHECK(advice.find("a fused optimizer") != std::string::npos);
    CHECK(advice.find("larger batch") != std::string::npos);
  }
  {
    torch::nn::Sequential model(torch::nn::Conv2d(3, 4, 3), torch::nn::Flatten());
    nitro::optim::FusedSGD optimizer(model->parameters(), 0.01);
    nitro::level::with<nitro::level::Advanced, nitro::monitor::Phases> loop{model, optimizer,
                                                                          {.monitor = {.warmup_steps = 1}}};
    run(loop, model);
    const auto s = nitro::monitor::summarize(loop);
    CHECK(s.loop->mixed_precision);
    CHECK(s.loop->fused_optimizer);
    CHECK(s.notes.empty());
    const auto advice = nitro::monitor::compute_advice(s);
    CHECK(advice.find("mixed precision") == std::string::npos);  // it is bf16 already
    CHECK(advice.find("fused optimizer") == std::string::npos);
    CHECK(advice.find("larger batch") != std::string::npos);
  }
}

TEST_CASE("summarize(loop): a channels-last model with 1x1 and one-input-channel convolutions is seen as channels-last") {
  torch::nn::Sequential model(torch::nn::Conv2d(1, 4, 3), torch::nn::Conv2d(4, 8, 1), torch::nn::Conv2d(8, 8, 3),
                              torch::nn::Flatten());
  torch::optim::SGD optimizer(model->parameters(), 0.01);
  nitro::level::with<nitro::level::Basic, nitro::monitor::Phases> loop{model, optimizer, {.monitor = {.warmup_steps = 0}}};
  const auto x = torch::randn({2, 1, 8, 8});
  loop.step(x, [&](const at::Tensor& in) { return model->forward(in).mean(); });
  CHECK_FALSE(nitro::monitor::summarize(loop).loop->channels_last);
  nitro::to_channels_last(*model);
  CHECK(nitro::monitor::summarize(loop).loop->channels_last);
}

TEST_CASE("memory::Watch: past its threshold (the tracking allocator's live bytes) it cleans up, and the report says so") {
  nitro::memory::ScopedCpuTracking track;
  std::vector<at::Tensor> cache;  // grows by 1 MiB a step until the watch's cleanup drops it
  torch::nn::Linear model(4, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.01);
  const auto x = torch::randn({8, 4});
  const std::int64_t base = track.stats().live_bytes;
  using Loop = nitro::level::with<nitro::level::Basic, nitro::monitor::Phases, nitro::memory::Watch>;
  Loop loop{model, optimizer,
            {.monitor = {.warmup_steps = 0},
             .hooks = {nitro::memory::Watch::Options{
                 .rss_bytes = base + (5ll << 19),  // 2.5 MiB above the start
                 .check_every = 1,
                 .cleanup = [&] { cache.clear(); },
                 .cpu_bytes = [&] { return track.stats().live_bytes; }}}}};
  std::vector<std::size_t> sizes;
  for (int i = 0; i < 7; ++i) {
    cache.push_back(torch::zeros({1 << 18}));  // 1 MiB
    loop.step(x, [&](const at::Tensor& in) { return model->forward(in).mean(); });
    sizes.push_back(cache.size());
  }
  // Over 2.5 MiB at the third MiB: dropped at steps 3 and 6.
  CHECK(sizes == std::vector<std::size_t>{1, 2, 0, 1, 2, 0, 1});
  const auto& c = loop.hook<nitro::memory::Watch>().counts();
  CHECK(c.checks == 7);
  CHECK(c.cpu_cleanups == 2);
  CHECK(c.cleanup_calls == 2);
  CHECK(c.cuda_cache_emptied == 0);
  CHECK(c.last_cpu_bytes > base + (5ll << 19));
  const auto s = nitro::monitor::summarize(loop);
  REQUIRE(s.notes.size() == 1);
  CHECK(s.notes[0].find("memory watch: 7 checks, CPU over its threshold 2 times") == 0);
  CHECK(s.notes[0].find("cleanup called 2 times") != std::string::npos);

  // A threshold below what the run keeps in use: one clean-up, then none until it grows by 5% more.
  std::int64_t figure = 1000;
  nitro::memory::Watch low({.rss_bytes = 100, .check_every = 1, .cpu_bytes = [&] { return figure; }},
                           c10::Device(c10::kCPU));
  for (int i = 0; i < 5; ++i) low.check();
  CHECK(low.counts().cpu_cleanups == 1);
  figure = 1049;
  low.check();
  CHECK(low.counts().cpu_cleanups == 1);
  figure = 1051;
  low.check();
  CHECK(low.counts().cpu_cleanups == 2);

  CHECK_THROWS_WITH_AS(nitro::memory::Watch({}, c10::Device(c10::kCPU)), doctest::Contains("no threshold is set"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::memory::Watch({.cuda_reserved_fraction = 1.5}, c10::Device(c10::kCPU)),
                       doctest::Contains("cuda_reserved_fraction must be in (0, 1]"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::memory::Watch({.rss_bytes = 1, .check_every = 0}, c10::Device(c10::kCPU)),
                       doctest::Contains("check_every must be >= 1"), nitro::Error);
}

}  // namespace nitro_test_monitor_report
