#include <nitro/infer/batcher.hpp>

#include "testing.hpp"

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace nitro_test_infer_batcher {  // one namespace per file: an area is compiled as one translation unit

using namespace std::chrono_literals;
using nitro::infer::BatcherOptions;
using nitro::infer::DynamicBatcher;

namespace {

// A model the test holds back: each batch waits until the gate is opened.
struct Gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  int entered = 0;
  void wait() {
    std::unique_lock lock(m);
    ++entered;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
  }
  void wait_entered(int n) {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return entered >= n; });
  }
  void release() {
    {
      std::lock_guard lock(m);
      open = true;
    }
    cv.notify_all();
  }
};

}  // namespace

TEST_CASE("DynamicBatcher: 16 threads, every request answered exactly once with its own row") {
  torch::manual_seed(1);
  torch::nn::Linear layer(32, 8);
  layer->eval();
  std::atomic<int> calls{0};
  auto model = [&](const at::Tensor& batch) {
    ++calls;
    return layer->forward(batch);
  };
  DynamicBatcher batcher{model, {.max_batch = 16, .max_delay = 3ms}};
  const int threads = 16, per_thread = 40;
  std::vector<at::Tensor> inputs;
  for (int i = 0; i < threads * per_thread; ++i) inputs.push_back(torch::randn({32}));
  std::vector<at::Tensor> answers(inputs.size());
  std::vector<std::thread> clients;
  for (int t = 0; t < threads; ++t) {
    clients.emplace_back([&, t] {
      for (int k = 0; k < per_thread; ++k) {
        const size_t i = static_cast<size_t>(t * per_thread + k);
        answers[i] = batcher.submit(inputs[i]).get();
      }
    });
  }
  for (auto& c : clients) c.join();
  // One at a time, without the batcher: the reference.
  torch::InferenceMode guard;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto expected = layer->forward(inputs[i].unsqueeze(0))[0];
    REQUIRE(answers[i].defined());
    CHECK((answers[i] - expected).abs().max().item<double>() < 1e-6);
  }
  const auto s = batcher.stats();
  CHECK(s.requests == inputs.size());
  CHECK(s.expired + s.failed + s.rejected == 0);
  CHECK(s.batches == static_cast<uint64_t>(calls.load()));
  uint64_t counted = 0;
  for (size_t n = 0; n < s.batch_sizes.size(); ++n) counted += s.batch_sizes[n] * n;
  CHECK(counted == inputs.size());
  CHECK(s.mean_batch() > 1.5);  // 16 callers at once: batches formed
  CHECK(s.latency_p99_ms >= s.latency_p50_ms);
  CHECK(s.latency_p50_ms >= s.queue_wait_p50_ms);
  MESSAGE("mean batch " << s.mean_batch() << ", latency p50 " << s.latency_p50_ms << " ms, p99 " << s.latency_p99_ms);
}

TEST_CASE("DynamicBatcher: a full batch runs at once, and a lone request waits max_delay, no longer") {
  auto model = [](const at::Tensor& b) { return b * 2; };
  DynamicBatcher batcher{model, {.max_batch = 4, .max_delay = 50ms}};
  const auto t0 = std::chrono::steady_clock::now();
  auto lone = batcher.submit(torch::ones({2}));
  CHECK(torch::equal(lone.get(), torch::full({2}, 2.0f)));
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(waited >= 50ms);
  CHECK(waited < 1s);
  const auto s = batcher.stats();
  CHECK(s.batch_sizes[1] == 1);
}

TEST_CASE("DynamicBatcher: an expired request gets RequestExpired, not a late answer") {
  Gate gate;
  auto model = [&](const at::Tensor& b) {
    gate.wait();
    return b + 1;
  };
  DynamicBatcher batcher{model, {.max_batch = 1, .max_delay = 0ms}};
  auto first = batcher.submit(torch::zeros({1}));
  gate.wait_entered(1);  // the worker is inside the model
  auto late = batcher.submit(torch::zeros({1}), std::chrono::steady_clock::now() + 1ms);
  auto in_time = batcher.submit(torch::zeros({1}), std::chrono::steady_clock::now() + 1h);
  std::this_thread::sleep_for(20ms);
  gate.release();
  CHECK(first.get().item<float>() == 1.0f);
  CHECK_THROWS_AS(late.get(), nitro::infer::RequestExpired);
  CHECK(in_time.get().item<float>() == 1.0f);
  const auto s = batcher.stats();
  CHECK(s.expired == 1);
  CHECK(s.requests == 2);
}

