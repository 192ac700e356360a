// snapshot::Policy's signals in one process: copies of a signal (a launcher's) are one stop, a third
// signal ends the process as it would have ended without a Policy, and after a stop the handler absorbs
// late copies for a while, then hands signals on. Each case in a child process of its own (signals
// end processes). The multi-process stop (the ranks' vote) is tested under torchrun in
// tests/dist/preemption.cpp.
#include "testing.hpp"

#include "child.hpp"

#include <nitro/memory/batch_size.hpp>
#include <nitro/snapshot/policy.hpp>
#include <nitro/snapshot/snapshot.hpp>
#include <nitro/train/training_loop.hpp>

#include <signal.h>

#include <fstream>
#include <sstream>
#include <string>

namespace nitro_test_snapshot_policy {  // one namespace per file: an area is compiled as one translation unit

namespace fs = std::filesystem;
using nitro::test::TempDir;

namespace {

void write_text(const fs::path& file, const std::string& text) { std::ofstream(file) << text; }
std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// args: directory, mode (twice | thrice | late). Raises SIGTERM at the 5th micro-batch (the middle of
// an accumulation window of 2): `twice` raises it twice, `thrice` three times; `late` raises it once,
// and after the stop, with the loop gone, twice more: once at once (a launcher's late copy) and once
// after the time for late copies has passed.
NITRO_TEST_CHILD(policy_signals) {
  at::set_num_threads(1);
  const fs::path dir = args.at(0);
  const std::string mode = args.at(1);
  torch::manual_seed(1);
  auto model = torch::nn::Sequential(torch::nn::Linear(4, 3));
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  {
    nitro::TrainingLoop<nitro::accumulate::Fixed<2>, nitro::snapshot::Policy> loop{
        model, optimizer, {.hooks = {{.directory = dir / "snapshots"}}}};
    for (int i = 1; i <= 20; ++i) {
      if (i == 5) {
        const int copies = mode == "twice" ? 2 : mode == "thrice" ? 3 : 1;
        for (int c = 0; c < copies; ++c) ::raise(SIGTERM);
      }
      const auto r = loop.step(at::randn({2, 4}), [&](const at::Tensor& x) { return model->forward(x).square().mean(); });
      if (r.stop) {
        write_text(dir / "stopped", std::to_string(i) + " " + std::to_string(loop.optimizer_steps()) + " " +
                                        std::to_string(loop.pending_micro_batches()) + " " + std::string(r.stop_reason));
        break;
      }
    }
  }
  if (mode == "late") {
    ::raise(SIGTERM);  // a launcher's copy, just after the run stopped: absorbed
    write_text(dir / "alive", "after a late copy");
    nitro::snapshot::detail::late_copies_ns.store(0);  // the time for late copies is over
    ::raise(SIGTERM);                                  // the process ends as it would have without a Policy
    write_text(dir / "alive", "after the last signal");
  }
  return 0;
}

// args: directory, mode. `stale`: a Policy gets two signals and goes without a step; a later Policy
// then gets one, which must be a stop, not the third that forces the end. `finder`: SIGTERM in the
// second trial of find_max_batch_size(loop, ...): no snapshot of a trial's state, and the first real
// step after the search stops.
NITRO_TEST_CHILD(policy_more) {
  at::set_num_threads(1);
  const fs::path dir = args.at(0);
  const std::string mode = args.at(1);
  torch::manual_seed(1);
  auto model = torch::nn::Sequential(torch::nn::Linear(4, 3));
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  using Loop = nitro::TrainingLoop<nitro::snapshot::Policy>;
  const auto fn = [&](const at::Tensor& x) { return model->forward(x).square().mean(); };
  if (mode == "stale") {
    {
      Loop first{model, optimizer, {.hooks = {{.directory = dir / "first"}}}};
      ::raise(SIGTERM);
      ::raise(SIGTERM);
    }
    Loop loop{model, optimizer, {.hooks = {{.directory = dir / "snapshots"}}}};
    ::raise(SIGTERM);
    const auto r = loop.step(at::randn({2, 4}), fn);
    write_text(dir / "stopped", r.stop ? std::string(r.stop_reason) : "no stop");
    return 0;
  }
  Loop loop{model, optimizer, {.hooks = {{.directory = dir / "snapshots", .every_steps = 1}}}};
  int trials = 0;
  const auto found = nitro::memory::find_max_batch_size(
      loop,
      [&](std::int64_t batch) {
        if (++trials == 2) ::raise(SIGTERM);
        const auto r = loop.step(at::randn({batch, 4}), fn);
        if (r.stop) throw std::runtime_error("a trial's step stopped the run");
      },
      {.min = 1, .max = 8});
  const auto in_search = nitro::snapshot::list(dir / "snapshots").size();
  const auto r = loop.step(at::randn({2, 4}), fn);
  write_text(dir / "stopped", std::to_string(found.batch_size > 0) + " " + std::to_string(in_search) + " " +
                                  (r.stop ? std::string(r.stop_reason) : "no stop") + " " +
                                  std::to_string(nitro::snapshot::list(dir / "snapshots").size()) + " " +
                                  std::to_string(loop.optimizer_steps()));
  return 0;
}

}  // namespace

TEST_CASE("snapshot::Policy: signals a Policy gone without acting left do not count toward a later Policy's third") {
  TempDir dir("nitro-policy-stale", true);
  CHECK(nitro::test::run_child("policy_more", {dir.path.string(), "stale"}) == 0);
  CHECK(read_text(dir / "stopped") == "SIGTERM");
}

TEST_CASE("snapshot::Policy: a SIGTERM during the batch-size finder's trials saves no trial's state and stops the first "
          "real step after the search") {
  TempDir dir("nitro-policy-finder", true);
  CHECK(nitro::test::run_child("policy_more", {dir.path.string(), "finder"}) == 0);
  // Found a size; nothing saved during the search; the next step: saved by steps and on the signal
  // (one file, step 1), and stopped.
  CHECK(read_text(dir / "stopped") == "1 0 SIGTERM 1 1");
}

TEST_CASE("snapshot::Policy: two copies of SIGTERM before a step ends are one stop, with one snapshot, and the process "
          "exits 0") {
  TempDir dir("nitro-policy-twice", true);
  CHECK(nitro::test::run_child("policy_signals", {dir.path.string(), "twice"}) == 0);
  // One process: the stop comes at the end of the very step (micro-batch 5, mid-window), saved with it.
  CHECK(read_text(dir / "stopped") == "5 2 1 SIGTERM");
  const auto files = nitro::snapshot::list(dir / "snapshots");
  REQUIRE(files.size() == 1);
  CHECK(files[0].filename() == nitro::snapshot::file_name(2, 1));
  CHECK(nitro::snapshot::check(files[0]) == std::nullopt);
}

TEST_CASE("snapshot::Policy: a third SIGTERM before the step ends ends the process as without a Policy") {
  TempDir dir("nitro-policy-thrice", true);
  CHECK(nitro::test::run_child("policy_signals", {dir.path.string(), "thrice"}) == 128 + SIGTERM);
  CHECK_FALSE(fs::exists(dir / "stopped"));
}

TEST_CASE("snapshot::Policy: after a stop on SIGTERM, a late copy of the signal is absorbed, and once the time for late "
          "copies has passed, a signal ends the process") {
  TempDir dir("nitro-policy-late", true);
  CHECK(nitro::test::run_child("policy_signals", {dir.path.string(), "late"}) == 128 + SIGTERM);
  CHECK(read_text(dir / "stopped") == "5 2 1 SIGTERM");
  CHECK(read_text(dir / "alive") == "after a late copy");
}

}  // namespace nitro_test_snapshot_policy
