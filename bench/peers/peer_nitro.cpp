// peer_nitro: the C++ side of the comparison with Python PyTorch (bench/peers/README.md). One process
// runs one configuration of one workload and prints one line, `PEER {json}`, that
// bench/peers/compare.py collects; the Python side (peer_torch.py) prints the same line.
//
//   peer_nitro export --workload W --dir D [--device cpu|cuda]
//       writes D/W/meta.json, the initial weights (D/W/params.bin, float32, in named_parameters order)
//       and the data (D/W/x.bin, D/W/y.bin), which both sides then load: the same weights, batches and
//       order on both sides, so their loss curves can be compared.
//   peer_nitro run --workload W --config C --dir D [--device cpu|cuda] [--steps N] [--warmup K]
//       W: mlp | cnn | transformer | resnet50 | gpt2
//       C: libtorch (a hand-written LibTorch loop, torch::optim::AdamW), nitro_basic (level::Basic,
//          FusedAdamW), nitro_advanced (level::Advanced + its hardware settings, FusedAdamW; ResNet-50
//          channels-last on a GPU), nitro_auto (level::Auto<Basic, Advanced>, and Max on a GPU, with
//          FusedAdamW: the level it picks on this machine), nitro_max (level::Max: graph::Capture;
//          GPU only; ResNet-50 channels-last)
//       W: checkpoint   C: plain | checkpoint (checkpoint::sequential, ceil(sqrt(layers)) segments)
//       W: pipeline     C: prefetcher (Prefetcher over a data set whose every batch costs L ms)
//   peer_nitro forward --workload resnet50|gpt2 --dir D [--device cpu|cuda]
//       the exported weights loaded, the first batch's logits in training mode (batch statistics) and
//       in evaluation mode written to D/W/logits_train.bin and D/W/logits_eval.bin (float32), and the
//       parameter count of the full-size model printed (`PARAMS resnet50=25557032`): what
//       tests/peers/models.py compares with torchvision's resnet50 and the Python twins.
//
// ResNet-50 (bench/models/resnet.hpp) and GPT-2 (bench/models/gpt2.hpp) run at full size on a GPU
// (224x224 images, batch 256; GPT-2 124M, 1024 tokens, batch 12) and small on the CPU (64x64 images,
// batch 8, 10 classes; a GPT of 2 layers, width 128, 128 tokens, batch 4), where the tests run them.
//
// Timing: warm-up steps first (not timed), then `steps` steps between two clock reads, the GPU
// synchronised before each. Peak memory: on a GPU the caching allocator's peak over the timed steps
// (everything allocated, parameters and optimizer state included); on the CPU the most CPU tensor
// bytes live at once during 3 more steps, counted by memory::ScopedCpuTracking (the Python side
// counts with the same tracker, through libnitro_peer_tracking.so). The losses of every step are
// copied into a preallocated tensor (one small copy a step on both sides) and printed at the end.
#include "../common.hpp"
#include "../models.hpp"
#include "../models/gpt2.hpp"
#include "../models/resnet.hpp"

#include <nitro/train/checkpoint.hpp>
#include <nitro/data/prefetcher.hpp>
#include <nitro/data/synthetic.hpp>
#include <nitro/memory/tracking_allocator.hpp>
#include <nitro/optim/fused.hpp>
#include <nitro/train/autotune.hpp>
#include <nitro/train/channels_last.hpp>
#include <nitro/train/levels.hpp>
#if NITRO_WITH_CUDA
#include <nitro/graph/capture.hpp>

#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;
using Batch = std::pair<at::Tensor, at::Tensor>;
using Batches = std::vector<Batch>;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string command, workload, config, dir, device = "cpu";
  int steps = -1, warmup = -1;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "peer_nitro: %s\nusage: peer_nitro export --workload W --dir D [--device cpu|cuda]\n"
               "       peer_nitro run --workload W --config C --dir D [--device cpu|cuda] [--steps N] [--warmup K]\n"
               "       peer_nitro forward --workload resnet50|gpt2 --dir D [--device cpu|cuda]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2) usage("no command");
  a.command = argv[1];
  for (int i = 2; i < argc; i += 2) {
    const std::string key = argv[i];
    if (i + 1 >= argc) usage(key + " needs a value");
    const std::string value = argv[i + 1];
    if (key == "--workload") a.workload = value;
    else if (key == "--config") a.config = value;
    else if (key == "--dir") a.dir = value;
    else if (key == "--device") a.device = value;
    else if (key == "--steps") a.steps = std::stoi(value);
    else if (key == "--warmup") a.warmup = std::stoi(value);
    else usage("unknown option " + key);
  }
  if (a.command != "export" && a.command != "run" && a.command != "forward") usage("unknown command " + a.command);
  if (a.workload.empty() || a.dir.empty()) usage("--workload and --dir are required");
  if (a.device != "cpu" && a.device != "cuda") usage("--device is cpu or cuda");
  if (a.device == "cuda" && !nitro::Cuda::available()) usage("--device cuda, but no GPU is usable here");
  return a;
}

