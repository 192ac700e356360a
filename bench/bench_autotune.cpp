// level::Auto against every configuration it could pick, measured exhaustively in the same run.
//
// Two workloads: the levels demo's CNN (SyntheticImages 3x32x32, batch 64, SGD with momentum) and the
// peers' MLP (8 x (Linear(512, 512), ReLU), Linear(512, 10), batch 64, AdamW). Every configuration
// (level::Basic, Advanced, Ultra; on a GPU also Max) x (channels-last for the CNN) x (the fused
// optimizer) x (on the CPU the current thread count and half of it) trains its own copy of the model
// from the same weights, in interleaved blocks of steps, several rounds; its speed is the median step
// time. Then a fresh level::Auto tunes (no cache) on the same model and batch, and its pick is
// looked up among the measured configurations:
//
//   RESULT autotune_vs_best_<w>=<the pick's measured speed / the best measured>     goal >= 0.95
//   RESULT autotune_vs_basic_<w>=<the pick's measured speed / level::Basic's>        goal >= 1.0
//   RESULT autotune_cost_share_<w>=<tuning seconds / a 10-epoch demo run's seconds> goal <= 0.05
//
// (a 10-epoch demo run: 10 x 8192 samples at level::Basic's measured speed). The dispatch cost of
// level::Auto is bench_loop_overhead's auto_dispatch_overhead.
//
//   bench_autotune [rounds, default 3] [block steps, default 6]
#include "common.hpp"
#include "models.hpp"

#include <nitro/data/synthetic.hpp>
#include <nitro/train/autotune.hpp>
#if NITRO_WITH_CUDA
#include <nitro/graph/capture.hpp>
#endif

#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

using Batch = std::pair<at::Tensor, at::Tensor>;

torch::nn::Sequential mlp() {
  torch::nn::Sequential m;
  for (int i = 0; i < 8; ++i) {
    m->push_back(torch::nn::Linear(512, 512));
    m->push_back(torch::nn::Functional(torch::relu));
  }
  m->push_back(torch::nn::Linear(512, 10));
  return m;
}

struct Config {
  nitro::tune::Choice choice;
  int threads = 0;
  std::string name;
  std::vector<double> times;
  double samples_per_s = 0;
  std::string failed;  // why it could not train, when it could not
};

