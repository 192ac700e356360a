// dist::ProcessGroup, dist::DataParallel, dist::DistributedSampler: real processes (this executable
// started as children), a real Gloo group over loopback, met through a FileStore; checked against one
// process training on the concatenation of the ranks' batches.
#include <nitro/dist/data_parallel.hpp>
#include <nitro/dist/sampler.hpp>
#include <nitro/snapshot/policy.hpp>
#include <nitro/snapshot/snapshot.hpp>
#include <nitro/train/training_loop.hpp>

#include "common.hpp"

#include <signal.h>
#include <sys/wait.h>

#include <torch/headeronly/version.h>

#include <chrono>
#include <cstddef>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace nitro_test_dist_data_parallel {  // one namespace per file: an area is compiled as one translation unit

namespace fs = std::filesystem;
using nitro::test::TempDir;
using namespace nitro::test::dist;
using namespace std::chrono_literals;

namespace {

constexpr int kRows = 12;     // rows of one step's global batch: 6 per rank of 2, 4 per rank of 3
constexpr int kSteps = 6;
constexpr int kInfStep = 3;   // fp16: rank 1's loss is inf at this step (the reference: the whole batch's)

torch::nn::Sequential make_model(int seed, int hidden = 16) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(8, hidden), torch::nn::Tanh(), torch::nn::Linear(hidden, 4));
}

struct Batch {
  at::Tensor x, y;
};

/// Micro-batch `index`'s global batch: kRows rows drawn from its own seed.
Batch global_batch(std::int64_t index) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + index);
  Batch b;
  b.x = at::randn({kRows, 8}, gen);
  b.y = at::randn({kRows, 4}, gen);
  return b;
}
Batch shard(const Batch& b, int rank, int world) {
  const std::int64_t rows = kRows / world;
  return {b.x.narrow(0, rank * rows, rows), b.y.narrow(0, rank * rows, rows)};
}
Batch concat(const std::vector<Batch>& parts) {
  std::vector<at::Tensor> xs, ys;
  for (const auto& p : parts) {
    xs.push_back(p.x);
    ys.push_back(p.y);
  }
  return {at::cat(xs), at::cat(ys)};
}

std::vector<at::Tensor> parameters_of(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}



/// Trains `mode` for kSteps optimizer steps: on rank's shards in a group, or (world 0) on whole batches
/// in one process without DataParallel. Returns the parameters and a line of counters.
struct Outcome {
  std::vector<at::Tensor> params;
  std::map<std::string, std::int64_t> counters;
};

template <class Loop>
Outcome train(const std::string& mode, std::optional<nitro::dist::ProcessGroup> group, typename Loop::Options options) {
  const int rank = group ? group->rank() : 0, world = group ? group->size() : 1;
  auto model = make_model(100 + rank);  // every rank starts from its own weights: rank 0's are broadcast
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Loop loop{model, optimizer, std::move(options)};
  const std::int64_t window = loop.accumulation_steps();
  for (std::int64_t step = 0; step < kSteps; ++step) {
    for (std::int64_t m = 0; m < window; ++m) {
      const bool poison = mode == "fp16" && step == kInfStep && (group ? rank == 1 : true);
      const auto fn = [&](const Batch& b) {
        at::Tensor loss = torch::mse_loss(model->forward(b.x), b.y);
        return poison ? loss * std::numeric_limits<float>::infinity() : loss;
      };
      if (group) {
        loop.step(shard(global_batch(step * window + m), rank, world), fn);
      } else if (mode == "accum" || mode == "flush") {
        // The reference takes no accumulation: one step on the window's micro-batches together.
        std::vector<Batch> parts;
        for (std::int64_t k = 0; k < 4; ++k) parts.push_back(global_batch(step * 4 + k));
        loop.step(concat(parts), fn);
      } else {
        loop.step(global_batch(step), fn);
      }
    }
  }
  if (mode == "flush") {
    // Two micro-batches of a window of four, then flush(): the ranks average their gradients there.
    const auto fn = [&](const Batch& b) { return torch::mse_loss(model->forward(b.x), b.y); };
    if (group) {
      for (std::int64_t m = 0; m < 2; ++m) loop.step(shard(global_batch(kSteps * 4 + m), rank, world), fn);
      if (!loop.flush()) throw std::runtime_error("flush() found no window");  // a child: no doctest here
    } else {
      loop.step(concat({global_batch(kSteps * 4), global_batch(kSteps * 4 + 1)}), fn);
    }
  }
  Outcome out{parameters_of(*model), {}};
  out.counters["steps"] = loop.optimizer_steps();
  out.counters["skipped"] = loop.skipped_steps();
  if constexpr ([]<class... Hs>(std::tuple<Hs...>*) {
                  return (std::same_as<Hs, nitro::dist::DataParallel> || ...);
                }(static_cast<typename Loop::hook_policies*>(nullptr))) {
    if (group) {
      auto& dp = loop.template hook<nitro::dist::DataParallel>();
      out.counters["calls"] = dp.all_reduce_calls();
      out.counters["rounds"] = dp.sync_rounds();
      out.counters["buckets"] = static_cast<std::int64_t>(dp.buckets());
    }
  }
  return out;
}

