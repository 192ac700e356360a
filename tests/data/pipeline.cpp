// nitro::data::Pipeline: stages with their own workers and bounded queues deliver every item once, in
// the source's order, whatever each stage's speed; errors reach the consumer at their item; epochs
// restart the same threads; a Prefetcher over a pipeline resumes exactly; and the stats name the
// slow stage (and so does the monitor's advice).
#include "testing.hpp"
#include "data/kept_batches.hpp"

#include <nitro/data/pipeline.hpp>
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/sampler.hpp>
#include <nitro/monitor/report.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace nitro_test_data_pipeline {  // one namespace per file: an area is compiled as one translation unit

namespace {

namespace data = nitro::data;
using Indices = std::vector<std::int64_t>;
using namespace std::chrono_literals;

std::atomic<int> reader_threads{0};
struct CountThread {
  CountThread() { ++reader_threads; }
};

// Sample i holds i; reading it takes 0, 0.1 or 0.2 ms so read workers finish out of order.
struct Numbers : torch::data::datasets::Dataset<Numbers> {
  std::size_t n = 0;
  explicit Numbers(std::size_t n_) : n(n_) {}
  torch::data::Example<> get(std::size_t index) override {
    thread_local CountThread counted;
    (void)counted;
    std::this_thread::sleep_for(std::chrono::microseconds(100 * ((index * 7) % 3)));
    const auto i = static_cast<std::int64_t>(index);
    return {torch::tensor(i), torch::tensor(i)};
  }
  std::optional<std::size_t> size() const override { return n; }
};

using Stacked = torch::data::datasets::MapDataset<Numbers, torch::data::transforms::Stack<>>;
Stacked stacked(std::size_t n) { return Numbers(n).map(torch::data::transforms::Stack<>()); }

Indices values(const at::Tensor& t) {
  auto c = t.contiguous();
  return Indices(c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel());
}

std::vector<Indices> expected_batches(std::uint64_t seed, std::int64_t epoch, std::size_t n, std::size_t batch,
                                      std::int64_t times = 1) {
  const auto order = data::epoch_order(seed, epoch, n);
  std::vector<Indices> out;
  for (std::size_t i = 0; i < n; i += batch) {
    Indices b;
    for (std::size_t j = i; j < std::min(n, i + batch); ++j) b.push_back(static_cast<std::int64_t>(order[j]) * times);
    out.push_back(b);
  }
  return out;
}

// Stage functions: a "decode" that doubles the data, after a pause that depends on the batch (so
// workers finish out of order), and a "collate" that keeps only the data.
struct Decode {
  std::chrono::microseconds pause{0};
  torch::data::Example<> operator()(torch::data::Example<> b) const {
    const auto first = b.data.numel() > 0 ? b.data[0].item<std::int64_t>() : 0;
    std::this_thread::sleep_for(pause * (1 + first % 3));
    return {b.data * 2, b.target};
  }
};
struct Collate {
  std::chrono::microseconds pause{0};
  at::Tensor operator()(torch::data::Example<> b) const {
    std::this_thread::sleep_for(pause);
    return b.data;
  }
};

template <class P>
std::vector<Indices> drain(P& p) {
  std::vector<Indices> out;
  while (auto b = p.next()) out.push_back(values(*b));
  return out;
}

}  // namespace

TEST_CASE("pipeline: every item once, in the sampler's order, through stages of several workers") {
  constexpr std::size_t n = 61, batch = 4;
  data::ResumableSampler sampler(n, {.seed = 9});
  auto p = data::pipeline(nitro::from_dataset(stacked(n), sampler, batch), {.name = "read", .workers = 3, .queue = 2},
                          data::stage({.name = "decode", .workers = 3, .queue = 1}, Decode{200us}),
                          data::stage({.name = "collate", .workers = 2, .queue = 3}, Collate{}));
  static_assert(std::is_same_v<decltype(p)::batch_type, at::Tensor>);
  CHECK(p.threads_started() == 8);
  CHECK(drain(p) == expected_batches(9, 0, n, batch, 2));
  CHECK_FALSE(p.next().has_value());  // ended until set_epoch
  CHECK(sampler.state().index == static_cast<std::int64_t>(n));
  const auto st = p.stats();
  REQUIRE(st.stages.size() == 3);
  CHECK(st.stages[0].name == "read");
  CHECK(st.stages[1].name == "decode");
  CHECK(st.delivered == 16);
  for (const auto& s : st.stages) CHECK(s.items == 16);
}