bool on_gpu(const Args& a) { return a.device == "cuda"; }
c10::Device device_of(const Args& a) { return on_gpu(a) ? nitro::Cuda::device() : nitro::Cpu::device(); }

// ---- the workloads' shapes (meta.json carries them to the Python side) ----

struct Shapes {
  std::int64_t batch = 64, batches = 16, classes = 10;
  // mlp
  std::int64_t in = 512, width = 512, layers = 8;
  // transformer, gpt2 (seq: the tokens of a sample, gpt2's block)
  std::int64_t vocab = 1000, seq = 128, heads = 4, ffn = 1024;
  // resnet50: square images of this side
  std::int64_t image = 224;
  int steps = 100, warmup = 10;
  // AdamW, on both sides (PyTorch's defaults but the learning rate; GPT-2: nanoGPT's betas (0.9, 0.95)
  // and weight decay 0.1, here on every parameter where nanoGPT spares biases and norms)
  double lr = 1e-3, beta2 = 0.999, weight_decay = 0.01;
  // > 0: SGD with this momentum instead of AdamW (ResNet-50)
  double momentum = 0;
};

bool is_model(const std::string& workload) {
  return workload == "mlp" || workload == "cnn" || workload == "transformer" || workload == "resnet50" ||
         workload == "gpt2";
}

Shapes shapes(const std::string& workload, bool gpu) {
  Shapes s;
  if (workload == "mlp") {
    s.batches = 32;
    s.steps = gpu ? 500 : 200;
    s.warmup = 20;
  } else if (workload == "cnn") {
    s.batches = 64;
    s.steps = gpu ? 300 : 60;
    s.warmup = 10;
  } else if (workload == "transformer") {
    s.batch = gpu ? 32 : 8;
    s.width = 256;
    s.layers = 4;
    s.classes = 16;
    s.batches = 8;
    s.steps = gpu ? 100 : 12;
    s.warmup = gpu ? 10 : 3;
  } else if (workload == "checkpoint") {
    s.layers = 32;
    s.width = gpu ? 4096 : 1024;
    s.batch = gpu ? 1024 : 256;
    s.steps = 5;
    s.warmup = 1;
  } else if (workload == "pipeline") {
    s.steps = 200;
    s.warmup = 10;
  } else if (workload == "resnet50") {
    s.image = gpu ? 224 : 64;
    s.batch = gpu ? 256 : 8;
    s.classes = gpu ? 1000 : 10;
    s.batches = gpu ? 2 : 4;
    s.steps = gpu ? 25 : 8;
    s.warmup = gpu ? 8 : 2;
    // torchvision's recipe: SGD, momentum 0.9, weight decay 1e-4, 0.1 per 256 images
    s.momentum = 0.9;
    s.weight_decay = 1e-4;
    s.lr = 0.1 * static_cast<double>(s.batch) / 256.0;
  } else if (workload == "gpt2") {
    const nitro::bench::Gpt2Config full;
    s.seq = gpu ? full.block : 128;
    s.vocab = gpu ? full.vocab : 512;
    s.layers = gpu ? full.layers : 2;
    s.heads = gpu ? full.heads : 4;
    s.width = gpu ? full.width : 128;
    s.batch = gpu ? 12 : 4;
    s.batches = gpu ? 2 : 4;
    s.steps = gpu ? 20 : 8;
    s.warmup = gpu ? 6 : 2;
    s.lr = 6e-4;
    s.beta2 = 0.95;
    s.weight_decay = 0.1;
  } else {
    usage("unknown workload " + workload + " (mlp, cnn, transformer, resnet50, gpt2, checkpoint, pipeline)");
  }
  return s;
}

// ---- models ----

torch::nn::Sequential mlp(const Shapes& s) {
  torch::nn::Sequential net;
  for (std::int64_t i = 0; i < s.layers; ++i) {
    net->push_back(torch::nn::Linear(i == 0 ? s.in : s.width, s.width));
    net->push_back(torch::nn::Functional(torch::relu));
  }
  net->push_back(torch::nn::Linear(s.width, s.classes));
  return net;
}