TEST_CASE("DynamicBatcher: an expired request takes no place in a batch: max_batch live ones fill it") {
  // The worker is held inside the model with a first, full batch while three requests with a short
  // deadline and four without queue up, interleaved; the deadlines pass before the model is let go.
  // The next batch must hold the four live requests (not two of them beside two expired ones, the
  // third waiting max_delay for a batch of its own).
  Gate gate;
  std::mutex m;
  std::vector<int64_t> rows;  // of each batch the model saw
  auto model = [&](const at::Tensor& b) {
    {
      std::lock_guard lock(m);
      rows.push_back(b.size(0));
    }
    gate.wait();  // the first batch waits for release(); once open, the gate stays open
    return b * 2;
  };
  DynamicBatcher batcher{model, {.max_batch = 4, .max_delay = 5s}};
  std::vector<std::future<at::Tensor>> first, late, live;
  for (int i = 0; i < 4; ++i) first.push_back(batcher.submit(torch::full({1}, static_cast<float>(i))));
  gate.wait_entered(1);  // the worker holds the first batch
  const auto soon = std::chrono::steady_clock::now() + 1ms;
  for (int i = 0; i < 4; ++i) {
    if (i < 3) late.push_back(batcher.submit(torch::full({1}, -1.0f), soon));
    live.push_back(batcher.submit(torch::full({1}, static_cast<float>(10 + i))));
  }
  std::this_thread::sleep_until(soon + 5ms);  // past every short deadline, the worker still held
  gate.release();
  for (int i = 0; i < 4; ++i) CHECK(first[static_cast<size_t>(i)].get().item<float>() == 2.0f * static_cast<float>(i));
  for (auto& f : late)
    CHECK_THROWS_WITH_AS(f.get(), doctest::Contains("deadline passed"), nitro::infer::RequestExpired);
  for (int i = 0; i < 4; ++i)  // each its own row, in the order they came
    CHECK(live[static_cast<size_t>(i)].get().item<float>() == 2.0f * static_cast<float>(10 + i));
  {
    std::lock_guard lock(m);
    CHECK(rows == std::vector<int64_t>{4, 4});
  }
  const auto s = batcher.stats();
  CHECK(s.expired == 3);
  CHECK(s.requests == 8);
  CHECK(s.batches == 2);
  CHECK(s.batch_sizes[4] == 2);
}

TEST_CASE("DynamicBatcher: back-pressure, rejecting or blocking as asked") {
  for (auto mode : {BatcherOptions::WhenFull::Reject, BatcherOptions::WhenFull::Block}) {
    CAPTURE(static_cast<int>(mode));
    Gate gate;
    auto model = [&](const at::Tensor& b) {
      gate.wait();
      return b;
    };
    DynamicBatcher batcher{model, {.max_batch = 1, .max_delay = 0ms, .queue_capacity = 2, .when_full = mode}};
    std::vector<std::future<at::Tensor>> answers;
    answers.push_back(batcher.submit(torch::zeros({1})));
    gate.wait_entered(1);  // that one is running; two more fill the queue
    answers.push_back(batcher.submit(torch::zeros({1})));
    answers.push_back(batcher.submit(torch::zeros({1})));
    if (mode == BatcherOptions::WhenFull::Reject) {
      CHECK_THROWS_WITH_AS(batcher.submit(torch::zeros({1})), doctest::Contains("queue is full"), nitro::Error);
      CHECK(batcher.stats().rejected == 1);
      gate.release();
    } else {
      std::atomic<bool> submitted{false};
      std::thread blocked([&] {
        answers.push_back(batcher.submit(torch::zeros({1})));
        submitted = true;
      });
      std::this_thread::sleep_for(50ms);
      CHECK_FALSE(submitted.load());  // waiting for room
      gate.release();
      blocked.join();
      CHECK(submitted.load());
    }
    for (auto& a : answers) CHECK(a.get().defined());
  }
}

TEST_CASE("DynamicBatcher: shutdown answers or fails every pending request, then refuses new ones") {
  for (auto how : {nitro::infer::Shutdown::answer_pending, nitro::infer::Shutdown::fail_pending}) {
    CAPTURE(static_cast<int>(how));
    Gate gate;
    auto model = [&](const at::Tensor& b) {
      gate.wait();
      return b * 3;
    };
    DynamicBatcher batcher{model, {.max_batch = 2, .max_delay = 0ms}};
    std::vector<std::future<at::Tensor>> answers;
    answers.push_back(batcher.submit(torch::ones({1})));
    gate.wait_entered(1);
    for (int i = 0; i < 5; ++i) answers.push_back(batcher.submit(torch::ones({1})));
    std::thread stopper([&] { batcher.shutdown(how); });
    std::this_thread::sleep_for(20ms);
    CHECK_THROWS_WITH_AS(batcher.submit(torch::ones({1})), doctest::Contains("shut down"), nitro::Error);
    gate.release();
    stopper.join();
    CHECK(answers[0].get().item<float>() == 3.0f);  // the running batch is always answered
    for (size_t i = 1; i < answers.size(); ++i) {
      if (how == nitro::infer::Shutdown::answer_pending)
        CHECK(answers[i].get().item<float>() == 3.0f);
      else
        CHECK_THROWS_AS(answers[i].get(), nitro::infer::BatcherStopped);
    }
    batcher.shutdown();  // again: nothing happens
  }
}

