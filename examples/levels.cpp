// The levels demo (make demo): the quickstart's CNN on nitro::data::SyntheticImages, trained with a
// plain LibTorch loop and with each optimization level, in one table: samples/s, peak memory,
// final training loss, test accuracy. Each level runs with monitor::Phases and a progress bar, prints
// its phase report and bottleneck advice, and writes its metrics (every 10 steps) to
// <metrics>/<level>.jsonl and .csv, which bench/plot_metrics.py draws, and to TensorBoard event files
// in <metrics>/tensorboard/<level>/; level::Basic's optimizer steps 20-22 are traced with LibTorch's
// profiler into <metrics>/basic.trace.json (open it at https://ui.perfetto.dev).
//
// level::Auto trains first: its trials measure each candidate level on this machine, and a level the
// trial measured more than --trial-only-slower-than times slower than level::Basic (3: bf16 autocast
// on a CPU without bf16 arithmetic), and a second trial against level::Basic again, is shown from its
// trial, marked so in the table (its samples/s and peak memory as the second trial measured them, no
// loss, accuracy or metrics files), not trained for the epochs. --train-all trains every level (and level::Auto last, after the fixed levels);
// --trial-only-slower-than 0 shows every level that has a trial (Advanced, Ultra) from it, to see
// that path on a machine where bf16 is fast. The end says how long the training took in all.
//
//   build/examples/levels [--epochs 2] [--samples 8192] [--batch 64] [--metrics DIR] [--train-all]
//                         [--trial-only-slower-than 3]
#include <nitro/monitor/trace.hpp>
#include <nitro/nitro.hpp>
#include <nitro/train/autotune.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>


namespace {

struct Args {
  int epochs = 2;
  std::int64_t samples = 8192;
  std::int64_t batch = 64;
  std::string metrics = "demo-metrics";
  bool train_all = false;                // every level trained, level::Auto last, no trial-only rows
  double trial_only_slower_than = 3.0;  // a level this many times slower than Basic in the trial: not trained
};

struct Row {
  std::string name;
  double samples_per_s = 0, peak_mb = 0, final_loss = 0, accuracy = 0;
  std::string report;  // the monitor's summary and advice (levels only)
  std::string mark;    // for a row shown from level::Auto's trial: "(trial only: 4.1x slower than Basic here)"
  std::optional<nitro::tune::Result> tuned;  // level::Auto's: what it tried, measured and chose
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
  if constexpr (is_auto) {
    row.name += " -> " + loop.result().name;
    row.tuned = loop.result();
  }
  const auto summary = nitro::monitor::summarize(loop);
  row.report = nitro::monitor::format(summary) + "advice:\n" + nitro::monitor::format(nitro::monitor::bottlenecks(summary));
  return row;
}

Args parse(int argc, char** argv) {
  Args a;
  constexpr const char* kUsage = "use --epochs N, --samples N, --batch N, --metrics DIR, --train-all, "
                                 "--trial-only-slower-than X";
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--train-all") {
      a.train_all = true;
      continue;
    }
    const bool known = arg == "--epochs" || arg == "--samples" || arg == "--batch" || arg == "--metrics" ||
                       arg == "--trial-only-slower-than";
    if (!known) nitro::detail::fail("levels: unknown option ", arg, "; ", kUsage);
    if (i + 1 == argc) nitro::detail::fail("levels: ", arg, " needs a value; ", kUsage);
    const char* value = argv[++i];
    if (arg == "--epochs") a.epochs = std::stoi(value);
    else if (arg == "--samples") a.samples = std::stoll(value);
    else if (arg == "--batch") a.batch = std::stoll(value);
    else if (arg == "--metrics") a.metrics = value;
    else a.trial_only_slower_than = std::stod(value);
  }
  NITRO_CHECK(a.epochs >= 1 && a.samples >= 1 && a.batch >= 2 && a.batch % 2 == 0,
              "levels: epochs and samples must be >= 1, batch an even number >= 2");
  NITRO_CHECK(std::isfinite(a.trial_only_slower_than) && a.trial_only_slower_than >= 0,
              "levels: --trial-only-slower-than must be a number >= 0 (0: every level with a trial from its trial)");
  return a;
}