/// A pre-norm encoder layer: attention through at::scaled_dot_product_attention (the fused kernels),
/// then a GELU feed-forward; peer_torch.py's EncoderLayer registers the same parameters in the same order.
struct EncoderLayerImpl : torch::nn::Module {
  EncoderLayerImpl(std::int64_t width, std::int64_t heads, std::int64_t ffn)
      : heads(heads),
        norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        qkv(register_module("qkv", torch::nn::Linear(width, 3 * width))),
        proj(register_module("proj", torch::nn::Linear(width, width))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc1(register_module("fc1", torch::nn::Linear(width, ffn))),
        fc2(register_module("fc2", torch::nn::Linear(ffn, width))) {}

  at::Tensor forward(at::Tensor x) {
    const auto b = x.size(0), t = x.size(1), d = x.size(2);
    const auto q_k_v = qkv(norm1(x)).view({b, t, 3, heads, d / heads}).permute({2, 0, 3, 1, 4});
    const auto attended = at::scaled_dot_product_attention(q_k_v[0], q_k_v[1], q_k_v[2]);
    x = x + proj(attended.transpose(1, 2).reshape({b, t, d}));
    return x + fc2(torch::gelu(fc1(norm2(x))));
  }

  std::int64_t heads;
  torch::nn::LayerNorm norm1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm norm2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(EncoderLayer);

struct EncoderImpl : torch::nn::Module {
  explicit EncoderImpl(const Shapes& s)
      : pos(register_parameter("pos", torch::randn({s.seq, s.width}) * 0.02)),
        embed(register_module("embed", torch::nn::Embedding(s.vocab, s.width))),
        layers(register_module("layers", torch::nn::ModuleList())),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.width})))),
        head(register_module("head", torch::nn::Linear(s.width, s.classes))) {
    for (std::int64_t i = 0; i < s.layers; ++i) layers->push_back(EncoderLayer(s.width, s.heads, s.ffn));
  }

  /// tokens [batch, seq] -> logits [batch, seq, classes]
  at::Tensor forward(const at::Tensor& tokens) {
    auto x = embed(tokens) + pos;
    for (const auto& layer : *layers) x = layer->as<EncoderLayer>()->forward(x);
    return head(norm(x));
  }

  at::Tensor pos;
  torch::nn::Embedding embed;
  torch::nn::ModuleList layers;
  torch::nn::LayerNorm norm;
  torch::nn::Linear head;
};
TORCH_MODULE(Encoder);

// ---- files: raw little-endian tensors and a meta.json both sides read ----

std::string dtype_name(const at::Tensor& t) {
  if (t.scalar_type() == at::kFloat) return "float32";
  if (t.scalar_type() == at::kLong) return "int64";
  throw std::runtime_error("peer_nitro: unexpected dtype");
}

std::string shape_json(at::IntArrayRef sizes) {
  std::ostringstream s;
  s << '[';
  for (std::size_t i = 0; i < sizes.size(); ++i) s << (i ? "," : "") << sizes[i];
  s << ']';
  return s.str();
}

void write_raw(const fs::path& path, const std::vector<at::Tensor>& tensors) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  for (const auto& t : tensors) {
    const auto c = t.detach().to(torch::kCPU).contiguous();
    f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  }
  if (!f) throw std::runtime_error("peer_nitro: cannot write " + path.string());
}

/// Fills `tensors` (CPU, contiguous) from the file, in order; the file must hold exactly their bytes.
void read_raw(const fs::path& path, const std::vector<at::Tensor>& tensors) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("peer_nitro: cannot read " + path.string() + " (run `peer_nitro export` first)");
  std::int64_t total = 0;
  for (const auto& t : tensors) {
    f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    total += static_cast<std::int64_t>(t.nbytes());
  }
  if (!f || f.peek() != std::char_traits<char>::eof() || static_cast<std::int64_t>(fs::file_size(path)) != total)
    throw std::runtime_error("peer_nitro: " + path.string() + " does not hold the expected " + std::to_string(total) +
                             " bytes: export it again");
}

nitro::bench::Gpt2Config gpt2_config(const Shapes& s) {
  return {.block = s.seq, .vocab = s.vocab, .layers = s.layers, .heads = s.heads, .width = s.width};
}

/// The model of a workload, from seed 0 (what `export` writes); `run` loads params.bin over it.
std::shared_ptr<torch::nn::Module> make_model(const std::string& workload, const Shapes& s) {
  torch::manual_seed(0);
  if (workload == "mlp") return mlp(s).ptr();
  if (workload == "cnn") return nitro::bench::demo_cnn().ptr();
  if (workload == "transformer") return Encoder(s).ptr();
  if (workload == "resnet50") return nitro::bench::resnet50(s.classes).ptr();
  if (workload == "gpt2") return nitro::bench::Gpt2(gpt2_config(s)).ptr();
  usage("workload " + workload + " has no model to export");
}

/// The shapes of a workload's inputs and targets (all batches).
std::pair<at::Tensor, at::Tensor> empty_data(const std::string& workload, const Shapes& s) {
  const auto n = s.batch * s.batches;
  if (workload == "mlp") return {torch::empty({n, s.in}), torch::empty({n}, torch::kLong)};
  if (workload == "cnn") return {torch::empty({n, 3, 32, 32}), torch::empty({n}, torch::kLong)};
  if (workload == "resnet50") return {torch::empty({n, 3, s.image, s.image}), torch::empty({n}, torch::kLong)};
  return {torch::empty({n, s.seq}, torch::kLong), torch::empty({n, s.seq}, torch::kLong)};  // transformer, gpt2
}

