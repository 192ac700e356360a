// Prefetcher against no prefetching. RESULT prefetch_vs_ideal = measured step / max(L / W, C), goal <= 1.10,
// for (L = 20, C = 5, W = 4) and (L = 5, C = 5, W = 1); on a GPU, h2d_vs_peak and overlap_ratio.
//
// CPU part. The source is a data set (nitro::from_dataset, SequentialSampler, W workers, depth 2W)
// whose get_batch takes L ms: real work, augmenting SyntheticImages (per sample: flip, pad 4 + random
// crop, brightness/contrast, then the batch normalised per channel; the batch size calibrated at
// start so that this takes --cpu-ms, default 1.5 ms, of one core), then a simulated I/O wait, a sleep
// until L has passed since the call began. On a 2-core machine 4 workers cannot each do 20 ms of CPU
// work beside a 5 ms step, so L there is mostly I/O wait; --io-fraction F makes the CPU part
// (1 - F) L instead, for every row.
// The training step reads its batch, then takes C ms: by default a busy wait on the steady clock
// until C has passed since the step began (one core, exact); --step matmul makes it 128 x 128
// matmuls on one core, their count calibrated at start, which on the 2-core VM this was written on
// was unreliable (the same count took 3.5 to 6.7 ms from run to run, and the matmuls slowed the
// workers' augmenting on the other core by up to 2x).
// Without prefetching a step reads the batch inline then steps (about L + C); with Prefetcher<Cpu>
// the ideal is max(L / W, C), with C as measured alone in the same rounds. The three (inline,
// prefetched, the step alone) run in the same process, rotating which goes first, and a step time
// is the mean over the steady-state window (warm-up steps excluded): the prefetcher's throughput,
// not a typical step.
//
// GPU part (only where a GPU is present): host-to-device throughput of Prefetcher<Cuda> (pageable
// 64 MB batches staged in its pinned pool by 4 workers) against a raw pinned copy_ (cudaMemcpyAsync)
// of the same bytes on a side stream, back to back: h2d_vs_peak, goal >= 0.90; and a step of C ms of
// GPU matmuls on batches whose copy is shorter than C, through Prefetcher<Cuda>, against the same
// step on a batch already on the GPU: overlap_ratio, goal <= 1.10.
//
//   bench_prefetch [--steps N] [--rounds R] [--warmup K] [--cpu-ms X] [--io-fraction F] [--step matmul|spin]
//                  [--configs L,C,W;L,C,W...] [--gpu-ms C] [--no-gpu]
#include "common.hpp"

#include <nitro/data/prefetcher.hpp>
#include <nitro/data/synthetic.hpp>

#include <torch/torch.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if NITRO_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Args {
  int steps = 40, rounds = 3, warmup = 5;
  double cpu_ms = 1.5, io_fraction = -1;  // < 0: the CPU part is cpu_ms for every row
  bool spin = true, gpu = true;
  double gpu_ms = 5;
  std::vector<std::array<double, 3>> configs{{20, 5, 4}, {5, 5, 1}, {20, 5, 1}, {2, 5, 1}};
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_prefetch: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--steps") a.steps = std::stoi(value());
    else if (k == "--rounds") a.rounds = std::stoi(value());
    else if (k == "--warmup") a.warmup = std::stoi(value());
    else if (k == "--cpu-ms") a.cpu_ms = std::stod(value());
    else if (k == "--io-fraction") a.io_fraction = std::stod(value());
    else if (k == "--step") {
      const auto v = value();
      if (v != "spin" && v != "matmul") {
        std::fprintf(stderr, "bench_prefetch: --step wants spin or matmul, got %s\n", v.c_str());
        std::exit(2);
      }
      a.spin = v == "spin";
    }
    else if (k == "--gpu-ms") a.gpu_ms = std::stod(value());
    else if (k == "--no-gpu") a.gpu = false;
    else if (k == "--configs") {
      a.configs.clear();
      std::stringstream all(value());
      std::string one;
      while (std::getline(all, one, ';')) {
        std::array<double, 3> c{};
        if (std::sscanf(one.c_str(), "%lf,%lf,%lf", &c[0], &c[1], &c[2]) != 3 || c[2] < 1) {
          std::fprintf(stderr, "bench_prefetch: --configs wants L,C,W;L,C,W..., got '%s'\n", one.c_str());
          std::exit(2);
        }
        a.configs.push_back(c);
      }
    } else {
      std::fprintf(stderr, "bench_prefetch: unknown argument %s\n", k.c_str());
      std::exit(2);
    }
  }
  if (a.steps < 1 || a.rounds < 1 || a.warmup < 0 || a.io_fraction > 1) {
    std::fprintf(stderr, "bench_prefetch: --steps and --rounds must be >= 1, --warmup >= 0, --io-fraction <= 1\n");
    std::exit(2);
  }
  return a;
}

