// nitro::autotune and level::Auto: the trials put everything back, the run after tuning equals the
// chosen configuration trained directly (bit for bit), candidates that run out of memory or throw are
// skipped, the decision cache hits and misses as it should, and snapshots keep the choice.
#include "testing.hpp"

#include <nitro/data/sampler.hpp>
#include <nitro/monitor/phases.hpp>
#include <nitro/monitor/report.hpp>
#include <nitro/snapshot/snapshot.hpp>
#include <nitro/train/autotune.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace nitro_test_train_autotune {  // one namespace per file: an area is compiled as one translation unit

namespace {

using Batch = std::pair<at::Tensor, at::Tensor>;

// A small CNN with BatchNorm (buffers) and Dropout (draws from the CPU generator).
torch::nn::Sequential cnn(int seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)),
                               torch::nn::BatchNorm2d(8), torch::nn::Functional(torch::relu),
                               torch::nn::Dropout(0.2), torch::nn::Flatten(), torch::nn::Linear(8 * 8 * 8, 4));
}

Batch batch_of(std::int64_t index, std::int64_t rows = 16) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(1000 + index);
  return {torch::randn({rows, 3, 8, 8}, g), torch::randint(0, 4, {rows}, g)};
}

// A hook policy that throws at every step: a candidate that fails.
struct Throws {
  using family = nitro::family::Hook;
  static constexpr std::string_view name = "throws";
  static constexpr bool enabled = true;
  struct Options {};
  explicit Throws(const Options&) {}
  template <class Loop>
  void on_step_begin(Loop&) {
    throw std::runtime_error("this candidate always fails");
  }
};

// A hook policy that throws unless the loop steps a fused optimizer: a candidate such as level::Max,
// whose CUDA graph needs one.
struct NeedsFused {
  using family = nitro::family::Hook;
  static constexpr std::string_view name = "needs-fused";
  static constexpr bool enabled = true;
  struct Options {};
  explicit NeedsFused(const Options&) {}
  template <class Loop>
  void on_step_begin(Loop& loop) {
    if (dynamic_cast<nitro::optim::FusedSGD*>(&loop.optimizer()) == nullptr)
      throw std::runtime_error("this candidate needs a fused optimizer");
  }
};

// A hook policy that allocates 64 MiB after each backward: a candidate that needs more memory.
struct Hungry {
  using family = nitro::family::Hook;
  static constexpr std::string_view name = "hungry";
  static constexpr bool enabled = true;
  struct Options {};
  explicit Hungry(const Options&) {}
  template <class Loop>
  void after_backward(Loop&) {
    volatile auto big = torch::empty({16 << 20}, torch::kFloat);
    (void)big;
  }
};

nitro::tune::Options quiet(std::vector<std::string>* log = nullptr) {
  nitro::tune::Options o;
  o.cache_dir.clear();
  o.warmup_steps = 1;
  o.timed_steps = 2;
  o.log = [log](const std::string& line) {
    if (log != nullptr) log->push_back(line);
  };
  return o;
}

bool contains(const std::vector<std::string>& lines, std::string_view what) {
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(what) != std::string::npos; });
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() || (a.sizes() == b.sizes() && a.dtype() == b.dtype() && a.to(at::kCPU).contiguous().equal(b.to(at::kCPU).contiguous()));
}

// Parameters, buffers, gradients, optimizer state (of the optimizer given) as a flat list of copies.
std::vector<at::Tensor> everything(torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone()), out.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor{});
  for (const auto& b : model.buffers()) out.push_back(b.clone());
  for (auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) {
      const auto it = optimizer.state().find(p.unsafeGetTensorImpl());
      if (it == optimizer.state().end()) {
        out.emplace_back();
        continue;
      }
      if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) out.push_back(s->momentum_buffer().clone());
    }
  return out;
}

bool all_same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i])) return false;
  return true;
}

const auto loss_fn = [](torch::nn::Sequential& model) {
  return [&model](const Batch& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); };
};

using Candidates3 = nitro::level::Auto<nitro::level::Basic, nitro::level::Advanced, nitro::TrainingLoop<nitro::clip::Norm>>;