Batch make_data(const std::string& workload, const Shapes& s) {
  const auto n = s.batch * s.batches;
  if (workload == "mlp") {  // labels from a fixed random linear teacher: learnable, so the loss falls smoothly
    torch::manual_seed(1);
    const auto x = torch::randn({n, s.in});
    return {x, x.matmul(torch::randn({s.in, s.classes})).argmax(1)};
  }
  if (workload == "cnn") {
    nitro::data::SyntheticImages images{{.size = n, .noise = 8.0}};  // the levels demo's data
    return images.stacked(0, n);
  }
  if (workload == "resnet50") {  // labels from a fixed random linear teacher of the 4x4-pooled image
    torch::manual_seed(1);
    const auto x = torch::randn({n, 3, s.image, s.image});
    const auto pooled = at::adaptive_avg_pool2d(x, {4, 4}).flatten(1);
    return {x, pooled.matmul(torch::randn({pooled.size(1), s.classes})).argmax(1)};
  }
  if (workload == "gpt2") {  // next-token prediction on sequences t' = (5 t + 7 + 3 [t odd]) mod vocab
    torch::manual_seed(1);
    auto tokens = torch::empty({n, s.seq + 1}, torch::kLong);
    tokens.select(1, 0).copy_(torch::randint(s.vocab, {n}));
    for (std::int64_t i = 1; i <= s.seq; ++i) {
      const auto t = tokens.select(1, i - 1);
      tokens.select(1, i).copy_((t * 5 + 7 + t.remainder(2) * 3).remainder(s.vocab));
    }
    return {tokens.narrow(1, 0, s.seq).contiguous(), tokens.narrow(1, 1, s.seq).contiguous()};
  }
  torch::manual_seed(1);  // transformer: each token's class is its id mod classes, learnable through the embedding
  auto tokens = torch::randint(s.vocab, {n, s.seq});
  return {tokens, tokens.remainder(s.classes)};
}

void export_workload(const Args& a) {
  const auto s = shapes(a.workload, on_gpu(a));
  const fs::path dir = fs::path(a.dir) / a.workload;
  fs::create_directories(dir);
  std::ostringstream meta;
  meta << std::setprecision(17);  // the hyper-parameters reach Python exactly
  meta << "{\"workload\":\"" << a.workload << "\",\"device\":\"" << a.device << "\",\"batch\":" << s.batch
       << ",\"batches\":" << s.batches << ",\"classes\":" << s.classes << ",\"in\":" << s.in << ",\"width\":" << s.width
       << ",\"layers\":" << s.layers << ",\"vocab\":" << s.vocab << ",\"seq\":" << s.seq << ",\"heads\":" << s.heads
       << ",\"ffn\":" << s.ffn << ",\"image\":" << s.image << ",\"steps\":" << s.steps << ",\"warmup\":" << s.warmup
       << ",\"lr\":" << s.lr << ",\"beta2\":" << s.beta2 << ",\"weight_decay\":" << s.weight_decay
       << ",\"momentum\":" << s.momentum;
  if (is_model(a.workload)) {
    auto model = make_model(a.workload, s);
    meta << ",\"params\":[";
    bool first = true;
    std::vector<at::Tensor> params;
    for (const auto& p : model->named_parameters()) {
      meta << (first ? "" : ",") << "{\"name\":\"" << p.key() << "\",\"shape\":" << shape_json(p.value().sizes()) << "}";
      first = false;
      params.push_back(p.value());
    }
    meta << "]";
    write_raw(dir / "params.bin", params);
    const auto [x, y] = make_data(a.workload, s);
    write_raw(dir / "x.bin", {x});
    write_raw(dir / "y.bin", {y});
    meta << ",\"x\":{\"dtype\":\"" << dtype_name(x) << "\",\"shape\":" << shape_json(x.sizes()) << "},\"y\":{\"dtype\":\""
         << dtype_name(y) << "\",\"shape\":" << shape_json(y.sizes()) << "}";
  } else if (a.workload == "pipeline") {
    // L = cpu_ms of work plus io_ms of waiting per batch, read by `workers` workers; the step takes step_ms.
    meta << ",\"cpu_ms\":2,\"io_ms\":8,\"workers\":2,\"step_ms\":4,\"pool\":16";
  }
  meta << "}\n";
  std::ofstream(dir / "meta.json") << meta.str();
  std::printf("peer_nitro: exported %s to %s\n", a.workload.c_str(), dir.c_str());
}

// ---- measuring ----