// ---------------------------------------------------------------------------------------------
// CPU part: the source.

/// Time spent in get_batch, summed over every copy of the data set (the workers' included).
struct SourceStats {
  std::atomic<std::int64_t> cpu_ns{0}, total_ns{0}, batches{0};
  void reset() { cpu_ns = total_ns = batches = 0; }
};

/// A batch of `indices.size()` augmented SyntheticImages, then a simulated I/O wait for the rest of
/// `l` (a sleep until l has passed since the call began), so a batch takes l whatever the CPU part
/// costs at that moment, as long as it fits. The target holds the sample indices, so the consumer
/// can check the order it receives.
class AugmentedImages
    : public torch::data::datasets::BatchDataset<AugmentedImages, torch::data::Example<>, std::vector<std::size_t>> {
 public:
  AugmentedImages(at::Tensor base, std::size_t size, std::chrono::microseconds l, std::shared_ptr<SourceStats> stats)
      : base_(std::move(base)), size_(size), l_(l), stats_(std::move(stats)) {
    mean_ = base_.mean({0, 2, 3}).view({1, -1, 1, 1});
    std_ = base_.std({0, 2, 3}).view({1, -1, 1, 1});
  }

  torch::data::Example<> get_batch(std::vector<std::size_t> indices) override {
    const auto start = Clock::now();
    auto batch = augment(indices);
    const auto worked = Clock::now();
    if (l_.count() > 0) std::this_thread::sleep_until(start + l_);  // "reading": the rest of L
    const auto end = Clock::now();
    if (stats_) {
      stats_->cpu_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(worked - start).count();
      stats_->total_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count();
      ++stats_->batches;
    }
    return batch;
  }

  /// The real work: flip, pad + crop, brightness/contrast per sample, then normalise the batch.
  torch::data::Example<> augment(const std::vector<std::size_t>& indices) const {
    std::mt19937 rng(static_cast<std::uint32_t>(indices.empty() ? 0 : indices.front() * 2654435761u));
    std::uniform_real_distribution<float> u(0.f, 1.f);
    std::vector<at::Tensor> images;
    images.reserve(indices.size());
    const auto n = base_.size(0), h = base_.size(2), w = base_.size(3);
    for (auto i : indices) {
      at::Tensor img = base_[static_cast<std::int64_t>(i) % n];
      if (rng() & 1u) img = img.flip({2});
      const auto padded = at::constant_pad_nd(img, {4, 4, 4, 4}, 0);
      img = padded.narrow(1, static_cast<std::int64_t>(rng() % 9), h).narrow(2, static_cast<std::int64_t>(rng() % 9), w);
      images.push_back(img.mul(0.8f + 0.4f * u(rng)).add_(0.2f * u(rng) - 0.1f));
    }
    auto x = at::stack(images).sub_(mean_).div_(std_);
    std::vector<std::int64_t> idx(indices.begin(), indices.end());
    return {std::move(x), torch::tensor(idx, at::kLong)};
  }

  std::optional<std::size_t> size() const override { return size_; }

 private:
  at::Tensor base_, mean_, std_;
  std::size_t size_;
  std::chrono::microseconds l_;
  std::shared_ptr<SourceStats> stats_;
};

// ---------------------------------------------------------------------------------------------
// CPU part: the training step.

class Step {
 public:
  Step(double ms, bool spin) : ms_(ms), spin_(spin) {
    a_ = torch::randn({128, 128});
    b_ = torch::randn({128, 128});
    c_ = torch::empty({128, 128});
  }

