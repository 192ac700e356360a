#include <nitro/memory/tracking_allocator.hpp>
#include <nitro/train/levels.hpp>

#include "testing.hpp"

#include <cstdint>
#include <future>
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
    check_same(plain, gradients(seq, [&](const at::Tensor& x) { return nitro::checkpoint::sequential(seq, segments, x); }), 1e-6);
  }
  torch::optim::SGD optimizer(seq->parameters(), 0.1);
  nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Off, nitro::checkpoint::Sqrt> loop{seq, optimizer};
  CHECK(nitro::checkpoint::Sqrt::segments(28, {}) == 6);
  check_same(plain, gradients(seq, [&](const at::Tensor& x) { return loop.forward(x); }), 1e-6);
  nitro::TrainingLoop<nitro::amp::Off, nitro::accumulate::Off, nitro::checkpoint::Segments<3>> loop3{seq, optimizer};
  check_same(plain, gradients(seq, [&](const at::Tensor& x) { return loop3.forward(x); }), 1e-6);
}

TEST_CASE("checkpoint::sequential's peak memory is torch.utils.checkpoint's (non-reentrant), not one activation more") {
  // 16 x (Linear(256, 256), ReLU), batch 64 (an activation is 64 KiB), 4 segments, forward and
  // backward of pow(2).mean(), the gradients allocated beforehand and zeroed in place. The reference,
  // 802632 bytes, is Python PyTorch 2.11's checkpoint_sequential(net, 4, x, use_reentrant=False) in
  // this environment, counted by the same tracker (bench/peers' libnitro_peer_tracking.so): a
  // recomputed segment's output held to the end of its backward made Nitro's 868168 (one more).
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int i = 0; i < 16; ++i) {
    net->push_back(torch::nn::Linear(256, 256));
    net->push_back(torch::nn::Functional(torch::relu));
  }
  const auto x = torch::randn({64, 256});
  const auto step = [&] {
    const auto loss = nitro::checkpoint::sequential(net, 4, x).pow(2).mean();
    loss.backward();
  };
  step();
  for (auto& p : net->parameters()) p.mutable_grad().zero_();
  nitro::memory::ScopedCpuTracking track;
  step();
  const auto peak = track.stats().peak_bytes;
  CAPTURE(peak);
  CHECK(peak <= 802632 + 1024);   // allowing a few scalars of difference
  CHECK(peak >= 802632 - 65536);  // and measuring what it should (not a tracker that saw nothing)
}

