// Regression: a small MLP fits y = f(x) + noise from (input, target) tensor pairs with the mean squared
// error, under a learning-rate schedule (linear warm-up, then cosine decay) that survives a resume.
//
// The schedule is a function of the loop's optimizer step, which a snapshot saves and a resume
// restores, so a run stopped and resumed sets the same rate at every step as one that never stopped
// (a LibTorch scheduler object counts its own steps, which no snapshot sees). The data set is the
// user's own torch::data::Dataset, read through a ResumableSampler so a resume starts at the batch
// where the run stopped.
//
//   build/examples/regression                                   # 8 epochs, snapshots in /tmp/nitro-regression
//   build/examples/regression --dir /tmp/r --stop-after 300     # "preempted" after 300 batches
//   build/examples/regression --dir /tmp/r                      # resumes; the same final parameters
//
// It prints the test error against the noise's variance (the best any model can do) and an XXH64 of
// the parameters' bytes: equal for a run stopped and resumed and one that never stopped.
#include <nitro/nitro.hpp>

#include <torch/torch.h>

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <numbers>
#include <string>
#include <string_view>

namespace {

// The user's own data set: row i of x and y as one (input, target) example.
struct Points : torch::data::datasets::Dataset<Points> {
  Points(at::Tensor x_, at::Tensor y_) : x(std::move(x_)), y(std::move(y_)) {}
  torch::data::Example<> get(size_t i) override { return {x[static_cast<int64_t>(i)], y[static_cast<int64_t>(i)]}; }
  std::optional<size_t> size() const override { return static_cast<size_t>(x.size(0)); }
  at::Tensor x, y;
};

// y = sin(3 x0) + x1 x2 - 0.5 x3^2 + noise: a target a linear model cannot fit.
std::pair<at::Tensor, at::Tensor> make_points(int64_t n, double noise, torch::Generator& gen) {
  const auto x = torch::rand({n, 4}, gen) * 2 - 1;
  const auto clean = torch::sin(3 * x.select(1, 0)) + x.select(1, 1) * x.select(1, 2) - 0.5 * x.select(1, 3).square();
  return {x, (clean + noise * torch::randn({n}, gen)).unsqueeze(1)};
}

// The learning rate at an optimizer step: linear warm-up over `warmup` steps, then a cosine decay to
// a tenth of `peak` at `total`.
double rate_at(std::int64_t step, std::int64_t warmup, std::int64_t total, double peak) {
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double t = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(std::max<std::int64_t>(1, total - warmup)));
  return peak * (0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * t)));
}

std::uint64_t parameter_hash(torch::nn::Module& model) {
  nitro::io::Xxh64 h;
  for (const auto& p : model.parameters()) {
    const auto c = p.detach().contiguous();
    h.update(c.data_ptr(), c.nbytes());
  }
  return h.digest();
}

}  // namespace

int main(int argc, char** argv) try {
  std::string dir = "/tmp/nitro-regression";
  int epochs = 8;
  std::int64_t samples = 4096, batch = 64, stop_after = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&] {
      NITRO_CHECK(i + 1 < argc, "regression: ", arg, " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--dir") dir = value();
    else if (arg == "--epochs") epochs = std::stoi(value());
    else if (arg == "--samples") samples = std::stoll(value());
    else if (arg == "--batch") batch = std::stoll(value());
    else if (arg == "--stop-after") stop_after = std::stoll(value());
    else NITRO_CHECK(false, "regression: unknown option ", arg, " (--dir D --epochs E --samples N --batch B --stop-after N)");
  }
  NITRO_CHECK(epochs >= 1 && samples >= batch && batch >= 1, "regression: need --epochs >= 1 and --samples >= --batch >= 1");
  at::set_num_threads(2);  // the same threads in every run: bitwise-equal results need it
  torch::manual_seed(0);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const double noise = 0.1;
  auto [train_x, train_y] = make_points(samples, noise, gen);
  const auto [test_x, test_y] = make_points(1024, noise, gen);
  const auto points = Points(train_x, train_y).map(torch::data::transforms::Stack<>());

  auto model = std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Linear(4, 64), torch::nn::Functional(torch::relu), torch::nn::Linear(64, 64),
      torch::nn::Functional(torch::relu), torch::nn::Linear(64, 1));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  nitro::data::ResumableSampler sampler(samples, {.seed = 1});
  using Loop = nitro::TrainingLoop<nitro::snapshot::Policy>;
  Loop loop{model, optimizer, {.hooks = {{.directory = dir, .every_steps = 100, .keep_last = 2, .sampler = &sampler}}}};

  if (const auto last = nitro::snapshot::latest(dir)) {
    nitro::snapshot::load(*last, loop, {.sampler = &sampler});
    std::printf("resumed from %s at epoch %lld, optimizer step %lld\n", last->filename().c_str(),
                static_cast<long long>(sampler.state().epoch), static_cast<long long>(loop.optimizer_steps()));
  } else {
    std::printf("new run in %s\n", dir.c_str());
  }

  const std::int64_t total = epochs * (samples / batch), warmup = total / 20 + 1;
  const auto loss_fn = [&](const auto& b) { return torch::mse_loss(model->forward(b.data), b.target); };
  std::int64_t micro = 0;
  while (sampler.state().epoch < epochs) {
    // Batches made ahead on two workers, in the sampler's order (the same order after a resume).
    nitro::Prefetcher<nitro::Cpu, decltype(nitro::from_dataset(points, sampler, batch))> batches{
        nitro::from_dataset(points, sampler, batch), {.depth = 4, .workers = 2}};
    for (auto& b : batches) {
      // The rate of this optimizer step, from the step the loop counts (saved in every snapshot).
      const double lr = rate_at(loop.optimizer_steps(), warmup, total, 0.05);
      for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
      const auto r = loop.step(b, loss_fn);
      if (++micro == stop_after) ::kill(::getpid(), SIGTERM);  // what a scheduler's preemption does
      if (r.stop) {
        std::printf("%s: snapshot written after optimizer step %lld; run again with --dir %s to resume\n",
                    std::string(r.stop_reason).c_str(), static_cast<long long>(loop.optimizer_steps()), dir.c_str());
        return 0;
      }
    }
    const double test_mse = [&] {
      torch::NoGradGuard no_grad;
      return torch::mse_loss(model->forward(test_x), test_y).item<double>();
    }();
    std::printf("epoch %lld: learning rate %.4f, test MSE %.5f\n", static_cast<long long>(sampler.state().epoch + 1),
                rate_at(loop.optimizer_steps(), warmup, total, 0.05), test_mse);
    sampler.set_epoch(sampler.state().epoch + 1);
  }
  loop.flush();
  torch::NoGradGuard no_grad;
  const double test_mse = torch::mse_loss(model->forward(test_x), test_y).item<double>();
  std::printf("done: %lld optimizer steps, test MSE %.5f (the noise's variance %.5f), parameters XXH64 %016llx\n",
              static_cast<long long>(loop.optimizer_steps()), test_mse, noise * noise,
              static_cast<unsigned long long>(parameter_hash(*model)));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "regression: %s\n", e.what());
  return 1;
}