  /// Calibrates the matmul count to ms_ on `batch`; returns the measured median step in ms.
  double calibrate(const torch::data::Example<>& batch) {
    if (spin_) return measure(batch);
    reps_ = 8;
    for (int i = 0; i < 3; ++i) (*this)(batch);
    for (int iter = 0; iter < 3; ++iter) {  // proportional refinement on the median of 15 steps
      const double m = measure(batch);
      reps_ = std::max(1, static_cast<int>(std::lround(reps_ * ms_ / m)));
    }
    return measure(batch);
  }

  void operator()(const torch::data::Example<>& batch) {
    const auto start = Clock::now();
    sink_ += batch.data.sum().item<double>();  // the step reads its batch
    if (spin_) {
      const auto until =
          start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms_));
      while (Clock::now() < until) {
      }
      return;
    }
    for (int i = 0; i < reps_; ++i) {
      at::mm_out(c_, a_, b_);
      std::swap(b_, c_);
      b_.mul_(1.0f / 128.0f);  // keeps the values bounded
    }
  }

  [[nodiscard]] int reps() const { return reps_; }

 private:
  double measure(const torch::data::Example<>& batch) {
    std::vector<double> t;
    for (int i = 0; i < 15; ++i) {
      const auto s = Clock::now();
      (*this)(batch);
      t.push_back(ms_since(s));
    }
    return nitro::bench::median(t);
  }

  double ms_;
  bool spin_;
  int reps_ = 1;
  double sink_ = 0;
  at::Tensor a_, b_, c_;
};

/// A RESULT line to print at the end.
struct Goal {
  std::string name;
  double value;
  std::string op;
  double goal;
};

struct RunStats {
  double step_ms = 0;     // mean over the steady-state window: (end of last step - end of warm-up) / steps
  double compute_ms = 0;  // mean time inside the step
  double wait_ms = 0;     // mean time getting the batch (inline: reading it; prefetched: waiting in next())
  double source_ms = 0;   // mean get_batch time seen by the source (all batches it made), and its CPU part
  double source_cpu_ms = 0;
  bool in_order = true;
};

struct Totals {
  double step = 0, compute = 0, wait = 0, source = 0, source_cpu = 0;
  int runs = 0;
  bool in_order = true;
  void add(const RunStats& r) {
    step += r.step_ms, compute += r.compute_ms, wait += r.wait_ms, source += r.source_ms, source_cpu += r.source_cpu_ms;
    in_order = in_order && r.in_order;
    ++runs;
  }
  [[nodiscard]] double mean_step() const { return step / runs; }
};

/// Reads batch after batch and steps on each; `next` is the batch source (inline or prefetched, or a
/// ready batch). Checks that batch i holds samples [i * batch, (i + 1) * batch) unless batch is 0.
template <class Next>
RunStats drive(Next&& next, Step& step, std::size_t batch, int warmup, int steps, SourceStats& stats) {
  RunStats r;
  stats.reset();
  Clock::time_point window_start = Clock::now();
  double compute = 0, wait = 0;
  std::int64_t expected = 0;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto t0 = Clock::now();
    if (i == warmup) window_start = t0;
    std::optional<torch::data::Example<>> b = next();
    const auto t1 = Clock::now();
    if (!b) {
      std::fprintf(stderr, "bench_prefetch: the source ended early, at step %d\n", i);
      std::exit(1);
    }
    if (batch > 0 && (b->target.size(0) != static_cast<std::int64_t>(batch) ||
                      b->target[0].item<std::int64_t>() != expected))
      r.in_order = false;
    expected += static_cast<std::int64_t>(batch);
    step(*b);
    const auto t2 = Clock::now();
    if (i >= warmup) compute += ms_between(t1, t2), wait += ms_between(t0, t1);
  }
  r.step_ms = ms_since(window_start) / steps;
  r.compute_ms = compute / steps;
  r.wait_ms = wait / steps;
  const auto n = std::max<std::int64_t>(1, stats.batches.load());
  r.source_ms = static_cast<double>(stats.total_ns.load()) / 1e6 / static_cast<double>(n);
  r.source_cpu_ms = static_cast<double>(stats.cpu_ns.load()) / 1e6 / static_cast<double>(n);
  return r;
}

