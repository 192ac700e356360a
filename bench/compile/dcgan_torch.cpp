// examples/dcgan.cpp written with LibTorch alone, for bench/compile.sh: the same generator and
// discriminator (28x28 one-channel images), synthetic images in [-1, 1], a random-order data loader,
// two Adam optimizers, the same losses, an EMA of the generator's weights for the samples, PGM
// samples, a checkpoint of both models and optimizers every --every iterations and on SIGTERM/SIGINT
// (torch::save / torch::load, resumed when --dir has one), time spent waiting for data, and a hash of
// the parameters at the end. Only its compile time is measured.
#include <torch/torch.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

constexpr std::int64_t kNoise = 100;
std::atomic<bool> g_stop{false};

// Blocky class prototypes in noise, scaled to [-1, 1]: enough structure for the discriminator.
class Digits : public torch::data::datasets::Dataset<Digits> {
 public:
  explicit Digits(std::int64_t size) : size_(size) {
    torch::manual_seed(7);
    prototypes_ = torch::randn({10, 1, 7, 7}).repeat_interleave(4, 2).repeat_interleave(4, 3);
  }
  torch::data::Example<> get(size_t index) override {
    const auto i = static_cast<std::int64_t>(index);
    if (i >= size_) throw std::out_of_range("Digits: index " + std::to_string(i) + " is out of range");
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(i) * 2654435761u + 1);
    auto image = prototypes_[i % 10] + 0.5 * torch::randn({1, 28, 28}, gen);
    return {torch::tanh(image), torch::scalar_tensor(i % 10, torch::kLong)};
  }
  std::optional<size_t> size() const override { return static_cast<size_t>(size_); }

 private:
  std::int64_t size_;
  torch::Tensor prototypes_;
};

torch::nn::Sequential generator_of(std::int64_t c) {
  using namespace torch::nn;
  auto block = [](std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t s, std::int64_t p) {
    return ConvTranspose2d(ConvTranspose2dOptions(in, out, k).stride(s).padding(p).bias(false));
  };
  return Sequential(block(kNoise, c * 4, 4, 1, 0), BatchNorm2d(c * 4), Functional(torch::relu),
                    block(c * 4, c * 2, 3, 2, 1), BatchNorm2d(c * 2), Functional(torch::relu),
                    block(c * 2, c, 4, 2, 1), BatchNorm2d(c), Functional(torch::relu),
                    block(c, 1, 4, 2, 1), Functional(torch::tanh));
}

torch::nn::Sequential discriminator_of(std::int64_t c) {
  using namespace torch::nn;
  auto block = [](std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t s, std::int64_t p) {
    return Conv2d(Conv2dOptions(in, out, k).stride(s).padding(p).bias(false));
  };
  const auto leaky = LeakyReLUOptions().negative_slope(0.2);
  return Sequential(block(1, c, 4, 2, 1), LeakyReLU(leaky),
                    block(c, c * 2, 4, 2, 1), BatchNorm2d(c * 2), LeakyReLU(leaky),
                    block(c * 2, c * 4, 4, 2, 1), BatchNorm2d(c * 4), LeakyReLU(leaky),
                    block(c * 4, 1, 3, 1, 0), Functional(torch::sigmoid));
}

// An exponential moving average of a module's parameters and buffers.
struct Ema {
  explicit Ema(torch::nn::Module& m, double decay) : decay(decay) {
    torch::NoGradGuard no_grad;
    for (const auto& p : m.parameters()) shadow.push_back(p.detach().clone());
  }
  void update(torch::nn::Module& m) {
    torch::NoGradGuard no_grad;
    auto params = m.parameters();
    for (size_t i = 0; i < params.size(); ++i) shadow[i].lerp_(params[i].detach(), 1.0 - decay);
  }
  // Puts the average into `m`, returns what it replaced.
  std::vector<torch::Tensor> swap_into(torch::nn::Module& m) {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> live;
    auto params = m.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      live.push_back(params[i].detach().clone());
      params[i].copy_(shadow[i]);
    }
    return live;
  }
  void restore(torch::nn::Module& m, const std::vector<torch::Tensor>& live) {
    torch::NoGradGuard no_grad;
    auto params = m.parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(live[i]);
  }
  double decay;
  std::vector<torch::Tensor> shadow;
};

