#include <nitro/memory/batch_size.hpp>
#include <nitro/memory/tracking_allocator.hpp>
#include <nitro/monitor/phases.hpp>
#include <nitro/train/training_loop.hpp>

#include "testing.hpp"

#include <nitro/hw/settings.hpp>
#include <torch/optim/adam.h>

#if NITRO_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace nitro_test_memory_batch_size {  // one namespace per file: an area is compiled as one translation unit

using nitro::memory::BatchSizeOptions;
using nitro::memory::SearchMode;
using nitro::memory::find_max_batch_size;

namespace {

constexpr std::int64_t kRowBytes = 4096;  // a float row of 1024

// A trial that holds batch x 1024 floats, and a temporary half as large, at once.
void rows_trial(std::int64_t batch) {
  const auto a = torch::empty({batch, 1024}, torch::kFloat);
  const auto b = torch::empty({(batch + 1) / 2, 1024}, torch::kFloat);
  (void)a;
  (void)b;
}

// Live bytes of rows_trial(batch).
std::int64_t rows_bytes(std::int64_t batch) { return (batch + (batch + 1) / 2) * kRowBytes; }

}  // namespace

TEST_CASE("binsearch returns exactly the largest fitting batch under a CPU budget within ceil(log2(max/min)) + 2 trials") {
  for (const std::int64_t answer : {1, 2, 7, 300, 511, 512, 700, 999, 1000}) {
    nitro::memory::ScopedCpuTracking track{{.budget_bytes = rows_bytes(answer) + 100}};
    const auto r = find_max_batch_size(rows_trial, {.mode = SearchMode::binsearch, .min = 1, .max = 1000, .trials_per_size = 1});
    CAPTURE(answer);
    CHECK(r.batch_size == answer);
    CHECK(r.largest_fit == answer);
    CHECK(r.first_failure == (answer == 1000 ? -1 : answer + 1));
    CHECK(r.trials <= static_cast<int>(std::ceil(std::log2(1000.0))) + 2);
    CHECK(r.trials == static_cast<int>(r.history.size()));
    CHECK(track.stats().live_bytes == 0);  // every trial's memory was given back
  }
}

TEST_CASE("power doubles to the last fitting power of two times min and counts calls per size") {
  nitro::memory::ScopedCpuTracking track{{.budget_bytes = rows_bytes(700) + 100}};
  const auto r = find_max_batch_size(rows_trial, {.mode = SearchMode::power, .min = 3, .max = 5000, .trials_per_size = 3});
  CHECK(r.largest_fit == 384);  // 3, 6, ..., 384 fit; 768 does not
  CHECK(r.first_failure == 768);
  CHECK(r.trials == 9);
  CHECK(r.trials <= static_cast<int>(std::ceil(std::log2(5000.0 / 3.0))) + 1);
  CHECK(r.calls == 8 * 3 + 1);  // the failing size stops at its first call
}

TEST_CASE("power tries max itself last when doubling passes it") {
  nitro::memory::ScopedCpuTracking roomy{{.budget_bytes = rows_bytes(5000) + 100}};
  const auto all = find_max_batch_size(rows_trial, {.mode = SearchMode::power, .min = 3, .max = 5000, .trials_per_size = 1});
  CHECK(all.largest_fit == 5000);
  CHECK(all.history.back().batch_size == 5000);
}

TEST_CASE("margin backs off a fraction of the largest fit but never below min") {
  nitro::memory::ScopedCpuTracking track{{.budget_bytes = rows_bytes(700) + 100}};
  CHECK(find_max_batch_size(rows_trial, {.min = 1, .max = 1000, .margin = 0.1, .trials_per_size = 1}).batch_size == 630);
  CHECK(find_max_batch_size(rows_trial, {.min = 690, .max = 1000, .margin = 0.5, .trials_per_size = 1}).batch_size == 690);
}

