// dist::DataParallel on this machine's CPU: 2 processes (this program started twice, a Gloo group over
// loopback met through a FileStore), one compute thread each, an MLP whose backward is long enough to
// hide communication. Rows, in interleaved rounds (median of each):
//   1 process      the plain loop, no group (the scaling baseline)
//   2 after        the gradients all-reduced once after backward, in one flat tensor (what the C++
//                  frontend's distributed example does)
//   2 overlapped   dist::DataParallel: DDP's Reducer, buckets all-reduced during backward
// RESULT ddp_overlap_speedup = overlapped / after samples/s, goal >= 1.15
// RESULT ddp_scaling_2proc  = 2-process overlapped samples/s / 1-process samples/s, goal >= 1.6
// RESULT ddp_stop_vote_overhead = the dist::DataParallel step with the ranks' stop vote (what
//   snapshot::Policy adds per optimizer step with several processes: Agreement::begin before the
//   forward, end after the optimizer step) / the same step without it, in interleaved blocks of steps
//   within one pair of processes, medians; goal <= 1.01
// RESULT ddp_stop_vote_instructions = the same, counted in instructions under callgrind
//   (bench/instructions.hpp) on the training thread, over a group of one (its Gloo all-reduces still
//   go through Gloo's queue and threads; a peer under valgrind would count its waits), a smaller MLP
//   (4 x 256, batch 32) so that valgrind finishes; goal <= 1.01
#include "common.hpp"
#include "instructions.hpp"

#include <nitro/core/rank.hpp>
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
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace {

constexpr int kWidth = 1024, kLayers = 8, kBatch = 128, kWarmup = 2, kSteps = 10, kRounds = 5;
constexpr int kVoteRounds = 12, kVoteBlock = 5;

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

/// What snapshot::Policy does per optimizer step with several processes (snapshot/policy.hpp), switched
/// on and off between blocks of steps: the ranks' vote on stopping, begun before the forward and read
/// at the end of the step.
struct StopVote {
  using family = nitro::family::Hook;
  static constexpr std::string_view name = "stop_vote";
  static constexpr bool enabled = true;
  struct Options {
    const bool* on = nullptr;
    /// The group to vote on; none: the run's (nitro::make_agreement, as snapshot::Policy does).
    std::optional<nitro::dist::ProcessGroup> group;
  };
  explicit StopVote(const Options& o) : on(o.on), group(o.group) {}
  template <class Loop>
  void on_step_begin(Loop&) {
    if (!*on) return;
    if (!vote) vote = group ? group->make_agreement() : nitro::make_agreement();
    vote->begin(false);
  }
  template <class Loop>
  void on_step_end(Loop&, nitro::StepResult&, std::int64_t) {
    if (vote && vote->pending() && vote->end()) throw std::runtime_error("a rank voted to stop");
  }
  const bool* on;
  std::optional<nitro::dist::ProcessGroup> group;
  std::unique_ptr<nitro::Agreement> vote;
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
    } else if (mode == "vote") {
      // Blocks of steps with and without the vote, interleaved (the same order on both ranks).
      bool on = false;
      nitro::TrainingLoop<nitro::dist::DataParallel, StopVote> loop{model, opt, {.hooks = {{.group = g}, {.on = &on}}}};
      const at::Tensor x = at::randn({kBatch, kWidth}), y = at::randint(0, 10, {kBatch});
      const auto fn = [&](const at::Tensor&) { return torch::cross_entropy_loss(model->forward(x), y); };
      for (int i = 0; i < kWarmup; ++i) loop.step(x, fn);
      const auto [off, with] = nitro::bench::interleaved(
          [&] {
            on = false;
            loop.step(x, fn);
          },
          [&] {
            on = true;
            loop.step(x, fn);
          },
          kVoteRounds, kVoteBlock);
      g.barrier();
      std::ofstream(out) << nitro::bench::median(off) << " " << nitro::bench::median(with);
      return 0;
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
  nitro::bench::Instructions counts{argc, argv};
  // A rank: --child MODE STORE RANK WORLD OUT (started by launch() below).
  if (argc >= 2 && std::string(argv[1]) == "--child") {
    if (argc != 7) throw std::runtime_error("usage: bench_ddp --child MODE STORE RANK WORLD OUT");
    return child(argv[2], argv[3], std::stoi(argv[4]), std::stoi(argv[5]), argv[6]);
  }
  // Instruction counts of the vote: DataParallel over a group of one (made in each variant's own
  // process: Gloo's threads do not survive a fork), with and without it, 5 steps after 3.
  torch::manual_seed(0);
  torch::nn::Sequential small;
  for (int i = 0; i < 4; ++i) {
    small->push_back(torch::nn::Linear(256, 256));
    small->push_back(torch::nn::ReLU());
  }
  torch::optim::SGD small_opt(small->parameters(), 0.01);
  const at::Tensor sx = at::randn({32, 256}), sy = at::randint(0, 256, {32});
  using VoteLoop = nitro::TrainingLoop<nitro::dist::DataParallel, StopVote>;
  std::optional<VoteLoop> vote_loop;
  bool vote_on = false;
  const auto make_vote_loop = [&] {
    auto g = nitro::dist::ProcessGroup::with_store(c10::make_intrusive<c10d::HashStore>(), 0, 1, {.gloo_hostname = "127.0.0.1"});
    vote_loop.emplace(small, small_opt, VoteLoop::Options{.hooks = {{.group = g}, {.on = &vote_on, .group = g}}});
  };
  const auto small_fn = [&](const at::Tensor&) { return torch::cross_entropy_loss(small->forward(sx), sy); };
  counts.add("ddp", [&] { vote_loop->step(sx, small_fn); }, {.warmup = 3, .steps = 5, .before = make_vote_loop});
  counts.add("ddp_vote", [&] { vote_loop->step(sx, small_fn); }, {.warmup = 3, .steps = 5, .before = [&] {
                                                                      make_vote_loop();
                                                                      vote_on = true;
                                                                    }});
  if (counts.child()) return counts.run_child();

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
  const double s = nitro::bench::median(single), a = nitro::bench::median(after), o = nitro::bench::median(overlapped);
  std::printf("| configuration | samples/s (median of %d) |\n|---|---|\n| 1 process | %.0f |\n| 2 processes, one all-reduce "
              "after backward | %.0f |\n| 2 processes, dist::DataParallel | %.0f |\n", kRounds, s, a, o);
  // The stop vote: rank 0's step times with and without it (both ranks step together).
  launch(self, "vote", 2, dir);
  double off = 0, with = 0;
  std::ifstream(dir / "rate-0") >> off >> with;
  std::printf("| 2 processes, dist::DataParallel, step without / with the stop vote (median of %d, ms) | %.3f / %.3f |\n",
              kVoteRounds * kVoteBlock, off * 1e3, with * 1e3);
  nitro::bench::result("ddp_overlap_speedup", o / a, ">=", 1.15);
  nitro::bench::result("ddp_scaling_2proc", o / s, ">=", 1.6);
  nitro::bench::result("ddp_stop_vote_overhead", with / off, "<=", 1.01);
  counts.result("ddp_stop_vote_instructions", "ddp_vote", "ddp");
  for (const auto& f : std::filesystem::directory_iterator(dir)) std::filesystem::remove(f.path());
  std::filesystem::remove(dir);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_ddp: %s\n", e.what());
  return 1;
}