template <class AutoLoop, class MakeModel, class MakeOptimizer>
void workload(const std::string& w, MakeModel make_model, MakeOptimizer make_optimizer, const std::vector<Batch>& batches,
              int rounds, int block) {
  const bool gpu = nitro::Cuda::available();
  const int threads_now = at::get_num_threads();
  const auto loss = [](auto& forward, const Batch& b) { return torch::cross_entropy_loss(forward(b.first), b.second); };
  const std::int64_t rows = batches.front().first.size(0);

  // Every configuration, each with its own model copy (same weights) and optimizer.
  struct Run {
    torch::nn::Sequential model{nullptr};
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    std::unique_ptr<AutoLoop> loop;
    std::size_t next = 0;
  };
  std::vector<Config> configs;
  std::vector<Run> runs;
  const bool conv = [&] {
    auto m = make_model();
    return nitro::tune::detail::has_conv_weights(*m);
  }();
  for (std::size_t c = 0; c < AutoLoop::candidates; ++c)
    for (const bool cl : {false, true}) {
      if (cl && !conv) continue;
      for (const bool fused : {false, true})
        for (const int t : {threads_now, threads_now / 2}) {
          if (t < 1 || (gpu && t != threads_now) || (t != threads_now && threads_now < 2)) continue;
          Config cfg;
          cfg.choice = {c, cl, fused, 0, 1};
          cfg.threads = t;
          Run run;
          run.model = make_model();
          run.optimizer = make_optimizer(*run.model);
          run.loop = std::make_unique<AutoLoop>(run.model, *run.optimizer);
          run.loop->adopt(cfg.choice);
          cfg.name = run.loop->result().name + (t != threads_now ? ", " + std::to_string(t) + " thread(s)" : "");
          configs.push_back(std::move(cfg));
          runs.push_back(std::move(run));
        }
    }
  const auto steps = [&](std::size_t i, int n) {
    if (!configs[i].failed.empty()) return;
    at::set_num_threads(configs[i].threads);
    auto& run = runs[i];
    try {
      for (int s = 0; s < n; ++s) {
        const double t = nitro::bench::seconds([&] { run.loop->step(batches[run.next++ % batches.size()], loss); });
        if (n == block) configs[i].times.push_back(t);
      }
    } catch (const std::exception& e) {  // level::Max without a fused optimizer, say
      const std::string what = e.what();
      configs[i].failed = what.substr(0, std::min<std::size_t>(what.find('\n'), 100));
    }
    at::set_num_threads(threads_now);
  };
  for (std::size_t i = 0; i < configs.size(); ++i) steps(i, 3);  // warm-up, not timed
  for (int r = 0; r < rounds; ++r)
    for (std::size_t k = 0; k < configs.size(); ++k) {
      // Rotate the order from round to round, so that drift falls on all alike.
      steps((k + static_cast<std::size_t>(r)) % configs.size(), block);
    }
  std::size_t best = 0, basic = 0;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    if (configs[i].failed.empty())
      configs[i].samples_per_s = static_cast<double>(rows) / nitro::bench::median(configs[i].times);
    if (configs[i].samples_per_s > configs[best].samples_per_s) best = i;
  }
  runs.clear();

  // level::Auto from the same start, no cache.
  auto model = make_model();
  auto optimizer = make_optimizer(*model);
  typename AutoLoop::Options options;
  options.tune.cache_dir.clear();
  options.tune.mode = nitro::tune::Mode::force;
  options.tune.log = [](const std::string& text) { std::printf("%s", (text + (text.ends_with('\n') ? "" : "\n")).c_str()); };
  AutoLoop loop(model, *optimizer, options);
  std::size_t next = 0;
  const double tuning = nitro::bench::seconds([&] { loop.tune([&] { return batches[next++ % batches.size()]; }, loss); });
  const auto pick = loop.choice();
  std::size_t picked = configs.size();
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const auto& c = configs[i].choice;
    const int t = pick.cpu_threads > 0 ? pick.cpu_threads : threads_now;
    if (c.candidate == pick.candidate && c.channels_last == pick.channels_last &&
        c.fused_optimizer == pick.fused_optimizer && configs[i].threads == t)
      picked = i;
  }
  std::printf("\nbench_autotune %s: every configuration, %d rounds of %d steps, median step (%s, %s)\n", w.c_str(), rounds,
              block, gpu ? "cuda" : "cpu", nitro::bench::machine().c_str());
  std::printf("%-64s %10s\n", "configuration", "samples/s");
  for (std::size_t i = 0; i < configs.size(); ++i)
    std::printf("%-64s %10.0f%s%s%s\n", configs[i].name.c_str(), configs[i].samples_per_s, i == best ? "  best" : "",
                i == picked ? "  <- level::Auto's pick" : "",
                configs[i].failed.empty() ? "" : ("  failed: " + configs[i].failed).c_str());
  std::printf("level::Auto tuned in %.2f s (%zu trials) and picked %s\n", tuning, loop.result().trials.size(),
              loop.result().name.c_str());
  if (picked == configs.size()) {
    std::printf("level::Auto's pick is not among the measured configurations\n");
    return;
  }
  const double demo_run = 10.0 * 8192.0 / configs[basic].samples_per_s;
  nitro::bench::result("autotune_vs_best_" + w, configs[picked].samples_per_s / configs[best].samples_per_s, ">=", 0.95);
  nitro::bench::result("autotune_vs_basic_" + w, configs[picked].samples_per_s / configs[basic].samples_per_s, ">=", 1.0);
  nitro::bench::result("autotune_cost_share_" + w, tuning / demo_run, "<=", 0.05);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3, block = argc > 2 ? std::atoi(argv[2]) : 6;
  const bool gpu = nitro::Cuda::available();
  const c10::Device device = gpu ? nitro::Cuda::device() : nitro::Cpu::device();

  nitro::data::SyntheticImages images{{.size = 64 * 4, .noise = 8.0}};
  std::vector<Batch> cnn_batches, mlp_batches;
  for (int b = 0; b < 4; ++b) {
    auto [x, y] = images.stacked(b * 64, (b + 1) * 64);
    cnn_batches.emplace_back(x.to(device), y.to(device));
    auto g = at::make_generator<at::CPUGeneratorImpl>(b);
    mlp_batches.emplace_back(torch::randn({64, 512}, g).to(device), torch::randint(0, 10, {64}, g).to(device));
  }
  const auto cnn = [&] {
    torch::manual_seed(0);
    auto m = nitro::bench::demo_cnn();
    m->to(device);
    return m;
  };
  const auto net = [&] {
    torch::manual_seed(0);
    auto m = mlp();
    m->to(device);
    return m;
  };
  const auto sgd = [](torch::nn::Module& m) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
  };
  const auto adamw = [](torch::nn::Module& m) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::AdamW>(m.parameters(), torch::optim::AdamWOptions(1e-3));
  };
#if NITRO_WITH_CUDA
  if (gpu) {
    using Auto = nitro::level::Auto<nitro::level::Basic, nitro::level::Advanced, nitro::level::Ultra, nitro::level::Max>;
    workload<Auto>("cnn", cnn, sgd, cnn_batches, rounds, block);
    workload<Auto>("mlp", net, adamw, mlp_batches, rounds, block);
    return 0;
  }
#endif
  using Auto = nitro::level::Auto<nitro::level::Basic, nitro::level::Advanced, nitro::level::Ultra>;
  workload<Auto>("cnn", cnn, sgd, cnn_batches, rounds, block);
  workload<Auto>("mlp", net, adamw, mlp_batches, rounds, block);
  return 0;
}