TEST_CASE("the finder leaves parameters gradients optimizer state and the random generator bitwise unchanged") {
  torch::manual_seed(0);
  // Wide: a row's activations (about 20 KB) are what the batch size changes.
  auto model = torch::nn::Sequential(torch::nn::Linear(64, 1024), torch::nn::Functional(torch::relu),
                                     torch::nn::BatchNorm1d(1024), torch::nn::Linear(1024, 8));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  // One real step first, so there is optimizer state and gradients to keep.
  model->forward(torch::randn({16, 64})).pow(2).mean().backward();
  opt.step();
  std::vector<at::Tensor> params, grads, buffers, exp_avg;
  for (const auto& p : model->parameters()) {
    params.push_back(p.detach().clone());
    grads.push_back(p.grad().clone());
    const auto& s = static_cast<torch::optim::AdamParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
    exp_avg.push_back(s.exp_avg().clone());
  }
  for (const auto& b : model->buffers()) buffers.push_back(b.clone());
  const auto rng = at::detail::getDefaultCPUGenerator().get_state();

  const auto trial = [&](std::int64_t batch) {
    const auto x = torch::randn({batch, 64});
    opt.param_groups()[0].options().set_lr(0.5);  // e.g. a warm-up schedule
    opt.zero_grad();
    model->forward(x).pow(2).mean().backward();
    opt.step();
  };
  // Ground truth: each size tried on its own from the same state, upwards until one fails.
  std::int64_t budget = 0, expected = 0;
  {
    nitro::memory::ScopedCpuTracking probe;
    nitro::memory::StateBackup backup(model.ptr().get(), &opt);
    probe.reset_peak();
    trial(40);
    budget = probe.stats().peak_bytes;  // what batch 40 needs, the backup's copies included
    backup.restore();
  }
  {
    nitro::memory::ScopedCpuTracking probe{{.budget_bytes = budget}};
    nitro::memory::StateBackup backup(model.ptr().get(), &opt);
    for (std::int64_t b = 2; b <= 64; ++b) {  // BatchNorm needs 2 rows
      bool fit = true;
      try {
        trial(b);
      } catch (const c10::OutOfMemoryError&) {
        fit = false;
      }
      backup.restore();
      if (!fit) break;
      expected = b;
    }
  }
  REQUIRE(expected >= 40);
  REQUIRE(expected < 64);
  nitro::memory::ScopedCpuTracking track{{.budget_bytes = budget}};
  const auto r = find_max_batch_size(trial, {.min = 2, .max = 64, .trials_per_size = 1, .model = model.ptr().get(), .optimizer = &opt});
  CHECK(r.batch_size == expected);

  const auto ps = model->parameters();
  for (size_t i = 0; i < ps.size(); ++i) {
    CHECK(torch::equal(ps[i], params[i]));
    CHECK(torch::equal(ps[i].grad(), grads[i]));
    const auto& s = static_cast<torch::optim::AdamParamState&>(*opt.state().at(ps[i].unsafeGetTensorImpl()));
    CHECK(torch::equal(s.exp_avg(), exp_avg[i]));
    CHECK(s.step() == 1);
  }
  const auto bs = model->buffers();
  for (size_t i = 0; i < bs.size(); ++i) CHECK(torch::equal(bs[i], buffers[i]));
  CHECK(torch::equal(at::detail::getDefaultCPUGenerator().get_state(), rng));
  CHECK(opt.param_groups()[0].options().get_lr() == 1e-2);
  CHECK(r.trials <= 1 + static_cast<int>(std::ceil(std::log2(63.0))));
}

TEST_CASE("a first size that already fails is an error that says so with the size and the memory") {
  nitro::memory::ScopedCpuTracking track{{.budget_bytes = 1000}};
  CHECK_THROWS_WITH_AS(find_max_batch_size(rows_trial, {.min = 4, .max = 64}),
                       doctest::Contains("min = 4, already runs out of memory"), nitro::Error);
  try {
    find_max_batch_size(rows_trial, {.min = 4, .max = 64});
  } catch (const nitro::Error& e) {
    CHECK(std::string(e.what()).find("memory now:") != std::string::npos);
    CHECK(std::string(e.what()).find("budget of 1000 bytes") != std::string::npos);
  }
}