// The first trial of candidate `candidate` in level::Auto's table (the candidate as given: the first
// round tries each in the list's order before any variation), when it measured a speed: its verdict
// "ok" or "slower (stopped ...)", which still timed its steps; null after an error or out of memory.
const nitro::tune::Trial* measured_trial(const nitro::tune::Result& tuned, std::size_t candidate) {
  for (const auto& t : tuned.trials) {
    if (t.choice.candidate != candidate) continue;
    return t.steps_timed > 0 && t.samples_per_s > 0 ? &t : nullptr;
  }
  return nullptr;
}

// A second trial of level::Basic against Level (nitro::autotune, the same CNN, optimizer and batch size,
// no variations), each trial unstopped: the median of its 4 timed steps. level::Auto's trial of a level
// it finds far slower stops early, at times after a single step, which another program on a shared
// machine can make many times slower than the level is.
template <class Level>
nitro::tune::Result trial_again(const Args& args) {
  const c10::Device device = nitro::Cuda::available() ? nitro::Cuda::device() : nitro::Cpu::device();
  auto model = cnn();
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
  nitro::data::SyntheticImages data{{.size = args.samples, .noise = 8.0}};
  const auto [x, y] = data.stacked(0, std::min(args.batch, args.samples));
  const auto batch = std::make_pair(x.to(device), y.to(device));
  nitro::tune::Options o;
  o.prune_after = 0;  // every trial runs all its steps
  o.channels_last = false;
  o.fused_optimizer = false;
  o.cpu_threads = {at::get_num_threads()};  // the thread count as it is: no variation tried
  o.mode = nitro::tune::Mode::force;
  o.cache_dir.clear();  // nothing read or written
  o.print_table = false;
  o.log = [](const std::string&) {};
  return nitro::autotune<nitro::level::Basic, Level>(
      model, optimizer, [&] { return batch; },
      [](auto& forward, const auto& b) { return torch::cross_entropy_loss(forward(b.first), b.second); }, o);
}

