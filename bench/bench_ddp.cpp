// dist::DataParallel on this machine's CPU: 2 processes (this program started twice, a Gloo group over
// loopback met through a FileStore), one compute thread each, an MLP whose backward is long enough to
// hide communication. Rows, in interleaved rounds (median of each):
//   1 process      the plain loop, no group (the scaling baseline)
//   2 after        the gradients all-reduced once after backward, in one flat tensor (what the C++
//                  frontend's distributed example does)
//   2 overlapped   dist::DataParallel: DDP's Reducer, buckets all-reduced during backward
// RESULT ddp_overlap_speedup = overlapped / after samples/s, goal >= 1.15
// RESULT ddp_scaling_2proc  = 2-process overlapped samples/s / 1-process samples/s, goal >= 1.6
#include "common.hpp"

#include <nitro/dist/data_parallel.hpp>
#include <nitro/train/training_loop.hpp>

#include <torch/torch.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

constexpr int kWidth = 1024, kLayers = 8, kBatch = 128, kWarmup = 2, kSteps = 10, kRounds = 5;

torch::nn::Sequential make_model() {
  torch::manual_seed(0);
  torch::nn::Sequential m;
  for (int i = 0; i < kLayers; ++i) {
    m->push_back(torch::nn::Linear(kWidth, kWidth));
    m->push_back(torch::nn::ReLU());
  }
  m->push_back(torch::nn::Linear(kWidth, 10));
  return m;
}

/// The gradients all-reduced once, after backward, flattened into one tensor.
struct AllReduceAfterBackward {
  using family = nitro::family::Hook;
  static constexpr std::string_view name = "after_backward";
  static constexpr bool enabled = true;
  struct Options {
    std::optional<nitro::dist::ProcessGroup> group;
  };
  explicit AllReduceAfterBackward(const Options& o) : group(*o.group) {}
  template <class Loop>
  void after_backward(Loop& loop) {
    std::vector<at::Tensor> grads;
    for (const auto& p : loop.model().parameters()) grads.push_back(p.grad());
    group.average(grads);
  }
  nitro::dist::ProcessGroup group;
};

/// One run: samples/s of this process over kSteps steps after kWarmup.
template <class Loop>
double run(Loop& loop, torch::nn::Sequential& model) {
  const at::Tensor x = at::randn({kBatch, kWidth}), y = at::randint(0, 10, {kBatch});
  const auto fn = [&](const at::Tensor&) { return torch::cross_entropy_loss(model->forward(x), y); };
  for (int i = 0; i < kWarmup; ++i) loop.step(x, fn);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kSteps; ++i) loop.step(x, fn);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return kSteps * kBatch / s;
}

int child(const std::string& mode, const std::string& store, int rank, int world, const std::string& out) {
  at::set_num_threads(1);
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), 0.01);
  double rate = 0;
  if (mode == "single") {
    nitro::TrainingLoop<> loop{model, opt};
    rate = run(loop, model);
  } else {
    auto g = nitro::dist::ProcessGroup::with_store(nitro::dist::file_store(store, world), rank, world,
                                                   {.gloo_hostname = "127.0.0.1"});
    if (mode == "after") {
      nitro::TrainingLoop<AllReduceAfterBackward> loop{model, opt, {.hooks = {{.group = g}}}};
      rate = run(loop, model);
    } else {
      nitro::TrainingLoop<nitro::dist::DataParallel> loop{model, opt, {.hooks = {{.group = g}}}};
      rate = run(loop, model);
    }
    g.barrier();
  }
  std::ofstream(out) << rate;
  return 0;
}

/// Starts `world` copies of this program in `mode`; the total samples/s of the ranks.
double launch(const std::string& self, const std::string& mode, int world, const std::filesystem::path& dir) {
  static int run_number = 0;
  const std::string store = (dir / ("store-" + std::to_string(run_number++))).string();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> args{self, "--child", mode, store, std::to_string(r), std::to_string(world),
                                  (dir / ("rate-" + std::to_string(r))).string()};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ) != 0) throw std::runtime_error("spawn failed");
    pids.push_back(pid);
  }
  for (const pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("a rank of " + mode + " failed");
  }
  double total = 0;
  for (int r = 0; r < world; ++r) {
    double rate = 0;
    std::ifstream(dir / ("rate-" + std::to_string(r))) >> rate;
    total += rate;
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) try {
  // A rank: --child MODE STORE RANK WORLD OUT (started by launch() below).
  if (argc >= 2 && std::string(argv[1]) == "--child") {
    if (argc != 7) throw std::runtime_error("usage: bench_ddp --child MODE STORE RANK WORLD OUT");
    return child(argv[2], argv[3], std::stoi(argv[4]), std::stoi(argv[5]), argv[6]);
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const auto dir = std::filesystem::temp_directory_path() / ("nitro-bench-ddp-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::printf("bench_ddp: MLP %d x %d, batch %d per rank, 1 compute thread per process, %s\n", kLayers, kWidth, kBatch,
              nitro::bench::machine().c_str());
  std::vector<double> single, after, overlapped;
  for (int round = 0; round < kRounds; ++round) {
    single.push_back(launch(self, "single", 1, dir));
    after.push_back(launch(self, "after", 2, dir));
    overlapped.push_back(launch(self, "ddp", 2, dir));
    std::printf("round %d: 1 process %.0f, 2 after backward %.0f, 2 overlapped %.0f samples/s\n", round, single.back(),
                after.back(), overlapped.back());
  }
  for (const auto& f : std::filesystem::directory_iterator(dir)) std::filesystem::remove(f.path());
  std::filesystem::remove(dir);
  const double s = nitro::bench::median(single), a = nitro::bench::median(after), o = nitro::bench::median(overlapped);
  std::printf("| configuration | samples/s (median of %d) |\n|---|---|\n| 1 process | %.0f |\n| 2 processes, one all-reduce "
              "after backward | %.0f |\n| 2 processes, dist::DataParallel | %.0f |\n", kRounds, s, a, o);
  nitro::bench::result("ddp_overlap_speedup", o / a, ">=", 1.15);
  nitro::bench::result("ddp_scaling_2proc", o / s, ">=", 1.6);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_ddp: %s\n", e.what());
  return 1;
}