template <class... Ps>
using DdpLoop = nitro::TrainingLoop<Ps..., nitro::dist::DataParallel>;

Outcome run_mode(const std::string& mode, std::optional<nitro::dist::ProcessGroup> g) {
  using nitro::dist::DataParallel;
  const DataParallel::Options dp{.group = g};
  const DataParallel::Options small_buckets{.group = g, .bucket_mib = 0.0002, .first_bucket_mib = 0.0001};
  if (!g) {  // the references: one process, no DataParallel
    if (mode == "bf16") return train<nitro::TrainingLoop<nitro::amp::Bf16>>(mode, g, {});
    if (mode == "fp16") return train<nitro::TrainingLoop<nitro::amp::Fp16<>>>(mode, g, {.amp = {.init_scale = 1024.0}});
    if (mode == "clip") return train<nitro::TrainingLoop<nitro::clip::Norm>>(mode, g, {.clip = {.max_norm = 0.05}});
    return train<nitro::TrainingLoop<>>(mode, g, {});
  }
  if (mode == "plain") return train<DdpLoop<>>(mode, g, {.hooks = {dp}});
  if (mode == "buckets") return train<DdpLoop<>>(mode, g, {.hooks = {small_buckets}});
  if (mode == "bf16") return train<DdpLoop<nitro::amp::Bf16>>(mode, g, {.hooks = {dp}});
  if (mode == "fp16") return train<DdpLoop<nitro::amp::Fp16<>>>(mode, g, {.amp = {.init_scale = 1024.0}, .hooks = {dp}});
  if (mode == "clip") return train<DdpLoop<nitro::clip::Norm>>(mode, g, {.clip = {.max_norm = 0.05}, .hooks = {dp}});
  if (mode == "accum" || mode == "flush") return train<DdpLoop<nitro::accumulate::Fixed<4>>>(mode, g, {.hooks = {dp}});
  throw std::runtime_error("unknown mode " + mode);
}

void save_outcome(const fs::path& prefix, const Outcome& o) {
  torch::save(o.params, prefix.string() + ".pt");
  std::string counters;
  for (const auto& [k, v] : o.counters) counters += k + " " + std::to_string(v) + "\n";
  write_text(prefix.string() + ".txt", counters);
}
Outcome load_outcome(const fs::path& prefix) {
  Outcome o;
  torch::load(o.params, prefix.string() + ".pt");
  std::istringstream in(read_text(prefix.string() + ".txt"));
  std::string k;
  std::int64_t v = 0;
  while (in >> k >> v) o.counters[k] = v;
  return o;
}

// args: store file, rank, world, output directory, modes...
NITRO_TEST_CHILD(ddp_modes) {
  at::set_num_threads(1);
  const int rank = std::stoi(args.at(1)), world = std::stoi(args.at(2));
  const fs::path out = args.at(3);
  auto g = join(args.at(0), rank, world);
  {
    // A group made while the world lives (here one of this process alone) leaves the writers' rank be.
    auto alone = nitro::dist::ProcessGroup::with_store(c10::make_intrusive<c10d::HashStore>(), 0, 1, {.gloo_hostname = "127.0.0.1"});
    if (nitro::process_rank() != rank || nitro::process_count() != world) return 3;
  }
  if (nitro::process_rank() != rank || nitro::process_count() != world) return 4;
  for (std::size_t i = 4; i < args.size(); ++i) {
    const Outcome o = run_mode(args[i], g);
    save_outcome(out / (args[i] + "-" + std::to_string(rank)), o);
  }
  return 0;
}


double max_relative(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double diff = (a[i] - b[i]).abs().max().item<double>();
    const double scale = std::max(b[i].abs().max().item<double>(), 1e-12);
    worst = std::max(worst, diff / scale);
  }
  return worst;
}
bool bitwise_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!at::equal(a[i], b[i])) return false;
  return true;
}