std::uint64_t fnv1a(std::initializer_list<torch::nn::Module*> models) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (auto* m : models)
    for (const auto& p : m->parameters()) {
      const auto c = p.detach().to(torch::kCPU).contiguous();
      const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
      for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
    }
  return h;
}

void write_pgm(const std::string& file, const torch::Tensor& images) {
  const auto pixels = ((images.detach().to(torch::kCPU).squeeze(1) + 1) * 127.5).clamp(0, 255).to(torch::kUInt8);
  const auto row = pixels.permute({1, 0, 2}).reshape({28, -1}).contiguous();
  std::ofstream out(file, std::ios::binary);
  out << "P5\n" << row.size(1) << " 28\n255\n";
  out.write(reinterpret_cast<const char*>(row.data_ptr<std::uint8_t>()), row.numel());
}

struct Checkpoint {
  std::filesystem::path dir;
  void save(torch::nn::Sequential& g, torch::nn::Sequential& d, torch::optim::Adam& go, torch::optim::Adam& dopt,
            const Ema& ema, const torch::Tensor& noise, std::int64_t iteration) const {
    const auto tmp = dir / "checkpoint.tmp";
    std::filesystem::create_directories(tmp);
    torch::save(g, (tmp / "generator.pt").string());
    torch::save(d, (tmp / "discriminator.pt").string());
    torch::save(go, (tmp / "generator_optimizer.pt").string());
    torch::save(dopt, (tmp / "discriminator_optimizer.pt").string());
    torch::save(ema.shadow, (tmp / "ema.pt").string());
    torch::save(std::vector<torch::Tensor>{noise, torch::tensor(iteration)}, (tmp / "extras.pt").string());
    // File by file: libtorch.so 2.11 exports a std::filesystem::remove_all that crashes on a
    // non-empty directory (README, "Removing a directory tree").
    if (std::filesystem::exists(dir / "checkpoint")) {
      for (const auto& e : std::filesystem::directory_iterator(dir / "checkpoint")) std::filesystem::remove(e.path());
      std::filesystem::remove(dir / "checkpoint");
    }
    std::filesystem::rename(tmp, dir / "checkpoint");
  }
  std::optional<std::int64_t> load(torch::nn::Sequential& g, torch::nn::Sequential& d, torch::optim::Adam& go,
                                   torch::optim::Adam& dopt, Ema& ema, torch::Tensor& noise) const {
    const auto from = dir / "checkpoint";
    if (!std::filesystem::exists(from / "extras.pt")) return std::nullopt;
    torch::load(g, (from / "generator.pt").string());
    torch::load(d, (from / "discriminator.pt").string());
    torch::load(go, (from / "generator_optimizer.pt").string());
    torch::load(dopt, (from / "discriminator_optimizer.pt").string());
    torch::load(ema.shadow, (from / "ema.pt").string());
    std::vector<torch::Tensor> extras;
    torch::load(extras, (from / "extras.pt").string());
    noise = extras.at(0);
    return extras.at(1).item<std::int64_t>();
  }
};

}  // namespace