TEST_CASE("pipeline: the queues bound the items in flight, whatever the consumer's pace") {
  std::atomic<std::int64_t> made{0}, taken{0}, most{0};
  std::int64_t count = 0;
  auto source = [&]() -> std::optional<at::Tensor> {
    if (count == 200) return std::nullopt;
    ++made;
    most = std::max(most.load(), made.load() - taken.load());
    return torch::tensor(count++);
  };
  auto p = data::pipeline(source, {.workers = 1, .queue = 2},
                          data::stage({.workers = 3, .queue = 2}, [](at::Tensor t) { return t + 1; }),
                          data::stage({.workers = 2, .queue = 1}, [](at::Tensor t) { return t * 10; }));
  std::int64_t expect = 0;
  while (auto t = p.next()) {
    CHECK(t->item<std::int64_t>() == (expect + 1) * 10);
    ++expect;
    ++taken;
    if (expect % 50 == 0) std::this_thread::sleep_for(20ms);  // the pipeline fills up meanwhile
  }
  CHECK(expect == 200);
  // Queues 2 + 2 + 1, workers 1 + 3 + 2, and the item being claimed: never more made than taken + 11.
  CHECK(most.load() <= 11);
  CHECK(most.load() >= 5);  // and it does fill them
}

TEST_CASE("pipeline: a stage's error reaches the consumer at its item, and the next epoch reads on") {
  constexpr std::size_t n = 24, batch = 4;
  data::ResumableSampler sampler(n, {.seed = 1, .shuffle = false});
  auto failing = [](torch::data::Example<> b) {
    if (b.data[0].item<std::int64_t>() == 12) throw std::runtime_error("cannot decode batch 12");
    return b;
  };
  auto p = data::pipeline(nitro::from_dataset(stacked(n), sampler, batch), {.workers = 2},
                          data::stage({.name = "decode", .workers = 2}, failing),
                          data::stage({.name = "collate"}, Collate{}));
  for (int i = 0; i < 3; ++i) CHECK(p.next().has_value());
  CHECK_THROWS_WITH_AS(p.next(), doctest::Contains("cannot decode batch 12"), std::runtime_error);
  CHECK_FALSE(p.next().has_value());
  CHECK(sampler.state().index == 12);  // the failed batch was not delivered
  p.set_epoch(1);
  CHECK(p.epoch() == 1);
  CHECK(values(*p.next()) == Indices{0, 1, 2, 3});
}

TEST_CASE("pipeline: items made past an error are freed when it ends the epoch") {
  nitro::test::KeptBatches data;
  data.n = 100;
  data.fail_at = 10;  // batch 1 fails in the read stage, after later batches went on through the stages
  const auto id = [](at::Tensor t) { return t; };
  auto p = data::pipeline(nitro::from_dataset(data, torch::data::samplers::SequentialSampler(data.n), 10),
                          {.workers = 3, .queue = 4}, data::stage({.name = "a", .queue = 4}, id),
                          data::stage({.name = "b", .queue = 4}, id));
  CHECK(values(*p.next()).front() == 0);
  CHECK_THROWS_WITH_AS(p.next(), "bad sample 10", std::runtime_error);
  {
    std::lock_guard guard(data.made->mutex);
    CHECK(data.made->batches.size() >= 3);
  }
  CHECK(data.only_kept_held({}));
  CHECK_FALSE(p.next().has_value());
}

TEST_CASE("pipeline: 3 epochs on one set of threads, the same batches as 3 separate pipelines") {
  constexpr std::size_t n = 30, batch = 5;
  const int before = reader_threads.load();
  data::ResumableSampler sampler(n, {.seed = 21});
  auto p = data::pipeline(nitro::from_dataset(stacked(n), sampler, batch), {.workers = 2},
                          data::stage({.workers = 2}, Decode{}), data::stage({}, Collate{}));
  for (std::int64_t e = 0; e < 3; ++e) {
    p.set_epoch(e);
    CHECK(drain(p) == expected_batches(21, e, n, batch, 2));
  }
  CHECK(reader_threads.load() - before == 2);
  CHECK(p.stats().stages[2].name == "stage 2");
}