// The chosen configuration trained directly, from the same start: what the Auto loop must equal.
template <class AutoLoop>
std::vector<at::Tensor> train_directly(const nitro::tune::Choice& c, int steps, at::Tensor& draw_after) {
  auto model = cnn(3);
  torch::optim::SGD user(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  std::unique_ptr<torch::optim::Optimizer> fused;
  if (c.channels_last) nitro::to_channels_last(*model);
  if (c.fused_optimizer) fused = std::make_unique<nitro::optim::FusedSGD>(user.param_groups(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::Optimizer& opt = fused ? *fused : user;
  std::vector<at::Tensor> out;
  nitro::tune::detail::with_index<AutoLoop::candidates>(c.candidate, [&]<std::size_t I>() {
    using L = std::tuple_element_t<I, typename AutoLoop::candidate_types>;
    nitro::hw::Settings settings = nitro::level::hardware<L>();
    if (c.cpu_threads > 0) settings.intra_op_threads = c.cpu_threads;
    nitro::hw::ScopedSettings hw{settings};
    typename L::Options options;
    if constexpr (std::is_same_v<typename L::accumulation_policy, nitro::accumulate::Dynamic>)
      options.accumulate.steps = c.micro_batches;
    L loop(model, opt, options);
    torch::manual_seed(77);
    for (int i = 0; i < steps; ++i) nitro::tune::detail::step_parts(loop, batch_of(i), loss_fn(model), c.micro_batches);
    out = everything(*model, opt);
    draw_after = torch::rand({4});
  });
  return out;
}

}  // namespace

TEST_CASE("autotune puts back the model, BatchNorm statistics, optimizer state, generators and the sampler") {
  auto model = cnn(3);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  // Some state first: two plain steps (momentum buffers, running statistics, gradients left).
  for (int i = 0; i < 2; ++i) {
    optimizer.zero_grad();
    loss_fn(model)(batch_of(i)).backward();
    optimizer.step();
  }
  nitro::data::ResumableSampler sampler(64, {.seed = 5});
  (void)sampler.next(8);
  const auto sampler_before = sampler.state();
  const auto before = everything(*model, optimizer);
  torch::manual_seed(123);
  std::vector<std::string> log;
  auto o = quiet(&log);
  o.keep_data = nitro::tune::keep(sampler);
  o.batches = 2;
  int drawn = 0;
  const auto r = nitro::autotune<nitro::level::Basic, nitro::level::Advanced, nitro::TrainingLoop<nitro::clip::Norm>>(
      model, optimizer,
      [&] {
        const auto indices = sampler.next(16);
        return batch_of(static_cast<std::int64_t>((*indices)[0]) + drawn++);
      },
      loss_fn(model), o);
  const auto draw = torch::rand({8});
  torch::manual_seed(123);
  CHECK(same(draw, torch::rand({8})));  // the CPU generator as before, though Dropout drew in every trial
  CHECK(all_same(before, everything(*model, optimizer)));
  CHECK(nitro::is_channels_last(*model) == false);  // a channels-last trial is undone
  CHECK(model->parameters()[0].is_contiguous());
  CHECK(sampler.state().index == sampler_before.index);
  CHECK(drawn == 2);
  CHECK(r.source == "tuned");
  // 3 candidates, then channels-last, the fused optimizer and (2 threads here) 1 thread on the fastest.
  CHECK(r.trials.size() >= 5);
  CHECK(r.choice.candidate < 3);
  CHECK(r.table().find("chosen: ") != std::string::npos);
  CHECK(contains(log, "autotune candidate"));
}

TEST_CASE("level::Auto trains exactly as the chosen configuration trained directly from the same start") {
  for (const bool forced : {false, true}) {
    CAPTURE(forced);
    auto model = cnn(3);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    Candidates3::Options options{quiet()};
    if (forced) {  // channels-last and the fused optimizer taken, whatever is fastest; 1 thread tried
      options.tune.channels_last = true;
      options.tune.fused_optimizer = true;
      options.tune.cpu_threads = {1};
    }
    const int threads = at::get_num_threads();
    at::Tensor auto_draw, direct_draw;
    std::vector<at::Tensor> trained;
    nitro::tune::Choice choice;
    {
      Candidates3 loop(model, optimizer, options);
      loop.tune([] { return batch_of(100); }, loss_fn(model));
      choice = loop.choice();
      torch::manual_seed(77);
      for (int i = 0; i < 4; ++i) loop.step(batch_of(i), loss_fn(model));
      trained = everything(*model, loop.optimizer());
      auto_draw = torch::rand({4});
      CHECK(loop.optimizer_steps() == 4);
      if (forced) {
        CHECK(choice.channels_last);
        CHECK(choice.fused_optimizer);
        CHECK(at::get_num_threads() == (choice.cpu_threads > 0 ? choice.cpu_threads : threads));
        CHECK(loop.fused_optimizer());
        CHECK(&loop.optimizer() != &optimizer);
      }
    }
    CHECK(at::get_num_threads() == threads);  // put back when the loop goes
    CHECK(all_same(trained, train_directly<Candidates3>(choice, 4, direct_draw)));
    CHECK(same(auto_draw, direct_draw));
  }
}

TEST_CASE("a candidate that runs out of memory or throws is skipped, and the result is still exact") {
  using Loop = nitro::level::Auto<nitro::level::with<nitro::level::Basic, Hungry>, nitro::TrainingLoop<Throws>,
                                  nitro::level::Basic>;
  auto model = cnn(3);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  Loop::Options options{quiet()};
  options.tune.memory_budget_bytes = 32 << 20;  // Hungry allocates 64 MiB
  options.tune.channels_last = false;
  options.tune.fused_optimizer = false;
  options.tune.cpu_threads = {at::get_num_threads()};
  Loop loop(model, optimizer, options);
  torch::manual_seed(77);
  loop.step(batch_of(0), loss_fn(model));  // tunes on this batch, then steps
  const auto& r = loop.result();
  REQUIRE(r.trials.size() == 3);
  CHECK(r.trials[0].verdict == "out of memory");
  CHECK(r.trials[1].verdict.find("error: ") == 0);
  CHECK(r.trials[1].verdict.find("this candidate always fails") != std::string::npos);
  CHECK(r.trials[2].verdict == "ok");
  CHECK(loop.winner() == 2);
  for (int i = 1; i < 3; ++i) loop.step(batch_of(i), loss_fn(model));
  const auto trained = everything(*model, optimizer);
  // The plain loop from the same start, without any tuning.
  auto again = cnn(3);
  torch::optim::SGD plain(again->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  nitro::level::Basic basic(again, plain);
  torch::manual_seed(77);
  for (int i = 0; i < 3; ++i) basic.step(batch_of(i), loss_fn(again));
  CHECK(all_same(trained, everything(*again, plain)));
}

TEST_CASE("a candidate that throws with the optimizer as given is tried with the fused one, unless fixed off") {
  using Loop = nitro::level::Auto<nitro::TrainingLoop<NeedsFused>, nitro::level::Basic>;
  for (const bool allow : {true, false}) {
    CAPTURE(allow);
    auto model = cnn(3);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    Loop::Options options{quiet()};
    options.tune.channels_last = false;
    options.tune.cpu_threads = {at::get_num_threads()};
    if (!allow) options.tune.fused_optimizer = false;
    Loop loop(model, optimizer, options);
    loop.step(batch_of(0), loss_fn(model));
    const auto& r = loop.result();
    REQUIRE(r.trials.size() >= 2);
    CHECK(r.trials[0].choice.candidate == 0);
    CHECK(!r.trials[0].choice.fused_optimizer);
    CHECK(r.trials[0].verdict.find("needs a fused optimizer") != std::string::npos);
    if (allow) {
      // Then at once the same candidate with the fused copy, which trains.
      REQUIRE(r.trials.size() >= 3);
      CHECK(r.trials[1].choice.candidate == 0);
      CHECK(r.trials[1].choice.fused_optimizer);
      CHECK(r.trials[1].verdict.find("error") == std::string::npos);
      CHECK(r.trials[2].choice.candidate == 1);
    } else {
      CHECK(r.trials[1].choice.candidate == 1);
      CHECK(loop.winner() == 1);
      for (const auto& t : r.trials) CHECK(!t.choice.fused_optimizer);
    }
  }
}

TEST_CASE("an accumulate::Dynamic candidate that runs out of memory splits the batch into micro-batches") {
  // Few parameters, large activations: half a batch needs about half the memory.
  const auto mlp = [] {
    torch::manual_seed(9);
    return torch::nn::Sequential(torch::nn::Linear(64, 2048), torch::nn::Functional(torch::relu),
                                 torch::nn::Linear(2048, 10));
  };
  const auto batch = [](std::int64_t i) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(50 + i);
    return Batch{torch::randn({512, 64}, g), torch::randint(0, 10, {512}, g)};
  };
  using Dyn = nitro::TrainingLoop<nitro::accumulate::Dynamic>;
  using Loop = nitro::level::Auto<nitro::level::Basic, Dyn>;
  // Measure the full batch's peak, then give a budget below it.
  std::int64_t full_peak = 0;
  {
    auto model = mlp();
    torch::optim::SGD optimizer(model->parameters(), 0.1);
    auto o = quiet();
    o.fused_optimizer = false;
    o.cpu_threads = {at::get_num_threads()};
    const auto r = nitro::autotune<nitro::level::Basic>(
        model, optimizer, [&] { return batch(0); },
        [&](const Batch& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); }, o);
    full_peak = r.trials.at(0).peak_bytes;
    REQUIRE(full_peak > (8 << 20));
  }
  auto model = mlp();
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  const auto loss = [&](const Batch& b) { return torch::cross_entropy_loss(model->forward(b.first), b.second); };
  Loop::Options options{quiet()};
  options.tune.memory_budget_bytes = full_peak * 3 / 4;
  options.tune.fused_optimizer = false;
  options.tune.cpu_threads = {at::get_num_threads()};
  Loop loop(model, optimizer, options);
  loop.tune([&] { return batch(0); }, loss);
  const auto& r = loop.result();
  CHECK(r.trials.at(0).verdict == "out of memory");
  CHECK(r.trials.at(1).verdict == "out of memory");  // Dyn with the whole batch
  CHECK(loop.winner() == 1);
  CHECK(loop.choice().micro_batches >= 2);
  CHECK(loop.accumulation_steps() == loop.choice().micro_batches);
  for (int i = 0; i < 3; ++i) {
    const auto result = loop.step(batch(i), loss);
    CHECK(result.stepped);
  }
  const auto trained = everything(*model, optimizer);
  auto again = mlp();
  torch::optim::SGD plain(again->parameters(), 0.1);
  Dyn direct(again, plain, {.accumulate = {loop.choice().micro_batches}});
  const auto loss2 = [&](const Batch& b) { return torch::cross_entropy_loss(again->forward(b.first), b.second); };
  for (int i = 0; i < 3; ++i) nitro::tune::detail::step_parts(direct, batch(i), loss2, loop.choice().micro_batches);
  CHECK(all_same(trained, everything(*again, plain)));
}

TEST_CASE("the decision cache: a hit runs no trial, a changed model or batch misses, a damaged file is ignored") {
  nitro::test::TempDir dir("nitro-autotune-cache", true);
  std::vector<std::string> log;
  auto o = quiet(&log);
  o.cache_dir = dir.path;
  o.timed_steps = 1;
  o.prune_after = 0;
  int calls = 0;
  const auto run = [&](int width, std::int64_t rows, std::optional<nitro::tune::Mode> mode = std::nullopt) {
    torch::manual_seed(1);
    torch::nn::Sequential model(torch::nn::Linear(6, width), torch::nn::Functional(torch::relu), torch::nn::Linear(width, 2));
    torch::optim::SGD optimizer(model->parameters(), 0.1);
    auto options = o;
    options.mode = mode;
    return nitro::autotune<nitro::level::Basic, nitro::level::Advanced>(
        model, optimizer, [&] { return Batch{torch::randn({rows, 6}), torch::randint(0, 2, {rows})}; },
        [&](const Batch& b) {
          ++calls;
          return torch::cross_entropy_loss(model->forward(b.first), b.second);
        },
        options);
  };
  const auto first = run(8, 4);
  CHECK(first.source == "tuned");
  CHECK(calls > 0);
  REQUIRE(std::filesystem::exists(first.cache_file));
  calls = 0;
  const auto hit = run(8, 4);
  CHECK(hit.source == "cache");
  CHECK(hit.choice == first.choice);
  CHECK(hit.trials.empty());
  CHECK(calls == 0);
  CHECK(run(9, 4).source == "tuned");   // another model
  CHECK(run(8, 5).source == "tuned");   // another batch shape
  CHECK(run(8, 4).source == "cache");
  // NITRO_AUTOTUNE=force tunes again; off runs nothing.
  ::setenv("NITRO_AUTOTUNE", "force", 1);
  calls = 0;
  CHECK(run(8, 4).source == "tuned");
  CHECK(calls > 0);
  ::setenv("NITRO_AUTOTUNE", "off", 1);
  calls = 0;
  const auto off = run(8, 4);
  CHECK(off.source == "off");
  CHECK(off.choice == nitro::tune::Choice{});
  CHECK(calls == 0);
  ::setenv("NITRO_AUTOTUNE", "sometimes", 1);
  CHECK_THROWS_WITH_AS(run(8, 4), doctest::Contains("NITRO_AUTOTUNE is \"sometimes\""), nitro::Error);
  // The option wins over the environment.
  CHECK(run(8, 4, nitro::tune::Mode::automatic).source == "cache");
  ::unsetenv("NITRO_AUTOTUNE");
  // A damaged file: one byte changed.
  {
    std::fstream f(first.cache_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('#');
  }
  log.clear();
  CHECK(run(8, 4).source == "tuned");
  CHECK(contains(log, "damaged"));
  CHECK(run(8, 4).source == "cache");  // rewritten
  // Not a cache file at all.
  {
    std::ofstream f(first.cache_file, std::ios::trunc);
    f << "hello\n";
  }
  log.clear();
  CHECK(run(8, 4).source == "tuned");
  CHECK(contains(log, "not a Nitro autotune file"));
}

TEST_CASE("a snapshot keeps the choice: a resume takes it without tuning and goes on exactly") {
  nitro::test::TempDir dir("nitro-autotune-snap", true);
  int calls = 0;
  const auto counted = [&](torch::nn::Sequential& model) {
    return [&calls, &model](const Batch& b) {
      ++calls;
      return torch::cross_entropy_loss(model->forward(b.first), b.second);
    };
  };
  Candidates3::Options options{quiet()};
  options.tune.fused_optimizer = true;  // the snapshot holds a FusedSGD, which only the same choice loads
  auto model = cnn(3);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  Candidates3 loop(model, optimizer, options);
  torch::manual_seed(5);
  for (int i = 0; i < 3; ++i) loop.step(batch_of(i), counted(model));
  nitro::snapshot::save(dir / "run.nitro", loop);
  for (int i = 3; i < 6; ++i) loop.step(batch_of(i), counted(model));
  const auto uninterrupted = everything(*model, loop.optimizer());

  auto other = cnn(4);  // other weights: the snapshot brings them
  torch::optim::SGD other_opt(other->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  Candidates3 resumed(other, other_opt, options);
  nitro::snapshot::load(dir / "run.nitro", resumed);
  CHECK(resumed.result().source == "snapshot");
  CHECK(resumed.choice() == loop.choice());
  CHECK(resumed.optimizer_steps() == 3);
  calls = 0;
  for (int i = 3; i < 6; ++i) resumed.step(batch_of(i), counted(other));
  CHECK(calls == 3);  // no trial ran
  CHECK(all_same(uninterrupted, everything(*other, resumed.optimizer())));
  // A snapshot of a plain loop holds no choice.
  auto third = cnn(3);
  torch::optim::SGD third_opt(third->parameters(), 0.1);
  nitro::level::Basic basic(third, third_opt);
  nitro::snapshot::save(dir / "plain.nitro", basic);
  Candidates3 fresh(third, third_opt, options);
  CHECK_THROWS_WITH_AS(nitro::snapshot::load(dir / "plain.nitro", fresh), doctest::Contains("holds no autotune choice"),
                       nitro::Error);
}

TEST_CASE("level::Auto forwards the monitor and the summary, with the table among its notes") {
  using Loop = nitro::level::with<nitro::level::Auto<nitro::level::Basic, nitro::level::Advanced>, nitro::monitor::Phases>;
  static_assert(std::is_same_v<Loop, nitro::level::Auto<nitro::level::with<nitro::level::Basic, nitro::monitor::Phases>,
                                                          nitro::level::with<nitro::level::Advanced, nitro::monitor::Phases>>>);
  auto model = cnn(3);
  torch::optim::SGD optimizer(model->parameters(), 0.05);
  Loop loop(model, optimizer, {quiet()});
  CHECK_THROWS_WITH_AS(loop.optimizer_steps(), doctest::Contains("has not chosen its candidate yet"), nitro::Error);
  CHECK(loop.describe() == "auto: not chosen yet");
  for (int i = 0; i < 4; ++i) loop.step(batch_of(i), loss_fn(model));
  CHECK(loop.monitor().totals().steps == 4 - 2);  // its 2 warm-up steps left out; trial steps count nowhere
  const auto summary = nitro::monitor::summarize(loop);
  REQUIRE_FALSE(summary.notes.empty());
  CHECK(summary.notes.back().find("autotune candidate") != std::string::npos);
  CHECK(nitro::monitor::format(summary).find("chosen: ") != std::string::npos);
  CHECK(loop.describe().find("auto: level::") == 0);
  CHECK_THROWS_WITH_AS(loop.tune([] { return batch_of(0); }, loss_fn(model)), doctest::Contains("has chosen already"),
                       nitro::Error);
}

TEST_CASE("autotune's bad input is a nitro::Error naming it") {
  auto model = cnn(3);
  torch::optim::SGD optimizer(model->parameters(), 0.05);
  const auto tune_with = [&](nitro::tune::Options o, auto make_batch) {
    return nitro::autotune<nitro::level::Basic>(model, optimizer, make_batch, loss_fn(model), o);
  };
  const auto make = [] { return batch_of(0); };
  auto o = quiet();
  o.timed_steps = 0;
  CHECK_THROWS_WITH_AS(tune_with(o, make), doctest::Contains("a budget of zero steps"), nitro::Error);
  o = quiet();
  o.warmup_steps = 0;
  CHECK_THROWS_WITH_AS(tune_with(o, make), doctest::Contains("warmup_steps must be >= 1"), nitro::Error);
  o = quiet();
  o.cpu_threads = {0};
  CHECK_THROWS_WITH_AS(tune_with(o, make), doctest::Contains("cpu_threads entry must be >= 1"), nitro::Error);
  o = quiet();
  o.max_micro_batches = 3;
  CHECK_THROWS_WITH_AS(tune_with(o, make), doctest::Contains("power of 2"), nitro::Error);
  o = quiet();
  o.memory_budget_bytes = -1;
  CHECK_THROWS_WITH_AS(tune_with(o, make), doctest::Contains("memory_budget_bytes must be >= 0"), nitro::Error);
  o = quiet();
  CHECK_THROWS_WITH_AS(tune_with(o, []() -> Batch { throw std::runtime_error("no more data"); }),
                       doctest::Contains("the batch maker threw while drawing batch 1 of 1: no more data"),
                       nitro::Error);
  // Every candidate fails: the error names the device and carries the table.
  auto failing = cnn(3);
  torch::optim::SGD failing_opt(failing->parameters(), 0.05);
  CHECK_THROWS_WITH_AS((nitro::autotune<nitro::TrainingLoop<Throws>>(failing, failing_opt, make, loss_fn(failing), quiet())),
                       doctest::Contains("no candidate could train this model on cpu"), nitro::Error);
  // The fused optimizer asked for where there is none.
  torch::optim::Adagrad adagrad(model->parameters(), 0.1);
  o = quiet();
  o.fused_optimizer = true;
  CHECK_THROWS_WITH_AS(
      (nitro::autotune<nitro::level::Basic>(model, adagrad, make, loss_fn(model), o)),
      doctest::Contains("has no fused version"), nitro::Error);
}

TEST_CASE("autotune puts back Adam's state, a parameter outside the model, and what the batch maker drew") {
  auto model = cnn(3);
  // A learnable bias of the loss that the model does not own, in a group of its own.
  auto extra = torch::zeros({4}, torch::requires_grad());
  std::vector<torch::optim::OptimizerParamGroup> groups{
      torch::optim::OptimizerParamGroup(model->parameters(), std::make_unique<torch::optim::AdamOptions>(1e-2)),
      torch::optim::OptimizerParamGroup({extra}, std::make_unique<torch::optim::AdamOptions>(1e-1))};
  torch::optim::Adam adam(groups, torch::optim::AdamOptions(1e-2));
  const auto loss = [&](const Batch& b) { return torch::cross_entropy_loss(model->forward(b.first) + extra, b.second); };
  for (int i = 0; i < 2; ++i) {
    adam.zero_grad();
    loss(batch_of(i)).backward();
    adam.step();
  }
  const auto extra_before = extra.detach().clone(), extra_grad = extra.grad().clone();
  std::vector<at::Tensor> moments;
  for (auto& [key, state] : adam.state())
    moments.push_back(static_cast<torch::optim::AdamParamState&>(*state).exp_avg().clone());
  torch::manual_seed(42);
  const auto r = nitro::autotune<nitro::level::Basic, nitro::level::Advanced>(
      model, adam, [] { return Batch{torch::randn({16, 3, 8, 8}), torch::randint(0, 4, {16})}; }, loss, quiet());
  CHECK(r.source == "tuned");
  CHECK(same(extra.detach(), extra_before));
  CHECK(same(extra.grad(), extra_grad));
  std::size_t i = 0;
  for (auto& [key, state] : adam.state()) CHECK(same(static_cast<torch::optim::AdamParamState&>(*state).exp_avg(), moments.at(i++)));
  const auto draw = torch::rand({4});
  torch::manual_seed(42);
  CHECK(same(draw, torch::rand({4})));  // the batch maker's draws are put back too
}

TEST_CASE("with the fused choice, a schedule on the user's optimizer applies, and a rate set on the loop's copy stays") {
  auto model = cnn(3);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  Candidates3 loop(model, optimizer, {quiet()});
  loop.adopt({.candidate = 0, .fused_optimizer = true});
  REQUIRE(&loop.optimizer() != &optimizer);
  loop.step(batch_of(0), loss_fn(model));
  optimizer.param_groups()[0].options().set_lr(0.01);  // a schedule
  loop.step(batch_of(1), loss_fn(model));
  CHECK(loop.optimizer().param_groups()[0].options().get_lr() == doctest::Approx(0.01));
  loop.optimizer().param_groups()[0].options().set_lr(0.005);  // a hook's change (stability::Guard's)
  loop.step(batch_of(2), loss_fn(model));
  CHECK(loop.optimizer().param_groups()[0].options().get_lr() == doctest::Approx(0.005));
  // A snapshot holds the copy's rate; a resume gives it to the fresh user optimizer too.
  nitro::test::TempDir dir("nitro-autotune-lr", true);
  nitro::snapshot::save(dir / "s.nitro", loop);
  auto other = cnn(3);
  torch::optim::SGD fresh(other->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  Candidates3 resumed(other, fresh, {quiet()});
  nitro::snapshot::load(dir / "s.nitro", resumed);
  CHECK(fresh.param_groups()[0].options().get_lr() == doctest::Approx(0.005));
  resumed.step(batch_of(3), loss_fn(other));
  CHECK(resumed.optimizer().param_groups()[0].options().get_lr() == doctest::Approx(0.005));
}

TEST_CASE("the cache misses for another optimizer, and a fused choice the optimizer cannot take is stale") {
  nitro::test::TempDir dir("nitro-autotune-opt", true);
  std::vector<std::string> log;
  auto o = quiet(&log);
  o.cache_dir = dir.path;
  o.timed_steps = 1;
  o.prune_after = 0;
  o.fused_optimizer = true;
  auto model = cnn(3);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const auto make = [] { return batch_of(0); };
  const auto first = nitro::autotune<nitro::level::Basic>(model, sgd, make, loss_fn(model), o);
  REQUIRE(first.choice.fused_optimizer);
  CHECK(nitro::autotune<nitro::level::Basic>(model, sgd, make, loss_fn(model), o).source == "cache");
  torch::optim::SGD other_momentum(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.5));
  CHECK(nitro::autotune<nitro::level::Basic>(model, other_momentum, make, loss_fn(model), o).source == "tuned");
  // A file that says fused for an optimizer without a fused version (written under its key by hand).
  torch::optim::RMSprop rms(model->parameters(), torch::optim::RMSpropOptions(0.01));
  auto plain = o;
  plain.fused_optimizer.reset();
  const auto r = nitro::autotune<nitro::level::Basic>(model, rms, make, loss_fn(model), plain);
  CHECK_FALSE(r.choice.fused_optimizer);
  std::string text;
  {
    std::ifstream in(r.cache_file);
    std::stringstream b;
    b << in.rdbuf();
    text = b.str();
  }
  text = text.substr(0, text.find("check "));
  const auto at = text.find("fused_optimizer 0");
  REQUIRE(at != std::string::npos);
  text.replace(at, 17, "fused_optimizer 1");
  text += "check " + nitro::tune::detail::hex(nitro::tune::detail::hash_text(text)) + "\n";
  {
    std::ofstream out(r.cache_file, std::ios::trunc);
    out << text;
  }
  log.clear();
  const auto again = nitro::autotune<nitro::level::Basic>(model, rms, make, loss_fn(model), plain);
  CHECK(again.source == "tuned");
  CHECK(contains(log, "stale"));
}

TEST_CASE("several Auto loops in one snapshot resume with their choices, without tuning") {
  nitro::test::TempDir dir("nitro-autotune-named", true);
  auto ga = cnn(3), da = cnn(4);
  torch::optim::SGD gopt(ga->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD dopt(da->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  Candidates3 g(ga, gopt, {quiet()}), d(da, dopt, {quiet()});
  g.adopt({.candidate = 0, .fused_optimizer = true});
  d.adopt({.candidate = 2});
  torch::manual_seed(3);
  for (int i = 0; i < 2; ++i) {
    g.step(batch_of(i), loss_fn(ga));
    d.step(batch_of(i + 10), loss_fn(da));
  }
  nitro::snapshot::save(dir / "gan.nitro", {{"g", g}, {"d", d}});
  for (int i = 2; i < 4; ++i) {
    g.step(batch_of(i), loss_fn(ga));
    d.step(batch_of(i + 10), loss_fn(da));
  }
  auto gb = cnn(5), db = cnn(6);
  torch::optim::SGD gopt2(gb->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD dopt2(db->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  Candidates3 g2(gb, gopt2, {quiet()}), d2(db, dopt2, {quiet()});
  nitro::snapshot::load(dir / "gan.nitro", {{"g", g2}, {"d", d2}});
  CHECK(g2.choice() == g.choice());
  CHECK(d2.choice() == d.choice());
  CHECK(g2.result().source == "snapshot");
  for (int i = 2; i < 4; ++i) {
    g2.step(batch_of(i), loss_fn(gb));
    d2.step(batch_of(i + 10), loss_fn(db));
  }
  CHECK(all_same(everything(*ga, g.optimizer()), everything(*gb, g2.optimizer())));
  CHECK(all_same(everything(*da, d.optimizer()), everything(*db, d2.optimizer())));
}

TEST_CASE("Options::hardware = false leaves the user's hardware settings as they are") {
  nitro::hw::ScopedSettings mine{{.cudnn_benchmark = false, .tf32 = false}};
  auto model = cnn(3);
  torch::optim::SGD optimizer(model->parameters(), 0.05);
  Candidates3::Options options{quiet()};
  options.tune.hardware = false;
  {
    Candidates3 loop(model, optimizer, options);
    loop.adopt({.candidate = 1});
    CHECK(nitro::hw::current().cudnn_benchmark == false);
  }
  {
    Candidates3 loop(model, optimizer, {quiet()});
    loop.adopt({.candidate = 1});
    CHECK(nitro::hw::current().cudnn_benchmark == true);  // level::Advanced's settings, for the loop's life
  }
  CHECK(nitro::hw::current().cudnn_benchmark == false);
}

}  // namespace nitro_test_train_autotune
