#include <nitro/monitor/phases.hpp>
#include <nitro/monitor/report.hpp>
#include <nitro/train/levels.hpp>

#include "testing.hpp"

#include <chrono>
#include <memory>
#include <thread>
#include <type_traits>

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#endif

namespace nitro_test_monitor_phases {  // one namespace per file: an area is compiled as one translation unit

using namespace std::chrono_literals;
using nitro::Phase;

namespace {

using MonitoredLoop = nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Off, nitro::checkpoint::Off,
                                          nitro::monitor::Phases>;

// Busy for `d` on this thread (a sleep can overshoot a lot on a loaded machine; a spin cannot undershoot).
void spin(std::chrono::microseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) {
  }
}

}  // namespace

TEST_CASE("monitor::Off is empty and the loop never calls it") {
  static_assert(std::is_empty_v<nitro::monitor::Off::Recorder>);
  static_assert(!nitro::monitor::Off::enabled);
  static_assert(nitro::MonitorPolicy<nitro::monitor::Phases>);
  static_assert(std::is_same_v<nitro::level::Basic::monitor_policy, nitro::monitor::Off>);
  static_assert(std::is_same_v<MonitoredLoop::monitor_policy, nitro::monitor::Phases>);
  // A monitor and a clip policy together, in either order.
  using Both = nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Off, nitro::checkpoint::Off, nitro::clip::Norm,
                                   nitro::monitor::Phases>;
  static_assert(std::is_same_v<Both::clip_policy, nitro::clip::Norm>);
  static_assert(std::is_same_v<Both::monitor_policy, nitro::monitor::Phases>);
}

TEST_CASE("the training loop times each phase: a slow data source shows as data wait and is flagged data-bound") {
  torch::manual_seed(0);
  torch::nn::Linear model(8, 1);
  torch::optim::SGD opt(model->parameters(), 0.01);
  MonitoredLoop loop{model, opt, {.monitor = {.window = 16, .warmup_steps = 1}}};
  const auto x = torch::randn({4, 8}), y = torch::randn({4, 1});
  constexpr int kSteps = 21;
  for (int i = 0; i < kSteps; ++i) {
    spin(6ms);  // "loading the batch"
    loop.step(std::make_pair(x, y), [&](const auto& b) {
      spin(2ms);  // a slow forward
      return torch::mse_loss(model->forward(b.first), b.second);
    });
  }
  const auto& t = loop.monitor().totals();
  CHECK(t.steps == kSteps - 1);  // warm-up left out
  CHECK(t.samples == 4 * (kSteps - 1));
  const auto s = nitro::monitor::summarize(loop.monitor());
  CHECK(s.steps == kSteps - 1);
  CHECK(s[Phase::data].mean_ms >= 6.0);
  CHECK(s[Phase::data].mean_ms < 60.0);
  CHECK(s[Phase::forward].mean_ms >= 2.0);
  CHECK(s[Phase::forward].p50_ms >= 2.0);
  CHECK(s[Phase::backward].mean_ms > 0.0);
  CHECK(s[Phase::optimizer].mean_ms > 0.0);
  CHECK(s.step.mean_ms >= 8.0);
  // The phases add up to the step (the only time outside them is the loop's own bookkeeping).
  double sum = 0;
  for (const auto& p : s.phases) sum += p.mean_ms;
  CHECK(sum == doctest::Approx(s.step.mean_ms).epsilon(0.01));
  CHECK(s.samples_per_s == doctest::Approx(4.0 * 1000.0 / s.step.mean_ms).epsilon(1e-6));
  CHECK(loop.monitor().window().size() == 16);  // the window keeps the last 16
  CHECK(loop.monitor().window().back().step == kSteps - 1);
  CHECK(s.peak_memory_bytes > 0);
  CHECK(s.memory_limit_bytes >= s.peak_memory_bytes);

  const auto advice = nitro::monitor::bottlenecks(s);
  REQUIRE_FALSE(advice.empty());
  CHECK(advice.front().kind == nitro::monitor::Bottleneck::data);
  CHECK(advice.front().text().find("Prefetcher") != std::string::npos);
  const auto table = nitro::monitor::format(s);
  CHECK(table.find("forward") != std::string::npos);
  CHECK(table.find("20 steps, 80 samples") != std::string::npos);
}

