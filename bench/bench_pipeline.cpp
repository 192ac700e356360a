// bench_pipeline: the input side (include/nitro/data/).
//
//   RESULT recordfile_vs_torch_load=<samples/s from a RecordFile / from torch::load per sample> goal>=5
//       about 1 GB of uint8 3x224x224 images with int64 labels (7000 samples), written once as one
//       record file and as one torch::save file per sample; an epoch reads every sample in a shuffled
//       order and stacks batches of 64 (the copy into a batch is the read for both); both from the page
//       cache (one untimed epoch each first), alternating epochs, medians
//
//   RESULT batched_augment_speedup=<per-sample loop time / batched time> goal>=2
//       a batch of 64 uint8 3x224x224 images through augment::Compose<ToFloat, RandomResizedCrop(224),
//       HFlip, ColorJitter(0.4, 0.4, 0.4), Normalize> at once, against the same pipeline called on each
//       image alone (a batch of 1, the same per-sample draws), CPU, alternating, medians
//
//   RESULT gpu_augment_overlap=<step time with augmentation / without> goal<=1.05   (GPU only)
//       a conv net's training step (batch 64 of 3x224x224, SGD) fed by Prefetcher<Cuda> over
//       RecordBatches, its transform on the copy stream: the full augmentation (crop, flip, jitter,
//       normalise) against only uint8 -> float and normalise; one prefetcher per round, alternating
//
//   build-release/bench/bench_pipeline [--samples 7000] [--rounds 3]
#include <nitro/data/augment.hpp>
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/record_file.hpp>
#include <nitro/io/file.hpp>