struct Outcome {
  double seconds = 0, samples_per_s = 0, peak_mb = -1;
  /// The loss of the last timed step (the sum read, for the pipeline); NaN where there is none.
  double final_loss = std::nan("");
  std::int64_t samples = 0, steps = 0;
  std::vector<double> losses;
};

std::int64_t gpu_peak_reset([[maybe_unused]] const c10::Device& d) {
#if NITRO_WITH_CUDA
  if (d.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(d.index());
    return 0;
  }
#endif
  return -1;
}

std::int64_t gpu_peak([[maybe_unused]] const c10::Device& d) {
#if NITRO_WITH_CUDA
  if (d.is_cuda()) return c10::cuda::CUDACachingAllocator::getDeviceStats(d.index()).allocated_bytes[0].peak;
#endif
  return -1;
}

constexpr int kMemorySteps = 3;

/// Runs `step(batch) -> loss` for warm-up, timed and (CPU) memory steps over the batches, in order.
template <class Step>
Outcome measure(Step&& step, const Batches& batches, const c10::Device& device, int warmup, int steps) {
  Outcome o;
  const auto total = warmup + steps + (device.is_cuda() ? 0 : kMemorySteps);
  const auto losses = torch::empty({total}, torch::TensorOptions().device(device));
  int i = 0;
  const auto one = [&] {
    losses[i].copy_(step(batches[static_cast<std::size_t>(i) % batches.size()]));
    ++i;
  };
  for (int k = 0; k < warmup; ++k) one();
  nitro::bench::synchronize();
  gpu_peak_reset(device);
  o.seconds = nitro::bench::seconds([&] {
    for (int k = 0; k < steps; ++k) one();
  });
  if (device.is_cuda()) {
    o.peak_mb = static_cast<double>(gpu_peak(device)) / 1048576.0;
  } else {
    nitro::memory::ScopedCpuTracking track;
    for (int k = 0; k < kMemorySteps; ++k) one();
    o.peak_mb = static_cast<double>(track.stats().peak_bytes) / 1048576.0;
  }
  o.steps = steps;
  o.samples = steps * batches.front().first.size(0);
  o.samples_per_s = static_cast<double>(o.samples) / o.seconds;
  const auto host = losses.to(torch::kCPU, torch::kDouble);
  o.losses.assign(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
  o.final_loss = o.losses[static_cast<std::size_t>(warmup + steps - 1)];
  return o;
}

/// level::Auto over Basic and Advanced, and Max on a GPU: it tunes at the first warm-up step (not
/// timed; bench_autotune measures what tuning costs) and keeps its choice in <dir>/autotune, so later
/// rounds start at once.
template <class Auto, class Model, class Run>
Outcome train_auto(const Args& a, const Model& model, torch::optim::Optimizer& optimizer, Run&& run) {
  typename Auto::Options options;
  options.tune.cache_dir = std::filesystem::path(a.dir) / "autotune";
  Auto loop{model, optimizer, options};
  auto outcome = run(loop);
  std::printf("peer_nitro: level::Auto chose %s (%s)\n", loop.result().name.c_str(), loop.result().source.c_str());
  return outcome;
}

/// The hand-written LibTorch loop.
template <class Loss>
Outcome train_plain(torch::optim::Optimizer& optimizer, const Loss& loss_of, const Batches& batches,
                    const c10::Device& device, int warmup, int steps) {
  return measure(
        [&](const Batch& b) {
          optimizer.zero_grad(/*set_to_none=*/true);
          auto loss = loss_of(b);
          loss.backward();
          optimizer.step();
          return loss.detach();
        },
        batches, device, warmup, steps);
}

/// Nitro's levels over a fused optimizer.
template <class Model, class Loss>
Outcome train_levels(const Args& a, const Model& model, torch::optim::Optimizer& optimizer, const Loss& loss_of,
                     const Batches& batches, const c10::Device& device, int warmup, int steps) {
  const auto run = [&](auto& loop) {
    return measure([&](const Batch& b) { return loop.step(b, loss_of).loss; }, batches, device, warmup, steps);
  };
  if (a.config == "nitro_basic") {
    nitro::hw::ScopedSettings hw{nitro::level::hardware<nitro::level::Basic>()};  // the CPU heap kept
    nitro::level::Basic loop{model, optimizer};
    return run(loop);
  }
  if (a.config == "nitro_advanced") {
    nitro::hw::ScopedSettings hw{nitro::level::hardware<nitro::level::Advanced>()};
    nitro::level::Advanced loop{model, optimizer};
    return run(loop);
  }
  if (a.config == "nitro_auto") {
#if NITRO_WITH_CUDA
    if (device.is_cuda())
      return train_auto<nitro::level::Auto<nitro::level::Basic, nitro::level::Advanced, nitro::level::Max>>(
          a, model, optimizer, run);
#endif
    return train_auto<nitro::level::Auto<nitro::level::Basic, nitro::level::Advanced>>(a, model, optimizer, run);
  }
#if NITRO_WITH_CUDA
  if (a.config == "nitro_max") {
    if (!device.is_cuda()) usage("nitro_max (CUDA graphs) needs --device cuda");
    nitro::hw::ScopedSettings hw{nitro::level::hardware<nitro::level::Max>()};
    nitro::level::Max loop{model, optimizer};
    return run(loop);
  }
#endif
  usage("unknown config " + a.config + " for " + a.workload +
        " (libtorch, nitro_basic, nitro_advanced, nitro_auto, nitro_max)");
}

/// One configuration of a model workload: the model (a module holder), its loss.
template <class Model>
Outcome train(const Args& a, const Shapes& s, Model model, Batches batches, int warmup, int steps) {
  const auto device = device_of(a);
  const auto loss_of = [&model](const Batch& b) {
    const auto out = model->forward(b.first);
    return torch::cross_entropy_loss(out.reshape({-1, out.size(-1)}), b.second.reshape({-1}));
  };
  // ResNet-50 on a GPU in channels-last where the Python rows have it (bf16 and fp16 autocast): the
  // model's convolution weights and the images.
  if (a.workload == "resnet50" && device.is_cuda() && (a.config == "nitro_advanced" || a.config == "nitro_max")) {
    nitro::to_channels_last(*model);
    for (auto& b : batches) b.first = b.first.contiguous(c10::MemoryFormat::ChannelsLast);
  }
  const auto params = model->parameters();
  // AdamW as Python's (weight decay 0.01 but for GPT-2: 0.1 on every parameter and nanoGPT's betas (0.9,
  // 0.95)); ResNet-50 with SGD and momentum, as torchvision's recipe trains it.
  const auto adamw = torch::optim::AdamWOptions(s.lr).betas({0.9, s.beta2}).weight_decay(s.weight_decay);
  const auto sgd = torch::optim::SGDOptions(s.lr).momentum(s.momentum).weight_decay(s.weight_decay);
  if (s.momentum > 0) {
    if (a.config == "libtorch") {
      torch::optim::SGD optimizer(params, sgd);
      return train_plain(optimizer, loss_of, batches, device, warmup, steps);
    }
    nitro::optim::FusedSGD optimizer(params, sgd);
    return train_levels(a, model, optimizer, loss_of, batches, device, warmup, steps);
  }
  if (a.config == "libtorch") {
    torch::optim::AdamW optimizer(params, adamw);
    return train_plain(optimizer, loss_of, batches, device, warmup, steps);
  }
  nitro::optim::FusedAdamW optimizer(params, adamw);
  return train_levels(a, model, optimizer, loss_of, batches, device, warmup, steps);
}

/// The exported model and data of a workload, on the CPU.
std::tuple<std::shared_ptr<torch::nn::Module>, at::Tensor, at::Tensor> load_workload(const Args& a, const Shapes& s) {
  auto module = make_model(a.workload, s);
  const fs::path dir = fs::path(a.dir) / a.workload;
  read_raw(dir / "params.bin", module->parameters());
  auto [x, y] = empty_data(a.workload, s);
  read_raw(dir / "x.bin", {x});
  read_raw(dir / "y.bin", {y});
  return {module, x, y};
}

Outcome run_training(const Args& a, const Shapes& s) {
  auto [module, x, y] = load_workload(a, s);
  const auto device = device_of(a);
  // cuDNN autotuning on every GPU row, as the Python rows have it (torch.backends.cudnn.benchmark):
  // each side at its best practice. Advanced and Max set it again through their level.
  std::optional<nitro::hw::ScopedSettings> autotune;
  if (device.is_cuda()) autotune.emplace(nitro::hw::Settings{.cudnn_benchmark = true});
  module->to(device);
  Batches batches;
  for (std::int64_t i = 0; i < s.batches; ++i)
    batches.emplace_back(x.narrow(0, i * s.batch, s.batch).to(device), y.narrow(0, i * s.batch, s.batch).to(device));
  const int warmup = a.warmup >= 0 ? a.warmup : s.warmup, steps = a.steps > 0 ? a.steps : s.steps;
  if (a.workload == "transformer")
    return train(a, s, Encoder(std::dynamic_pointer_cast<EncoderImpl>(module)), std::move(batches), warmup, steps);
  if (a.workload == "resnet50")
    return train(a, s, nitro::bench::ResNet(std::dynamic_pointer_cast<nitro::bench::ResNetImpl>(module)),
                 std::move(batches), warmup, steps);
  if (a.workload == "gpt2")
    return train(a, s, nitro::bench::Gpt2(std::dynamic_pointer_cast<nitro::bench::Gpt2Impl>(module)),
                 std::move(batches), warmup, steps);
  return train(a, s, torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(module)),
               std::move(batches), warmup, steps);
}

