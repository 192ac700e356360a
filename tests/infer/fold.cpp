#include <nitro/infer/fold.hpp>
#include <nitro/infer/runner.hpp>

#include "testing.hpp"

namespace nitro_test_infer_fold {  // one namespace per file: an area is compiled as one translation unit

namespace {

// Running statistics and affine parameters far from their defaults, so a fold that ignored any of
// them would be caught.
template <class Bn>
void randomize(Bn& bn) {
  torch::NoGradGuard no_grad;
  bn->running_mean.copy_(torch::randn_like(bn->running_mean));
  bn->running_var.copy_(torch::rand_like(bn->running_var) * 2 + 0.1);
  if (bn->weight.defined()) bn->weight.copy_(torch::randn_like(bn->weight));
  if (bn->bias.defined()) bn->bias.copy_(torch::randn_like(bn->bias));
}

template <class Conv, class ConvOptions, class Bn, class BnOptions>
void check_fold(std::vector<int64_t> input_shape, bool bias) {
  torch::manual_seed(7);
  Bn bn(BnOptions(8).eps(1e-3));
  randomize(bn);
  torch::nn::Sequential model(Conv(ConvOptions(3, 8, 3).padding(1).bias(bias)), bn, torch::nn::ReLU());
  model->eval();
  const auto x = torch::randn(input_shape);
  const auto expected = model->forward(x);
  auto folded = nitro::infer::fold_conv_bn(model);
  CHECK(folded->size() == 2);  // conv (with the norm inside) and ReLU
  CHECK(folded->named_children()[0].key() == "0");
  CHECK(folded->named_children()[1].key() == "2");
  const auto got = folded->forward(x);
  CHECK(torch::allclose(got, expected, 1e-5, 1e-5));
  CHECK((got - expected).abs().max().template item<double>() < 1e-5);
  // The input model is left as it was.
  CHECK(model->size() == 3);
  CHECK(torch::equal(model->forward(x), expected));
}

}  // namespace

TEST_CASE("fold_conv_bn equals the unfolded eval model: Conv1d/2d/3d, with and without bias") {
  for (bool bias : {true, false}) {
    CAPTURE(bias);
    check_fold<torch::nn::Conv1d, torch::nn::Conv1dOptions, torch::nn::BatchNorm1d, torch::nn::BatchNorm1dOptions>(
        {4, 3, 17}, bias);
    check_fold<torch::nn::Conv2d, torch::nn::Conv2dOptions, torch::nn::BatchNorm2d, torch::nn::BatchNorm2dOptions>(
        {4, 3, 12, 10}, bias);
    check_fold<torch::nn::Conv3d, torch::nn::Conv3dOptions, torch::nn::BatchNorm3d, torch::nn::BatchNorm3dOptions>(
        {2, 3, 6, 5, 7}, bias);
  }
}

TEST_CASE("fold_conv_bn: the weights are the hand-computed w * gamma / sqrt(var + eps)") {
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(1, 2, 1).bias(true));
  torch::nn::BatchNorm2d bn(torch::nn::BatchNorm2dOptions(2).eps(0.0));
  {
    torch::NoGradGuard no_grad;
    conv->weight.copy_(torch::tensor({2.0f, -3.0f}).reshape({2, 1, 1, 1}));
    conv->bias.copy_(torch::tensor({1.0f, 5.0f}));
    bn->running_mean.copy_(torch::tensor({0.5f, 1.0f}));
    bn->running_var.copy_(torch::tensor({4.0f, 0.25f}));
    bn->weight.copy_(torch::tensor({3.0f, 2.0f}));
    bn->bias.copy_(torch::tensor({-1.0f, 0.5f}));
  }
  conv->eval();
  bn->eval();
  const auto f = nitro::infer::fold_conv_bn(conv, bn);
  // channel 0: scale 3 / 2 = 1.5: w 3, b (1 - 0.5) * 1.5 - 1 = -0.25; channel 1: scale 2 / 0.5 = 4: w -12, b 16.5
  CHECK(torch::equal(f->weight.flatten(), torch::tensor({3.0f, -12.0f})));
  CHECK(torch::equal(f->bias, torch::tensor({-0.25f, 16.5f})));
}