TEST_CASE("pipeline under a prefetcher: epochs through the prefetcher, and an exact resume after a stop") {
  constexpr std::size_t n = 40, batch = 4;
  data::ResumableSampler sampler(n, {.seed = 5});
  using P = data::Pipeline<nitro::DatasetSource<Stacked, data::ResumableSampler>, Decode, Collate>;
  std::vector<Indices> first_three;
  {
    nitro::Prefetcher<nitro::Cpu, P> batches{
        P(nitro::from_dataset(stacked(n), sampler, batch), {.workers = 2}, data::stage({.workers = 2}, Decode{100us}),
          data::stage({}, Collate{})),
        {.depth = 3}};
    batches.set_epoch(0);
    CHECK(drain(batches) == expected_batches(5, 0, n, batch, 2));
    batches.set_epoch(1);
    for (int i = 0; i < 3; ++i) first_three.push_back(values(*batches.next()));
    std::this_thread::sleep_for(20ms);  // batches made ahead, in the prefetcher and in the pipeline
    CHECK(sampler.state().epoch == 1);
    CHECK(sampler.state().index == 12);  // only the delivered ones
    CHECK(batches.source().stats().delivered >= 13);
  }
  // The stopped run's sampler (rewound) continues at its 4th batch; so does a loaded copy.
  const auto whole = expected_batches(5, 1, n, batch, 2);
  CHECK(first_three == std::vector<Indices>(whole.begin(), whole.begin() + 3));
  data::ResumableSampler again(n, {.seed = 5});
  again.load_state(sampler.state());
  nitro::Prefetcher<nitro::Cpu, P> resumed{
      P(nitro::from_dataset(stacked(n), again, batch), {.workers = 3}, data::stage({.workers = 1}, Decode{}),
        data::stage({.workers = 2}, Collate{})),
      {.depth = 2}};
  resumed.set_epoch(1);  // the epoch it resumes: keeps the position
  CHECK(drain(resumed) == std::vector<Indices>(whole.begin() + 3, whole.end()));
}

