// Two models in one run: a DCGAN (a generator and a discriminator of 28x28 one-channel images, the
// architecture of pytorch/examples' cpp/dcgan) trained with two nitro::TrainingLoops, the device
// chosen at run time, one snapshot for both loops, and a monitor per loop that is told when the
// other loop runs.
//
// What it shows, in the order of the iteration:
//   - the device is a value (`torch::cuda::is_available()`), and nitro::Prefetcher<nitro::Auto> takes
//     it: pinned copies on a copy stream on a GPU, none on the CPU;
//   - the discriminator's loop trains on real and fake images (one loss, the sum of both); the fake
//     images it made are the generator loop's batch, whose loss goes through the discriminator;
//   - no zero_grad() anywhere: a loop's step starts from no gradient on its own parameters, so the
//     gradients the generator's backward leaves in the discriminator are not added to its next step;
//   - each loop's monitor is paused while the other loop steps, so its "data wait" is the loader's;
//   - the generator has an EMA of its weights (nitro::ema::Model); the sample images come from it;
//   - nitro::snapshot::Run writes one snapshot of both loops, the sampler, the generators and the
//     fixed sample noise every --every iterations and on SIGTERM/SIGINT, at the end of an iteration,
//     after the samples are drawn. Started again with the same --dir, the run resumes exactly: it
//     ends by printing an XXH64 of both models' parameters, the same whether it stopped or not.
//
//   build/examples/dcgan --dir /tmp/gan-a --iterations 60                   # uninterrupted
//   build/examples/dcgan --dir /tmp/gan-b --iterations 60 --stop-after 25   # SIGTERM in iteration 25
//   build/examples/dcgan --dir /tmp/gan-b --iterations 60                   # resumes; the same hash
//
// --base sets the channels (64 in the original on a GPU; 16 by default on the CPU, to train in seconds);
// --images the size of the data set (4096 by default: 64 batches an epoch).
#include <nitro/nitro.hpp>

#include <torch/torch.h>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>

namespace {

constexpr std::int64_t kNoise = 100;

torch::nn::Sequential make_generator(std::int64_t base) {
  namespace nn = torch::nn;
  const auto up = [](std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride, std::int64_t padding) {
    return nn::ConvTranspose2d(nn::ConvTranspose2dOptions(in, out, kernel).stride(stride).padding(padding).bias(false));
  };
  return nn::Sequential(up(kNoise, base * 4, 4, 1, 0), nn::BatchNorm2d(base * 4), nn::Functional(torch::relu),  // 4x4
                        up(base * 4, base * 2, 3, 2, 1), nn::BatchNorm2d(base * 2), nn::Functional(torch::relu),  // 7x7
                        up(base * 2, base, 4, 2, 1), nn::BatchNorm2d(base), nn::Functional(torch::relu),  // 14x14
                        up(base, 1, 4, 2, 1), nn::Functional(torch::tanh));  // 28x28 in [-1, 1]
}

torch::nn::Sequential make_discriminator(std::int64_t base) {
  namespace nn = torch::nn;
  const auto down = [](std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride, std::int64_t padding) {
    return nn::Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(false));
  };
  const auto leaky = nn::LeakyReLUOptions().negative_slope(0.2);
  return nn::Sequential(down(1, base, 4, 2, 1), nn::LeakyReLU(leaky),                                   // 14x14
                        down(base, base * 2, 4, 2, 1), nn::BatchNorm2d(base * 2), nn::LeakyReLU(leaky),  // 7x7
                        down(base * 2, base * 4, 4, 2, 1), nn::BatchNorm2d(base * 4), nn::LeakyReLU(leaky),  // 3x3
                        down(base * 4, 1, 3, 1, 0), nn::Functional(torch::sigmoid));  // 1x1: "real"
}

std::uint64_t parameter_hash(std::initializer_list<torch::nn::Module*> models) {
  nitro::io::Xxh64 h;
  for (auto* model : models)
    for (const auto& p : model->parameters()) {
      const auto c = p.detach().to(torch::kCPU).contiguous();
      h.update(c.data_ptr(), c.nbytes());
    }
  return h.digest();
}