TEST_CASE("fold_conv_bn: groups, stride, dilation, padding modes, and what is left unfolded") {
  torch::manual_seed(3);
  torch::nn::BatchNorm2d bn1(8), bn2(8), no_stats(torch::nn::BatchNorm2dOptions(8).track_running_stats(false));
  randomize(bn1);
  randomize(bn2);
  torch::nn::Sequential model(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).stride(2).dilation(2).padding(2)),
                              bn1,
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).padding(1).groups(4)
                                                    .padding_mode(torch::kReflect).bias(false)),
                              bn2, torch::nn::ReLU(), bn2,  // a norm after no convolution
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 1)), no_stats,
                              torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(8, 8, 2)));
  model->eval();
  const auto x = torch::randn({2, 3, 16, 16});
  const auto expected = model->forward(x);
  auto folded = nitro::infer::fold_conv_bn(model);
  // conv+bn1, conv+bn2, relu, bn2 (kept), conv, no_stats (kept), transposed conv
  CHECK(folded->size() == 7);
  CHECK(folded->ptr(3) == model->ptr(5));  // left unfolded, shared
  CHECK(folded->ptr(5) == model->ptr(7));
  CHECK((folded->forward(x) - expected).abs().max().item<double>() < 1e-5);
}

TEST_CASE("fold_conv_bn refuses a model in training mode, and says so") {
  torch::nn::Sequential model(torch::nn::Conv2d(3, 4, 3), torch::nn::BatchNorm2d(4));
  model->train();
  CHECK_THROWS_WITH_AS(nitro::infer::fold_conv_bn(model), doctest::Contains("training mode"), nitro::Error);
  torch::nn::Conv2d conv(3, 4, 3);
  torch::nn::BatchNorm2d bn(5);
  conv->eval();
  bn->eval();
  CHECK_THROWS_WITH_AS(nitro::infer::fold_conv_bn(conv, bn), doctest::Contains("5 channels"), nitro::Error);
}

TEST_CASE("prepare: eval, no gradients, folded, channels-last, and the Basic runner equals the eval forward") {
  torch::manual_seed(5);
  torch::nn::BatchNorm2d bn(16);
  randomize(bn);
  torch::nn::Sequential model(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)), bn,
                              torch::nn::ReLU(), torch::nn::AdaptiveAvgPool2d(1), torch::nn::Flatten(),
                              torch::nn::Linear(16, 4));
  model->eval();
  const auto x = torch::randn({5, 3, 8, 8});
  const auto expected = model->forward(x);
  model->train();
  nitro::infer::PrepareOptions options;
  options.channels_last = true;
  auto prepared = nitro::infer::prepare(model, options);
  CHECK_FALSE(prepared->is_training());
  CHECK(prepared->size() == 5);
  for (const auto& p : prepared->parameters()) CHECK_FALSE(p.requires_grad());
  CHECK(prepared->ptr<torch::nn::Conv2dImpl>(0)->weight.is_contiguous(c10::MemoryFormat::ChannelsLast));

  nitro::infer::Runner<nitro::infer::level::Fast> fast{nitro::infer::module_model(prepared)};
  nitro::infer::Runner<nitro::infer::level::Basic> basic{nitro::infer::module_model(prepared)};
  const auto a = fast(x);
  const auto b = basic(x);
  CHECK(a.is_inference());
  CHECK((a - expected).abs().max().item<double>() < 1e-5);
  CHECK((b - expected).abs().max().item<double>() < 1e-5);

  options.dtype = at::kLong;
  CHECK_THROWS_WITH_AS(nitro::infer::prepare(model, options), doctest::Contains("floating type"), nitro::Error);
  options.dtype = at::kBFloat16;
  options.channels_last = false;
  auto bf16 = nitro::infer::prepare(model, options);
  CHECK(bf16->parameters().front().scalar_type() == at::kBFloat16);
  const double tolerance = 0.05 * (1.0 + expected.abs().max().item<double>());  // bf16: 8 bits of mantissa
  CHECK((bf16->forward(x.to(at::kBFloat16)).to(at::kFloat) - expected).abs().max().item<double>() < tolerance);
  // The runner converts float inputs to the prepared model's dtype.
  nitro::infer::Runner<nitro::infer::level::Basic> run_bf16{nitro::infer::module_model(bf16)};
  CHECK((run_bf16(x).to(at::kFloat) - expected).abs().max().item<double>() < tolerance);
}

}  // namespace nitro_test_infer_fold
