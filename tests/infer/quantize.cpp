#include <nitro/data/synthetic.hpp>
#include <nitro/infer/quantize.hpp>
#include <nitro/infer/runner.hpp>

#include "testing.hpp"

namespace nitro_test_infer_quantize {  // one namespace per file: an area is compiled as one translation unit

namespace {

// The levels demo's CNN (examples/levels.cpp), trained as the demo trains it (2 epochs of its 8192
// samples at noise 8), with Adam.
torch::nn::Sequential trained_demo_cnn(nitro::data::SyntheticImages& train) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)), torch::nn::ReLU(),
                              torch::nn::MaxPool2d(2), torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)),
                              torch::nn::ReLU(), torch::nn::MaxPool2d(2), torch::nn::Flatten(),
                              torch::nn::Linear(32 * 8 * 8, 10));
  torch::optim::Adam opt(model->parameters(), 1e-3);
  const int64_t n = *train.size(), batch = 64;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int64_t b = 0; b + batch <= n; b += batch) {
      auto [x, y] = train.stacked(b, b + batch);
      opt.zero_grad();
      torch::nn::functional::cross_entropy(model->forward(x), y).backward();
      opt.step();
    }
  }
  model->eval();
  return model;
}

double accuracy(torch::nn::Sequential& model, const at::Tensor& x, const at::Tensor& y) {
  torch::InferenceMode guard;
  return model->forward(x).argmax(1).eq(y).to(at::kDouble).mean().item<double>();
}

}  // namespace

TEST_CASE("quantize_dynamic: the demo's CNN keeps its test accuracy within 1 point of fp32") {
  nitro::hw::ScopedSettings threads{{.intra_op_threads = 2}};
  nitro::data::SyntheticImages train({.size = 8192, .noise = 8.0, .seed = 1});  // the demo's data
  nitro::data::SyntheticImages test({.size = 2048, .offset = 100000, .noise = 8.0, .seed = 1});
  auto model = trained_demo_cnn(train);
  auto [x, y] = test.stacked(0, 2048);
  const double fp32 = accuracy(model, x, y);
  auto int8 = nitro::infer::quantize_dynamic(model);
  REQUIRE(std::dynamic_pointer_cast<nitro::infer::DynamicInt8LinearImpl>(int8->ptr(7)) != nullptr);
  const double q = accuracy(int8, x, y);
  MESSAGE("demo CNN test accuracy: fp32 " << fp32 << ", int8 " << q);
  CHECK(fp32 > 0.5);  // it learned something, so the comparison means something
  CHECK(std::abs(q - fp32) <= 0.01);
  // The fp32 model is left as it was.
  CHECK(std::dynamic_pointer_cast<torch::nn::LinearImpl>(model->ptr(7)) != nullptr);
}

TEST_CASE("DynamicInt8Linear: close to the fp32 layer, per channel and per tensor, and refuses what it cannot do") {
  torch::manual_seed(11);
  torch::nn::Linear fp32(256, 64);
  fp32->eval();
  const auto x = torch::randn({8, 256});
  at::Tensor expected;
  {
    torch::NoGradGuard g;
    expected = fp32->forward(x);
  }
  const double range = expected.abs().max().item<double>();
  for (bool per_channel : {true, false}) {
    CAPTURE(per_channel);
    nitro::infer::DynamicInt8Linear q(fp32, nitro::infer::QuantizeOptions{.per_channel = per_channel});
    const auto got = q->forward(x);
    CHECK(got.sizes() == expected.sizes());
    CHECK(got.scalar_type() == at::kFloat);
    // 8-bit weights and 7-bit activations: about 1% of the output's range.
    CHECK((got - expected).abs().max().item<double>() < 0.03 * range);
    CHECK((got - expected).abs().max().item<double>() > 0);  // it did quantise
    // Leading dimensions are kept; a 1-d input is one sample.
    CHECK(q->forward(x.reshape({2, 4, 256})).sizes() == c10::IntArrayRef{2, 4, 64});
    CHECK(torch::equal(q->forward(x[0]), q->forward(x.slice(0, 0, 1))[0]));
  }
  nitro::infer::DynamicInt8Linear q(fp32);
  CHECK_THROWS_WITH_AS(q->forward(torch::randn({8, 255})), doctest::Contains("last dimension 256"), nitro::Error);
  CHECK_THROWS_WITH_AS(q->forward(x.to(at::kDouble)), doctest::Contains("float32 CPU input"), nitro::Error);
  torch::nn::Linear f64(4, 4);
  f64->to(at::kDouble);
  CHECK_THROWS_WITH_AS(nitro::infer::DynamicInt8Linear{f64}, doctest::Contains("quantise a float32 model"),
                       nitro::Error);
}

}  // namespace nitro_test_infer_quantize