TEST_CASE("DynamicBatcher: a throwing model fails only the requests of its batch") {
  auto model = [](const at::Tensor& b) {
    if ((b < 0).any().item<bool>()) throw std::runtime_error("negative input");
    return b.sum(1);
  };
  DynamicBatcher batcher{model, {.max_batch = 1, .max_delay = 0ms}};
  auto good1 = batcher.submit(torch::ones({3}));
  auto bad = batcher.submit(-torch::ones({3}));
  auto good2 = batcher.submit(torch::full({3}, 2.0f));
  CHECK(good1.get().item<float>() == 3.0f);
  CHECK_THROWS_WITH_AS(bad.get(), "negative input", std::runtime_error);
  CHECK(good2.get().item<float>() == 6.0f);
  const auto s = batcher.stats();
  CHECK(s.failed == 1);
  CHECK(s.requests == 2);
}

TEST_CASE("DynamicBatcher: a user's mistakes are nitro::Errors that say what to do") {
  auto id = [](const at::Tensor& b) { return b; };
  CHECK_THROWS_WITH_AS((DynamicBatcher{id, {.max_batch = 0}}), doctest::Contains("max_batch must be >= 1"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS((DynamicBatcher{id, {.max_batch = 8, .queue_capacity = 4}}),
                       doctest::Contains("queue_capacity"), nitro::Error);
  CHECK_THROWS_WITH_AS((DynamicBatcher{id, {.max_delay = -1ms}}), doctest::Contains("max_delay"), nitro::Error);
  DynamicBatcher batcher{id, {.max_batch = 2, .max_delay = 0ms}};
  batcher.submit(torch::zeros({2, 3})).get();
  CHECK_THROWS_WITH_AS(batcher.submit(torch::zeros({3, 2})), doctest::Contains("first one's shape"), nitro::Error);
  CHECK_THROWS_WITH_AS(batcher.submit(at::Tensor()), doctest::Contains("undefined"), nitro::Error);
  auto wrong_rows = [](const at::Tensor& b) { return b.sum(); };
  DynamicBatcher bad{wrong_rows, {.max_batch = 2, .max_delay = 0ms}};
  CHECK_THROWS_WITH_AS(bad.submit(torch::zeros({2})).get(), doctest::Contains("first dimension must be the batch"),
                       nitro::Error);
}

TEST_CASE("DynamicBatcher: two threads shutting down at once both return") {
  for (int i = 0; i < 20; ++i) {
    DynamicBatcher batcher{[](const at::Tensor& b) { return b; }, {.max_batch = 2, .max_delay = 1ms}};
    batcher.submit(torch::zeros({1})).get();
    std::thread a([&] { batcher.shutdown(); });
    std::thread b([&] { batcher.shutdown(nitro::infer::Shutdown::fail_pending); });
    a.join();
    b.join();
  }
}

TEST_CASE("DynamicBatcher: a deadline shorter than max_delay runs the request in time instead of expiring it") {
  DynamicBatcher batcher{[](const at::Tensor& b) { return b + 1; }, {.max_batch = 8, .max_delay = 300ms}};
  const auto t0 = std::chrono::steady_clock::now();
  auto answer = batcher.submit(torch::zeros({1}), t0 + 50ms);
  CHECK(answer.get().item<float>() == 1.0f);
  CHECK(std::chrono::steady_clock::now() - t0 < 200ms);
  CHECK(batcher.stats().expired == 0);
}

TEST_CASE("DynamicBatcher: in Block mode a deadline bounds the wait for room") {
  Gate gate;
  DynamicBatcher batcher{[&](const at::Tensor& b) {
                           gate.wait();
                           return b;
                         },
                         {.max_batch = 1, .max_delay = 0ms, .queue_capacity = 1,
                          .when_full = BatcherOptions::WhenFull::Block}};
  auto running = batcher.submit(torch::zeros({1}));
  gate.wait_entered(1);
  auto queued = batcher.submit(torch::zeros({1}));  // fills the queue
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(batcher.submit(torch::zeros({1}), t0 + 20ms), nitro::infer::RequestExpired);
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  CHECK(batcher.stats().expired == 1);
  gate.release();
  running.get();
  queued.get();
}

TEST_CASE("DynamicBatcher: shutdown with fail_pending fails a batch still being gathered") {
  std::atomic<int> calls{0};
  DynamicBatcher batcher{[&](const at::Tensor& b) {
                           ++calls;
                           return b;
                         },
                         {.max_batch = 8, .max_delay = 5s}};
  auto pending = batcher.submit(torch::ones({1}));
  std::this_thread::sleep_for(20ms);  // the worker is gathering, waiting for more
  batcher.shutdown(nitro::infer::Shutdown::fail_pending);
  CHECK_THROWS_AS(pending.get(), nitro::infer::BatcherStopped);
  CHECK(calls.load() == 0);
}

TEST_CASE("DynamicBatcher: an input of another layout is refused at submit and fails no one else") {
  DynamicBatcher batcher{[](const at::Tensor& b) { return b; }, {.max_batch = 4, .max_delay = 20ms}};
  auto good = batcher.submit(torch::ones({3}));
  CHECK_THROWS_WITH_AS(batcher.submit(torch::ones({3}).to_sparse()), doctest::Contains("dense"), nitro::Error);
  CHECK(torch::equal(good.get(), torch::ones({3})));
}

}  // namespace nitro_test_infer_batcher