int main(int argc, char** argv) try {
  std::string dir = "/tmp/torch-dcgan";
  std::int64_t iterations = 200, every = 20, stop_after = -1, log_every = 10, base = -1, count = 4096;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument("dcgan: " + std::string(arg) + " needs a value");
      return argv[++i];
    };
    if (arg == "--dir") dir = next();
    else if (arg == "--iterations") iterations = std::stoll(next());
    else if (arg == "--every") every = std::stoll(next());
    else if (arg == "--stop-after") stop_after = std::stoll(next());
    else if (arg == "--log-every") log_every = std::stoll(next());
    else if (arg == "--base") base = std::stoll(next());
    else if (arg == "--images") count = std::stoll(next());
    else throw std::invalid_argument("dcgan: unknown option " + std::string(arg));
  }
  if (iterations <= 0 || every <= 0 || log_every <= 0 || count < 64 || count % 64 != 0)
    throw std::invalid_argument("dcgan: bad --iterations, --every, --log-every or --images");
  at::set_num_threads(2);
  torch::manual_seed(1);
  ::signal(SIGTERM, [](int) { g_stop = true; });
  ::signal(SIGINT, [](int) { g_stop = true; });

  const torch::Device device = torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (base < 0) base = device.is_cuda() ? 64 : 16;
  std::printf("dcgan: training on %s, %lld base channels\n", device.str().c_str(), static_cast<long long>(base));

  auto generator = generator_of(base), discriminator = discriminator_of(base);
  generator->to(device);
  discriminator->to(device);
  torch::optim::Adam g_optimizer(generator->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
  torch::optim::Adam d_optimizer(discriminator->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
  Ema ema(*generator, 0.999);
  auto sample_noise = torch::randn({8, kNoise, 1, 1}, device);

  const Checkpoint checkpoint{dir};
  std::filesystem::create_directories(dir);
  std::int64_t iteration = 0;
  if (const auto resumed = checkpoint.load(generator, discriminator, g_optimizer, d_optimizer, ema, sample_noise)) {
    iteration = *resumed;
    std::printf("dcgan: resumed at iteration %lld\n", static_cast<long long>(iteration));
  }

  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      Digits(count).map(torch::data::transforms::Stack<>()), torch::data::DataLoaderOptions(64).workers(2));
  double d_wait = 0, d_step = 0, g_step = 0;
  const std::int64_t batches_per_epoch = count / 64;
  for (std::int64_t epoch = 0; iteration < iterations; ++epoch) {
    auto waited = std::chrono::steady_clock::now();
    for (auto& batch : *loader) {
      const auto t0 = std::chrono::steady_clock::now();
      d_wait += std::chrono::duration<double>(t0 - waited).count();
      const auto real = batch.data.to(device, /*non_blocking=*/true);
      const std::int64_t rows = real.size(0);

      discriminator->zero_grad();
      const auto real_labels = torch::empty({rows}, real.options()).uniform_(0.8, 1.0);
      const auto d_real = torch::binary_cross_entropy(discriminator->forward(real).view(-1), real_labels);
      const auto fake = generator->forward(torch::randn({rows, kNoise, 1, 1}, real.options()));
      const auto d_fake =
          torch::binary_cross_entropy(discriminator->forward(fake.detach()).view(-1), torch::zeros({rows}, real.options()));
      const auto d_loss = d_real + d_fake;
      d_loss.backward();
      d_optimizer.step();
      const auto t1 = std::chrono::steady_clock::now();
      d_step += std::chrono::duration<double>(t1 - t0).count();

      generator->zero_grad();
      if (iteration + 1 == stop_after) ::kill(::getpid(), SIGTERM);
      const auto g_loss =
          torch::binary_cross_entropy(discriminator->forward(fake).view(-1), torch::ones({rows}, real.options()));
      g_loss.backward();
      g_optimizer.step();
      ema.update(*generator);
      g_step += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();

      ++iteration;
      if (iteration % log_every == 0)
        std::printf("[%4lld/%lld] epoch %lld batch %2lld/%lld  D_loss %.4f | G_loss %.4f\n",
                    static_cast<long long>(iteration), static_cast<long long>(iterations), static_cast<long long>(epoch),
                    static_cast<long long>(iteration % batches_per_epoch), static_cast<long long>(batches_per_epoch),
                    d_loss.item<double>(), g_loss.item<double>());
      if (iteration % every == 0) {
        torch::NoGradGuard no_grad;
        generator->eval();
        const auto live = ema.swap_into(*generator);
        write_pgm(dir + "/samples-" + std::to_string(iteration) + ".pgm", generator->forward(sample_noise));
        ema.restore(*generator, live);
        generator->train();
      }
      if (iteration % every == 0 || g_stop)
        checkpoint.save(generator, discriminator, g_optimizer, d_optimizer, ema, sample_noise, iteration);
      if (g_stop) {
        std::printf("dcgan: stopped; checkpoint of iteration %lld written; exiting\n", static_cast<long long>(iteration));
        return 0;
      }
      if (iteration >= iterations) break;
      waited = std::chrono::steady_clock::now();
    }
  }
  std::printf("discriminator: %.3f s stepping, %.3f s waiting for data; generator: %.3f s stepping\n", d_step, d_wait,
              g_step);
  std::printf("done: %lld iterations, parameters FNV-1a %016llx\n", static_cast<long long>(iteration),
              static_cast<unsigned long long>(fnv1a({generator.ptr().get(), discriminator.ptr().get()})));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "dcgan: %s\n", e.what());
  return 1;
}