TEST_CASE("checkpointed recomputation under bf16 autocast equals the plain bf16 gradients") {
  auto seq = make_mlp(4);
  const auto plain = gradients(seq, [&](const at::Tensor& x) { return seq->forward(x); }, /*bf16=*/true);
  const auto ckpt = gradients(seq, [&](const at::Tensor& x) { return nitro::checkpoint::sequential(seq, 3, x); }, true);
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

TEST_CASE("checkpoint::run takes integer inputs: token ids into an embedding") {
  torch::manual_seed(3);
  torch::nn::Embedding embed(50, 8);
  torch::nn::Linear head(8, 1);
  const auto ids = torch::randint(0, 50, {4, 6}, torch::kLong);  // int64, cannot require grad
  const auto out = nitro::checkpoint::run([embed, head](const at::Tensor& t) mutable { return head->forward(embed->forward(t)); }, ids);
  out.pow(2).mean().backward();
  const auto embed_grad = embed->weight.grad().clone(), head_grad = head->weight.grad().clone();
  embed->zero_grad();
  head->zero_grad();
  head->forward(embed->forward(ids)).pow(2).mean().backward();
  CHECK(torch::allclose(embed->weight.grad(), embed_grad, 1e-6, 1e-7));
  CHECK(torch::allclose(head->weight.grad(), head_grad, 1e-6, 1e-7));
}

namespace {
// A forward that returns before its backward runs, its checkpointed function reading a local that
// is gone by then: captured by value, as the rule says.
at::Tensor scaled_forward(torch::nn::Linear& layer, const at::Tensor& x) {
  const auto scale = torch::full({16}, 0.5);  // a local of this forward
  const double shift = 0.25;
  return nitro::checkpoint::run([=](const at::Tensor& in) mutable { return torch::tanh(layer->forward(in) * scale + shift); }, x);
}
}  // namespace

TEST_CASE("a function captured by value is recomputed correctly after its forward has returned") {
  torch::manual_seed(4);
  torch::nn::Linear layer(16, 16);
  const auto x = torch::randn({4, 16});
  scaled_forward(layer, x).sum().backward();
  const auto checkpointed = layer->weight.grad().clone();
  layer->zero_grad();
  torch::tanh(layer->forward(x) * torch::full({16}, 0.5) + 0.25).sum().backward();
  CHECK(torch::allclose(layer->weight.grad(), checkpointed, 1e-6, 1e-7));
}

namespace {
// A custom module (not a Sequential), as ported LibTorch programs have: a stem, blocks held in a
// vector, a head. Its forward lets the training loop's checkpoint policy act on the blocks.
struct TowerImpl : torch::nn::Module {
  explicit TowerImpl(int depth) {
    torch::manual_seed(5);
    stem = register_module("stem", torch::nn::Linear(32, 64));
    for (int i = 0; i < depth; ++i) blocks.push_back(register_module("block" + std::to_string(i), torch::nn::Linear(64, 64)));
    head = register_module("head", torch::nn::Linear(64, 1));
  }
  at::Tensor forward(const at::Tensor& x) {
    ++forwards;
    saw_checkpointing = nitro::checkpoint::active();
    auto h = torch::relu(stem->forward(x));
    h = nitro::checkpoint::sequential(blocks, h);
    return head->forward(h);
  }
  torch::nn::Linear stem{nullptr}, head{nullptr};
  std::vector<torch::nn::Linear> blocks;
  int forwards = 0;
  bool saw_checkpointing = false;
};
TORCH_MODULE(Tower);

template <class Loop>
std::pair<std::vector<at::Tensor>, std::int64_t> train_tower(bool* saw_checkpointing) {
  Tower model(16);
  torch::optim::SGD optimizer(model->parameters(), 0.01);
  Loop loop{model, optimizer};
  torch::manual_seed(6);
  const auto x = torch::randn({1024, 32}), y = torch::randn({1024, 1});  // activations outweigh the gradients
  nitro::memory::ScopedCpuTracking track;
  for (int i = 0; i < 2; ++i) loop.step(std::make_pair(x, y), [&](const auto& b) { return (model->forward(b.first) - b.second).pow(2).mean(); });
  *saw_checkpointing = model->saw_checkpointing;
  std::vector<at::Tensor> params;
  for (const auto& p : model->parameters()) params.push_back(p.detach().clone());
  return {params, track.stats().peak_bytes};
}
}  // namespace

TEST_CASE("a custom module's forward takes the loop's checkpoint policy: Ultra's memory, the same training") {
  bool plain_saw = true, sqrt_saw = false;
  const auto [plain, plain_peak] = train_tower<nitro::TrainingLoop<>>(&plain_saw);
  const auto [sqrt, sqrt_peak] = train_tower<nitro::TrainingLoop<nitro::checkpoint::Sqrt>>(&sqrt_saw);
  CHECK_FALSE(plain_saw);
  CHECK(sqrt_saw);
  CAPTURE(plain_peak);
  CAPTURE(sqrt_peak);
  CHECK(sqrt_peak < plain_peak * 3 / 4);  // 4 of 16 block activations kept instead of all
  REQUIRE(plain.size() == sqrt.size());
  for (size_t i = 0; i < plain.size(); ++i) CHECK(torch::allclose(plain[i], sqrt[i], 1e-5, 1e-7));

  // Outside a loop (evaluation), and inside a loop without checkpointing, the blocks run plainly.
  Tower eval(4);
  CHECK_FALSE(nitro::checkpoint::active());
  (void)eval->forward(torch::randn({2, 32}));
  CHECK_FALSE(eval->saw_checkpointing);
}

TEST_CASE("level::Ultra trains a custom module whose forward uses checkpoint::block") {
  struct NetImpl : torch::nn::Module {
    NetImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 32))), fc2(register_module("fc2", torch::nn::Linear(32, 2))) {}
    at::Tensor forward(const at::Tensor& x) {
      const auto h = nitro::checkpoint::block([this](const at::Tensor& in) { return torch::relu(fc1->forward(in)); }, x);
      return fc2->forward(h);
    }
    torch::nn::Linear fc1, fc2;
  };
  auto net = std::make_shared<NetImpl>();
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  nitro::level::Ultra loop{net, optimizer, {.accumulate = {.steps = 2}}};
  const auto x = torch::randn({16, 8});
  const auto y = torch::randint(0, 2, {16});
  int stepped = 0;
  for (int i = 0; i < 4; ++i)
    stepped += loop.step(std::make_pair(x, y), [&](const auto& b) { return torch::cross_entropy_loss(net->forward(b.first), b.second); }).stepped;
  CHECK(stepped == 2);
}

