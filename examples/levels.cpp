// The levels demo (make demo): the quickstart's CNN on nitro::data::SyntheticImages, trained with a
// plain LibTorch loop and with each optimization level, in one table: samples/s, peak memory,
// final training loss, test accuracy. Each level runs with monitor::Phases and a progress bar, prints
// its phase report and bottleneck advice, and writes its metrics (every 10 steps) to
// <metrics>/<level>.jsonl and .csv, which bench/plot_metrics.py draws, and to TensorBoard event files
// in <metrics>/tensorboard/<level>/; level::Basic's optimizer steps 20-22 are traced with LibTorch's
// profiler into <metrics>/basic.trace.json (open it at https://ui.perfetto.dev).
//
//   build/examples/levels [--epochs 2] [--samples 8192] [--batch 64] [--metrics DIR]
#include <nitro/monitor/trace.hpp>
#include <nitro/nitro.hpp>
#include <nitro/train/autotune.hpp>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>


namespace {

struct Args {
  int epochs = 2;
  std::int64_t samples = 8192;
  std::int64_t batch = 64;
  std::string metrics = "demo-metrics";
};

struct Row {
  std::string name;
  double samples_per_s = 0, peak_mb = 0, final_loss = 0, accuracy = 0;
  std::string report;  // the monitor's summary and advice (levels only)
};

torch::nn::Sequential cnn() {
  torch::manual_seed(0);  // every configuration starts from the same weights
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)),
                               torch::nn::Functional(torch::relu), torch::nn::MaxPool2d(2),
                               torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)),
                               torch::nn::Functional(torch::relu), torch::nn::MaxPool2d(2), torch::nn::Flatten(),
                               torch::nn::Linear(32 * 8 * 8, 10));
}

// Tensor bytes live now and at most since `scope` began: the CUDA caching allocator's on a GPU, the
// tracked CPU tensors' on the CPU (the scope tracks them there).
std::pair<std::int64_t, std::int64_t> tensor_bytes(const nitro::memory::PeakScope& scope) {
  const auto r = scope.result();
  if (r.cuda) return {nitro::memory::cuda_memory(r.cuda->device)->allocated_bytes, r.cuda->peak_allocated_bytes};
  return {r.cpu_live_tensor_bytes.value_or(-1), r.cpu_peak_tensor_bytes.value_or(-1)};
}

// Trains `model` for the epochs with `step(x, y) -> loss tensor` per micro-batch of `batch` samples;
// `watch(loss, memory)` after each step.
template <class Step, class Flush, class Watch>
Row train(const std::string& name, torch::nn::Sequential& model, const Args& args, std::int64_t batch, Step&& step,
          Flush&& flush, Watch&& watch) {
  const bool gpu = nitro::Cuda::available();
  const c10::Device device = gpu ? nitro::Cuda::device() : nitro::Cpu::device();
  nitro::data::SyntheticImages train_set{{.size = args.samples, .noise = 8.0}};
  nitro::data::SyntheticImages test_set{{.size = 1024, .offset = args.samples, .noise = 8.0}};
  torch::manual_seed(1);  // the same sample order for every configuration
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      train_set.map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(batch).workers(2));
  Row row{name};
  const nitro::memory::PeakScope peak{{.track_cpu_tensors = !gpu}};
  double seconds = 0;
  for (int epoch = 0; epoch < args.epochs; ++epoch) {
    model->train();
    auto loss_sum = torch::zeros({}, device);
    std::int64_t seen = 0;
    const auto start = std::chrono::steady_clock::now();
    for (auto& b : *loader) {
      const auto x = b.data.to(device), y = b.target.to(device);
      const auto loss = step(x, y).detach();
      loss_sum += loss * x.size(0);
      seen += x.size(0);
      watch(loss, peak);
    }
    flush();
    row.final_loss = loss_sum.item<double>() / static_cast<double>(seen);  // synchronises
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    row.samples_per_s = static_cast<double>(seen) * (epoch + 1) / seconds;
  }
  row.peak_mb = static_cast<double>(tensor_bytes(peak).second) / 1048576.0;
  model->eval();
  torch::NoGradGuard no_grad;
  const auto [tx, ty] = test_set.stacked(0, 1024);
  row.accuracy = model->forward(tx.to(device)).argmax(1).eq(ty.to(device)).to(torch::kDouble).mean().item<double>();
  return row;
}

