#pragma once
// A GAN small enough for unit tests, trained the way pytorch/examples' DCGAN trains (the
// discriminator on real and fake images, then the generator through the discriminator), both as
// two nitro::TrainingLoops without any zero_grad() and as the plain LibTorch program with them.
// Not in the precompiled header: only the tests of several models include it.
#include <torch/torch.h>

#include <cstdint>
#include <optional>

namespace nitro::test {

struct TinyGan {
  static constexpr std::int64_t noise = 4, features = 8, rows = 16;
  torch::nn::Sequential g, d;
  std::optional<torch::optim::Adam> g_opt, d_opt;

  explicit TinyGan(std::uint64_t seed) {
    torch::manual_seed(seed);
    g = torch::nn::Sequential(torch::nn::Linear(noise, 16), torch::nn::BatchNorm1d(16), torch::nn::Functional(torch::relu),
                              torch::nn::Linear(16, features), torch::nn::Functional(torch::tanh));
    d = torch::nn::Sequential(torch::nn::Linear(features, 16), torch::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(0.2)),
                              torch::nn::Linear(16, 1), torch::nn::Functional(torch::sigmoid));
    g_opt.emplace(g->parameters(), torch::optim::AdamOptions(2e-3).betas({0.5, 0.999}));
    d_opt.emplace(d->parameters(), torch::optim::AdamOptions(2e-3).betas({0.5, 0.999}));
  }

  /// The real batch of iteration i: a fixed pattern, no generator drawn.
  static at::Tensor real(std::int64_t i) {
    return torch::sin(torch::arange(rows * features, torch::kFloat).reshape({rows, features}) * 0.1 +
                      static_cast<double>(i));
  }

  /// The discriminator's loss on real and fake images; `fake` receives the generator's images.
  at::Tensor d_loss(const at::Tensor& real_batch, at::Tensor& fake) {
    const auto real_labels = torch::empty({real_batch.size(0), 1}).uniform_(0.8, 1.0);
    const auto loss_real = torch::binary_cross_entropy(d->forward(real_batch), real_labels);
    fake = g->forward(torch::randn({real_batch.size(0), noise}));
    const auto loss_fake = torch::binary_cross_entropy(d->forward(fake.detach()), torch::zeros({real_batch.size(0), 1}));
    return loss_real + loss_fake;
  }
  /// The generator's loss: the discriminator should take its images for real.
  at::Tensor g_loss(const at::Tensor& fake) {
    return torch::binary_cross_entropy(d->forward(fake), torch::ones({fake.size(0), 1}));
  }

  /// One iteration with two loops: no zero_grad() anywhere (the loops release what is not theirs).
  template <class DLoop, class GLoop>
  void iterate(DLoop& d_loop, GLoop& g_loop, std::int64_t i) {
    at::Tensor fake;
    d_loop.step(real(i), [&](const at::Tensor& r) { return d_loss(r, fake); });
    g_loop.step(fake, [&](const at::Tensor& f) { return g_loss(f); });
  }

  /// The same iteration as the original program writes it: zero_grad, two backward passes, step.
  void iterate_plain(std::int64_t i) {
    d->zero_grad();
    const auto r = real(i);
    const auto real_labels = torch::empty({r.size(0), 1}).uniform_(0.8, 1.0);
    torch::binary_cross_entropy(d->forward(r), real_labels).backward();
    const auto fake = g->forward(torch::randn({r.size(0), noise}));
    torch::binary_cross_entropy(d->forward(fake.detach()), torch::zeros({r.size(0), 1})).backward();
    d_opt->step();
    g->zero_grad();
    torch::binary_cross_entropy(d->forward(fake), torch::ones({r.size(0), 1})).backward();
    g_opt->step();
  }

  /// Every parameter and buffer of both models equal bit for bit.
  bool same_as(TinyGan& other) {
    const auto same = [](torch::nn::Module& a, torch::nn::Module& b) {
      auto pa = a.named_parameters(), pb = b.named_parameters();
      auto ba = a.named_buffers(), bb = b.named_buffers();
      for (const auto& p : pa)
        if (!torch::equal(p.value(), pb[p.key()])) return false;
      for (const auto& p : ba)
        if (!torch::equal(p.value(), bb[p.key()])) return false;
      return true;
    };
    return same(*g, *other.g) && same(*d, *other.d);
  }
};

}  // namespace nitro::test
