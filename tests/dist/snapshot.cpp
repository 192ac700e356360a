// dist::fetch_latest_snapshot: ranks that do not share a file system (a directory of their own each)
// resume from rank 0's snapshot, received over the group, and end as the uninterrupted run; on a shared
// directory nothing is sent.
#include <nitro/dist/data_parallel.hpp>
#include <nitro/dist/sampler.hpp>
#include <nitro/dist/snapshot.hpp>
#include <nitro/snapshot/policy.hpp>
#include <nitro/snapshot/snapshot.hpp>
#include <nitro/train/training_loop.hpp>

#include "common.hpp"

#include <string>
#include <vector>

namespace nitro_test_dist_snapshot {  // one namespace per file: an area is compiled as one translation unit

namespace fs = std::filesystem;
using nitro::test::TempDir;
using namespace nitro::test::dist;
using namespace std::chrono_literals;

namespace {

std::vector<at::Tensor> parameters_of(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

// args: store, rank, world, directory, layout (shared | separate), total steps, stop after (-1: never),
// resume (yes | no). Writes final-<rank>.pt, and fetched-<rank> when resuming.
NITRO_TEST_CHILD(fetch_resume) {
  at::set_num_threads(1);
  const int rank = std::stoi(args.at(1)), world = std::stoi(args.at(2));
  const fs::path dir = args.at(3);
  const bool separate = args.at(4) == "separate";
  const std::int64_t total = std::stoll(args.at(5)), stop = std::stoll(args.at(6));
  const bool resume = args.at(7) == "yes";
  // Each rank's "disk": its own directory, or one shared by both.
  const fs::path snapshots = separate ? dir / ("disk-" + std::to_string(rank)) / "snapshots" : dir / "snapshots";
  auto g = join(args.at(0), rank, world, 60s);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor xs = at::randn({40, 8}, gen), ys = at::randn({40, 4}, gen);
  nitro::dist::DistributedSampler sampler(40, g, {.seed = 3});
  torch::manual_seed(100 + rank);
  auto model = torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-2));
  using Loop = nitro::TrainingLoop<nitro::accumulate::Fixed<2>, nitro::dist::DataParallel, nitro::snapshot::Policy>;
  Loop loop{model, optimizer, {.hooks = {{.group = g}, {.directory = snapshots, .every_steps = 1, .keep_last = 50,
                                                       .on_signal = false, .sampler = &sampler}}}};
  if (resume) {
    std::optional<nitro::dist::FetchedSnapshot> got;
    try {
      got = nitro::dist::fetch_latest_snapshot(g, snapshots, {.chunk_bytes = 4096});
    } catch (const nitro::Error& e) {
      write_text(dir / ("error-" + std::to_string(rank)), e.what());
      return 3;
    }
    if (!got) {
      write_text(dir / ("fetched-" + std::to_string(rank)), "none");
      return 0;
    }
    nitro::snapshot::load(got->file, loop, {.sampler = &sampler});
    write_text(dir / ("fetched-" + std::to_string(rank)),
               got->file.filename().string() + " " + (got->received ? "received " : "local ") + std::to_string(got->bytes));
  }
  while (loop.optimizer_steps() < total) {
    auto idx = sampler.next(3);
    if (!idx) {
      sampler.set_epoch(sampler.epoch() + 1);
      continue;
    }
    const auto index = at::tensor(std::vector<std::int64_t>(idx->begin(), idx->end()));
    const at::Tensor x = xs.index_select(0, index), y = ys.index_select(0, index);
    loop.step(x, [&](const at::Tensor& in) { return torch::mse_loss(model->forward(in), y); });
    if (stop >= 0 && loop.optimizer_steps() == stop && loop.pending_micro_batches() == 0) return 0;
  }
  torch::save(parameters_of(*model), (dir / ("final-" + std::to_string(rank) + ".pt")).string());
  return 0;
}

bool bitwise_equal(const fs::path& a, const fs::path& b) {
  std::vector<at::Tensor> x, y;
  torch::load(x, a.string());
  torch::load(y, b.string());
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!at::equal(x[i], y[i])) return false;
  return true;
}

}  // namespace