// Images in [-1, 1], (n, 1, 28, 28), as one PGM picture, side by side.
void write_pgm(const std::string& file, const at::Tensor& images) {
  const auto pixels = ((images.detach().to(torch::kCPU).squeeze(1) + 1) * 127.5).clamp(0, 255).to(torch::kUInt8);
  const auto row = pixels.permute({1, 0, 2}).reshape({28, -1}).contiguous();
  std::ofstream out(file, std::ios::binary);
  out << "P5\n" << row.size(1) << " 28\n255\n";
  out.write(reinterpret_cast<const char*>(row.data_ptr<std::uint8_t>()), row.numel());
}

}  // namespace

int main(int argc, char** argv) try {
  std::string dir = "/tmp/nitro-dcgan";
  std::int64_t iterations = 200, every = 20, stop_after = -1, log_every = 10, base = -1, images_count = 4096;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&] {
      NITRO_CHECK(i + 1 < argc, "dcgan: ", arg, " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--dir") dir = value();
    else if (arg == "--iterations") iterations = std::stoll(value());
    else if (arg == "--every") every = std::stoll(value());
    else if (arg == "--stop-after") stop_after = std::stoll(value());
    else if (arg == "--log-every") log_every = std::stoll(value());
    else if (arg == "--base") base = std::stoll(value());
    else if (arg == "--images") images_count = std::stoll(value());
    else NITRO_CHECK(false, "dcgan: unknown option ", arg,
                     " (--dir D --iterations N --every N --stop-after N --log-every N --base C --images N)");
  }
  NITRO_CHECK(iterations > 0 && every > 0 && log_every > 0, "dcgan: --iterations, --every and --log-every must be > 0");
  NITRO_CHECK(images_count >= 64 && images_count % 64 == 0, "dcgan: --images must be a multiple of the batch, 64");
  at::set_num_threads(2);  // the same threads in every run (bitwise-equal results need it): your core count
  torch::manual_seed(1);

  // The device, chosen at run time as the original does.
  const torch::Device device = torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (base < 0) base = device.is_cuda() ? 64 : 16;
  std::printf("dcgan: training on %s, %lld base channels\n", device.str().c_str(), static_cast<long long>(base));

  auto generator = make_generator(base), discriminator = make_discriminator(base);
  generator->to(device);
  discriminator->to(device);
  torch::optim::Adam g_optimizer(generator->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));
  torch::optim::Adam d_optimizer(discriminator->parameters(), torch::optim::AdamOptions(2e-4).betas({0.5, 0.999}));

  using DLoop = nitro::TrainingLoop<nitro::monitor::Phases>;
  using GLoop = nitro::TrainingLoop<nitro::monitor::Phases, nitro::ema::Model>;
  DLoop d_loop{discriminator, d_optimizer};
  GLoop g_loop{generator, g_optimizer, {.hooks = {nitro::ema::Model::Options{.decay = 0.999, .tau = 100}}}};

  // MNIST's shape, scaled to the generator's tanh range.
  const std::int64_t kImages = images_count, kBatch = 64;
  const auto images = nitro::data::SyntheticImages({.size = kImages, .channels = 1, .height = 28, .width = 28,
                                                    .block = 4, .range = nitro::data::SyntheticImages::Range{-1, 1}})
                          .map(torch::data::transforms::Stack<>());
  nitro::data::ResumableSampler sampler(kImages, {.seed = 1});
  // What the run keeps besides the loops: the noise the samples are drawn from.
  nitro::StateDict extras;
  extras.tensors["sample_noise"] = torch::randn({8, kNoise, 1, 1}, device);

  nitro::snapshot::Run run{{.directory = dir, .every = every, .keep_last = 2, .sampler = &sampler, .extras = &extras},
                           {{"generator", g_loop}, {"discriminator", d_loop}}};
  if (const auto last = run.resume())
    std::printf("dcgan: resumed from %s at iteration %lld\n", last->filename().c_str(), static_cast<long long>(run.iteration()));

  const std::int64_t batches_per_epoch = kImages / kBatch;
  while (run.iteration() < iterations) {
    {
      nitro::Prefetcher<nitro::Auto, decltype(nitro::from_dataset(images, sampler, kBatch))> batches{
          nitro::from_dataset(images, sampler, kBatch), {.depth = 4, .workers = 2, .device = device}};
      for (auto& batch : batches) {
        const std::int64_t rows = batch.data.size(0);
        at::Tensor fake;
        nitro::StepResult d, g;
        {
          auto away = g_loop.monitor().pause();
          d = d_loop.step(batch.data, [&](const at::Tensor& real) {
            const auto real_labels = torch::empty({rows}, real.options()).uniform_(0.8, 1.0);
            const auto d_real = torch::binary_cross_entropy(discriminator->forward(real).view(-1), real_labels);
            fake = generator->forward(torch::randn({rows, kNoise, 1, 1}, real.options()));
            const auto d_fake = torch::binary_cross_entropy(discriminator->forward(fake.detach()).view(-1),
                                                            torch::zeros({rows}, real.options()));
            return d_real + d_fake;
          });
        }
        {
          auto away = d_loop.monitor().pause();
          g = g_loop.step(fake, [&](const at::Tensor& images) {
            if (run.iteration() + 1 == stop_after) ::kill(::getpid(), SIGTERM);  // a scheduler's preemption
            return torch::binary_cross_entropy(discriminator->forward(images).view(-1), torch::ones({rows}, images.options()));
          });
        }
        auto away_g = g_loop.monitor().pause();
        auto away_d = d_loop.monitor().pause();
        const std::int64_t done = run.iteration() + 1;
        if (done % log_every == 0)
          std::printf("[%4lld/%lld] epoch %lld batch %2lld/%lld  D_loss %.4f | G_loss %.4f\n", static_cast<long long>(done),
                      static_cast<long long>(iterations), static_cast<long long>(sampler.state().epoch),
                      static_cast<long long>(sampler.state().index / kBatch), static_cast<long long>(batches_per_epoch),
                      d.loss.item<double>(), g.loss.item<double>());
        if (done % every == 0) {
          // Samples from the EMA of the generator, drawn before the snapshot of this iteration.
          auto& ema = g_loop.hook<nitro::ema::Model>();
          torch::NoGradGuard no_grad;
          generator->eval();
          {
            auto weights = ema.swap_into(*generator);
            write_pgm(dir + "/samples-" + std::to_string(done) + ".pgm", generator->forward(extras.tensors["sample_noise"]));
          }
          generator->train();
        }
        const auto end = run.end_iteration();
        if (end.stop) {
          std::printf("dcgan: %s: snapshot %s of iteration %lld written; exiting\n", std::string(end.stop_reason).c_str(),
                      end.saved->filename().c_str(), static_cast<long long>(run.iteration()));
          return 0;
        }
        if (run.iteration() >= iterations) break;
      }
    }  // the prefetcher is gone: batches it made ahead and did not deliver are the sampler's again
    if (run.iteration() < iterations) sampler.set_epoch(sampler.state().epoch + 1);
  }

  run.save_now();  // the end of the run (a longer run started with this --dir continues from here)
  for (auto* loop_name : {"discriminator", "generator"}) {
    const auto summary = std::string_view(loop_name) == "generator" ? nitro::monitor::summarize(g_loop.monitor())
                                                                    : nitro::monitor::summarize(d_loop.monitor());
    std::printf("%s: %s", loop_name, nitro::monitor::format(summary).c_str());
    for (const auto& advice : nitro::monitor::bottlenecks(summary)) std::printf("  advice: %s\n", advice.text().c_str());
  }
  std::printf("done: %lld iterations, parameters XXH64 %016llx\n", static_cast<long long>(run.iteration()),
              static_cast<unsigned long long>(parameter_hash({generator.ptr().get(), discriminator.ptr().get()})));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "dcgan: %s\n", e.what());
  return 1;
}