TEST_CASE("no data wait: not flagged data-bound") {
  torch::manual_seed(0);
  torch::nn::Linear model(8, 1);
  torch::optim::SGD opt(model->parameters(), 0.01);
  MonitoredLoop loop{model, opt};
  const auto x = torch::randn({4, 8}), y = torch::randn({4, 1});
  for (int i = 0; i < 12; ++i) {
    loop.step(std::make_pair(x, y), [&](const auto& b) {
      spin(3ms);
      return torch::mse_loss(model->forward(b.first), b.second);
    });
  }
  const auto s = nitro::monitor::summarize(loop.monitor());
  CHECK(s.steps == 10);
  for (const auto& a : nitro::monitor::bottlenecks(s)) CHECK(a.kind != nitro::monitor::Bottleneck::data);
  loop.monitor().reset();
  CHECK(loop.monitor().totals().steps == 0);
  CHECK(loop.monitor().window().empty());
}

TEST_CASE("two loops, each paused during the other's step: each one's data wait is the loader's, and the advice is right") {
  torch::manual_seed(0);
  torch::nn::Linear a(8, 1), b(8, 1);
  torch::optim::SGD opt_a(a->parameters(), 0.01), opt_b(b->parameters(), 0.01);
  MonitoredLoop loop_a{a, opt_a, {.monitor = {.warmup_steps = 1}}}, loop_b{b, opt_b, {.monitor = {.warmup_steps = 1}}};
  MonitoredLoop plain{b, opt_b, {.monitor = {.warmup_steps = 1}}};  // the same without pauses
  const auto x = torch::randn({4, 8}), y = torch::randn({4, 1});
  const auto slow_loss = [&](torch::nn::Linear& m) {
    return [&](const auto& batch) {
      spin(6ms);  // each model's step is slow; the "loader" takes no time
      return torch::mse_loss(m->forward(batch.first), batch.second);
    };
  };
  for (int i = 0; i < 11; ++i) {
    {
      auto away = loop_b.monitor().pause();
      loop_a.step(std::make_pair(x, y), slow_loss(a));
    }
    {
      auto away = loop_a.monitor().pause();
      loop_b.step(std::make_pair(x, y), slow_loss(b));
    }
  }
  for (int i = 0; i < 11; ++i) {
    loop_a.step(std::make_pair(x, y), slow_loss(a));  // not paused: counted as plain's data wait
    plain.step(std::make_pair(x, y), slow_loss(b));
  }
  const auto sa = nitro::monitor::summarize(loop_a.monitor()), sb = nitro::monitor::summarize(loop_b.monitor()),
             sp = nitro::monitor::summarize(plain.monitor());
  CHECK(sb[Phase::data].mean_ms < 3.0);  // the other loop's step (>= 6 ms) is left out
  CHECK(sb.step.mean_ms < sb[Phase::forward].mean_ms + 3.0);
  CHECK(sp[Phase::data].mean_ms >= 6.0);  // without a pause it is data wait
  for (const auto& advice : nitro::monitor::bottlenecks(sb)) CHECK(advice.kind != nitro::monitor::Bottleneck::data);
  CHECK(nitro::monitor::bottlenecks(sp).front().kind == nitro::monitor::Bottleneck::data);
  // loop_a: its first 10 counted steps paused (the last 11 not); a pause before any step changes nothing.
  CHECK(sa.steps == 21);
  nitro::monitor::Recorder fresh;
  { auto away = fresh.pause(); }
  fresh.begin_step();
  fresh.end_step(1);
  CHECK(fresh.window().empty());  // warm-up
}

