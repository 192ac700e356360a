#include <nitro/train/training_loop.hpp>

#include "testing.hpp"

#include <vector>

namespace {

torch::nn::Sequential make_mlp(int layers) {
  torch::manual_seed(1);
  torch::nn::Sequential seq;
  for (int i = 0; i < layers; ++i) {
    seq->push_back(torch::nn::Linear(16, 16));
    seq->push_back(torch::nn::Functional(torch::relu));
    seq->push_back(torch::nn::Dropout(0.3));
  }
  seq->push_back(torch::nn::Linear(16, 1));
  return seq;
}

std::vector<at::Tensor> grads_of(torch::nn::Sequential& seq) {
  std::vector<at::Tensor> out;
  for (const auto& p : seq->parameters()) out.push_back(p.grad().clone());
  return out;
}

// The gradients of one forward/backward, the RNG seeded the same before each run.
template <class Forward>
std::vector<at::Tensor> gradients(torch::nn::Sequential& seq, Forward&& forward, bool bf16 = false) {
  seq->zero_grad();
  torch::manual_seed(42);
  const auto x = torch::randn({8, 16});
  at::Tensor loss;
  {
    std::optional<nitro::AutocastGuard> autocast;
    if (bf16) autocast.emplace(c10::DeviceType::CPU, torch::kBFloat16);
    loss = forward(x).to(torch::kFloat).pow(2).mean();
  }
  loss.backward();
  return grads_of(seq);
}

void check_same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, double rtol) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(torch::allclose(a[i], b[i], rtol, 1e-7));
  }
}

}  // namespace

TEST_CASE("Segments and Sqrt give the gradients of the plain forward, dropout included") {
  auto seq = make_mlp(9);  // 28 modules: Sqrt makes 6 segments
  seq->train();
  const auto plain = gradients(seq, [&](const at::Tensor& x) { return seq->forward(x); });
  for (std::int64_t segments : {1, 2, 4, 6, 28}) {
    CAPTURE(segments);
    check_same(plain, gradients(seq, [&](const at::Tensor& x) { return nitro::detail::run_segments(*seq, segments, x); }), 1e-6);
  }
  torch::optim::SGD optimizer(seq->parameters(), 0.1);
  nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Off, nitro::checkpoint::Sqrt> loop{seq, optimizer};
  CHECK(nitro::checkpoint::Sqrt::segments(28, {}) == 6);
  check_same(plain, gradients(seq, [&](const at::Tensor& x) { return loop.forward(x); }), 1e-6);
  nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Off, nitro::checkpoint::Segments<3>> loop3{seq, optimizer};
  check_same(plain, gradients(seq, [&](const at::Tensor& x) { return loop3.forward(x); }), 1e-6);
}

TEST_CASE("checkpointed recomputation under bf16 autocast equals the plain bf16 gradients") {
  auto seq = make_mlp(4);
  const auto plain = gradients(seq, [&](const at::Tensor& x) { return seq->forward(x); }, /*bf16=*/true);
  const auto ckpt = gradients(seq, [&](const at::Tensor& x) { return nitro::detail::run_segments(*seq, 3, x); }, true);
  check_same(plain, ckpt, 1e-6);
}

TEST_CASE("checkpoint::run inside a forward: recomputed once in backward, gradients reach the parameters") {
  torch::nn::Linear inner(6, 6);
  int calls = 0;
  const auto x = torch::randn({3, 6});  // does not require grad
  const auto out = nitro::checkpoint::run(
      [&](const at::Tensor& in) {
        ++calls;
        return torch::tanh(inner->forward(in));
      },
      x);
  CHECK(calls == 1);
  CHECK(out.requires_grad());
  out.sum().backward();
  CHECK(calls == 2);  // the recomputation
  REQUIRE(inner->weight.grad().defined());
  const auto expected_weight_grad = inner->weight.grad().clone();
  inner->zero_grad();
  torch::tanh(inner->forward(x)).sum().backward();
  CHECK(torch::allclose(inner->weight.grad(), expected_weight_grad, 1e-6, 1e-7));

  // Several inputs and outputs, one of which requires grad.
  const auto a = torch::randn({4}).requires_grad_(), b = torch::randn({4});
  const auto outs = nitro::checkpoint::run(
      [](const at::Tensor& p, const at::Tensor& q) { return std::vector<at::Tensor>{p * q, p.exp()}; }, a, b);
  (outs[0].sum() + outs[1].sum()).backward();
  CHECK(torch::allclose(a.grad(), b + a.exp().detach()));
}