struct Row {
  double l, c;
  std::size_t w, depth, batch;
  double cpu_ms, io_ms;
  int matmuls;
  Totals without, with, alone;  // alone: the step on a ready batch, no source
  /// max(L / W, C): L as built (augmentation measured alone + the sleep), C as measured alone in the
  /// same rounds (not the C asked for, so an error in the step's calibration does not count).
  [[nodiscard]] double c_alone() const { return alone.mean_step(); }
  [[nodiscard]] double ideal() const { return std::max(l / static_cast<double>(w), c_alone()); }
  /// max(L / W, C) with L and C as they were inside the prefetched runs (contention included).
  [[nodiscard]] double seen_bound() const {
    return std::max(with.source / with.runs / static_cast<double>(w), with.compute / with.runs);
  }
};

Row run_config(const Args& args, const at::Tensor& base, double l, double c, std::size_t w, double per_sample_ms) {
  Row row{.l = l, .c = c, .w = w, .depth = 2 * w};
  // The CPU share of L and the batch size that takes it alone; the rest of L is the sleep.
  const double cpu_target = std::min(l, args.io_fraction >= 0 ? (1 - args.io_fraction) * l : args.cpu_ms);
  // Median of 15 batches (after 3) of n samples; the batch size is corrected once on it.
  AugmentedImages measure_cpu(base, 1 << 20, std::chrono::microseconds(0), nullptr);
  std::vector<std::size_t> idx;
  auto aug_ms = [&](std::size_t n) {
    idx.resize(n);
    std::vector<double> t;
    for (int i = 0; i < 18; ++i) {
      for (std::size_t k = 0; k < n; ++k) idx[k] = static_cast<std::size_t>(i) * n + k;
      const auto s = Clock::now();
      (void)measure_cpu.augment(idx);
      if (i >= 3) t.push_back(ms_since(s));
    }
    return nitro::bench::median(t);
  };
  auto batch_for = [&](double ms_per_sample) {
    return static_cast<std::size_t>(std::max<long>(1, std::lround(cpu_target / ms_per_sample)));
  };
  row.batch = batch_for(per_sample_ms);
  row.batch = batch_for(aug_ms(row.batch) / static_cast<double>(row.batch));
  row.cpu_ms = aug_ms(row.batch);
  const int per_run = args.warmup + args.steps;
  const std::size_t batches = static_cast<std::size_t>(per_run) + 2 * (row.depth + w) + 4;
  auto stats = std::make_shared<SourceStats>();
  const auto ready = measure_cpu.augment(idx);  // the batch of the "alone" runs, and of the step's calibration
  row.io_ms = std::max(0.0, l - row.cpu_ms);
  AugmentedImages data(base, batches * row.batch, std::chrono::microseconds(std::lround(l * 1000)), stats);

  Step step(c, args.spin);
  (void)step.calibrate(ready);
  row.matmuls = step.reps();

  for (int r = 0; r < args.rounds; ++r) {
    for (int order = 0; order < 3; ++order) {  // rotate which goes first
      const int mode = (r + order) % 3;
      if (mode == 2) {
        auto same = [&]() -> std::optional<torch::data::Example<>> { return ready; };
        row.alone.add(drive(same, step, 0, args.warmup, args.steps, *stats));
      } else if (mode == 0) {
        torch::data::samplers::SequentialSampler sampler(data.size().value());
        sampler.reset(data.size().value());
        auto inline_next = [&]() -> std::optional<torch::data::Example<>> {
          auto indices = sampler.next(row.batch);
          if (!indices) return std::nullopt;
          return data.get_batch(std::move(*indices));
        };
        row.without.add(drive(inline_next, step, row.batch, args.warmup, args.steps, *stats));
      } else {
        auto p = nitro::prefetch<nitro::Cpu>(
            nitro::from_dataset(data, torch::data::samplers::SequentialSampler(data.size().value()), row.batch),
            {.depth = row.depth, .workers = w});
        row.with.add(drive([&] { return p.next(); }, step, row.batch, args.warmup, args.steps, *stats));
      }
    }
  }
  return row;
}

// ---------------------------------------------------------------------------------------------
// GPU part.

#if NITRO_WITH_CUDA
/// Batch i is host tensor i % n (pageable or pinned), one tensor per batch.
struct HostTensors : torch::data::datasets::BatchDataset<HostTensors, at::Tensor, std::vector<std::size_t>> {
  std::vector<at::Tensor> tensors;
  std::size_t n = 0;
  at::Tensor get_batch(std::vector<std::size_t> indices) override { return tensors[indices.front() % tensors.size()]; }
  std::optional<std::size_t> size() const override { return n; }
};