/// `forward`: the logits of the first batch in training and in evaluation mode, for the tests'
/// comparison with torchvision and the Python twins; the full-size model's parameter count.
void run_forward(const Args& a, const Shapes& s) {
  if (a.workload != "resnet50" && a.workload != "gpt2") usage("forward is for resnet50 and gpt2");
  auto [module, x, y] = load_workload(a, s);
  const auto device = device_of(a);
  module->to(device);
  const auto first = x.narrow(0, 0, s.batch).to(device);
  const auto logits = [&](bool training) {
    module->train(training);
    const at::NoGradGuard no_grad;
    if (a.workload == "resnet50") return std::dynamic_pointer_cast<nitro::bench::ResNetImpl>(module)->forward(first);
    return std::dynamic_pointer_cast<nitro::bench::Gpt2Impl>(module)->forward(first);
  };
  const fs::path dir = fs::path(a.dir) / a.workload;
  write_raw(dir / "logits_train.bin", {logits(true)});
  write_raw(dir / "logits_eval.bin", {logits(false)});
  const auto full = shapes(a.workload, /*gpu=*/true);
  std::printf("PARAMS %s=%lld\n", a.workload.c_str(),
              static_cast<long long>(nitro::bench::parameter_count(*make_model(a.workload, full))));
}

