// The baseline: a small CNN trained on nitro::data::SyntheticImages with a plain LibTorch loop
// (torch::data loader, SGD, no Nitro policies), printing loss, accuracy and samples/s per epoch.
// The optimization levels of Nitro are measured against this loop.
//
//   make demo                      (or: build/examples/quickstart --epochs 5 --samples 16384)
#include <nitro/nitro.hpp>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace {

struct Net : torch::nn::Module {
  explicit Net(std::int64_t classes)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)))),
        fc(register_module("fc", torch::nn::Linear(32 * 8 * 8, classes))) {}

  at::Tensor forward(at::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);
    return fc->forward(x.flatten(1));
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc;
};

struct Args {
  int epochs = 3;
  std::int64_t samples = 8192;
  std::int64_t batch = 64;
  double noise = 8.0;  // hard enough that accuracy climbs over the epochs
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&] {
      NITRO_CHECK(i + 1 < argc, "quickstart: ", arg, " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--epochs") a.epochs = std::stoi(value());
    else if (arg == "--samples") a.samples = std::stoll(value());
    else if (arg == "--batch") a.batch = std::stoll(value());
    else if (arg == "--noise") a.noise = std::stod(value());
    else nitro::detail::fail("quickstart: unknown option ", arg, "; use --epochs, --samples, --batch, --noise");
  }
  NITRO_CHECK(a.epochs >= 1 && a.samples >= 1 && a.batch >= 1, "quickstart: epochs, samples, batch must be >= 1");
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  torch::manual_seed(0);
  const bool gpu = nitro::Cuda::available();
  const c10::Device device = gpu ? nitro::Cuda::device() : nitro::Cpu::device();
  nitro::hw::ScopedSettings hw{nitro::hw::Settings::fast()};

  const nitro::data::SyntheticImages::Options data{.size = args.samples, .noise = args.noise};
  nitro::data::SyntheticImages train{data};
  nitro::data::SyntheticImages test{{.size = 1024, .offset = args.samples, .noise = args.noise}};
  const auto [test_x, test_y] = test.stacked(0, 1024);
  const auto test_images = test_x.to(device), test_labels = test_y.to(device);

  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      train.map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(args.batch).workers(2));

  Net model(data.classes);
  model.to(device);
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));

  std::printf("Nitro %s quickstart (baseline: plain LibTorch %s loop) on %s, %lld samples of 3x32x32, batch %lld\n",
              nitro::version_string, TORCH_VERSION, gpu ? "cuda" : "cpu", static_cast<long long>(args.samples),
              static_cast<long long>(args.batch));
  std::printf("%-6s %-11s %-14s %-10s\n", "epoch", "train loss", "test accuracy", "samples/s");
  for (int epoch = 1; epoch <= args.epochs; ++epoch) {
    model.train();
    auto loss_sum = torch::zeros({}, device);
    std::int64_t seen = 0;
    const auto start = std::chrono::steady_clock::now();
    for (auto& batch : *loader) {
      const auto x = batch.data.to(device), y = batch.target.to(device);
      optimizer.zero_grad();
      const auto loss = torch::cross_entropy_loss(model.forward(x), y);
      loss.backward();
      optimizer.step();
      loss_sum += loss.detach() * x.size(0);  // summed on the device: no sync per step
      seen += x.size(0);
    }
    const double train_loss = loss_sum.item<double>() / static_cast<double>(seen);  // synchronises
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    model.eval();
    torch::NoGradGuard no_grad;
    const double accuracy = model.forward(test_images).argmax(1).eq(test_labels).to(torch::kDouble).mean().item<double>();
    std::printf("%-6d %-11.4f %-14.4f %-10.0f\n", epoch, train_loss, accuracy, static_cast<double>(seen) / seconds);
    std::fflush(stdout);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "quickstart: %s\n", e.what());
  return 1;
}