void check_world(int world) {
  TempDir dir("nitro-ddp", true);
  const std::vector<std::string> modes{"plain", "buckets", "clip", "accum", "flush", "bf16", "fp16"};
  std::vector<std::string> extra{dir.path.string()};
  extra.insert(extra.end(), modes.begin(), modes.end());
  const auto codes = run_ranks("ddp_modes", world, dir.path, extra);
  for (int r = 0; r < world; ++r) REQUIRE(codes[static_cast<std::size_t>(r)] == 0);
  at::set_num_threads(1);
  for (const auto& mode : modes) {
    CAPTURE(mode);
    const Outcome reference = run_mode(mode, std::nullopt);
    const Outcome first = load_outcome(dir / (mode + "-0"));
    for (int r = 1; r < world; ++r) {
      CAPTURE(r);
      const Outcome other = load_outcome(dir / (mode + "-" + std::to_string(r)));
      CHECK(bitwise_equal(other.params, first.params));  // the same averaged gradients everywhere
      CHECK(other.counters == first.counters);
    }
    // fp32: as one process on the concatenation; bf16/fp16 round their matrix products over other row
    // counts (6 or 4 rows against 12), so those are compared more loosely.
    const double tolerance = mode == "bf16" || mode == "fp16" ? 2e-2 : 1e-5;
    CHECK(max_relative(first.params, reference.params) <= tolerance);
    const std::int64_t extra = mode == "flush" ? 1 : 0;  // the flushed partial window
    CHECK(first.counters.at("steps") == kSteps + extra);
    CHECK(first.counters.at("skipped") == (mode == "fp16" ? 1 : 0));
    CHECK(reference.counters.at("skipped") == (mode == "fp16" ? 1 : 0));
    // One all-reduce per bucket per optimizer step, none on the accumulation window's first three.
    CHECK(first.counters.at("rounds") == kSteps + extra);
    if (mode != "buckets") {
      CHECK(first.counters.at("buckets") == 1);
      CHECK(first.counters.at("calls") == kSteps + extra);
    } else {
      CHECK(first.counters.at("buckets") > 1);
      // The first step runs in DDP's single bucket; the buckets are rebuilt by size after it.
      CHECK(first.counters.at("calls") == 1 + (kSteps - 1) * first.counters.at("buckets"));
    }
  }
}

}  // namespace

TEST_CASE("DataParallel over 2 processes: every rank ends with the parameters of one process training on the "
          "ranks' batches together (fp32, small buckets, clip, accumulation, flush, bf16, fp16 with inf on one rank)") {
  check_world(2);
}

TEST_CASE("DataParallel over 3 processes: the same, with a third of each batch per rank") { check_world(3); }

// ---- snapshots: a 2-process run stopped and resumed --------------------------------------------------

namespace {

constexpr std::size_t kSamples = 40;

// args: store, rank, world, directory, total steps, stop after (or -1), resume ("-" or a snapshot)
NITRO_TEST_CHILD(ddp_resume) {
  at::set_num_threads(1);
  const int rank = std::stoi(args.at(1)), world = std::stoi(args.at(2));
  const fs::path dir = args.at(3);
  const std::int64_t total = std::stoll(args.at(4)), stop = std::stoll(args.at(5));
  const std::string resume = args.at(6);
  auto g = join(args.at(0), rank, world);
  // The data set: sample i is row i of a fixed table.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor xs = at::randn({static_cast<std::int64_t>(kSamples), 8}, gen), ys = at::randn({static_cast<std::int64_t>(kSamples), 4}, gen);
  nitro::dist::DistributedSampler sampler(kSamples, g, {.seed = 3});
  auto model = make_model(100 + rank);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-2));
  using Loop = nitro::TrainingLoop<nitro::accumulate::Fixed<2>, nitro::dist::DataParallel, nitro::snapshot::Policy>;
  Loop loop{model, optimizer, {.hooks = {{.group = g}, {.directory = dir / "snapshots", .every_steps = 1, .keep_last = 50,
                                                       .on_signal = false, .sampler = &sampler}}}};
  if (resume != "-") nitro::snapshot::load(resume, loop, {.sampler = &sampler});
  while (loop.optimizer_steps() < total) {
    auto idx = sampler.next(3);
    if (!idx) {
      sampler.set_epoch(sampler.epoch() + 1);
      continue;
    }
    const auto index = at::tensor(std::vector<std::int64_t>(idx->begin(), idx->end()));
    const Batch b{xs.index_select(0, index), ys.index_select(0, index)};
    loop.step(b, [&](const Batch& batch) { return torch::mse_loss(model->forward(batch.x), batch.y); });
    if (stop >= 0 && loop.optimizer_steps() == stop && loop.pending_micro_batches() == 0) return 0;
  }
  torch::save(parameters_of(*model), (dir / ("final-" + std::to_string(rank) + ".pt")).string());
  write_text(dir / ("written-" + std::to_string(rank)), std::to_string(loop.hook<nitro::snapshot::Policy>().snapshots_written()));
  return 0;
}

}  // namespace