// A level, with monitor::Phases added, a progress bar and metric files; SGD with momentum, LibTorch's
// (torch::optim::SGD) or Nitro's fused one (nitro::optim::FusedSGD: the same steps, one kernel).
// Traced: monitor::Trace records optimizer steps 20-22 into <metrics>/<file>.trace.json.
template <class Level, class Optimizer = torch::optim::SGD, bool Traced = false>
Row train_level(const std::string& name, const std::string& file, const Args& args, std::int64_t micro_batch,
                typename Level::Options level_options) {
  using Loop = std::conditional_t<Traced, nitro::level::with<Level, nitro::monitor::Phases, nitro::monitor::Trace>,
                                  nitro::level::with<Level, nitro::monitor::Phases>>;
  // level::Auto: it sets the hardware its pick needs, and tunes at its first step (counted in its
  // samples/s). The demo always tunes, to show the trials; a program of yours keeps the choice in the
  // decision cache and starts at once the next time (NITRO_AUTOTUNE=force tunes again).
  constexpr bool is_auto = requires { Level::candidates; };
  const bool gpu = nitro::Cuda::available();
  auto model = cnn();
  model->to(gpu ? nitro::Cuda::device() : nitro::Cpu::device());
  Optimizer optimizer(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
  std::optional<nitro::hw::ScopedSettings> hw;
  typename Loop::Options options;
  if constexpr (is_auto) {
    options.tune = level_options.tune;
    options.tune.mode = nitro::tune::Mode::force;
    options.tune.print_table = false;  // it is in the report below
  } else {
    hw.emplace(nitro::level::hardware<Level>());
    options.amp = level_options.amp;
    options.accumulate = level_options.accumulate;
    options.checkpoint = level_options.checkpoint;
    options.clip = level_options.clip;
  }
  if constexpr (is_auto) {
  } else if constexpr (Traced) {
    static_assert(std::tuple_size_v<decltype(level_options.hooks)> == 0, "levels demo: trace a level without hooks");
    options.hooks = {nitro::monitor::Trace::Options{
        .path = std::filesystem::path(args.metrics) / (file + ".trace.json"), .start = 20, .steps = 3}};
  } else {
    options.hooks = level_options.hooks;
  }
  std::filesystem::create_directories(args.metrics);
  Loop loop{model, optimizer, options};

  const std::int64_t steps = args.epochs * ((args.samples + micro_batch - 1) / micro_batch);
  nitro::monitor::ProgressBar bar{{.total = steps, .desc = name, .loss_every = 10}};
  const auto tensorboard = std::filesystem::path(args.metrics) / "tensorboard" / file;
  // The last demo's run of this level. Not std::filesystem::remove_all, which crashes in a program
  // linked with LibTorch (nitro/io/file.hpp says why).
  nitro::io::remove_tree(tensorboard);
  nitro::monitor::Sinks sinks{nitro::monitor::JsonLinesSink{std::filesystem::path(args.metrics) / (file + ".jsonl")},
                              nitro::monitor::CsvSink{std::filesystem::path(args.metrics) / (file + ".csv")},
                              nitro::monitor::TensorBoardSink{tensorboard}};
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  std::int64_t written = 0, samples = 0, samples_then = 0;
  nitro::monitor::Totals phases_then{};
  // A metrics row (and one .item()) every 10 optimizer steps, so levels with accumulation line up.
  constexpr std::int64_t kEvery = 10;
  auto watch = [&](const at::Tensor& loss, const nitro::memory::PeakScope& memory) {
    if constexpr (is_auto) {
      if (samples == 0) bar.set_postfix(loop.describe());  // what it chose, on the progress line
    }
    bar.update(1, loss);
    samples += micro_batch;
    const std::int64_t step = loop.optimizer_steps();
    if (step % kEvery != 0 || step == written) return;
    written = step;
    const auto now = std::chrono::steady_clock::now();
    const auto [live, peak] = tensor_bytes(memory);
    sinks.write({.step = step,
                 .time_s = std::chrono::duration<double>(now - start).count(),
                 .loss = loss.item<double>(),
                 .lr = optimizer.param_groups()[0].options().get_lr(),
                 .samples_per_s = static_cast<double>(samples - samples_then) / std::chrono::duration<double>(now - last).count(),
                 .memory_bytes = live,
                 .peak_memory_bytes = peak});
    // The phases' mean times since the last row, as TensorBoard scalars beside the row's.
    const auto& totals = loop.monitor().totals();
    if (const auto steps_now = totals.steps - phases_then.steps; steps_now > 0) {
      const auto mean = [&](nitro::Phase p) {
        const auto i = static_cast<std::size_t>(p);
        return (totals.phase_ms[i] - phases_then.phase_ms[i]) / static_cast<double>(steps_now);
      };
      sinks.template get<2>().scalars(step, {{"phase/data_ms", mean(nitro::Phase::data)},
                                             {"phase/forward_ms", mean(nitro::Phase::forward)},
                                             {"phase/backward_ms", mean(nitro::Phase::backward)},
                                             {"phase/optimizer_ms", mean(nitro::Phase::optimizer)}});
      phases_then = totals;
    }
    last = now;
    samples_then = samples;
  };
  Row row = train(
      name, model, args, micro_batch,
      [&](const at::Tensor& x, const at::Tensor& y) {
        return loop
            .step(std::make_pair(x, y),
                  [](auto& forward, const auto& b) { return torch::cross_entropy_loss(forward(b.first), b.second); })
            .loss;
      },
      [&] { loop.flush(); }, watch);
  bar.close();
  sinks.close();
  if constexpr (is_auto) row.name += " -> " + loop.result().name;
  const auto summary = nitro::monitor::summarize(loop);
  row.report = nitro::monitor::format(summary) + "advice:\n" + nitro::monitor::format(nitro::monitor::bottlenecks(summary));
  return row;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view arg = argv[i];
    if (arg == "--epochs") a.epochs = std::stoi(argv[i + 1]);
    else if (arg == "--samples") a.samples = std::stoll(argv[i + 1]);
    else if (arg == "--batch") a.batch = std::stoll(argv[i + 1]);
    else if (arg == "--metrics") a.metrics = argv[i + 1];
    else nitro::detail::fail("levels: unknown option ", arg, "; use --epochs, --samples, --batch, --metrics");
  }
  NITRO_CHECK(a.epochs >= 1 && a.samples >= 1 && a.batch >= 2 && a.batch % 2 == 0,
              "levels: epochs and samples must be >= 1, batch an even number >= 2");
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  const bool gpu = nitro::Cuda::available();
  std::printf("Nitro %s levels demo: CNN on SyntheticImages (%lld samples of 3x32x32, noise 8), batch %lld, "
              "%d epochs, SGD, on %s\n",
              nitro::version_string, static_cast<long long>(args.samples), static_cast<long long>(args.batch),
              args.epochs, gpu ? "cuda" : "cpu");
  auto plain = [&](const Args& a) {
    auto model = cnn();
    model->to(gpu ? nitro::Cuda::device() : nitro::Cpu::device());
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
    return train(
        "plain LibTorch loop", model, a, a.batch,
        [&](const at::Tensor& x, const at::Tensor& y) {
          optimizer.zero_grad();
          auto loss = torch::cross_entropy_loss(model->forward(x), y);
          loss.backward();
          optimizer.step();
          return loss;
        },
        [] {}, [](const at::Tensor&, const nitro::memory::PeakScope&) {});
  };
  plain({.epochs = 1, .samples = 1024, .batch = args.batch});  // warm-up: thread pools, kernels, allocator
  std::vector<Row> rows;
  rows.push_back(plain(args));
  rows.push_back(train_level<nitro::level::Basic, torch::optim::SGD, /*Traced=*/true>("level::Basic", "basic", args,
                                                                                      args.batch, {}));
  rows.push_back(train_level<nitro::level::Basic, nitro::optim::FusedSGD>("level::Basic + FusedSGD", "basic_fused", args,
                                                                          args.batch, {}));
  rows.push_back(train_level<nitro::level::Advanced>("level::Advanced (bf16)", "advanced", args, args.batch, {}));
  rows.push_back(train_level<nitro::level::Ultra>(
      "level::Ultra (bf16, 2x" + std::to_string(args.batch / 2) + " accum, sqrt ckpt, clip)", "ultra", args, args.batch / 2,
      {.accumulate = nitro::accumulate::Dynamic::for_batch(args.batch, args.batch / 2), .clip = {.max_norm = 5.0}}));
  // level::Auto tries the three levels (and channels-last, the fused optimizer, the thread count) on
  // this CNN and machine, then trains with the fastest.
  rows.push_back(train_level<nitro::level::Auto<nitro::level::Basic, nitro::level::Advanced, nitro::level::Ultra>>(
      "level::Auto", "auto", args, args.batch, {}));
  // level::Max replays each step from a CUDA graph: on a GPU only (graph/capture.hpp).
  if (gpu)
    rows.push_back(train_level<nitro::level::Max, nitro::optim::FusedSGD>("level::Max (bf16, CUDA graph) + FusedSGD",
                                                                        "max", args, args.batch, {}));

  std::printf("%-70s %10s %9s %11s %14s\n", "configuration", "samples/s", "peak MB", "final loss", "test accuracy");
  for (const auto& r : rows)
    std::printf("%-70s %10.0f %9.1f %11.4f %14.4f\n", r.name.c_str(), r.samples_per_s, r.peak_mb, r.final_loss,
                r.accuracy);
  std::printf("peak MB: the most tensor memory live at once during training (%s)\n",
              gpu ? "CUDA caching allocator" : "CPU tensors, nitro::memory::ScopedCpuTracking");
  for (const auto& r : rows) {
    if (r.report.empty()) continue;
    std::printf("\n%s, monitor::Phases (per micro-batch step):\n%s", r.name.c_str(), r.report.c_str());
  }
  std::printf("\nmetrics (a row every 10 optimizer steps): %s/{basic,basic_fused,advanced,ultra,auto%s}.{jsonl,csv}; plot them with\n"
              "  python3 bench/plot_metrics.py %s/*.jsonl -o metrics.png\n",
              args.metrics.c_str(), gpu ? ",max" : "", args.metrics.c_str());
  std::printf("TensorBoard event files, one run per level: %s/tensorboard/; view them with\n"
              "  tensorboard --logdir %s/tensorboard      (then open http://localhost:6006)\n",
              args.metrics.c_str(), args.metrics.c_str());
  std::printf("a trace of level::Basic's optimizer steps 20-22: %s/basic.trace.json; open it at https://ui.perfetto.dev "
              "(Open trace file) or chrome://tracing\n",
              args.metrics.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "levels: %s\n", e.what());
  return 1;
}