TEST_CASE("pipeline: the stats name the slow stage, and so does the monitor's advice") {
  const auto run = [](std::chrono::microseconds decode, std::chrono::microseconds collate) {
    std::int64_t count = 0;
    auto source = [&count]() -> std::optional<torch::data::Example<>> {
      if (count == 40) return std::nullopt;
      const auto i = count++;
      return torch::data::Example<>{torch::tensor({i}), torch::tensor(i)};
    };
    auto p = data::pipeline(source, {.name = "read"}, data::stage({.name = "decode"}, Decode{decode}),
                            data::stage({.name = "collate"}, Collate{collate}));
    while (p.next()) {
    }
    return p.stats();
  };
  // Decode pauses 2-6 ms per item (by item), collate nothing: decode is the bottleneck.
  const auto slow_decode = run(2000us, 0us);
  CAPTURE(slow_decode.format());
  CHECK(slow_decode.bottleneck() == 1);
  CHECK(slow_decode.stages[1].utilisation() > 0.8);
  CHECK(slow_decode.stages[0].wait_output_s > slow_decode.stages[0].busy_s);  // read waits for room
  CHECK(slow_decode.stages[2].wait_input_s > slow_decode.stages[2].busy_s);   // collate waits for decode
  CHECK(slow_decode.consumer_wait_share() > 0.5);
  CHECK(slow_decode.format().find("busiest stage is 'decode'") != std::string::npos);
  CHECK(slow_decode.format().find(" ms per item)") != std::string::npos);
  auto none_delivered = slow_decode;
  none_delivered.delivered = 0;  // no per-item figure to give
  CHECK(none_delivered.format().find("per item") == std::string::npos);
  // Collate 5 ms per item: collate is.
  const auto slow_collate = run(0us, 5000us);
  CAPTURE(slow_collate.format());
  CHECK(slow_collate.bottleneck() == 2);
  CHECK(slow_collate.stages[1].wait_output_s > slow_collate.stages[1].busy_s);

  // The monitor's report: a data-bound run with these stats names the stage and what to do.
  nitro::monitor::Summary s;
  s.steps = 10;
  s.step.mean_ms = 10;
  s.phases[static_cast<std::size_t>(nitro::Phase::data)] = {.mean_ms = 6, .share = 0.6};
  s.pipeline = slow_decode;
  const auto advice = nitro::monitor::bottlenecks(s);
  REQUIRE_FALSE(advice.empty());
  CHECK(advice[0].kind == nitro::monitor::Bottleneck::data);
  CHECK(advice[0].text().find("slowest stage is 'decode'") != std::string::npos);
  CHECK(advice[0].suggestion.find("give stage 'decode' more workers") != std::string::npos);
  CHECK(nitro::monitor::format(s).find("data pipeline:") != std::string::npos);

  // The same stats over a longer life (set-up before the first epoch): the consumer waited as long per
  // item, so the stage is still named.
  auto idle_first = slow_decode;
  idle_first.seconds *= 100;
  s.pipeline = idle_first;
  CHECK(nitro::monitor::bottlenecks(s)[0].text().find("slowest stage is 'decode'") != std::string::npos);

  // A pipeline that kept up (its consumer hardly waited, 0.1 ms per item of the step's 6 ms): no stage
  // is blamed for the step's wait.
  auto kept_up = slow_decode;
  kept_up.consumer_wait_s = 0.1e-3 * static_cast<double>(kept_up.delivered);
  s.pipeline = kept_up;
  const auto after = nitro::monitor::bottlenecks(s);
  REQUIRE_FALSE(after.empty());
  CHECK(after[0].kind == nitro::monitor::Bottleneck::data);
  CHECK(after[0].text().find("the pipeline keeps up") != std::string::npos);
  CHECK(after[0].text().find("decode") == std::string::npos);
  CHECK(after[0].suggestion.find("between the pipeline and the step") != std::string::npos);
}

TEST_CASE("pipeline: options are checked, and destroying it mid-epoch returns promptly") {
  auto source = []() -> std::optional<at::Tensor> { return torch::zeros({1}); };  // endless
  const auto id = [](at::Tensor t) { return t; };
  CHECK_THROWS_WITH_AS(data::pipeline(source, {.workers = 1}, data::stage({.name = "x", .workers = 0}, id)),
                       doctest::Contains("stage 'x' has 0 workers"), nitro::Error);
  CHECK_THROWS_WITH_AS(data::pipeline(source, {.queue = 0}, data::stage({}, id)),
                       doctest::Contains("stage 'read' has a queue of 0"), nitro::Error);
  const auto slow = [](at::Tensor t) {
    std::this_thread::sleep_for(30ms);
    return t;
  };
  const auto start = std::chrono::steady_clock::now();
  {
    auto p = data::pipeline(source, {}, data::stage({.workers = 4, .queue = 8}, slow));
    CHECK(p.next().has_value());
  }
  CHECK(std::chrono::steady_clock::now() - start < 5s);
}

TEST_CASE("pipeline: a stage may take its item's epoch and position") {
  constexpr std::size_t n = 12, batch = 4;
  data::ResumableSampler sampler(n, {.seed = 2});
  auto p = data::pipeline(nitro::from_dataset(stacked(n), sampler, batch), {.workers = 2},
                          data::stage({.workers = 3}, [](torch::data::Example<> b, const data::StageContext& c) {
                            return torch::tensor({c.epoch, static_cast<std::int64_t>(c.position)});
                          }));
  for (std::int64_t e = 0; e < 3; ++e) {
    p.set_epoch(e);
    CHECK(drain(p) == std::vector<Indices>{{e, 0}, {e, 1}, {e, 2}});
  }
  // Restarted mid-epoch: the items made ahead for epoch 4 are dropped, not delivered in epoch 5.
  p.set_epoch(4);
  CHECK(values(*p.next()) == Indices{4, 0});
  std::this_thread::sleep_for(10ms);
  p.set_epoch(5);
  CHECK(drain(p) == std::vector<Indices>{{5, 0}, {5, 1}, {5, 2}});
}

}  // namespace nitro_test_data_pipeline