HostTensors host_tensors(std::int64_t floats, int count, bool pinned, std::size_t n) {
  HostTensors h;
  h.n = n;
  for (int i = 0; i < count; ++i)
    h.tensors.push_back(at::full({floats}, static_cast<float>(i + 1), at::TensorOptions().pinned_memory(pinned)));
  return h;
}

struct H2d {
  double bytes_per_s = 0;
  std::size_t pinned_allocated = 0;
};

/// Prefetcher<Cuda> bytes/s: the consumer takes each batch and waits for it on its stream. The
/// prefetcher is made and warmed up (its pinned pool filled) before the clock starts.
H2d prefetch_h2d(std::int64_t floats, bool pinned_source, std::size_t workers, int warmup, int batches) {
  const std::size_t depth = 2 * workers;
  auto source =
      host_tensors(floats, 4, pinned_source, static_cast<std::size_t>(warmup + batches) + 2 * (depth + workers) + 4);
  auto p = nitro::prefetch<nitro::Cuda>(
      nitro::from_dataset(source, torch::data::samplers::SequentialSampler(source.n), 1),
      {.depth = depth, .workers = workers, .pin_memory = true, .non_blocking = true});
  auto consumer = c10::cuda::getCurrentCUDAStream();
  for (int i = 0; i < warmup; ++i) {
    auto b = p.next();
    consumer.synchronize();
  }
  const double s = nitro::bench::seconds([&] {
    for (int i = 0; i < batches; ++i) {
      auto b = p.next();
      consumer.synchronize();
    }
  });
  return {static_cast<double>(floats) * 4.0 * batches / s, p.pinned_pool().allocated()};
}

/// Raw pinned host-to-device copies of the same bytes, back to back on a side stream.
double raw_h2d(std::int64_t floats, int warmup, int batches) {
  const auto src = at::full({floats}, 1.0f, at::TensorOptions().pinned_memory(true));
  auto dst = at::empty({floats}, at::TensorOptions().device(nitro::Cuda::device()));
  auto stream = c10::cuda::getStreamFromPool();
  c10::cuda::CUDAStreamGuard guard(stream);
  for (int i = 0; i < warmup; ++i) dst.copy_(src, true);
  stream.synchronize();
  const double s = nitro::bench::seconds([&] {
    for (int i = 0; i < batches; ++i) dst.copy_(src, true);
    stream.synchronize();
  });
  return static_cast<double>(floats) * 4.0 * batches / s;
}

/// What the staging alone moves: `threads` threads, each copying 64 MB float tensors from pageable
/// into pinned memory (PinnedPool::pinned_copy, as a prefetcher's worker stages a batch) `count` times;
/// no device copy. If it is about the prefetcher's rate, staging bounds the prefetcher (info line).
double staging_only(std::int64_t floats, std::size_t threads, int count) {
  std::vector<at::Tensor> sources;
  for (std::size_t t = 0; t < threads; ++t) sources.push_back(at::full({floats}, 1.0f));
  for (auto& s : sources) (void)nitro::PinnedPool::pinned_copy(s);  // warm the host allocator's cache
  const double s = nitro::bench::seconds([&] {
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        for (int i = 0; i < count; ++i) (void)nitro::PinnedPool::pinned_copy(sources[t]);
      });
    for (auto& th : pool) th.join();
  });
  return static_cast<double>(floats) * 4.0 * static_cast<double>(threads) * count / s;
}

/// C ms of matmuls on the current stream that read `batch`.
struct GpuStep {
  at::Tensor a, b, c, acc;
  int reps = 1;
  void operator()(const at::Tensor& batch) {
    acc.add_(batch.sum());
    for (int i = 0; i < reps; ++i) at::mm_out(c, a, b);
  }
};

