// examples/quickstart.cpp written with LibTorch alone, for bench/compile.sh: the same CNN, the same
// synthetic image data set (class prototypes, shifted, scaled, in Gaussian noise), the same data
// loader, SGD and loop, the same arguments and output. Only its compile time is measured.
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

std::uint64_t mix(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Images : public torch::data::datasets::Dataset<Images> {
 public:
  Images(std::int64_t size, std::int64_t offset, double noise) : size_(size), offset_(offset), noise_(noise) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(mix(0, ~std::uint64_t{0}));
    prototypes_ = torch::randn({10, 3, 8, 8}, gen).repeat_interleave(4, 2).repeat_interleave(4, 3).contiguous();
  }

  torch::data::Example<> get(size_t index) override {
    if (static_cast<std::int64_t>(index) >= size_) throw std::out_of_range("Images: index out of range");
    const std::uint64_t h = mix(0, static_cast<std::uint64_t>(offset_) + index);
    const auto label = static_cast<std::int64_t>(h % 10);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(h);
    const auto dy = static_cast<std::int64_t>((h >> 20) % 5) - 2, dx = static_cast<std::int64_t>((h >> 40) % 5) - 2;
    const double contrast = 0.75 + 0.5 * static_cast<double>((h >> 8) & 0xFFF) / 4095.0;
    auto image = prototypes_[label].roll({dy, dx}, {1, 2}).mul(contrast);
    if (noise_ > 0) image.add_(torch::randn(image.sizes(), gen), noise_).div_(std::sqrt(1.0 + noise_ * noise_));
    return {std::move(image), torch::scalar_tensor(label, torch::kLong)};
  }

  std::optional<size_t> size() const override { return static_cast<size_t>(size_); }

  std::pair<torch::Tensor, torch::Tensor> stacked(std::int64_t begin, std::int64_t end) {
    std::vector<torch::Tensor> images, labels;
    for (auto i = begin; i < end; ++i) {
      auto e = get(static_cast<size_t>(i));
      images.push_back(std::move(e.data));
      labels.push_back(std::move(e.target));
    }
    return {torch::stack(images), torch::stack(labels)};
  }

 private:
  std::int64_t size_, offset_;
  double noise_;
  torch::Tensor prototypes_;
};

struct Net : torch::nn::Module {
  explicit Net(std::int64_t classes)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)))),
        fc(register_module("fc", torch::nn::Linear(32 * 8 * 8, classes))) {}

  torch::Tensor forward(torch::Tensor x) {
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
  double noise = 8.0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&] {
      if (i + 1 >= argc) throw std::invalid_argument("quickstart: " + std::string(arg) + " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--epochs") a.epochs = std::stoi(value());
    else if (arg == "--samples") a.samples = std::stoll(value());
    else if (arg == "--batch") a.batch = std::stoll(value());
    else if (arg == "--noise") a.noise = std::stod(value());
    else throw std::invalid_argument("quickstart: unknown option " + std::string(arg));
  }
  if (a.epochs < 1 || a.samples < 1 || a.batch < 1) throw std::invalid_argument("quickstart: values must be >= 1");
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  torch::manual_seed(0);
  const bool gpu = torch::cuda::is_available();
  const torch::Device device = gpu ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  at::globalContext().setBenchmarkCuDNN(true);
  at::globalContext().setFloat32MatmulPrecision("high");

  Images train(args.samples, 0, args.noise);
  Images test(1024, args.samples, args.noise);
  const auto [test_x, test_y] = test.stacked(0, 1024);
  const auto test_images = test_x.to(device), test_labels = test_y.to(device);

  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      train.map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(args.batch).workers(2));

  Net model(10);
  model.to(device);
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));

  std::printf("quickstart (plain LibTorch %s) on %s, %lld samples of 3x32x32, batch %lld\n", TORCH_VERSION,
              gpu ? "cuda" : "cpu", static_cast<long long>(args.samples), static_cast<long long>(args.batch));
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
      loss_sum += loss.detach() * x.size(0);
      seen += x.size(0);
    }
    const double train_loss = loss_sum.item<double>() / static_cast<double>(seen);
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