// ---- checkpoint: the 32-layer MLP of bench_checkpoint, peak memory of forward + backward ----

Outcome run_checkpoint(const Args& a, const Shapes& s) {
  const auto device = device_of(a);
  torch::manual_seed(0);
  torch::nn::Sequential net;  // bench_checkpoint's: 32 x (Linear(width, width), ReLU)
  for (std::int64_t i = 0; i < s.layers; ++i) {
    net->push_back(torch::nn::Linear(s.width, s.width));
    net->push_back(torch::nn::Functional(torch::relu));
  }
  net->to(device);
  torch::manual_seed(1);
  const auto x = torch::randn({s.batch, s.width}).to(device);
  const auto segments = static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(net->size()))));
  std::function<void()> step;
  // The loss in a statement of its own: C++ keeps the temporaries of a full expression alive until
  // its end, so `net->forward(x).pow(2).mean().backward()` would hold two activations through the
  // backward that Python frees at once.
  if (a.config == "plain") {
    step = [&] {
      const auto loss = net->forward(x).pow(2).mean();
      loss.backward();
    };
  } else if (a.config == "checkpoint") {
    step = [&] {
      const auto loss = nitro::checkpoint::sequential(net, segments, x).pow(2).mean();
      loss.backward();
    };
  }
  if (!step) usage("unknown config " + a.config + " for checkpoint (plain, checkpoint)");
  // Gradients exist before measuring and are zeroed in place: the peak is activations and
  // backward's temporaries, as in bench_checkpoint.
  const auto zero = [&] {
    for (auto& p : net->parameters()) p.mutable_grad().zero_();
  };
  const int warmup = a.warmup >= 0 ? a.warmup : s.warmup, steps = a.steps > 0 ? a.steps : s.steps;
  for (int i = 0; i < std::max(warmup, 1); ++i) step();
  zero();
  Outcome o;
  if (device.is_cuda()) {
#if NITRO_WITH_CUDA
    namespace alloc = c10::cuda::CUDACachingAllocator;
    nitro::bench::synchronize();
    alloc::resetPeakStats(device.index());
    const auto before = alloc::getDeviceStats(device.index()).allocated_bytes[0].current;
    step();
    nitro::bench::synchronize();
    o.peak_mb = static_cast<double>(alloc::getDeviceStats(device.index()).allocated_bytes[0].peak - before) / 1048576.0;
#endif
  } else {
    nitro::memory::ScopedCpuTracking track;
    step();
    o.peak_mb = static_cast<double>(track.stats().peak_bytes) / 1048576.0;
  }
  zero();
  o.seconds = nitro::bench::seconds([&] {
    for (int i = 0; i < steps; ++i) step();
  });
  o.steps = steps;
  o.samples = steps * s.batch;
  o.samples_per_s = static_cast<double>(o.samples) / o.seconds;
  std::printf("peer_nitro: checkpoint %s: %lld segments\n", a.config.c_str(), static_cast<long long>(segments));
  return o;
}

// ---- pipeline: Prefetcher against DataLoader, the same L ms of work per batch ----

void spin_until(Clock::time_point t) {
  while (Clock::now() < t) {
  }
}

struct SlowBatches : torch::data::datasets::BatchDataset<SlowBatches, torch::data::Example<>, std::vector<std::size_t>> {
  at::Tensor x, y;
  std::int64_t pool = 16;
  double cpu_ms = 2, io_ms = 8;
  std::int64_t samples = 0;