TEST_CASE("other errors of a trial reach the caller after the state is put back") {
  torch::manual_seed(0);
  torch::nn::Linear model(4, 4);
  const auto before = model->weight.detach().clone();
  torch::optim::SGD opt(model->parameters(), 0.1);
  const auto trial = [&](std::int64_t batch) {
    model->forward(torch::ones({batch, 4})).sum().backward();
    opt.step();
    if (batch > 2) throw std::runtime_error("bad batch");
  };
  CHECK_THROWS_WITH_AS(find_max_batch_size(trial, {.min = 1, .max = 8, .model = model.ptr().get(), .optimizer = &opt}),
                       "bad batch", std::runtime_error);
  CHECK(torch::equal(model->weight, before));
  CHECK_FALSE(model->weight.grad().defined());
}

TEST_CASE("finder bad options name the option") {
  const auto t = [](std::int64_t) {};
  CHECK_THROWS_WITH_AS(find_max_batch_size(t, {.min = 0}), doctest::Contains("min must be >= 1"), nitro::Error);
  CHECK_THROWS_WITH_AS(find_max_batch_size(t, {.min = 8, .max = 4}), doctest::Contains("max (4) must be >= min (8)"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(find_max_batch_size(t, {.margin = 1.0}), doctest::Contains("margin must be in [0, 1)"), nitro::Error);
  CHECK_THROWS_WITH_AS(find_max_batch_size(t, {.margin = -0.1}), doctest::Contains("margin"), nitro::Error);
  CHECK_THROWS_WITH_AS(find_max_batch_size(t, {.trials_per_size = 0}), doctest::Contains("trials_per_size"), nitro::Error);
}

TEST_CASE("out of memory as cuBLAS, cuDNN or the CUDA runtime report it is a failed size, a shape error is not") {
  for (const char* report : {"CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
                             "cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR",
                             "CUDA error: out of memory"}) {
    CAPTURE(report);
    const auto trial = [&](std::int64_t batch) {
      if (batch > 37) throw c10::Error(report);
    };
    const auto found = find_max_batch_size(trial, {.min = 1, .max = 100});
    CHECK(found.batch_size == 37);
    CHECK(found.first_failure == 38);
  }
  const auto shape_error = [](std::int64_t batch) {
    if (batch > 3) throw c10::Error("mat1 and mat2 shapes cannot be multiplied (4x3 and 4x3)");
  };
  CHECK_THROWS_WITH_AS(find_max_batch_size(shape_error, {.min = 1, .max = 100}), doctest::Contains("shapes"), c10::Error);
}

TEST_CASE("with the training loop the finder puts the loop back too: the first real steps are those without a search") {
  using Loop = nitro::TrainingLoop<nitro::accumulate::Fixed<3>, nitro::monitor::Phases>;
  const auto batch = torch::sin(torch::arange(4 * 16, torch::kFloat).reshape({4, 16}));
  const auto make = [] {
    torch::manual_seed(0);
    return torch::nn::Linear(16, 1);
  };
  auto searched = make(), reference = make();
  torch::optim::SGD opt_searched(searched->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD opt_reference(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Loop loop{searched, opt_searched}, plain{reference, opt_reference};
  const auto loss_of = [&](torch::nn::Linear& m) {
    return [&m](const at::Tensor& x) { return m->forward(x).pow(2).mean(); };
  };
  {
    nitro::memory::ScopedCpuTracking track{{.budget_bytes = rows_bytes(20) + 2048}};  // + the backup and the step's scalars
    const auto found = find_max_batch_size(
        loop,
        [&](std::int64_t b) {
          rows_trial(b);
          loop.step(batch, loss_of(searched));  // one micro-batch of a window of 3
        },
        {.min = 1, .max = 64, .trials_per_size = 1});
    CHECK(found.batch_size == 20);
    CHECK(found.calls > 3);
  }
  CHECK(loop.pending_micro_batches() == 0);
  CHECK(loop.optimizer_steps() == 0);
  CHECK(loop.monitor().totals().steps == 0);  // trial steps count nowhere
  for (const auto& p : searched->parameters()) CHECK_FALSE(p.grad().defined());
  for (int i = 0; i < 6; ++i) {
    const auto a = loop.step(batch, loss_of(searched));
    const auto b = plain.step(batch, loss_of(reference));
    CHECK(a.stepped == b.stepped);
  }
  CHECK(loop.optimizer_steps() == 2);
  CHECK(torch::equal(searched->weight, reference->weight));
  CHECK(torch::equal(searched->bias, reference->bias));
}

namespace {

const at::Tensor& rows16() {
  static const auto batch = torch::sin(torch::arange(4 * 16, torch::kFloat).reshape({4, 16}));
  return batch;
}
torch::nn::Linear seeded_linear(std::int64_t in, std::int64_t out) {
  torch::manual_seed(0);
  return torch::nn::Linear(in, out);
}
auto square_loss(torch::nn::Linear& m) {
  return [&m](const at::Tensor& x) { return m->forward(x).pow(2).mean(); };
}

}  // namespace

TEST_CASE("a TrainingLoop stepped in a trial of the finder without a loop is an error naming the loop overload, and changes nothing") {
  using Loop = nitro::TrainingLoop<nitro::accumulate::Fixed<3>, nitro::monitor::Phases>;
  auto trapped = seeded_linear(16, 1), reference = seeded_linear(16, 1);
  torch::optim::SGD opt_trapped(trapped->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD opt_reference(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Loop loop{trapped, opt_trapped}, plain{reference, opt_reference};
  // One micro-batch of a window of 3 first: a window in progress, with its gradients.
  loop.step(rows16(), square_loss(trapped));
  plain.step(rows16(), square_loss(reference));
  const auto weight = trapped->weight.detach().clone(), grad = trapped->weight.grad().clone();
  const auto monitored = loop.monitor().totals().steps;
  for (const bool flush : {false, true}) {
    CAPTURE(flush);
    const auto trial = [&](std::int64_t b) {
      rows_trial(b);
      if (flush) (void)loop.flush();
      else loop.step(rows16(), square_loss(trapped));
    };
    bool refused = false;
    try {
      nitro::memory::ScopedCpuTracking track{{.budget_bytes = rows_bytes(20) + 2048}};
      (void)find_max_batch_size(trial, {.min = 1, .max = 64, .trials_per_size = 1, .model = trapped.ptr().get(),
                                        .optimizer = &opt_trapped});
    } catch (const nitro::Error& e) {
      refused = true;
      const std::string what = e.what();
      CHECK(what.find(flush ? "TrainingLoop::flush inside a trial of find_max_batch_size(trial, options)"
                            : "TrainingLoop::step inside a trial of find_max_batch_size(trial, options)") == 0);
      CHECK(what.find("Give the finder the loop: find_max_batch_size(loop, trial, options)") != std::string::npos);
      CHECK(what.find("accumulation window") != std::string::npos);
    }
    CHECK(refused);
    CHECK(nitro::memory::detail::trial_loops == nullptr);
    // The loop had not changed when the error came, and the finder put the model back.
    CHECK(loop.pending_micro_batches() == 1);
    CHECK(loop.optimizer_steps() == 0);
    CHECK(loop.monitor().totals().steps == monitored);
    CHECK(torch::equal(trapped->weight, weight));
    CHECK(torch::equal(trapped->weight.grad(), grad));
  }
  // Outside any trial the loop steps, and trains exactly as one that never met the finder.
  for (int i = 0; i < 5; ++i) {
    const auto a = loop.step(rows16(), square_loss(trapped));
    const auto b = plain.step(rows16(), square_loss(reference));
    CHECK(a.stepped == b.stepped);
  }
  CHECK(loop.optimizer_steps() == 2);
  CHECK(torch::equal(trapped->weight, reference->weight));
  CHECK(torch::equal(trapped->bias, reference->bias));
}

TEST_CASE("a loop the finder was not given, stepped in a trial of the loop form, is an error that says to give every loop") {
  auto first = seeded_linear(16, 1), second = seeded_linear(16, 1);
  torch::optim::SGD opt_first(first->parameters(), 0.1), opt_second(second->parameters(), 0.1);
  nitro::TrainingLoop<> given{first, opt_first}, other{second, opt_second};
  const auto before = second->weight.detach().clone();
  const auto trial = [&](std::int64_t) {
    given.step(rows16(), square_loss(first));
    other.step(rows16(), square_loss(second));
  };
  CHECK_THROWS_WITH_AS(find_max_batch_size(given, trial, {.min = 1, .max = 8}),
                       doctest::Contains("on a TrainingLoop the finder was not given"), nitro::Error);
  CHECK_THROWS_WITH_AS(find_max_batch_size(given, trial, {.min = 1, .max = 8}),
                       doctest::Contains("find_max_batch_size(std::tie(loop_a, loop_b), trial, options)"), nitro::Error);
  CHECK(given.optimizer_steps() == 0);
  CHECK(other.optimizer_steps() == 0);
  CHECK(torch::equal(first->weight, seeded_linear(16, 1)->weight));
  CHECK(torch::equal(second->weight, before));
  CHECK_FALSE(second->weight.grad().defined());
}

TEST_CASE("with several loops the finder puts every loop, model and optimizer back: training after it is training without it") {
  // A GAN's two loops of different types: the generator accumulates over 2 micro-batches and is
  // monitored; the critic steps Adam every micro-batch. The generator's loss reaches the critic's weights.
  struct Gan {
    torch::nn::Linear generator = seeded_linear(16, 16), critic = seeded_linear(16, 1);
    torch::optim::SGD g_opt{generator->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)};
    torch::optim::Adam d_opt{critic->parameters(), torch::optim::AdamOptions(1e-2)};
    nitro::TrainingLoop<nitro::accumulate::Fixed<2>, nitro::monitor::Phases> g_loop{generator, g_opt};
    nitro::TrainingLoop<> d_loop{critic, d_opt};
    void step(const at::Tensor& z) {
      d_loop.step(z, [this](const at::Tensor& x) {
        return critic->forward(generator->forward(x).detach()).mean() - critic->forward(x.cos()).mean();
      });
      g_loop.step(z, [this](const at::Tensor& x) { return -critic->forward(generator->forward(x)).mean(); });
    }
  };
  Gan searched, reference;
  // A step first: Adam's state, and a generator window in progress.
  searched.step(rows16());
  reference.step(rows16());
  nitro::memory::BatchSizeResult found;
  {
    nitro::memory::ScopedCpuTracking track{{.budget_bytes = rows_bytes(20) + (64 << 10)}};
    found = find_max_batch_size(std::tie(searched.g_loop, searched.d_loop),
                                [&](std::int64_t b) {
                                  rows_trial(b);
                                  searched.step(rows16());
                                },
                                {.min = 1, .max = 64});
  }
  CHECK(found.largest_fit >= 20);
  CHECK(found.first_failure == found.largest_fit + 1);  // a size ran out of memory: that path ran too
  CHECK(nitro::memory::detail::trial_loops == nullptr);
  CHECK(searched.g_loop.pending_micro_batches() == 1);
  CHECK(searched.g_loop.optimizer_steps() == 0);
  CHECK(searched.g_loop.monitor().totals().steps == reference.g_loop.monitor().totals().steps);
  CHECK(searched.d_loop.optimizer_steps() == 1);
  for (int i = 0; i < 5; ++i) {
    const auto z = torch::sin(torch::arange(4 * 16, torch::kFloat).reshape({4, 16}) * (i + 2));
    searched.step(z);
    reference.step(z);
  }
  CHECK(searched.g_loop.optimizer_steps() == 3);
  CHECK(searched.d_loop.optimizer_steps() == 6);
  const auto a = searched.generator->parameters(), b = reference.generator->parameters();
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i], b[i]));
  const auto c = searched.critic->parameters(), d = reference.critic->parameters();
  for (std::size_t i = 0; i < c.size(); ++i) CHECK(torch::equal(c[i], d[i]));
}

TEST_CASE("the finder's mark is this thread's, the innermost search's, and gone after every exit") {
  using nitro::memory::detail::trial_loops;
  CHECK(trial_loops == nullptr);
  bool marked = false, other_thread_marked = true;
  {
    nitro::memory::ScopedCpuTracking track{{.budget_bytes = rows_bytes(5) + 100}};
    const auto r = find_max_batch_size(
        [&](std::int64_t b) {
          marked = trial_loops != nullptr;
          std::thread([&] { other_thread_marked = trial_loops != nullptr; }).join();  // a prefetcher's worker
          rows_trial(b);
        },
        {.min = 1, .max = 8, .trials_per_size = 1});
    CHECK(r.largest_fit == 5);  // sizes 6 and above ran out of memory
  }
  CHECK(marked);
  CHECK_FALSE(other_thread_marked);
  CHECK(trial_loops == nullptr);
  const auto throws = [](std::int64_t) { throw std::runtime_error("a bug in the trial"); };
  CHECK_THROWS_AS(find_max_batch_size(throws, {.max = 4}), std::runtime_error);
  CHECK(trial_loops == nullptr);

  // A search inside another's trial: its own loops (here none) decide in its trials; the outer
  // finder's loop steps again in the outer trial once the inner search is over.
  auto model = seeded_linear(16, 1);
  torch::optim::SGD opt(model->parameters(), 0.1);
  nitro::TrainingLoop<> loop{model, opt};
  int outer_steps = 0;
  (void)find_max_batch_size(
      loop,
      [&](std::int64_t) {
        CHECK_THROWS_WITH_AS(
            find_max_batch_size([&](std::int64_t) { loop.step(rows16(), square_loss(model)); }, {.max = 2}),
            doctest::Contains("find_max_batch_size(loop, trial, options)"), nitro::Error);
        loop.step(rows16(), square_loss(model));
        ++outer_steps;
      },
      {.min = 1, .max = 1, .trials_per_size = 1});
  CHECK(outer_steps == 1);
  CHECK(loop.optimizer_steps() == 0);
  CHECK(torch::equal(model->weight, seeded_linear(16, 1)->weight));
  CHECK(trial_loops == nullptr);
}

TEST_CASE("the banner's examples, copied here, run: the loop form, several loops, a step written by hand") {
  torch::manual_seed(0);
  torch::nn::Linear model(16, 1), generator(16, 16), critic(16, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1), g_opt(generator->parameters(), 0.1),
      d_opt(critic->parameters(), 0.1);
  nitro::TrainingLoop<> loop{model, optimizer}, generator_loop{generator, g_opt}, critic_loop{critic, d_opt};
  const auto make_batch = [](std::int64_t b) { return torch::ones({b, 16}); };
  const auto loss_fn = [&](const at::Tensor& x) { return model->forward(x).pow(2).mean(); };
  const auto critic_loss = [&](const at::Tensor& x) { return critic->forward(generator->forward(x).detach()).mean(); };
  const auto generator_loss = [&](const at::Tensor& x) { return -critic->forward(generator->forward(x)).mean(); };

  auto found = nitro::memory::find_max_batch_size(
      loop, [&](std::int64_t batch) { loop.step(make_batch(batch), loss_fn); },   // one training step
      {.mode = nitro::memory::SearchMode::binsearch, .min = 8, .max = 4096, .margin = 0.1});
  std::printf("batch %lld (%d sizes tried)\n", (long long)found.batch_size, found.trials);

  auto both = nitro::memory::find_max_batch_size(
      std::tie(generator_loop, critic_loop),
      [&](std::int64_t b) {
        critic_loop.step(make_batch(b), critic_loss);
        generator_loop.step(make_batch(b), generator_loss);
      },
      {.max = 4096});

  auto plain = nitro::memory::find_max_batch_size(
      [&](std::int64_t b) { optimizer.zero_grad(); loss_fn(make_batch(b)).backward(); optimizer.step(); },
      {.max = 4096, .model = model.ptr().get(), .optimizer = &optimizer});

  // No memory limit here: every size fits.
  CHECK(found.largest_fit == 4096);
  CHECK(found.batch_size == 3686);  // 90% of it
  CHECK(both.batch_size == 4096);
  CHECK(plain.batch_size == 4096);
  CHECK(loop.optimizer_steps() == 0);
  CHECK(generator_loop.optimizer_steps() == 0);
  CHECK(critic_loop.optimizer_steps() == 0);
}

TEST_CASE("the banner leads with the loop form, and each of its examples is the copy above, line for line") {
  const auto read = [](const char* path) {
    std::ifstream in(std::string(NITRO_SOURCE_DIR) + path);
    REQUIRE(in);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto trimmed_lines = [](const std::string& text) {
    std::vector<std::string> out;
    std::size_t at = 0;
    while (at < text.size()) {
      const auto end = std::min(text.find('\n', at), text.size());
      const auto line = text.substr(at, end - at);
      const auto first = line.find_first_not_of(' ');
      out.push_back(first == std::string::npos ? "" : line.substr(first));
      at = end + 1;
    }
    return out;
  };
  const auto header = read("/include/nitro/memory/batch_size.hpp");
  const auto test = trimmed_lines(read("/tests/memory/batch_size.cpp"));
  // The banner: the comment before the first #include. An example: lines indented by 3 or more under
  // "//", together, that call the finder.
  std::vector<std::vector<std::string>> examples, blocks(1);
  std::size_t at = 0;
  for (;;) {
    const auto end = header.find('\n', at);
    const auto line = header.substr(at, end - at);
    if (line.rfind("#include", 0) == 0) break;
    at = end + 1;
    if (line.rfind("//   ", 0) == 0) blocks.back().push_back(line.substr(line.find_first_not_of(" /")));
    else if (!blocks.back().empty()) blocks.emplace_back();
  }
  for (const auto& b : blocks) {
    bool calls = false;
    for (const auto& l : b) calls = calls || l.find("find_max_batch_size(") != std::string::npos;
    if (calls) examples.push_back(b);
  }
  REQUIRE(examples.size() == 3);
  REQUIRE(examples[0].size() >= 2);
  CHECK(examples[0][0] == "auto found = nitro::memory::find_max_batch_size(");
  CHECK(examples[0][1].rfind("loop, ", 0) == 0);  // the loop form first
  for (const auto& example : examples)
    for (const auto& line : example) {
      CAPTURE(line);
      CHECK(std::find(test.begin(), test.end(), line) != test.end());
    }
}

TEST_CASE("gpu: under a CUDA memory cap the finder finds the largest batch and puts model and every generator back" * nitro::test::needs_gpu()) {
#if NITRO_WITH_CUDA
  // The model on cuda:1 while cuda:0 is current where two GPUs exist: the finder must put back the
  // generator of the model's GPU, not only the current one's.
  const bool two = nitro::test::gpu_count() >= 2;
  const c10::Device device = two ? c10::Device(c10::kCUDA, 1) : c10::Device(c10::kCUDA, 0);
  c10::cuda::CUDAGuard current(0);
  torch::manual_seed(0);
  torch::nn::Linear model(256, 256);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), 1e-3);
  const auto before = model->weight.detach().cpu();
  const auto total = nitro::memory::cuda_memory(device.index())->total_bytes;
  REQUIRE(total > 0);
  constexpr std::int64_t kRow = 64 << 20;  // each batch row holds 64 MiB on the device
  nitro::hw::ScopedSettings cap{{.cuda_memory_fraction = 0.05, .cuda_device = device.index()}};
  const auto cap_bytes = static_cast<std::int64_t>(static_cast<double>(total) * 0.05);
  c10::cuda::CUDACachingAllocator::emptyCache();
  const auto trial = [&](std::int64_t b) {
    const auto rows = torch::empty({b, kRow / 4}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    const auto noise = torch::rand({4}, torch::TensorOptions().device(device));  // draws from the model's generator
    model->forward(torch::randn({8, 256}, torch::TensorOptions().device(device))).pow(2).mean().add(noise.sum()).backward();
    opt.step();
  };
  const auto rng_before = at::cuda::detail::getDefaultCUDAGenerator(device.index()).get_state();
  const auto found = find_max_batch_size(trial, {.min = 1, .max = 4096, .model = model.ptr().get(), .optimizer = &opt});
  CAPTURE(cap_bytes);
  CAPTURE(found.largest_fit);
  CHECK(found.largest_fit >= 1);
  CHECK(found.largest_fit * kRow <= cap_bytes);                // what fit was within the cap
  CHECK((found.largest_fit + 2) * kRow > cap_bytes);           // and nearly all of it
  CHECK(found.first_failure == found.largest_fit + 1);
  CHECK(torch::equal(model->weight.detach().cpu(), before));
  CHECK(opt.state().empty());  // Adam's state made by the trials is gone
  CHECK(torch::equal(at::cuda::detail::getDefaultCUDAGenerator(device.index()).get_state(), rng_before));
  if (!two) MESSAGE("one GPU: the non-default device index is not exercised");
#endif
}

}  // namespace nitro_test_memory_batch_size