TEST_CASE("a step whose model never took the Segments or Sqrt policy is an error before its backward") {
  auto seq = make_mlp(4);
  torch::optim::SGD optimizer(seq->parameters(), 0.1);
  nitro::TrainingLoop<nitro::checkpoint::Sqrt> loop{seq, optimizer};
  const auto x = torch::randn({8, 16});
  // A one-argument loss function calls the Sequential directly: the loop cannot checkpoint it.
  CHECK_THROWS_WITH_AS(loop.step(x, [&](const at::Tensor& in) { return seq->forward(in).mean(); }),
                       doctest::Contains("never took the checkpoint policy"), nitro::Error);
  CHECK(loop.pending_micro_batches() == 0);
  for (const auto& p : seq->parameters()) CHECK_FALSE(p.grad().defined());  // no backward ran
  // Taking the forward works.
  CHECK(loop.step(x, [](auto& forward, const at::Tensor& in) { return forward(in).mean(); }).stepped);

  // A custom module whose forward never asks.
  torch::nn::Linear linear(16, 1);
  torch::optim::SGD opt2(linear->parameters(), 0.1);
  nitro::TrainingLoop<nitro::checkpoint::Segments<2>> custom{linear, opt2};
  CHECK_THROWS_WITH_AS(custom.step(x, [&](const at::Tensor& in) { return linear->forward(in).mean(); }),
                       doctest::Contains("checkpoint::sequential(blocks, x)"), nitro::Error);
}

TEST_CASE("one segment, one layer, or the forward called on another thread is no error") {
  const auto x = torch::randn({8, 16});
  const auto loss = [](auto& forward, const at::Tensor& in) { return forward(in).mean(); };
  auto seq = make_mlp(4);
  torch::optim::SGD optimizer(seq->parameters(), 0.1);
  nitro::TrainingLoop<nitro::checkpoint::Segments<1>> one_segment{seq, optimizer};  // checkpoints nothing, as asked
  CHECK(one_segment.step(x, loss).stepped);
  torch::nn::Sequential single(torch::nn::Linear(16, 1));
  torch::optim::SGD single_opt(single->parameters(), 0.1);
  nitro::TrainingLoop<nitro::checkpoint::Sqrt> one_layer{single, single_opt};
  CHECK(one_layer.step(x, loss).stepped);
  nitro::TrainingLoop<nitro::checkpoint::Sqrt> threaded{seq, optimizer};
  CHECK(threaded.step(x, [](auto& forward, const at::Tensor& in) {
    return std::async(std::launch::async, [&] { return forward(in).mean(); }).get();
  }).stepped);
}

TEST_CASE("the policy reaches only the loop's own model: not an inner loop's, not a no-grad forward") {
  const auto x = torch::randn({8, 32});
  Tower student(4), teacher(4), inner(4);
  torch::optim::SGD opt(student->parameters(), 0.01), inner_opt(inner->parameters(), 0.01);
  nitro::TrainingLoop<nitro::checkpoint::Sqrt> outer{student, opt};
  nitro::TrainingLoop<> inner_loop{inner, inner_opt};
  outer.step(x, [&](const at::Tensor& in) {
    {
      torch::NoGradGuard no_grad;
      (void)teacher->forward(in);  // no gradients: runs plainly, and does not count for the student
    }
    inner_loop.step(in, [&](const at::Tensor& b) { return inner->forward(b).pow(2).mean(); });
    return student->forward(in).pow(2).mean();
  });
  CHECK(student->saw_checkpointing);
  CHECK_FALSE(inner->saw_checkpointing);  // a loop with checkpoint::Off hides the outer policy
  // A student the loss function never calls: the teacher's no-grad forward does not satisfy the check.
  CHECK_THROWS_WITH_AS(outer.step(x, [&](const at::Tensor& in) {
    torch::NoGradGuard no_grad;
    return teacher->forward(in).pow(2).mean().detach().requires_grad_();
  }), doctest::Contains("never took the checkpoint policy"), nitro::Error);
}

TEST_CASE("checkpoint::run refuses an undefined input, saying so") {
  CHECK_THROWS_WITH_AS(nitro::checkpoint::run([](const at::Tensor& a, const at::Tensor&) { return a * 2; },
                                              torch::ones({2}), at::Tensor{}),
                       doctest::Contains("input 1 is an undefined tensor"), nitro::Error);
}