  /// cpu_ms of work (a busy wait), then waiting (a sleep) until cpu_ms + io_ms have passed, then the
  /// batch gathered (a copy, as collation makes).
  torch::data::Example<> get_batch(std::vector<std::size_t> indices) override {
    const auto start = Clock::now();
    spin_until(start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(cpu_ms)));
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double, std::milli>(cpu_ms + io_ms)));
    auto index = torch::empty({static_cast<std::int64_t>(indices.size())}, torch::kLong);
    auto* out = index.data_ptr<std::int64_t>();
    for (std::size_t i = 0; i < indices.size(); ++i) out[i] = static_cast<std::int64_t>(indices[i]) % x.size(0);
    return {x.index_select(0, index), y.index_select(0, index)};
  }
  std::optional<std::size_t> size() const override { return static_cast<std::size_t>(samples); }
};

template <class Device>
Outcome run_pipeline_on(const Args& a, const Shapes& s) {
  if (a.config != "prefetcher") usage("unknown config " + a.config + " for pipeline (prefetcher)");
  const double step_ms = 4;
  const std::size_t workers = 2;
  const int warmup = a.warmup >= 0 ? a.warmup : s.warmup, steps = a.steps > 0 ? a.steps : s.steps;
  SlowBatches data;
  torch::manual_seed(1);
  data.x = torch::randn({data.pool * s.batch, 3, 32, 32});
  data.y = torch::randint(10, {data.pool * s.batch});
  data.samples = static_cast<std::int64_t>(warmup + steps) * s.batch;
  auto source = nitro::from_dataset(data, torch::data::samplers::SequentialSampler(static_cast<std::size_t>(data.samples)),
                                    static_cast<std::size_t>(s.batch));
  const auto device = device_of(a);
  auto acc = torch::zeros({}, torch::TensorOptions().device(device));
  Outcome o;
  int seen = 0;
  Clock::time_point start;
  // Depth 2 x workers: what DataLoader holds with its default prefetch_factor of 2.
  for (auto& batch : nitro::prefetch<Device>(std::move(source), {.depth = 2 * workers, .workers = workers})) {
    if (seen == warmup) {
      nitro::bench::synchronize();
      start = Clock::now();
    }
    const auto step_start = Clock::now();
    acc += batch.data.sum();
    spin_until(step_start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(step_ms)));
    ++seen;
  }
  nitro::bench::synchronize();
  o.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (seen != warmup + steps) throw std::runtime_error("peer_nitro: the prefetcher gave " + std::to_string(seen) + " batches");
  o.steps = steps;
  o.samples = static_cast<std::int64_t>(steps) * s.batch;
  o.samples_per_s = static_cast<double>(o.samples) / o.seconds;
  o.final_loss = acc.item<double>();  // the sum of what was read: the same on both sides
  return o;
}

Outcome run_pipeline(const Args& a, const Shapes& s) {
#if NITRO_WITH_CUDA
  if (on_gpu(a)) return run_pipeline_on<nitro::Cuda>(a, s);
#endif
  return run_pipeline_on<nitro::Cpu>(a, s);
}

}  // namespace

int main(int argc, char** argv) try {
  const auto a = parse(argc, argv);
  if (a.command == "export") {
    export_workload(a);
    return 0;
  }
  if (a.command == "forward") {
    run_forward(a, shapes(a.workload, on_gpu(a)));
    return 0;
  }
  const auto s = shapes(a.workload, on_gpu(a));
  Outcome o;
  if (a.workload == "checkpoint") o = run_checkpoint(a, s);
  else if (a.workload == "pipeline") o = run_pipeline(a, s);
  else o = run_training(a, s);
  // JSON as Python's json module reads it: NaN and Infinity for a diverged loss (printf's "nan" is not).
  const auto number = [](double v, const char* format) -> std::string {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
    char text[32];
    std::snprintf(text, sizeof text, format, v);
    return text;
  };
  const std::string final_loss = std::isnan(o.final_loss) ? std::string("null") : number(o.final_loss, "%.8g");
  std::printf("PEER {\"side\":\"nitro\",\"workload\":\"%s\",\"config\":\"%s\",\"device\":\"%s\",\"steps\":%lld,"
              "\"samples\":%lld,\"seconds\":%.6f,\"samples_per_s\":%.3f,\"steps_per_s\":%.4f,\"peak_mb\":%.3f,\"final_loss\":%s,\"losses\":[",
              a.workload.c_str(), a.config.c_str(), a.device.c_str(), static_cast<long long>(o.steps),
              static_cast<long long>(o.samples), o.seconds, o.samples_per_s, static_cast<double>(o.steps) / o.seconds,
              o.peak_mb, final_loss.c_str());
  for (std::size_t i = 0; i < o.losses.size(); ++i)
    std::printf("%s%s", i ? "," : "", number(o.losses[i], "%.7g").c_str());
  std::printf("]}\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "peer_nitro: %s\n", e.what());
  return 1;
}