TEST_CASE("pauses that nest or overlap count their time once, and a step begun inside a pause ends it") {
  const auto data_wait = [](auto&& between) {
    nitro::monitor::Recorder r({.warmup_steps = 0});
    r.begin_step();
    r.end_step(1);
    between(r);
    r.begin_step();
    r.end_step(1);
    return r.window().back().phase_ms[static_cast<int>(Phase::data)];
  };
  // 20 ms waiting for data, 30 ms inside two nested pauses, 10 more in the outer one.
  const float nested = data_wait([](auto& r) {
    spin(20ms);
    auto outer = r.pause();
    {
      auto inner = r.pause();
      spin(30ms);
    }
    spin(10ms);
  });
  CHECK(nested >= 20.0f);
  CHECK(nested < 35.0f);
  // Two pauses alive together, ended in the order they began.
  const float overlapping = data_wait([](auto& r) {
    spin(20ms);
    auto a = std::make_unique<nitro::monitor::Recorder::Pause>(r);
    auto b = std::make_unique<nitro::monitor::Recorder::Pause>(r);
    spin(30ms);
    a.reset();
    spin(10ms);
    b.reset();
  });
  CHECK(overlapping >= 20.0f);
  CHECK(overlapping < 35.0f);
  // load_state inside a pause ends it: the wait starts again at the load (never negative).
  const float loaded = data_wait([](auto& r) {
    auto away = r.pause();
    spin(30ms);
    r.load_state(r.state());
    spin(20ms);
  });
  CHECK(loaded >= 20.0f);
  CHECK(loaded < 35.0f);
  // A step begun inside a pause: the 30 ms paused before it are not its data wait.
  nitro::monitor::Recorder r({.warmup_steps = 0});
  r.begin_step();
  r.end_step(1);
  {
    auto away = r.pause();
    spin(30ms);
    r.begin_step();
    r.end_step(1);
    spin(30ms);  // after the step: no longer paused
  }
  r.begin_step();
  r.end_step(1);
  const auto w = r.window();
  CHECK(w[1].phase_ms[static_cast<int>(Phase::data)] < 15.0f);
  CHECK(w[2].phase_ms[static_cast<int>(Phase::data)] >= 30.0f);
}

TEST_CASE("the recorder adds up repeated marks of a phase and reads memory every memory_every steps") {
  nitro::monitor::Recorder r({.window = 4, .warmup_steps = 0, .memory_every = 2});
  for (int i = 0; i < 4; ++i) {
    r.begin_step();
    spin(1ms);
    r.mark(Phase::forward);
    r.mark(Phase::backward);
    spin(1ms);
    r.mark(Phase::forward);  // a second part (accumulate::Adaptive)
    r.mark(Phase::backward);
    r.mark(Phase::optimizer);
    r.end_step(3);
  }
  CHECK(r.totals().steps == 4);
  CHECK(r.totals().samples == 12);
  CHECK(r.totals().memory_readings == 2);
  CHECK(r.totals().peak_cpu_resident_bytes > 0);
  for (const auto& rec : r.window()) CHECK(rec.phase_ms[static_cast<int>(Phase::forward)] >= 2.0f);
  CHECK_FALSE(r.device_timed());
}

TEST_CASE("percentiles are nearest-rank over the window") {
  std::vector<float> v;
  for (int i = 100; i >= 1; --i) v.push_back(static_cast<float>(i));
  const auto s = nitro::monitor::detail::phase_summary(v, 5050.0, 100);
  CHECK(s.mean_ms == 50.5);
  CHECK(s.p50_ms == 50.0);
  CHECK(s.p90_ms == 90.0);
  CHECK(s.p99_ms == 99.0);
  CHECK(s.max_ms == 100.0);
  std::vector<float> one{7.0f};
  CHECK(nitro::monitor::detail::phase_summary(one, 7.0, 1).p99_ms == 7.0);
}

