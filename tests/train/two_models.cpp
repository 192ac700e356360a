// Several models in one run: the gradients a loop's step starts from are its own. A GAN trained with
// two loops and no zero_grad() equals, bit for bit, the original program with its zero_grad() calls.
#include "testing.hpp"

#include "tiny_gan.hpp"

#include <nitro/train/training_loop.hpp>

namespace nitro_test_train_two_models {  // one namespace per file: an area is compiled as one translation unit

using nitro::test::TinyGan;

TEST_CASE("two loops without zero_grad train a GAN exactly as the plain program with zero_grad") {
  TinyGan plain(7), ported(7);
  REQUIRE(plain.same_as(ported));
  nitro::TrainingLoop<> d_loop(ported.d, *ported.d_opt), g_loop(ported.g, *ported.g_opt);
  torch::manual_seed(11);
  for (std::int64_t i = 0; i < 8; ++i) plain.iterate_plain(i);
  torch::manual_seed(11);
  for (std::int64_t i = 0; i < 8; ++i) ported.iterate(d_loop, g_loop, i);
  CHECK(plain.same_as(ported));
  // The generator's backward left gradients in the discriminator (as in the original); the next
  // discriminator step releases them before its forward.
  CHECK(ported.d->parameters()[0].grad().defined());
  CHECK_FALSE(ported.g->parameters()[0].grad().defined());
}

TEST_CASE("a loop's window starts from no gradient, and keeps its own within the window") {
  torch::nn::Linear model(3, 1);
  {
    torch::NoGradGuard no_grad;
    model->weight.fill_(0.5);
    model->bias.zero_();
  }
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::TrainingLoop<nitro::accumulate::Fixed<2>> loop(model, optimizer);
  // Another backward through the model before the window: released, not added.
  model->forward(torch::ones({1, 3})).sum().mul(100).backward();
  REQUIRE(model->weight.grad().defined());
  const auto loss = [&](const at::Tensor& b) { return model->forward(b).mean(); };
  loop.step(torch::ones({4, 3}), loss);
  // Half the window's gradient: d(mean / 2)/dw = 0.5 for each weight.
  CHECK(torch::equal(model->weight.grad(), torch::full({1, 3}, 0.5)));
  loop.step(torch::ones({4, 3}), loss);
  // One step of the window's mean gradient (1 per weight): 0.5 - 0.1.
  CHECK(torch::allclose(model->weight, torch::full({1, 3}, 0.4)));
  CHECK_FALSE(model->weight.grad().defined());
}

}  // namespace nitro_test_train_two_models