TEST_CASE("a 2-process run with a DistributedSampler, snapshotted by rank 0 and resumed in new processes, ends "
          "with the parameters of the uninterrupted run") {
  TempDir whole("nitro-ddp-whole", true), split("nitro-ddp-split", true);
  for (const int c : run_ranks("ddp_resume", 2, whole.path, {whole.path.string(), "14", "-1", "-"})) REQUIRE(c == 0);
  for (const int c : run_ranks("ddp_resume", 2, split.path, {split.path.string(), "14", "9", "-"})) REQUIRE(c == 0);
  const fs::path snap = split / "snapshots" / nitro::snapshot::file_name(9, 0);
  REQUIRE(fs::exists(snap));
  fs::remove(split / "store");
  for (const int c : run_ranks("ddp_resume", 2, split.path, {split.path.string(), "14", "-1", snap.string()})) REQUIRE(c == 0);
  for (const int r : {0, 1}) {
    std::vector<at::Tensor> a, b;
    torch::load(a, (whole / ("final-" + std::to_string(r) + ".pt")).string());
    torch::load(b, (split / ("final-" + std::to_string(r) + ".pt")).string());
    CHECK(bitwise_equal(a, b));
  }
  // Only rank 0 wrote (one snapshot per step); rank 1's policy named the files and wrote none.
  std::int64_t files = 0;
  for (const auto& f : fs::directory_iterator(whole / "snapshots")) files += f.path().extension() == ".nitro" ? 1 : 0;
  CHECK(files == 14);
  CHECK(read_text(whole / "written-0") == "14");
  CHECK(read_text(whole / "written-1") == "0");
}

// ---- failures -------------------------------------------------------------------------------------------

namespace {

/// A model with a layer its forward never uses.
struct WithUnused : torch::nn::Module {
  torch::nn::Sequential body = register_module("body", make_model(7));
  torch::nn::Linear extra = register_module("extra", torch::nn::Linear(3, 3));
  at::Tensor forward(const at::Tensor& x) { return body->forward(x); }
};

// args: store, rank, world, directory, mode (kill-N: rank 1 dies before step N | hang-N: rank 1 stops
// calling collectives for 12 s before step N | other-model | unused)
NITRO_TEST_CHILD(ddp_fail) {
  at::set_num_threads(1);
  const int rank = std::stoi(args.at(1)), world = std::stoi(args.at(2));
  const fs::path dir = args.at(3);
  const std::string mode = args.at(4);
  const auto started = std::chrono::steady_clock::now();
  try {
    auto g = join(args.at(0), rank, world, 4s);
    const auto train = [&](auto model) {
      torch::optim::SGD optimizer(model->parameters(), 0.1);
      // Small buckets: the rebuild after the first step broadcasts, and several all-reduces per step.
      nitro::TrainingLoop<nitro::dist::DataParallel> loop{
          model, optimizer, {.hooks = {{.group = g, .bucket_mib = 0.0002, .first_bucket_mib = 0.0001}}}};
      for (std::int64_t step = 0; step < 1000; ++step) {
        if (mode.starts_with("kill-") && rank == 1 && step == std::stoll(mode.substr(5))) ::raise(SIGKILL);
        if (mode.starts_with("hang-") && rank == 1 && step == std::stoll(mode.substr(5))) std::this_thread::sleep_for(12s);
        loop.step(shard(global_batch(step), rank, world),
                  [&](const Batch& b) { return torch::mse_loss(model->forward(b.x), b.y); });
      }
    };
    if (mode == "unused") {
      train(std::make_shared<WithUnused>());
    } else {
      train(make_model(7, mode == "other-model" && rank == 1 ? 17 : 16).ptr());
    }
    write_text(dir / ("error-" + std::to_string(rank)), "no error");
    return 1;
  } catch (const nitro::Error& e) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    write_text(dir / ("error-" + std::to_string(rank)), e.what());
    write_text(dir / ("seconds-" + std::to_string(rank)), std::to_string(seconds));
    return 0;
  } catch (const std::exception& e) {
    write_text(dir / ("error-" + std::to_string(rank)), std::string("not a nitro::Error: ") + e.what());
    return 2;
  }
}

}  // namespace