TEST_CASE("monitor::Phases bad options") {
  CHECK_THROWS_WITH_AS(nitro::monitor::Recorder({.window = 0}), doctest::Contains("window must be >= 1"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::monitor::Recorder({.warmup_steps = -1}), doctest::Contains("warmup_steps"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::monitor::Recorder({.memory_every = -1}), doctest::Contains("memory_every"), nitro::Error);
}

TEST_CASE("gpu: phases come from CUDA events without a synchronisation per step" * nitro::test::needs_gpu()) {
  torch::manual_seed(0);
  torch::nn::Linear model(1024, 1024);
  model->to(nitro::Cuda::device());
  torch::optim::SGD opt(model->parameters(), 0.01);
  MonitoredLoop loop{model, opt, {.monitor = {.warmup_steps = 1}}};
  const auto x = torch::randn({4096, 1024}, torch::kCUDA);
  for (int i = 0; i < 20; ++i)
    loop.step(x, [&](const at::Tensor& b) { return model->forward(b).pow(2).mean(); });
  CHECK(loop.monitor().device_timed());
  const auto s = nitro::monitor::summarize(loop.monitor());
  CHECK(s.steps == 19);
  CHECK(s[Phase::forward].mean_ms > 0.0);
  CHECK(s[Phase::backward].mean_ms > s[Phase::forward].mean_ms * 0.5);
  CHECK(s.peak_memory_bytes >= 4096 * 1024 * 4);
  CHECK_FALSE(std::isnan(s.device_idle_fraction));
}

TEST_CASE("the recorder's state saves and loads its figures") {
  nitro::monitor::Recorder r({.window = 8, .warmup_steps = 0});
  CHECK(r.device() == c10::Device(c10::kCPU));
  const auto step = [&] {
    r.begin_step();
    r.mark(Phase::forward);
    r.mark(Phase::backward);
    r.mark(Phase::optimizer);
    r.end_step(4);
  };
  step();
  const auto saved = r.state();
  for (int i = 0; i < 5; ++i) step();
  CHECK(r.totals().steps == 6);
  r.load_state(saved);
  CHECK(r.totals().steps == 1);
  CHECK(r.totals().samples == 4);
  CHECK(r.window().size() == 1);
  nitro::monitor::Recorder other({.window = 4});
  CHECK_THROWS_WITH_AS(other.load_state(saved), doctest::Contains("keeps 8 steps"), nitro::Error);

  // The time between the save and the load (a batch-size search) is no step's data wait.
  std::this_thread::sleep_for(200ms);
  r.load_state(r.state());
  step();
  CHECK(r.window().back().phase_ms[static_cast<int>(Phase::data)] < 100.0f);
}

TEST_CASE("gpu: the monitor times and reads the model's GPU, not the current one" * nitro::test::needs_gpu()) {
#if NITRO_WITH_CUDA
  // cuda:1 while cuda:0 is current where two GPUs exist; else `cuda` resolved to the current one.
  const bool two = nitro::test::gpu_count() >= 2;
  const c10::Device device = two ? c10::Device(c10::kCUDA, 1) : nitro::Cuda::device();
  c10::cuda::CUDAGuard current(0);
  torch::manual_seed(0);
  torch::nn::Linear model(512, 512);
  model->to(device);
  torch::optim::SGD opt(model->parameters(), 0.01);
  MonitoredLoop loop{model, opt, {.monitor = {.warmup_steps = 1, .memory_every = 1}}};
  CHECK(loop.monitor().device() == (two ? device : c10::Device(c10::kCUDA, 0)));
  const auto x = torch::randn({2048, 512}, device);
  for (int i = 0; i < 10; ++i) loop.step(x, [&](const at::Tensor& b) { return model->forward(b).pow(2).mean(); });
  const auto s = nitro::monitor::summarize(loop.monitor());
  CHECK(s.steps == 9);
  CHECK(s[Phase::forward].mean_ms > 0.0);
  // The peak read is that of the model's device, which holds at least the input.
  CHECK(loop.monitor().totals().peak_cuda_allocated_bytes >= 2048 * 512 * 4);
  if (!two) MESSAGE("one GPU: the non-default device index is not exercised");
#endif
}

}  // namespace nitro_test_monitor_phases
