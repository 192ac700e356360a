// Snapshots against plain torch::save / torch::load of the same tensors: a model of about 100M
// parameters (24 Linear layers of 2048 x 2048) with Adam's state after one step, on the CPU.
//
//   snapshot::save   every parameter and buffer, Adam's two moments and step per parameter, the
//                    generators; streamed with XXH3 checksums into a temporary file, fsync, rename,
//                    fsync of the directory (the real thing: what a run pays per snapshot)
//   torch::save      a std::vector<at::Tensor> of the same parameters and moments, no fsync
//   snapshot::load   reads and checks every part (format version 2: XXH3; for reference, the same
//                    file in version 1, XXH64), checks names, shapes and dtypes, then copies into
//                    the live model and makes the new tensors the optimizer's state
//   torch::load      into a std::vector<at::Tensor> (and, for reference only, the same followed by
//                    the copy into the live model and optimizer state that snapshot::load also does)
//
// Alternating rounds (the one going first alternating), medians; the files are in the same directory
// (NITRO_BENCH_DIR, default the system's temporary directory), and the page cache is warm for both.
// RESULT snapshot_save_vs_torch_save = median snapshot save / median torch::save, goal <= 1.25;
// RESULT snapshot_load_vs_torch_load likewise.
#include "common.hpp"

#include <nitro/snapshot/snapshot.hpp>

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

int main() {
  namespace fs = std::filesystem;
  at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  const char* env = std::getenv("NITRO_BENCH_DIR");
  const fs::path dir = fs::path(env != nullptr ? env : fs::temp_directory_path().string()) /
                       ("nitro-bench-snapshot-" + std::to_string(::getpid()));
  fs::create_directories(dir);

  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int i = 0; i < 24; ++i) model->push_back(torch::nn::Linear(2048, 2048));
  std::int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-4));
  {
    for (auto& p : model->parameters()) p.mutable_grad() = torch::randn_like(p);
    optimizer.step();
    optimizer.zero_grad(true);
  }
  std::vector<at::Tensor> tensors;
  for (auto& p : model->parameters()) {
    tensors.push_back(p);
    auto& s = static_cast<torch::optim::AdamParamState&>(*optimizer.state().at(p.unsafeGetTensorImpl()));
    tensors.push_back(s.exp_avg());
    tensors.push_back(s.exp_avg_sq());
  }
  std::int64_t bytes = 0;
  for (const auto& t : tensors) bytes += static_cast<std::int64_t>(t.nbytes());
  std::printf("bench_snapshot: %lld parameters, %.0f MB of parameters and Adam state, %s, in %s\n",
              static_cast<long long>(params), static_cast<double>(bytes) / 1e6, nitro::bench::machine().c_str(),
              dir.string().c_str());

  const fs::path ours = dir / "snapshot-000000000001-000000.nitro", theirs = dir / "torch.pt";
  const nitro::snapshot::Contents contents{.model = model.ptr().get(), .optimizer = &optimizer};
  const auto save_ours = [&] { nitro::snapshot::save(ours, contents); };
  const auto save_torch = [&] { torch::save(tensors, theirs.string()); };
  // Warm-up: one of each (allocations, page cache), not timed.
  save_ours();
  save_torch();
  const auto [s_ours, s_torch] = nitro::bench::interleaved(save_ours, save_torch, 5, 1);
  double no_fsync = nitro::bench::seconds([&] { nitro::snapshot::save(ours, contents, {.fsync = false}); });

  const auto load_ours = [&] { nitro::snapshot::load(ours, contents); };
  const auto load_torch = [&] {
    std::vector<at::Tensor> back;
    torch::load(back, theirs.string());
  };
  load_ours();
  load_torch();
  const auto [l_ours, l_torch] = nitro::bench::interleaved(load_ours, load_torch, 9, 1);

  // For reference, not goals: a file of format version 1 (whose parts are checked with XXH64), and
  // what restoring the live model from torch::load's tensors adds (the copy into place that
  // snapshot::load does after its checks).
  const fs::path v1 = dir / "snapshot-000000000001-000001.nitro";
  nitro::snapshot::save(v1, contents, {.fsync = false, .format_version = 1});
  std::vector<double> l_v1;
  for (int i = 0; i < 3; ++i) l_v1.push_back(nitro::bench::seconds([&] { nitro::snapshot::load(v1, contents); }));
  std::vector<double> l_torch_copy;
  for (int i = 0; i < 3; ++i)
    l_torch_copy.push_back(nitro::bench::seconds([&] {
      std::vector<at::Tensor> back;
      torch::load(back, theirs.string());
      torch::NoGradGuard no_grad;
      for (std::size_t k = 0; k < back.size(); ++k) tensors[k].copy_(back[k]);
    }));

  const double so = nitro::bench::median(s_ours), st = nitro::bench::median(s_torch);
  const double lo = nitro::bench::median(l_ours), lt = nitro::bench::median(l_torch);
  std::printf("%-34s %10s %10s\n", "", "median s", "GB/s");
  std::printf("%-34s %10.3f %10.2f\n", "snapshot::save (fsync)", so, bytes / so / 1e9);
  std::printf("%-34s %10.3f %10.2f\n", "snapshot::save (no fsync, once)", no_fsync, bytes / no_fsync / 1e9);
  std::printf("%-34s %10.3f %10.2f\n", "torch::save", st, bytes / st / 1e9);
  std::printf("%-34s %10.3f %10.2f\n", "snapshot::load (all checked)", lo, bytes / lo / 1e9);
  const double lv1 = nitro::bench::median(l_v1);
  std::printf("%-34s %10.3f %10.2f\n", "snapshot::load, format version 1", lv1, bytes / lv1 / 1e9);
  std::printf("%-34s %10.3f %10.2f\n", "torch::load", lt, bytes / lt / 1e9);
  const double ltc = nitro::bench::median(l_torch_copy);
  std::printf("%-34s %10.3f %10.2f\n", "torch::load + copy into the model", ltc, bytes / ltc / 1e9);
  std::printf("file sizes: snapshot %.1f MB, torch::save %.1f MB\n", static_cast<double>(fs::file_size(ours)) / 1e6,
              static_cast<double>(fs::file_size(theirs)) / 1e6);
  std::error_code ec;
  fs::remove(ours, ec);
  fs::remove(v1, ec);
  fs::remove(theirs, ec);
  fs::remove(dir, ec);
  nitro::bench::result("snapshot_save_vs_torch_save", so / st, "<=", 1.25);
  nitro::bench::result("snapshot_load_vs_torch_load", lo / lt, "<=", 1.25);
  return 0;
}