#include <ATen/ops/randint.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/stack.h>
#include <torch/data/samplers/sequential.h>
#include <torch/nn.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include "common.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// A training step's time with the full augmentation as the prefetcher's transform (on its copy
// stream, beside the step) against a transform that only converts and normalises: one prefetcher per
// round (made and warmed up before the clock), alternating, medians of the per-step times.
void gpu_augment_overlap(const std::shared_ptr<nitro::data::RecordFile>& file, int rounds) {
  std::vector<double> wait_with, wait_without;
  double waited = 0;
  namespace aug = nitro::data::augment;
  using Batch = nitro::data::RecordBatch;
  const c10::Device device = nitro::Cuda::device();
  torch::manual_seed(0);
  auto model = torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, 7).stride(2).padding(3)), torch::nn::ReLU(),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 128, 3).stride(2).padding(1)), torch::nn::ReLU(),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(128, 256, 3).stride(2).padding(1)), torch::nn::ReLU(),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(256, 256, 3).stride(2).padding(1)), torch::nn::ReLU(),
      torch::nn::AdaptiveAvgPool2d(1), torch::nn::Flatten(), torch::nn::Linear(256, 1000));
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const auto full = std::make_shared<aug::Compose<aug::ToFloat, aug::RandomResizedCrop, aug::HFlip, aug::ColorJitter,
                                                  aug::Normalize>>(
      aug::ToFloat{}, aug::RandomResizedCrop{.height = 224, .width = 224}, aug::HFlip{},
      aug::ColorJitter{.brightness = 0.4, .contrast = 0.4, .saturation = 0.4}, aug::Normalize{});
  const auto plain = std::make_shared<aug::Compose<aug::ToFloat, aug::Normalize>>();
  constexpr int warmup = 3, steps = 20;
  const auto run = [&](bool augmented) {
    nitro::PrefetchOptions<Batch> o{.depth = 4, .workers = 2};
    if (augmented)
      o.transform = [full](Batch b) {
        b.data = (*full)(b.data, {.seed = 1, .epoch = 0, .index = b.index});
        return b;
      };
    else
      o.transform = [plain](Batch b) {
        b.data = (*plain)(b.data, {.seed = 1, .epoch = 0, .index = b.index});
        return b;
      };
    auto p = nitro::prefetch<nitro::Cuda>(
        nitro::from_dataset(nitro::data::RecordBatches(file),
                            torch::data::samplers::SequentialSampler(static_cast<std::size_t>(file->size())), 64),
        std::move(o));
    const auto step = [&] {
      const auto asked = std::chrono::steady_clock::now();
      auto b = p.next();
      waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count();
      optimizer.zero_grad();
      torch::cross_entropy_loss(model->forward(b->data), b->target).backward();
      optimizer.step();
    };
    for (int i = 0; i < warmup; ++i) step();
    waited = 0;
    const double per_step = nitro::bench::seconds([&] {
                              for (int i = 0; i < steps; ++i) step();
                            }) /
                            steps;
    (augmented ? wait_with : wait_without).push_back(waited / steps);
    return per_step;
  };
  // The transform alone on one thread (synchronised at the end): what one worker makes a second. Two workers making fewer batches a second than the step takes leave the step waiting in
  // next() (the wait columns): then the step is data-bound, not slowed by sharing the GPU.
  const auto alone = [&](bool augmented) {
    auto source = nitro::from_dataset(nitro::data::RecordBatches(file),
                                      torch::data::samplers::SequentialSampler(static_cast<std::size_t>(file->size())), 64);
    std::vector<Batch> host;
    for (int i = 0; i < 8; ++i) host.push_back(source.produce(*source.claim()));
    const auto once = [&](const Batch& b) {
      const auto d = b.data.to(device, /*non_blocking=*/false);
      return augmented ? (*full)(d, {.seed = 1, .epoch = 0, .index = b.index.to(device)})
                       : (*plain)(d, {.seed = 1, .epoch = 0, .index = b.index.to(device)});
    };
    for (const auto& b : host) (void)once(b);
    nitro::bench::synchronize();
    return nitro::bench::seconds([&] {
             for (const auto& b : host) (void)once(b);
             nitro::bench::synchronize();
           }) /
           static_cast<double>(host.size());
  };
  std::vector<double> with, without;
  run(true);
  run(false);
  wait_with.clear();  // the warm-up rounds count for neither column
  wait_without.clear();
  for (int r = 0; r < rounds + 2; ++r) {
    if (r % 2 == 0) {
      with.push_back(run(true));
      without.push_back(run(false));
    } else {
      without.push_back(run(false));
      with.push_back(run(true));
    }
  }
  const double mw = nitro::bench::median(with) * 1e3, mo = nitro::bench::median(without) * 1e3;
  const double ww = nitro::bench::median(wait_with) * 1e3, wo = nitro::bench::median(wait_without) * 1e3;
  const double aw = alone(true) * 1e3, ao = alone(false) * 1e3;
  std::printf("\nGPU: training step (conv net, batch 64 of 3x224x224) fed by Prefetcher<Cuda>   median ms/step   "
              "of it in next()   transform alone, ms/batch, 1 thread\n");
  std::printf("transform: uint8 -> float, normalise                                        %9.2f %18.2f %18.2f\n", mo, wo,
              ao);
  std::printf("transform: + random resized crop, flip, colour jitter (on the copy stream)  %9.2f %18.2f %18.2f\n", mw, ww,
              aw);
  nitro::bench::result("gpu_augment_overlap", mw / mo, "<=", 1.05);
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t samples = 7000;
  int rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--samples")) samples = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
  }
  const fs::path dir = fs::temp_directory_path() / ("nitro-bench-pipeline-" + std::to_string(::getpid()));
  fs::create_directories(dir / "tensors");
  const nitro::bench::ScopedTree cleanup{dir};

  std::printf("bench_pipeline: cpu (%s), %lld samples of uint8 3x224x224 (%.2f GB), %d rounds\n",
              nitro::bench::machine().c_str(), static_cast<long long>(samples), samples * 150528 / 1e9, rounds);
  {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
    nitro::data::RecordWriter w(dir / "data.nrec", {{"image", at::kByte, {3, 224, 224}}, {"label", at::kLong, {}}},
                                {.chunk_records = 256, .fsync = false});
    for (int64_t i = 0; i < samples; ++i) {
      const auto image = at::randint(0, 256, {3, 224, 224}, gen, at::TensorOptions().dtype(at::kByte));
      w.write({image, at::scalar_tensor(i % 1000, at::kLong)});
      char name[64];
      std::snprintf(name, sizeof name, "%07lld.pt", static_cast<long long>(i));
      torch::save(image, (dir / "tensors" / name).string());
    }
    w.close();
  }
  auto file = nitro::data::RecordFile::open(dir / "data.nrec");
  const auto order = at::randperm(samples, at::TensorOptions().dtype(at::kLong));
  const auto* idx = order.data_ptr<int64_t>();
  std::vector<std::string> names(static_cast<size_t>(samples));
  for (int64_t i = 0; i < samples; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "%07lld.pt", static_cast<long long>(i));
    names[static_cast<size_t>(i)] = (dir / "tensors" / name).string();
  }
  int64_t checksum_a = 0, checksum_b = 0;
  const auto epoch_records = [&] {
    std::vector<at::Tensor> batch;
    for (int64_t i = 0; i < samples; ++i) {
      batch.push_back(file->record(idx[i])[0]);
      if (batch.size() == 64 || i + 1 == samples) {
        checksum_a += at::stack(batch).select(2, 100).sum().item<int64_t>();
        batch.clear();
      }
    }
  };
  const auto epoch_torch_load = [&] {
    std::vector<at::Tensor> batch;
    for (int64_t i = 0; i < samples; ++i) {
      at::Tensor t;
      torch::load(t, names[static_cast<size_t>(idx[i])]);
      batch.push_back(std::move(t));
      if (batch.size() == 64 || i + 1 == samples) {
        checksum_b += at::stack(batch).select(2, 100).sum().item<int64_t>();
        batch.clear();
      }
    }
  };
  epoch_records();  // warm-up: the page cache, the chunk checksums
  epoch_torch_load();
  checksum_a = checksum_b = 0;
  auto [ta, tb] = nitro::bench::interleaved(epoch_records, epoch_torch_load, rounds, 1);
  const double ra = samples / nitro::bench::median(ta), rb = samples / nitro::bench::median(tb);
  std::printf("\nread a shuffled epoch, batches of 64             samples/s      GB/s\n");
  std::printf("torch::load, one file per sample              %10.0f %9.2f\n", rb, rb * 150528 / 1e9);
  std::printf("data::RecordFile (mapped, views)              %10.0f %9.2f\n", ra, ra * 150528 / 1e9);
  std::printf("same samples read (a row of every image summed): %s\n\n", checksum_a == checksum_b ? "yes" : "NO");
  if (checksum_a != checksum_b) {
    std::fprintf(stderr, "bench_pipeline: the two readers read different data\n");
    return 1;
  }
  // --- batched augmentation against a per-sample loop ------------------------------------------
  namespace aug = nitro::data::augment;
  aug::Compose<aug::ToFloat, aug::RandomResizedCrop, aug::HFlip, aug::ColorJitter, aug::Normalize> pipeline{
      {}, {.height = 224, .width = 224}, {}, {.brightness = 0.4, .contrast = 0.4, .saturation = 0.4}, {}};
  std::vector<at::Tensor> first;
  for (int64_t i = 0; i < 64; ++i) first.push_back(file->record(i)[0]);
  const auto batch = at::stack(first);
  const auto index = at::arange(64, at::TensorOptions().dtype(at::kLong));
  at::Tensor batched_out, loop_out;
  const auto batched = [&] { batched_out = pipeline(batch, {.seed = 1, .epoch = 0, .index = index}); };
  const auto loop = [&] {
    std::vector<at::Tensor> outs;
    for (int64_t i = 0; i < 64; ++i)
      outs.push_back(pipeline(batch.slice(0, i, i + 1), {.seed = 1, .epoch = 0, .index = index.slice(0, i, i + 1)}));
    loop_out = at::cat(outs);
  };
  batched();
  loop();
  const double diff = (batched_out - loop_out).abs().max().item<double>();
  auto [tbat, tloop] = nitro::bench::interleaved(batched, loop, rounds + 2, 2);
  const double mb = nitro::bench::median(tbat) * 1e3, ml = nitro::bench::median(tloop) * 1e3;
  std::printf("augment 64 x uint8 3x224x224: crop, flip, jitter, normalise     median ms\n");
  std::printf("each image alone (a loop of 64)                                 %9.1f\n", ml);
  std::printf("the batch at once (augment::Compose)                            %9.1f\n", mb);
  std::printf("largest difference between the two outputs: %.3g\n\n", diff);
  nitro::bench::result("recordfile_vs_torch_load", ra / rb, ">=", 5.0);
  nitro::bench::result("batched_augment_speedup", ml / mb, ">=", 2.0);
  if (nitro::Cuda::available()) gpu_augment_overlap(file, rounds);
  else std::printf("gpu_augment_overlap: not run (no GPU here)\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
  return 1;
}