TEST_CASE("a rank killed before the first step, before the buckets' rebuild, or mid-training makes the other end "
          "with a nitro::Error naming its rank, within the timeout") {
  for (const std::string when : {"kill-0", "kill-1", "kill-3"}) {
    CAPTURE(when);
    TempDir dir("nitro-ddp-kill", true);
    const auto codes = run_ranks("ddp_fail", 2, dir.path, {dir.path.string(), when});
    CHECK(codes[1] == 128 + SIGKILL);
    CHECK(codes[0] == 0);
    const std::string error = read_text(dir / "error-0");
    CAPTURE(error);
    CHECK(error.find("failed on rank 0 of 2") != std::string::npos);
    CHECK(std::stod(read_text(dir / "seconds-0")) < 30.0);  // the timeout is 4 s
  }
}

TEST_CASE("a rank that stops calling collectives makes the other end with a nitro::Error after the timeout") {
  TempDir dir("nitro-ddp-hang", true);
  const auto codes = run_ranks("ddp_fail", 2, dir.path, {dir.path.string(), "hang-2"});
  CHECK(codes[0] == 0);
  const std::string error = read_text(dir / "error-0");
  CAPTURE(error);
  CHECK(error.find("failed on rank 0 of 2") != std::string::npos);
  const double seconds = std::stod(read_text(dir / "seconds-0"));
  CHECK(seconds >= 3.5);   // it waited for the timeout (4 s) ...
  CHECK(seconds < 11.5);   // ... and not for the hung rank to come back (12 s)
  // The hung rank, back, finds its partner gone: a nitro::Error too, not a crash or a hang.
  CHECK(codes[1] == 0);
}

TEST_CASE("a parameter that gets no gradient is a named error at the first step, not ranks drifting apart") {
  TempDir dir("nitro-ddp-unused", true);
  const auto codes = run_ranks("ddp_fail", 2, dir.path, {dir.path.string(), "unused"});
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(codes[static_cast<std::size_t>(r)] == 0);
    const std::string error = read_text(dir / ("error-" + std::to_string(r)));
    CAPTURE(error);
    CHECK(error.find("parameter extra.weight got no gradient in this step") != std::string::npos);
  }
}

TEST_CASE("ranks with different models both fail at the first step, naming the first difference") {
  TempDir dir("nitro-ddp-models", true);
  const auto codes = run_ranks("ddp_fail", 2, dir.path, {dir.path.string(), "other-model"});
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(codes[static_cast<std::size_t>(r)] == 0);
    const std::string error = read_text(dir / ("error-" + std::to_string(r)));
    CAPTURE(error);
    CHECK(error.find("the ranks' models differ: rank 1 of 2") != std::string::npos);
    CHECK(error.find("its model has parameter 0.weight [17, 8] Float where rank 0's has parameter 0.weight [16, 8] Float") != std::string::npos);
  }
}

// ---- the environment and bad input, in this process ----------------------------------------------------