void gpu_part(const Args& args, std::vector<Goal>& results) {
  const int rounds = 3, warmup = 24, batches = 48;
  const std::int64_t big = 16 * 1024 * 1024;  // 64 MB of float
  const std::size_t workers = 4;
  std::vector<double> raw, pageable, pinned, staging, pageable8;
  std::size_t allocated_pageable = 0, allocated_pinned = 0;
  for (int r = 0; r < rounds; ++r) {
    raw.push_back(raw_h2d(big, 4, batches));
    const auto a = prefetch_h2d(big, false, workers, warmup, batches);
    const auto b = prefetch_h2d(big, true, workers, warmup, batches);
    staging.push_back(staging_only(big, workers, batches / static_cast<int>(workers)));
    pageable8.push_back(prefetch_h2d(big, false, 2 * workers, warmup, batches).bytes_per_s);
    pageable.push_back(a.bytes_per_s), pinned.push_back(b.bytes_per_s);
    allocated_pageable = std::max(allocated_pageable, a.pinned_allocated);
    allocated_pinned = std::max(allocated_pinned, b.pinned_allocated);
  }
  const double peak = nitro::bench::median(raw), via_pageable = nitro::bench::median(pageable),
               via_pinned = nitro::bench::median(pinned);
  std::printf("\nGPU part: host-to-device, 64 MB float batches, %d rounds of %d batches (after %d warm-up), median of "
              "rounds; the consumer waits for each batch on its stream\n",
              rounds, batches, warmup);
  std::printf("%-66s %8s %8s %11s\n", "path", "GB/s", "vs raw", "pinned bufs");
  std::printf("%-66s %8.2f %8.3f %11s\n", "raw pinned copy_(non_blocking) back to back, side stream", peak / 1e9, 1.0,
              "-");
  std::printf("%-66s %8.2f %8.3f %11zu\n", "Prefetcher<Cuda>, pageable source, pin_memory staging, 4 workers",
              via_pageable / 1e9, via_pageable / peak, allocated_pageable);
  std::printf("%-66s %8.2f %8.3f %11zu\n", "Prefetcher<Cuda>, source already pinned, 4 workers", via_pinned / 1e9,
              via_pinned / peak, allocated_pinned);
  // Where the difference goes: the pool stages every CPU tensor, pinned ones too (their owner may
  // refill them while the copy is in flight), so each batch is first a host memcpy on its worker.
  const double staged = nitro::bench::median(staging), eight = nitro::bench::median(pageable8);
  std::printf("%-66s %8.2f %8.3f %11s\n", "staging alone: 4 threads memcpy pageable -> pinned, no device copy",
              staged / 1e9, staged / peak, "-");
  std::printf("%-66s %8.2f %8.3f %11s\n", "Prefetcher<Cuda>, pageable source, 8 workers", eight / 1e9, eight / peak, "-");

  // Overlap: C ms of matmuls per step on a 16 MB batch whose copy takes less than C.
  const std::int64_t small = 4 * 1024 * 1024;  // 16 MB
  const auto opts = at::TensorOptions().device(nitro::Cuda::device());
  GpuStep step{torch::randn({2048, 2048}, opts), torch::randn({2048, 2048}, opts), torch::empty({2048, 2048}, opts),
               torch::zeros({}, opts)};
  const auto resident = at::full({small}, 1.0f, opts);
  for (int i = 0; i < 5; ++i) step(resident);
  step.reps = 20;
  const double t20 = nitro::bench::seconds([&] { step(resident); }) * 1e3;
  step.reps = std::max(1, static_cast<int>(std::lround(20 * args.gpu_ms / t20)));
  const double copy_ms = 1e3 * static_cast<double>(small) * 4.0 / peak;
  const int steps = 40;
  auto consumer = c10::cuda::getCurrentCUDAStream();
  std::vector<double> alone, with, inline_copy;
  auto source = host_tensors(small, 4, false, static_cast<std::size_t>(rounds * (steps + 5) + 64));
  for (int r = 0; r < rounds; ++r) {
    alone.push_back(nitro::bench::seconds([&] {
      for (int i = 0; i < steps; ++i) {
        step(resident);
        consumer.synchronize();  // a loop reading its loss each step
      }
    }) * 1e3 / steps);
    {
      auto p = nitro::prefetch<nitro::Cuda>(
          nitro::from_dataset(source, torch::data::samplers::SequentialSampler(source.n), 1), {.depth = 4, .workers = 2});
      for (int i = 0; i < 5; ++i) {
        auto b = p.next();
        step(*b);
        consumer.synchronize();
      }
      with.push_back(nitro::bench::seconds([&] {
        for (int i = 0; i < steps; ++i) {
          auto b = p.next();
          step(*b);
          consumer.synchronize();
        }
      }) * 1e3 / steps);
    }
    std::size_t k = 0;
    inline_copy.push_back(nitro::bench::seconds([&] {
      for (int i = 0; i < steps; ++i) {
        step(source.tensors[k++ % source.tensors.size()].to(nitro::Cuda::device()));
        consumer.synchronize();
      }
    }) * 1e3 / steps);
  }
  const double m_alone = nitro::bench::median(alone), m_with = nitro::bench::median(with),
               m_inline = nitro::bench::median(inline_copy);
  std::printf("\nGPU part: copy/compute overlap, step = %d matmuls 2048x2048 (calibrated to %.1f ms) on a 16 MB batch "
              "(raw pinned copy %.2f ms), %d steps x %d rounds, mean step per round, median of rounds\n",
              step.reps, args.gpu_ms, copy_ms, steps, rounds);
  std::printf("%-66s %8s %8s\n", "step", "ms", "vs alone");
  std::printf("%-66s %8.3f %8.3f\n", "compute alone (batch already on the GPU)", m_alone, 1.0);
  std::printf("%-66s %8.3f %8.3f\n", "Prefetcher<Cuda> (depth 4, 2 workers, pin_memory)", m_with, m_with / m_alone);
  std::printf("%-66s %8.3f %8.3f\n", "no prefetching: pageable .to(cuda) then compute", m_inline, m_inline / m_alone);
  if (copy_ms >= m_alone)
    std::printf("note: the copy (%.2f ms) is not shorter than the compute (%.2f ms)\n", copy_ms, m_alone);
  results.push_back({"h2d_vs_peak", via_pageable / peak, ">=", 0.90});
  results.push_back({"overlap_ratio", m_with / m_alone, "<=", 1.10});
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  const auto total_start = Clock::now();
  const int default_threads = at::get_num_threads();
  torch::set_num_threads(1);  // each worker and the step use one core each
  torch::manual_seed(0);

  // 256 base images, 3x32x32.
  nitro::data::SyntheticImages images{{.size = 256, .noise = 1.0}};
  const at::Tensor base = images.stacked(0, 256).first;

  // Per-sample augmentation cost (median of 15 batches of 64, one core), for the batch sizes; first
  // 0.3 s of augmenting and matmuls, so that the allocator and the clock speed settle.
  AugmentedImages probe_set(base, 1 << 20, std::chrono::microseconds(0), nullptr);
  std::vector<std::size_t> idx(64);
  for (std::size_t k = 0; k < idx.size(); ++k) idx[k] = k;
  {
    Step warm(1.0, false);
    const auto until = Clock::now() + std::chrono::milliseconds(300);
    while (Clock::now() < until) warm(probe_set.augment(idx));
  }
  std::vector<double> t;
  for (int i = 0; i < 18; ++i) {
    for (std::size_t k = 0; k < idx.size(); ++k) idx[k] = static_cast<std::size_t>(i) * 64 + k;
    const auto s = Clock::now();
    (void)probe_set.augment(idx);
    if (i >= 3) t.push_back(ms_since(s));
  }
  const double per_sample_ms = nitro::bench::median(t) / 64.0;

  std::vector<Row> rows;
  for (const auto& c : args.configs)
    rows.push_back(run_config(args, base, c[0], c[1], static_cast<std::size_t>(c[2]), per_sample_ms));

  std::printf("bench_prefetch: CPU part, Prefetcher<Cpu> over nitro::from_dataset (SequentialSampler, W workers, depth "
              "2W) against reading each batch inline; %s, torch threads 1\n",
              nitro::bench::machine().c_str());
  std::printf("source: L ms per batch = augmenting a batch of SyntheticImages 3x32x32 on one core (per sample flip, "
              "pad 4 + crop, brightness/contrast; batch normalised; %.1f us per sample alone), then a sleep until L "
              "has passed (simulated I/O)\n",
              per_sample_ms * 1e3);
  if (args.io_fraction >= 0)
    std::printf("split: --io-fraction %.2f: %.0f%% of L is I/O wait, the rest augmentation\n", args.io_fraction,
                100 * args.io_fraction);
  else
    std::printf("split: augmentation calibrated to --cpu-ms %.2f, I/O wait = the rest of L (--io-fraction F sets the "
                "split instead)\n",
                args.cpu_ms);
  if (std::thread::hardware_concurrency() <= 2)
    std::printf("note: %u CPU threads: L is mostly I/O wait here (W workers cannot do W x L ms of CPU work beside the "
                "step)\n",
                std::thread::hardware_concurrency());
  std::printf("step: sums its batch, then %s\n",
              args.spin ? "busy-waits on the steady clock until C has passed (one core; --step matmul for real compute)"
                        : "128x128 float matmuls on one core, their count calibrated at start to C (median of 15 steps)");
  std::printf("step ms = mean over the steady-state window (%d steps after %d warm-up, %d runs of each mode, "
              "order rotated)\n",
              args.steps, args.warmup, args.rounds);
  std::printf("%5s %5s %6s %6s %5s %3s %5s %7s | %8s %8s %8s %8s %8s | %7s %7s %7s %8s %8s\n", "L", "aug", "io",
              "batch", "C", "W", "depth", "C alone", "without", "with", "ideal", "w/ideal", "speedup", "C seen", "wait",
              "L seen", "aug seen", "w/seen");
  bool order_ok = true;
  for (const auto& r : rows) {
    const double with = r.with.mean_step(), without = r.without.mean_step();
    std::printf(
        "%5.1f %5.2f %6.2f %6zu %5.1f %3zu %5zu %7.3f | %8.3f %8.3f %8.3f %8.3f %8.2f | %7.3f %7.3f %7.3f %8.3f %8.3f\n",
        r.l, r.cpu_ms, r.io_ms, r.batch, r.c, r.w, r.depth, r.c_alone(), without, with, r.ideal(), with / r.ideal(),
        without / with, r.with.compute / r.with.runs, r.with.wait / r.with.runs, r.with.source / r.with.runs,
        r.with.source_cpu / r.with.runs, with / r.seen_bound());
    order_ok = order_ok && r.with.in_order && r.without.in_order;
  }
  std::printf("columns: aug, io = the split of L (aug measured alone, median of 15; io = the rest); C = asked, C "
              "alone = the step on a ready batch, mean, in the same rounds; without = read inline then step; with = "
              "Prefetcher<Cpu>; ideal = max(L / W, C alone); speedup = without / with; C seen, wait = mean step and "
              "mean wait in next() in the prefetched runs; L seen, aug seen = mean get_batch and its augmentation part "
              "in the workers in those runs; w/seen = with / max(L seen / W, C seen)\n");
  std::printf("order: %s\n", order_ok ? "every batch arrived in sampler order, in every run"
                                       : "WRONG: some batch arrived out of sampler order");
  for (const auto& r : rows)
    std::printf("info: L=%g C=%g W=%zu: speedup over no prefetching %.2f (at most (L + C alone) / ideal = %.2f)%s\n", r.l,
                r.c, r.w, r.without.mean_step() / r.with.mean_step(), (r.l + r.c_alone()) / r.ideal(),
                args.spin ? "" : ("; step = " + std::to_string(r.matmuls) + " matmuls").c_str());

  std::vector<Goal> gpu_results;  // printed with the other RESULT lines, at the end
#if NITRO_WITH_CUDA
  if (args.gpu && nitro::Cuda::available()) {
    torch::set_num_threads(default_threads);  // pinned staging copies may use several cores
    gpu_part(args, gpu_results);
  } else {
    std::printf("\nGPU part: skipped: %s (h2d_vs_peak and overlap_ratio are measured only where a GPU is present)\n",
                args.gpu ? "no GPU" : "--no-gpu");
  }
#else
  (void)default_threads;
  std::printf("\nGPU part: skipped: built without CUDA (h2d_vs_peak and overlap_ratio need Prefetcher<Cuda>)\n");
#endif
  std::printf("info: %.1f s\n", ms_since(total_start) / 1e3);

  for (const auto& r : rows) {
    const bool required = (r.l == 20 && r.c == 5 && r.w == 4) || (r.l == 5 && r.c == 5 && r.w == 1);
    if (!required) continue;
    char name[96];
    std::snprintf(name, sizeof name, "prefetch_vs_ideal_l%g_c%g_w%zu", r.l, r.c, r.w);
    nitro::bench::result(name, r.with.mean_step() / r.ideal(), "<=", 1.10);
  }
  for (const auto& g : gpu_results) nitro::bench::result(g.name, g.value, g.op, g.goal);
  return 0;
}