TEST_CASE("ranks without a shared file system resume from rank 0's snapshot, received over the group, and end as "
          "the uninterrupted run, and on a shared directory nothing is sent") {
  TempDir whole("nitro-fetch-whole", true);
  CHECK(run_ranks("fetch_resume", 2, whole.path, {whole.path.string(), "shared", "12", "-1", "no"}) == std::vector<int>{0, 0});
  for (const std::string layout : {"separate", "shared"}) {
    CAPTURE(layout);
    TempDir split("nitro-fetch-split", true);
    CHECK(run_ranks("fetch_resume", 2, split.path, {split.path.string(), layout, "12", "7", "no"}) == std::vector<int>{0, 0});
    const fs::path on_rank0 = (layout == "separate" ? split / "disk-0" : split.path) / "snapshots" / nitro::snapshot::file_name(7, 0);
    REQUIRE(fs::exists(on_rank0));
    if (layout == "separate") CHECK(nitro::snapshot::list(split / "disk-1" / "snapshots").empty());  // rank 1 writes none
    fs::remove(split / "store");
    CHECK(run_ranks("fetch_resume", 2, split.path, {split.path.string(), layout, "12", "-1", "yes"}) == std::vector<int>{0, 0});
    const std::string size = std::to_string(fs::file_size(on_rank0));
    const std::string name = on_rank0.filename().string();
    CHECK(read_text(split / "fetched-0") == name + " local " + size);
    CHECK(read_text(split / "fetched-1") == name + (layout == "separate" ? " received " : " local ") + size);
    if (layout == "separate") {
      const fs::path copy = split / "disk-1" / "snapshots" / name;
      CHECK(read_text(copy) == read_text(on_rank0));  // byte for byte
    }
    for (const int r : {0, 1}) {
      CAPTURE(r);
      CHECK(bitwise_equal(whole / ("final-" + std::to_string(r) + ".pt"), split / ("final-" + std::to_string(r) + ".pt")));
    }
  }
  // A rank that cannot make its copy (a directory in the way of its name): every rank stops with an error.
  {
    TempDir bad("nitro-fetch-bad", true);
    CHECK(run_ranks("fetch_resume", 2, bad.path, {bad.path.string(), "separate", "12", "7", "no"}) == std::vector<int>{0, 0});
    fs::remove(bad / "store");
    fs::create_directories(bad / "disk-1" / "snapshots" / nitro::snapshot::file_name(7, 0));
    CHECK(run_ranks("fetch_resume", 2, bad.path, {bad.path.string(), "separate", "12", "-1", "yes"}) == std::vector<int>{3, 3});
    const std::string e0 = read_text(bad / "error-0"), e1 = read_text(bad / "error-1");
    CAPTURE(e0);
    CAPTURE(e1);
    CHECK(e0.find("1 rank(s) could not make their copy of rank 0's snapshot") != std::string::npos);
    CHECK(e1.find("rank 1 could not make its copy of rank 0's snapshot") != std::string::npos);
  }
  // Rank 0 has no snapshot: no rank gets one.
  TempDir empty("nitro-fetch-none", true);
  CHECK(run_ranks("fetch_resume", 2, empty.path, {empty.path.string(), "separate", "12", "-1", "yes"}) == std::vector<int>{0, 0});
  CHECK(read_text(empty / "fetched-0") == "none");
  CHECK(read_text(empty / "fetched-1") == "none");
}

TEST_CASE("fetch_snapshot: bad options are named errors") {
  ScopedEnv env(kNoLauncher);
  auto g = nitro::dist::ProcessGroup::from_environment();
  CHECK_THROWS_WITH_AS((void)nitro::dist::fetch_snapshot(g, "/nonexistent/x.nitro", {.chunk_bytes = 10}),
                       doctest::Contains("chunk_bytes must be in [4096, 2^31]"), nitro::Error);
  CHECK_THROWS_WITH_AS((void)nitro::dist::fetch_snapshot(g, "/nonexistent/x.nitro"),
                       doctest::Contains("rank 0 cannot read /nonexistent/x.nitro"), nitro::Error);
  CHECK_THROWS_WITH_AS((void)nitro::dist::fetch_latest_snapshot(g, ""), doctest::Contains("the directory is empty"),
                       nitro::Error);
  TempDir none("nitro-fetch-alone", true);
  CHECK(nitro::dist::fetch_latest_snapshot(g, none.path) == std::nullopt);
}

}  // namespace nitro_test_dist_snapshot