// A level shown from its trials instead of trained, or nullopt: train it. It is shown from them when
// level::Auto's trial (`tuned`, where the level is candidate `candidate` and level::Basic candidate 0)
// measured it more than --trial-only-slower-than times slower than level::Basic, and a second trial
// (trial_again) measured it so again; the row has the second trial's samples/s and peak memory.
template <class Level>
std::optional<Row> from_trial(const std::string& name, const std::string& file, const Args& args,
                              const std::optional<nitro::tune::Result>& tuned, std::size_t candidate) {
  if (args.train_all || !tuned) return std::nullopt;
  const auto slower_than_basic = [](const nitro::tune::Result& r, std::size_t i) -> std::optional<double> {
    const auto* basic = measured_trial(r, 0);
    const auto* level = measured_trial(r, i);
    if (basic == nullptr || level == nullptr) return std::nullopt;
    return basic->samples_per_s / level->samples_per_s;
  };
  const auto first = slower_than_basic(*tuned, candidate);
  if (!first || !(*first > args.trial_only_slower_than)) return std::nullopt;
  nitro::tune::Result again;
  try {
    again = trial_again<Level>(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: its second trial failed (%s); training it\n", name.c_str(), e.what());
    return std::nullopt;
  }
  const auto second = slower_than_basic(again, 1);
  std::fprintf(stderr, "%s: %.1fx level::Basic's time a sample in level::Auto's trial, %.1fx in a second trial: %s\n",
               name.c_str(), *first, second.value_or(NAN),
               second && *second > args.trial_only_slower_than ? "not trained" : "trained");
  if (!second || !(*second > args.trial_only_slower_than)) return std::nullopt;
  const auto* level = measured_trial(again, 1);
  Row row{name};
  row.samples_per_s = level->samples_per_s;
  row.peak_mb = level->peak_bytes >= 0 ? static_cast<double>(level->peak_bytes) / 1048576.0 : NAN;
  row.final_loss = row.accuracy = NAN;
  char mark[96];
  if (*second >= 1) std::snprintf(mark, sizeof mark, "(trial only: %.1fx slower than Basic here)", *second);
  else std::snprintf(mark, sizeof mark, "(trial only: %.1fx faster than Basic here)", 1 / *second);
  row.mark = mark;
  // No metrics of this level: the files of an earlier run that trained it would be drawn as this run's.
  const std::filesystem::path dir = args.metrics;
  for (const auto& stale : {dir / (file + ".jsonl"), dir / (file + ".csv"), dir / "tensorboard" / file})
    nitro::io::remove_tree(stale);
  return row;
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
  const auto started = std::chrono::steady_clock::now();
  plain({.epochs = 1, .samples = 1024, .batch = args.batch});  // warm-up: thread pools, kernels, allocator
  // level::Auto tries the three levels (and level::Max on a GPU; channels-last, the fused optimizer,
  // the thread count) on this CNN and machine, then trains with the fastest. It trains first: its trials say which of the
  // fixed levels are too slow here to train (from_trial). With --train-all it trains last, as the
  // fixed levels' runs do not depend on it then.
  using AutoLevel = nitro::level::Auto<nitro::level::Basic, nitro::level::Advanced, nitro::level::Ultra>;
  static_assert(std::is_same_v<std::tuple_element_t<0, AutoLevel::candidate_types>, nitro::level::Basic> &&
                    std::is_same_v<std::tuple_element_t<1, AutoLevel::candidate_types>, nitro::level::Advanced> &&
                    std::is_same_v<std::tuple_element_t<2, AutoLevel::candidate_types>, nitro::level::Ultra>,
                "levels demo: from_trial's candidate indices are Basic 0, Advanced 1, Ultra 2");
  // On a GPU, level::Max (the step replayed from a CUDA graph) is a candidate too, after the others:
  // the indices above stay.
  const auto train_auto = [&] {
#if NITRO_WITH_CUDA
    if (gpu) {
      using AutoGpu = nitro::level::Auto<nitro::level::Basic, nitro::level::Advanced, nitro::level::Ultra,
                                         nitro::level::Max>;
      return train_level<AutoGpu>("level::Auto", "auto", args, args.batch, {});
    }
#endif
    return train_level<AutoLevel>("level::Auto", "auto", args, args.batch, {});
  };
  // The plain loop before anything of Nitro's has run: level::Auto applies its winner's hardware
  // settings, and glibc's heap setting among them stays set for the process.
  Row plain_row = plain(args);
  std::optional<Row> auto_row;
  if (!args.train_all) auto_row = train_auto();
  const std::optional<nitro::tune::Result> tuned = auto_row ? auto_row->tuned : std::nullopt;

  std::vector<Row> rows;
  std::vector<std::string> files;  // the levels that trained, and wrote metrics
  int from_trials = 0;
  bool ultra_from_trial = false;
  rows.push_back(std::move(plain_row));
  rows.push_back(train_level<nitro::level::Basic, torch::optim::SGD, /*Traced=*/true>("level::Basic", "basic", args,
                                                                                      args.batch, {}));
  files.push_back("basic");
  rows.push_back(train_level<nitro::level::Basic, nitro::optim::FusedSGD>("level::Basic + FusedSGD", "basic_fused", args,
                                                                          args.batch, {}));
  files.push_back("basic_fused");
  const std::string advanced = "level::Advanced (bf16)";
  if (auto r = from_trial<nitro::level::Advanced>(advanced, "advanced", args, tuned, 1)) {
    rows.push_back(std::move(*r));
    ++from_trials;
  } else {
    rows.push_back(train_level<nitro::level::Advanced>(advanced, "advanced", args, args.batch, {}));
    files.push_back("advanced");
  }
  const std::string ultra = "level::Ultra (bf16, 2x" + std::to_string(args.batch / 2) + " accum, sqrt ckpt, clip)";
  // Shown from its trial, Ultra is level::Auto's candidate as given (its default accumulation).
  if (auto r = from_trial<nitro::level::Ultra>("level::Ultra (bf16, accum, sqrt ckpt, clip)", "ultra", args, tuned, 2)) {
    rows.push_back(std::move(*r));
    ++from_trials;
    ultra_from_trial = true;
  } else {
    rows.push_back(train_level<nitro::level::Ultra>(
        ultra, "ultra", args, args.batch / 2,
        {.accumulate = nitro::accumulate::Dynamic::for_batch(args.batch, args.batch / 2), .clip = {.max_norm = 5.0}}));
    files.push_back("ultra");
  }
  rows.push_back(auto_row ? std::move(*auto_row) : train_auto());
  files.push_back("auto");
  // level::Max replays each step from a CUDA graph: on a GPU only (graph/capture.hpp).
  if (gpu) {
    rows.push_back(train_level<nitro::level::Max, nitro::optim::FusedSGD>("level::Max (bf16, CUDA graph) + FusedSGD",
                                                                        "max", args, args.batch, {}));
    files.push_back("max");
  }
  const double trained_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  // The table; a row shown from level::Auto's trial has its mark after the name, no loss nor accuracy.
  const auto number = [](double v, int decimals) {
    if (std::isnan(v)) return std::string("-");
    char text[32];
    std::snprintf(text, sizeof text, "%.*f", decimals, v);
    return std::string(text);
  };
  int width = 70;
  for (const auto& r : rows)
    width = std::max(width, static_cast<int>(r.name.size() + (r.mark.empty() ? 0 : 2 + r.mark.size())));
  std::printf("%-*s %10s %9s %11s %14s\n", width, "configuration", "samples/s", "peak MB", "final loss", "test accuracy");
  for (const auto& r : rows) {
    const std::string name = r.mark.empty() ? r.name : r.name + "  " + r.mark;
    std::printf("%-*s %10s %9s %11s %14s\n", width, name.c_str(), number(r.samples_per_s, 0).c_str(),
                number(r.peak_mb, 1).c_str(), number(r.final_loss, 4).c_str(), number(r.accuracy, 4).c_str());
  }
  std::printf("peak MB: the most tensor memory live at once during training (%s)\n",
              gpu ? "CUDA caching allocator" : "CPU tensors, nitro::memory::ScopedCpuTracking");
  if (from_trials > 0) {
    std::printf("trial only: not trained, as level::Auto's trial and a second trial against level::Basic both measured "
                "its time a\n  sample above %gx level::Basic's on this machine; samples/s and peak MB are the second "
                "trial's (the median of 4\n  timed steps on one batch of %lld), not %d epochs'; no loss, accuracy or "
                "metrics files. --train-all trains every level,\n  --trial-only-slower-than X sets the factor\n",
                args.trial_only_slower_than, static_cast<long long>(args.batch), args.epochs);
    if (ultra_from_trial)
      std::printf("  level::Ultra's trials: level::Ultra as level::Auto tries it, batches of %lld without the demo's "
                  "accumulation\n", static_cast<long long>(args.batch));
  }
  for (const auto& r : rows) {
    if (r.report.empty()) continue;
    std::printf("\n%s, monitor::Phases (per micro-batch step):\n%s", r.name.c_str(), r.report.c_str());
  }
  std::string trained_files;
  for (const auto& f : files) trained_files += (trained_files.empty() ? "" : ",") + f;
  std::printf("\nmetrics (a row every 10 optimizer steps): %s/{%s}.{jsonl,csv}; plot them with\n"
              "  python3 bench/plot_metrics.py %s/*.jsonl -o metrics.png\n",
              args.metrics.c_str(), trained_files.c_str(), args.metrics.c_str());
  std::printf("TensorBoard event files, one run per level: %s/tensorboard/; view them with\n"
              "  tensorboard --logdir %s/tensorboard      (then open http://localhost:6006)\n",
              args.metrics.c_str(), args.metrics.c_str());
  std::printf("a trace of level::Basic's optimizer steps 20-22: %s/basic.trace.json; open it at https://ui.perfetto.dev "
              "(Open trace file) or chrome://tracing\n",
              args.metrics.c_str());
  std::printf("trained in %.0f s: %zu rows trained for %d epoch%s (the warm-up and level::Auto's trials included)",
              trained_s, rows.size() - static_cast<std::size_t>(from_trials), args.epochs, args.epochs == 1 ? "" : "s");
  if (from_trials > 0) std::printf(", %d shown from level::Auto's trial", from_trials);
  std::printf("\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "levels: %s\n", e.what());
  return 1;
}