TEST_CASE("the environment: torchrun's variables read, and each mistake a named error") {
  {
    ScopedEnv env(kNoLauncher);
    const auto e = nitro::dist::environment();
    CHECK(e.world_size == 1);
    CHECK(e.rank == 0);
  }
  {
    ScopedEnv env(with(kNoLauncher, {{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "10.1.2.3"},
                                     {"MASTER_PORT", "29511"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
    const auto e = nitro::dist::environment();
    CHECK(e.rank == 2);
    CHECK(e.world_size == 4);
    CHECK(e.local_rank == 0);
    CHECK(e.master_addr == "10.1.2.3");
    CHECK(e.master_port == 29511);
    CHECK(e.agent_store);
  }
  const auto fails = [](const std::map<std::string, std::optional<std::string>>& vars, const std::string& says) {
    ScopedEnv env(with(kNoLauncher, vars));
    CAPTURE(says);
    CHECK_THROWS_WITH_AS(nitro::dist::environment(), doctest::Contains(says.c_str()), nitro::Error);
  };
  fails({{"WORLD_SIZE", "2"}}, "WORLD_SIZE is set but RANK is not");
  fails({{"RANK", "0"}}, "RANK is set but WORLD_SIZE is not");
  fails({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}, "RANK=2 but WORLD_SIZE=2");
  fails({{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK=\"x\" is not an integer");
  fails({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1234"}}, "MASTER_ADDR is not set");
  fails({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT=70000 is outside");
}

TEST_CASE("an unreachable store is a named error after the timeout, not a hang") {
  // A port nothing listens on (bound, never listened: connections are refused).
  ScopedEnv env(with(kNoLauncher, {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "9"}}));
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS((void)nitro::dist::ProcessGroup::from_environment({.timeout = 2s}),
                       doctest::Contains("could not be reached, or not all 2 ranks joined it, within 2000 ms"), nitro::Error);
  CHECK(std::chrono::steady_clock::now() - start < 30s);
}

TEST_CASE("a group of one: collectives, the rank seen by the writers, a model on a device without a backend") {
  ScopedEnv env(kNoLauncher);
  CHECK(nitro::process_count() == 1);
  {
    auto g = nitro::dist::ProcessGroup::from_environment();
    CHECK(g.size() == 1);
    CHECK(g.is_main());
    CHECK(nitro::process_count() == 1);
    CHECK(g.all_reduce_mean(2.5) == 2.5);
    const at::Tensor t = at::arange(4, at::kFloat);
    CHECK(at::equal(g.all_reduce_mean(t), t));
    g.barrier();
    const std::vector<at::Tensor> mixed{at::full({2}, 3.0), at::full({3}, 4.0, at::kDouble), at::full({1}, 5.0)};
    CHECK(g.average(mixed) == 2);  // one collective per dtype
    CHECK(at::equal(mixed[1], at::full({3}, 4.0, at::kDouble)));
    CHECK_THROWS_WITH_AS((void)g.all_reduce_mean(at::arange(3)), doctest::Contains("needs a floating-point tensor"),
                         nitro::Error);
    // A model on a device this group has no backend for (meta here; CUDA on a Gloo-only group alike).
    struct OnMeta : torch::nn::Module {
      at::Tensor w = register_parameter("w", at::zeros({2, 2}, c10::Device(c10::kMeta)));
    };
    auto model = std::make_shared<OnMeta>();
    torch::optim::SGD optimizer(model->parameters(), 0.1);
    nitro::TrainingLoop<nitro::dist::DataParallel> loop{model, optimizer, {.hooks = {{.group = g}}}};
    CHECK_THROWS_WITH_AS(loop.step(at::zeros({1, 2}, c10::Device(c10::kMeta)), [&](const at::Tensor& x) { return x.mm(model->w).sum(); }),
                         doctest::Contains("parameter w is on meta, which this process group has no backend for"), nitro::Error);
  }
  CHECK_THROWS_WITH_AS(nitro::dist::DataParallel({}), doctest::Contains("Options::group is not set"), nitro::Error);
  CHECK_THROWS_WITH_AS((void)nitro::dist::ProcessGroup::from_environment({.timeout = 0ms}),
                       doctest::Contains("timeout must be > 0"), nitro::Error);
}

TEST_CASE("DistributedSampler: disjoint shards of one seeded order, padded to equal lengths, resumable, and a "
          "different world size refused") {
  // 10 samples over 3 ranks: 4 each, the order padded with its first two.
  const auto order = nitro::data::epoch_order(9, 2, 10);
  std::multiset<std::size_t> seen;
  for (int r = 0; r < 3; ++r) {
    nitro::data::ResumableSampler s(10, {.seed = 9, .shard = r, .shards = 3});
    s.set_epoch(2);
    CHECK(s.length() == 4);
    std::vector<std::size_t> got;
    while (auto b = s.next(3)) got.insert(got.end(), b->begin(), b->end());
    REQUIRE(got.size() == 4);
    for (std::size_t k = 0; k < 4; ++k) CHECK(got[k] == order[(k * 3 + static_cast<std::size_t>(r)) % 10]);
    seen.insert(got.begin(), got.end());
  }
  for (std::size_t i = 0; i < 10; ++i) CHECK(seen.count(i) >= 1);  // every sample, two of them twice
  CHECK(seen.size() == 12);
  nitro::data::ResumableSampler cut(10, {.seed = 9, .shard = 2, .shards = 3, .drop_last = true});
  CHECK(cut.length() == 3);
  // Resume: the state carries the shard count.
  nitro::data::ResumableSampler a(10, {.seed = 9, .shard = 1, .shards = 3});
  (void)a.next(2);
  const auto st = a.state();
  CHECK(st.shards == 3);
  nitro::data::ResumableSampler b(10, {.seed = 9, .shard = 1, .shards = 3});
  b.load_state(st);
  const auto epoch0 = nitro::data::epoch_order(9, 0, 10);
  CHECK(b.next(2) == std::optional<std::vector<std::size_t>>(std::vector<std::size_t>{epoch0[7], epoch0[0]}));
  nitro::data::ResumableSampler two(10, {.seed = 9, .shard = 1, .shards = 2});
  CHECK_THROWS_WITH_AS(two.load_state(st), doctest::Contains("saved by a sampler read in 3 shards"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::data::ResumableSampler(10, {.shard = 3, .shards = 3}),
                       doctest::Contains("shard must be in [0, shards)"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::data::ResumableSampler(2, {.shards = 3, .drop_last = true}),
                       doctest::Contains("leaves each shard nothing"), nitro::Error);
}

TEST_CASE("gpu: a single-process NCCL group runs DataParallel steps on the GPU, as the same steps without it" * nitro::test::needs_gpu()) {
#if NITRO_DIST_NCCL
  ScopedEnv env(kNoLauncher);
  auto g = nitro::dist::ProcessGroup::with_store(c10::make_intrusive<c10d::HashStore>(), 0, 1, {.nccl = true});
  REQUIRE(g.serves(c10::kCUDA));
  const c10::Device cuda(c10::kCUDA, 0);
  auto model = make_model(100), plain = make_model(100);
  model->to(cuda);
  plain->to(cuda);
  torch::optim::SGD opt(model->parameters(), 0.1), opt_plain(plain->parameters(), 0.1);
  nitro::TrainingLoop<nitro::dist::DataParallel> loop{model, opt, {.hooks = {{.group = g}}}};
  nitro::TrainingLoop<> reference{plain, opt_plain};
  for (std::int64_t step = 0; step < 3; ++step) {
    Batch b = global_batch(step);
    b.x = b.x.to(cuda);
    b.y = b.y.to(cuda);
    loop.step(b, [&](const Batch& x) { return torch::mse_loss(model->forward(x.x), x.y); });
    reference.step(b, [&](const Batch& x) { return torch::mse_loss(plain->forward(x.x), x.y); });
  }
  CHECK(loop.hook<nitro::dist::DataParallel>().all_reduce_calls() == 3);
  CHECK(max_relative(parameters_of(*model), parameters_of(*plain)) <= 1e-6);
#else
  FAIL("this build has no NCCL (NITRO_DIST_NCCL is 0): link nitro::dist with a CUDA LibTorch and nccl.h");
#endif
}

// ---- gloo's headers: declarations only, layouts as the library's -----------------------------------------

#if NITRO_DIST_GLOO
// What Nitro's code lays out itself, compared with libtorch_cpu 2.11 (x86-64): the sizes its own code
// allocates (operator new(0xb0) in ProcessGroupGloo::Options::create_default, operator new(0x1e8) in
// ProcessGroupGloo::split and merge) and the offsets its Options constructor writes (threads = 2 at
// 0xa8, the devices vector zeroed at 0x90). Read with objdump -d; another LibTorch needs them read again.
#if defined(__x86_64__) && TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 11
static_assert(sizeof(c10d::ProcessGroupGloo::Options) == 0xb0);
static_assert(sizeof(c10d::ProcessGroupGloo) == 0x1e8);
static_assert(offsetof(c10d::ProcessGroupGloo::Options, devices) == 0x90);
static_assert(offsetof(c10d::ProcessGroupGloo::Options, threads) == 0xa8);
#endif

TEST_CASE("Gloo through Debian's gloo headers: what Nitro reads and writes of ProcessGroupGloo is where the library "
          "put it") {
  // Made by the library: Nitro's view of its fields.
  const auto made = c10d::ProcessGroupGloo::Options::create_default(std::chrono::milliseconds(1234));
  CHECK(made->timeout == std::chrono::milliseconds(1234));
  CHECK(made->devices.size() >= 1);
  CHECK(made->threads >= 1);
  // Made by Nitro, read by the library (the group's threads and timeout, through inline accessors).
  auto g = nitro::dist::ProcessGroup::with_store(c10::make_intrusive<c10d::HashStore>(), 0, 1,
                                                 {.timeout = 3456ms, .gloo_threads = 3, .gloo_hostname = "127.0.0.1"});
  auto backend = c10::static_intrusive_pointer_cast<c10d::ProcessGroupGloo>(g.group()->getBackend(c10::kCPU));
  REQUIRE(backend);
  CHECK(backend->getBackendName() == "gloo");
  CHECK(backend->getNumThreads() == 3);
  CHECK(backend->getOptions()->timeout == 3456ms);
  CHECK(backend->getOptions()->devices.size() == 1);
  CHECK(backend->getSize() == 1);
  CHECK(backend->getRank() == 0);
  // Every gloo call Nitro makes, once: the three device factories (createDeviceForHostname above).
  CHECK(c10d::ProcessGroupGloo::createDefaultDevice() != nullptr);
  CHECK_THROWS((void)c10d::ProcessGroupGloo::createDeviceForInterface("nitro-no-such-interface"));
  // And a collective through it.
  std::vector<at::Tensor> t{at::ones({3})};
  g.all_reduce_sum(t);
  CHECK(at::equal(t[0], at::ones({3})));
}
#endif

// ---- torchrun --------------------------------------------------------------------------------------------

namespace {


// Started by torchrun: the group from its environment. args: output directory.
NITRO_TEST_CHILD(torchrun_rank) {
  at::set_num_threads(1);
  auto g = nitro::dist::ProcessGroup::from_environment({.timeout = 60s});
  const auto env = nitro::dist::environment();
  auto model = make_model(100 + g.rank());
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::TrainingLoop<nitro::dist::DataParallel> loop{model, optimizer, {.hooks = {{.group = g}}}};
  for (std::int64_t step = 0; step < 4; ++step)
    loop.step(shard(global_batch(step), g.rank(), g.size()),
              [&](const Batch& b) { return torch::mse_loss(model->forward(b.x), b.y); });
  const fs::path out = args.at(0);
  torch::save(parameters_of(*model), (out / ("torchrun-" + std::to_string(g.rank()) + ".pt")).string());
  write_text(out / ("env-" + std::to_string(g.rank())),
             std::to_string(g.size()) + " " + std::to_string(env.local_rank) + " " + (env.agent_store ? "agent" : "rank0"));
  g.barrier();
  return 0;
}

}  // namespace

TEST_CASE("torchrun --standalone --nproc-per-node 2 --no-python starts two ranks of a C++ program that train as one" *
          doctest::skip(torchrun_path().empty())) {
  TempDir dir("nitro-torchrun", true);
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string command = "timeout 300 " + torchrun_path() + " --standalone --nproc-per-node 2 --no-python " + self +
                              " --nitro-child torchrun_rank " + dir.path.string() + " > " + (dir / "log").string() + " 2>&1";
  const int status = std::system(command.c_str());
  const std::string log = read_text(dir / "log");
  CAPTURE(log);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  std::vector<at::Tensor> a, b;
  torch::load(a, (dir / "torchrun-0.pt").string());
  torch::load(b, (dir / "torchrun-1.pt").string());
  CHECK(bitwise_equal(a, b));
  // torchrun serves the store itself and says so: every rank was a client of it.
  CHECK(read_text(dir / "env-0") == "2 0 agent");
  CHECK(read_text(dir / "env-1") == "2 1 agent");
}

// Needs a Gloo group (skipped where this build has none, as on the GPU machine without gloo's headers).
TEST_CASE("gpu: a CUDA model on a group without NCCL is a named error" * nitro::test::needs_gpu(!NITRO_DIST_GLOO)) {
  ScopedEnv env(kNoLauncher);
  auto g = nitro::dist::ProcessGroup::with_store(c10::make_intrusive<c10d::HashStore>(), 0, 1,
                                                 {.gloo_hostname = "127.0.0.1"});
  auto model = make_model(1);
  model->to(c10::Device(c10::kCUDA, 0));
  torch::optim::SGD opt(model->parameters(), 0.1);
  nitro::TrainingLoop<nitro::dist::DataParallel> loop{model, opt, {.hooks = {{.group = g}}}};
  const Batch b{at::zeros({2, 8}, c10::Device(c10::kCUDA, 0)), at::zeros({2, 4}, c10::Device(c10::kCUDA, 0))};
  CHECK_THROWS_WITH_AS(loop.step(b, [&](const Batch& x) { return torch::mse_loss(model->forward(x.x), x.y); }),
                       doctest::Contains("a CUDA model needs an NCCL group"), nitro::Error);
}

}  // namespace nitro_test_dist_data_parallel
