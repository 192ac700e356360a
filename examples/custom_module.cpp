// Porting a LibTorch program whose model is a custom module (not a torch::nn::Sequential) to Nitro,
// and giving it level::Ultra's memory savings. The model is the LeNet-style network of
// pytorch/examples' cpp/mnist (two 5x5 convolutions, feature dropout, two linear layers,
// log-softmax), trained here on nitro::data::SyntheticImages of 1x28x28 so nothing is downloaded.
//
// What changes in the port:
//   1. the hand-written step (zero_grad, forward, loss, backward, step) becomes loop.step(batch, loss_fn);
//   2. the model's forward wraps its two convolution stages in nitro::checkpoint::block: a plain call
//      under level::Basic and in evaluation, checkpointed (activations recomputed in the backward
//      pass) when the training loop's checkpoint policy is on, as in level::Ultra. Nothing else of
//      the model changes, and a loop with the policy on refuses a step that checkpointed nothing.
//
//   build/examples/custom_module [--epochs 2] [--samples 8192] [--batch 256]
#include <nitro/nitro.hpp>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>

namespace {

struct LeNetImpl : torch::nn::Module {
  LeNetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 10, 5)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(10, 20, 5)))),
        conv2_drop(register_module("conv2_drop", torch::nn::Dropout2d())),
        fc1(register_module("fc1", torch::nn::Linear(320, 50))),
        fc2(register_module("fc2", torch::nn::Linear(50, 10))) {}

  at::Tensor forward(at::Tensor x) {
    // [this]: the stages are recomputed in the backward pass, after forward has returned.
    x = nitro::checkpoint::block([this](const at::Tensor& in) { return torch::relu(torch::max_pool2d(conv1->forward(in), 2)); }, x);
    x = nitro::checkpoint::block(
        [this](const at::Tensor& in) { return torch::relu(torch::max_pool2d(conv2_drop->forward(conv2->forward(in)), 2)); }, x);
    x = torch::relu(fc1->forward(x.flatten(1)));
    x = torch::dropout(x, 0.5, is_training());
    return torch::log_softmax(fc2->forward(x), 1);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Dropout2d conv2_drop;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(LeNet);

struct Args {
  int epochs = 2;
  std::int64_t samples = 8192;
  std::int64_t batch = 256;
};

struct Row {
  std::string name;
  double samples_per_s = 0, peak_mb = 0, accuracy = 0;
};

// Trains a fresh LeNet with loop type Loop; `micro` samples per step() (Ultra accumulates two).
template <class Loop>
Row train(const std::string& name, const Args& args, std::int64_t micro, typename Loop::Options options) {
  const bool gpu = nitro::Cuda::available();
  const c10::Device device = gpu ? nitro::Cuda::device() : nitro::Cpu::device();
  torch::manual_seed(1);  // the same weights and sample order for every level
  LeNet model;
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  nitro::hw::ScopedSettings hw{nitro::level::hardware<Loop>()};
  Loop loop{model, optimizer, options};

  const nitro::data::SyntheticImages::Options data{.size = args.samples, .channels = 1, .height = 28, .width = 28,
                                                   .block = 4, .noise = 2.0};
  nitro::data::SyntheticImages train_set{data};
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      train_set.map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(micro).workers(2));

  Row row{name};
  const nitro::memory::PeakScope peak{{.track_cpu_tensors = !gpu}};
  std::int64_t seen = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < args.epochs; ++epoch) {
    model->train();
    for (auto& b : *loader) {
      loop.step(std::make_pair(b.data.to(device), b.target.to(device)),
                [&](const auto& batch) { return torch::nll_loss(model->forward(batch.first), batch.second); });
      seen += b.data.size(0);
    }
    loop.flush();
  }
  if (gpu) torch::cuda::synchronize();
  row.samples_per_s = static_cast<double>(seen) / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto r = peak.result();
  row.peak_mb = static_cast<double>(r.cuda ? r.cuda->peak_allocated_bytes : r.cpu_peak_tensor_bytes.value_or(-1)) / 1048576.0;

  model->eval();
  torch::NoGradGuard no_grad;
  nitro::data::SyntheticImages test_set{{.size = 1024, .offset = args.samples, .channels = 1, .height = 28, .width = 28,
                                         .block = 4, .noise = 2.0}};
  const auto [tx, ty] = test_set.stacked(0, 1024);
  row.accuracy = model->forward(tx.to(device)).argmax(1).eq(ty.to(device)).to(torch::kDouble).mean().item<double>();
  return row;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view arg = argv[i];
    if (arg == "--epochs") a.epochs = std::stoi(argv[i + 1]);
    else if (arg == "--samples") a.samples = std::stoll(argv[i + 1]);
    else if (arg == "--batch") a.batch = std::stoll(argv[i + 1]);
    else nitro::detail::fail("custom_module: unknown option ", arg, "; use --epochs, --samples, --batch");
  }
  NITRO_CHECK(a.epochs >= 1 && a.samples >= 1 && a.batch >= 2 && a.batch % 2 == 0,
              "custom_module: epochs and samples must be >= 1, batch an even number >= 2");
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  std::printf("Nitro %s: a custom LibTorch module (LeNet of pytorch/examples' cpp/mnist) under each level, "
              "%lld samples of 1x28x28, batch %lld, %d epochs, on %s\n",
              nitro::version_string, static_cast<long long>(args.samples), static_cast<long long>(args.batch),
              args.epochs, nitro::Cuda::available() ? "cuda" : "cpu");
  Row rows[] = {
      train<nitro::level::Basic>("level::Basic", args, args.batch, {}),
      train<nitro::level::Ultra>("level::Ultra (bf16, 2 x " + std::to_string(args.batch / 2) + " accumulated, checkpointed)",
                                 args, args.batch / 2,
                                 {.accumulate = nitro::accumulate::Dynamic::for_batch(args.batch, args.batch / 2),
                                  .clip = {.max_norm = 5.0}}),
  };
  std::printf("%-58s %10s %9s %14s\n", "configuration", "samples/s", "peak MB", "test accuracy");
  for (const auto& r : rows)
    std::printf("%-58s %10.0f %9.1f %14.4f\n", r.name.c_str(), r.samples_per_s, r.peak_mb, r.accuracy);
  std::printf("peak MB: the most tensor memory live at once during training (%s)\n",
              nitro::Cuda::available() ? "CUDA caching allocator" : "CPU tensors, nitro::memory::ScopedCpuTracking");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "custom_module: %s\n", e.what());
  return 1;
}
