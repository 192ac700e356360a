#include <nitro/hw/settings.hpp>
#include <nitro/memory/tracking_allocator.hpp>
#include <nitro/train/levels.hpp>

#include "testing.hpp"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdint>
#include <cstdio>
#include <future>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace nitro_test_train_checkpoint {  // one namespace per file: an area is compiled as one translation unit

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

namespace {
// The models and data of tests/train/checkpoint_reference.py: weights from sin and cos of aranges,
// double precision.
torch::nn::Linear reference_linear(std::int64_t inputs, std::int64_t outputs, double k) {
  torch::nn::Linear m(inputs, outputs);
  m->to(torch::kDouble);
  torch::NoGradGuard no_grad;
  m->weight.copy_(torch::sin(torch::arange(inputs * outputs, torch::kDouble) * 0.37 + k).reshape({outputs, inputs}) * 0.5);
  m->bias.copy_(torch::cos(torch::arange(outputs, torch::kDouble) * 0.5 + k) * 0.1);
  return m;
}

// Runs tests/train/checkpoint_reference.py: "<experiment> <name>" -> the gradient's values, or
// {"none"} where Python's gradient is None.
std::map<std::string, std::vector<std::string>> run_checkpoint_reference() {
  const std::string command = std::string("\"") + NITRO_TEST_PYTHON + "\" \"" NITRO_SOURCE_DIR
                              "/tests/train/checkpoint_reference.py\" 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  REQUIRE(pipe != nullptr);
  std::map<std::string, std::vector<std::string>> out;
  std::string text;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe.get())) text += buffer;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    std::string experiment, name;
    in >> experiment >> name;
    auto& values = out[experiment + " " + name];
    for (std::string v; in >> v;) values.push_back(v);
  }
  return out;
}

bool have_python() { return std::string(NITRO_TEST_PYTHON).size() > 0; }

// The checkpointed gradients (in the order of `names`, the reference's names) against the plain
// computation's and Python's.
void check_second_order(const std::string& experiment, const std::vector<std::string>& names,
                        const std::vector<at::Tensor>& checkpointed, const std::vector<at::Tensor>& plain) {
  static const auto reference = run_checkpoint_reference();  // once per process, for every experiment
  REQUIRE(checkpointed.size() == names.size());
  REQUIRE(plain.size() == names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    CAPTURE(names[i]);
    const auto it = reference.find(experiment + " " + names[i]);
    REQUIRE(it != reference.end());
    const auto& expected = it->second;
    REQUIRE(checkpointed[i].defined() == plain[i].defined());
    if (!plain[i].defined()) {
      CHECK(expected == std::vector<std::string>{"none"});
      continue;
    }
    CHECK(torch::allclose(checkpointed[i], plain[i], 1e-12, 1e-15));
    const auto values = checkpointed[i].detach().flatten();
    REQUIRE(static_cast<std::size_t>(values.numel()) == expected.size());
    for (std::int64_t k = 0; k < values.numel(); ++k) {
      CAPTURE(k);
      CHECK(values[k].item<double>() == doctest::Approx(std::stod(expected[static_cast<std::size_t>(k)])).epsilon(1e-12));
    }
  }
}

// backward(create_graph) warns of the reference cycle between a parameter and its gradient: the
// tests that call it reset every .grad.
struct QuietWarnings : c10::WarningHandler {
  QuietWarnings() : guard(this) {}
  void process(const c10::Warning&) override {}
  c10::WarningUtils::WarningHandlerGuard guard;
};

const std::vector<std::string> reference_params{"G.weight", "G.bias", "a.weight", "a.bias",
                                                "b.weight", "b.bias", "head.weight", "head.bias"};
}  // namespace

TEST_CASE("a gradient penalty through a checkpoint (torch::autograd::grad, create_graph) equals the plain one and "
          "torch.utils.checkpoint's" * doctest::skip(!have_python())) {
  nitro::hw::ScopedSettings one_thread{{.intra_op_threads = 1}};
  // WGAN-GP: the critic's segment checkpointed, its input a mix of real and generated samples, so
  // the penalty's gradient reaches the generator G through second derivatives of the segment.
  const auto penalty_grads = [](bool checkpointed) {
    auto G = reference_linear(3, 4, 0), a = reference_linear(4, 8, 1), b = reference_linear(8, 8, 2),
         head = reference_linear(8, 1, 3);
    const auto real = torch::sin(torch::arange(20, torch::kDouble) * 0.3).reshape({5, 4});
    const auto z = torch::cos(torch::arange(15, torch::kDouble) * 0.7).reshape({5, 3});
    const auto eps = torch::linspace(0.1, 0.9, 5, torch::kDouble).reshape({5, 1});
    const auto x_hat = eps * real + (1 - eps) * G->forward(z);
    auto segment = [a, b](const at::Tensor& t) mutable { return torch::tanh(b->forward(torch::tanh(a->forward(t)))); };
    const auto d = head->forward(checkpointed ? nitro::checkpoint::run(segment, x_hat) : segment(x_hat));
    const auto g = torch::autograd::grad({d.sum()}, {x_hat}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    // torch::autograd::grad leaves every .grad alone, those of the parameters inside the checkpoint too.
    for (const auto& p : {a->weight, a->bias, b->weight, b->bias, head->weight}) CHECK_FALSE(p.grad().defined());
    (g.norm(2, {1}) - 1).pow(2).mean().backward();
    return std::vector<at::Tensor>{G->weight.grad(), G->bias.grad(), a->weight.grad(),    a->bias.grad(),
                                   b->weight.grad(), b->bias.grad(), head->weight.grad(), head->bias.grad()};
  };
  check_second_order("penalty", reference_params, penalty_grads(true), penalty_grads(false));
}

TEST_CASE("backward(create_graph) through nested checkpoints: the gradients' own gradients equal the plain ones and "
          "torch.utils.checkpoint's" * doctest::skip(!have_python())) {
  nitro::hw::ScopedSettings one_thread{{.intra_op_threads = 1}};
  QuietWarnings quiet;
  const auto hessian_grads = [](bool checkpointed) {
    auto a = reference_linear(4, 8, 1), b = reference_linear(8, 8, 2), head = reference_linear(8, 1, 3);
    const auto x = torch::sin(torch::arange(20, torch::kDouble) * 0.21).reshape({5, 4}).requires_grad_();
    auto nested = [a, b](const at::Tensor& t) mutable {
      return torch::tanh(nitro::checkpoint::run([b](const at::Tensor& u) mutable { return b->forward(u); }, torch::tanh(a->forward(t))));
    };
    auto plain = [a, b](const at::Tensor& t) mutable { return torch::tanh(b->forward(torch::tanh(a->forward(t)))); };
    const auto y = x * 2 + 0.1;  // x is upstream of the checkpoint: its gradient comes through the returned one
    const auto loss = head->forward(checkpointed ? nitro::checkpoint::run(nested, y) : plain(y)).pow(2).sum();
    loss.backward({}, std::nullopt, /*create_graph=*/true);
    std::vector<at::Tensor> leaves{x, a->weight, a->bias, b->weight, b->bias, head->weight, head->bias};
    std::vector<at::Tensor> first, second;
    for (auto& t : leaves) first.push_back(t.grad().defined() ? t.grad().detach().clone() : at::Tensor{});
    const auto s = a->weight.grad().pow(2).sum() + x.grad().pow(2).sum();
    for (auto& t : leaves) t.mutable_grad() = at::Tensor{};
    s.backward();
    for (auto& t : leaves) second.push_back(t.grad());
    for (auto& t : leaves) t.mutable_grad() = at::Tensor{};
    return std::make_pair(first, second);
  };
  const auto checkpointed = hessian_grads(true), plain = hessian_grads(false);
  const std::vector<std::string> names{"x", "a.weight", "a.bias", "b.weight", "b.bias", "head.weight", "head.bias"};
  check_second_order("first", names, checkpointed.first, plain.first);  // b's through the nested checkpoint
  check_second_order("hessian", names, checkpointed.second, plain.second);
}

TEST_CASE("a parameter reached only through a checkpoint's output that the loss does not use gets no gradient") {
  // As without checkpointing, and as torch.utils.checkpoint(use_reentrant=False): .grad stays
  // undefined (a zero gradient would have AdamW decay the parameter), while a parameter both
  // outputs use gets the gradient of the used one.
  torch::manual_seed(7);
  torch::nn::Linear a(4, 4), other(4, 4), head(4, 1);
  const auto x = torch::randn({5, 4}).requires_grad_();
  auto segment = [a, other](const at::Tensor& t) mutable {
    return std::vector<at::Tensor>{torch::tanh(a->forward(t)), torch::tanh(other->forward(t)) + a->weight.sum()};
  };
  std::vector<at::Tensor> all{x, a->weight, a->bias, other->weight, other->bias, head->weight, head->bias};
  const auto reset = [&] { for (auto& t : all) t.mutable_grad() = at::Tensor{}; };
  std::vector<at::Tensor> expected;
  for (bool checkpointed : {false, true}) {
    CAPTURE(checkpointed);
    reset();
    const auto outs = checkpointed ? nitro::checkpoint::run(segment, x) : segment(x);
    head->forward(outs[0]).sum().backward();
    CHECK_FALSE(other->weight.grad().defined());
    CHECK_FALSE(other->bias.grad().defined());
    std::vector<at::Tensor> got{x.grad(), a->weight.grad(), a->bias.grad()};
    for (const auto& g : got) REQUIRE(g.defined());
    if (expected.empty()) {
      expected = got;
    } else {
      for (size_t i = 0; i < got.size(); ++i) CHECK(torch::allclose(got[i], expected[i], 1e-6, 1e-7));
    }
  }
  // AdamW with weight decay leaves the unused parameter as it was.
  const auto before = other->weight.detach().clone();
  torch::optim::AdamW adamw(other->parameters(), torch::optim::AdamWOptions(0.1).weight_decay(0.5));
  adamw.step();
  CHECK(other->weight.equal(before));

  // torch::autograd::grad and backward(inputs) through the checkpoint: the input's gradient, and no
  // .grad written anywhere else.
  reset();
  const auto outs = nitro::checkpoint::run(segment, x);
  const auto loss = head->forward(outs[0]).sum();
  const auto gx = torch::autograd::grad({loss}, {x}, {}, /*retain_graph=*/true)[0];
  CHECK(torch::allclose(gx, expected[0], 1e-6, 1e-7));
  for (const auto& t : all) CHECK_FALSE(t.grad().defined());
  loss.backward({}, std::nullopt, false, std::vector<at::Tensor>{x});
  CHECK(torch::allclose(x.grad(), expected[0], 1e-6, 1e-7));
  for (size_t i = 1; i < all.size(); ++i) CHECK_FALSE(all[i].grad().defined());
}

TEST_CASE("torch::autograd::grad for a parameter used inside a checkpoint is refused, saying what to do") {
  torch::manual_seed(8);
  torch::nn::Linear a(4, 4);
  const auto x = torch::randn({3, 4}).requires_grad_();
  // The weight is used inside the checkpoint and outside it (as tied weights are): the gradient
  // through the checkpoint cannot be returned for it, and leaving it out would be silently wrong.
  const auto inside = nitro::checkpoint::run([a](const at::Tensor& t) mutable { return torch::tanh(a->forward(t)); }, x);
  const auto loss = inside.sum() + a->weight.pow(2).sum();
  CHECK_THROWS_WITH_AS(torch::autograd::grad({loss}, {x, a->weight}, {}, /*retain_graph=*/true),
                       doctest::Contains("reads without taking it as an input"), nitro::Error);
  // Used inside only, it is not in the graph the caller sees: LibTorch says so.
  CHECK_THROWS_WITH_AS(torch::autograd::grad({inside.sum()}, {x, a->bias}, {}, /*retain_graph=*/true),
                       doctest::Contains("not have been used in the graph"), c10::Error);
  // The input alone is fine, and writes no .grad.
  CHECK(torch::autograd::grad({loss}, {x})[0].defined());
  CHECK_FALSE(a->weight.grad().defined());
}

TEST_CASE("torch::autograd::grad through a checkpoint given one tensor as two inputs: each place its own gradient") {
  const auto x = torch::linspace(-1, 1, 5, torch::kDouble).requires_grad_();
  const auto fn = [](const at::Tensor& p, const at::Tensor& q) { return p * q.exp(); };
  const auto plain = torch::autograd::grad({fn(x, x).sum()}, {x}, {}, std::nullopt, /*create_graph=*/true)[0];
  const auto checkpointed = torch::autograd::grad({nitro::checkpoint::run(fn, x, x).sum()}, {x}, {}, std::nullopt, true)[0];
  CHECK(torch::allclose(checkpointed, (1 + x) * x.exp(), 1e-12, 1e-15));
  CHECK(torch::allclose(checkpointed, plain, 1e-12, 1e-15));
  // and its own gradient (2 + x) e^x
  const auto second = torch::autograd::grad({checkpointed.sum()}, {x})[0];
  CHECK(torch::allclose(second, (2 + x.detach()) * x.detach().exp(), 1e-12, 1e-15));
}

TEST_CASE("backward(create_graph) through a checkpoint runs a parameter's hook once, as the plain backward does") {
  QuietWarnings quiet;
  std::vector<at::Tensor> weight_grads;
  for (bool checkpointed : {false, true}) {
    CAPTURE(checkpointed);
    torch::manual_seed(9);
    torch::nn::Linear a(4, 4);
    const auto x = torch::randn({3, 4});
    int calls = 0;
    a->weight.register_hook([&calls](const at::Tensor& g) {
      ++calls;
      return g * 0.5;
    });
    auto fn = [a](const at::Tensor& t) mutable { return torch::tanh(a->forward(t)); };
    const auto loss = (checkpointed ? nitro::checkpoint::run(fn, x) : fn(x)).pow(2).sum();
    loss.backward({}, std::nullopt, /*create_graph=*/true);
    CHECK(calls == 1);
    REQUIRE(a->weight.grad().defined());
    CHECK(a->weight.grad().requires_grad());  // a gradient with history, which can be differentiated
    weight_grads.push_back(a->weight.grad().detach().clone());
    for (auto& p : a->parameters()) p.mutable_grad() = at::Tensor{};
  }
  CHECK(torch::allclose(weight_grads[0], weight_grads[1], 1e-6, 1e-7));
}

namespace {
// A node pre-hook and post-hook on a parameter's gradient accumulator, counting their calls.
struct CountPre : torch::autograd::FunctionPreHook {
  int* calls;
  explicit CountPre(int* c) : calls(c) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    ++*calls;
    return grads;
  }
};
struct CountPost : torch::autograd::FunctionPostHook {
  int* calls;
  explicit CountPost(int* c) : calls(c) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    ++*calls;
    return outputs;
  }
};
}  // namespace

TEST_CASE("backward(create_graph) through a checkpoint also reached from upstream: each gradient counted once, as plain") {
  QuietWarnings quiet;
  // (a) A weight used before the checkpoint and inside it (a shared layer). (b) A leaf passed as the
  // checkpoint's input and also captured by its function. (c) Nested: the inner function captures a
  // tensor computed from the outer checkpoint's input, the same weight upstream too. In each, a
  // leaf's gradient reaches it both through the checkpoint's input and inside it: the inner engine
  // call must not carry the upstream part, which the outer backward carries.
  for (bool create_graph : {false, true}) {
    CAPTURE(create_graph);
    std::vector<at::Tensor> a_grads, b_grads, c_grads;
    for (bool checkpointed : {false, true}) {
      auto a = reference_linear(4, 4, 1), head = reference_linear(4, 1, 3);
      const auto x = torch::sin(torch::arange(12, torch::kDouble) * 0.3).reshape({3, 4});
      {
        auto fn = [a](const at::Tensor& t) mutable { return torch::tanh(a->forward(t)); };
        const auto y = torch::tanh(a->forward(x));
        head->forward(checkpointed ? nitro::checkpoint::run(fn, y) : fn(y)).pow(2).sum().backward({}, std::nullopt, create_graph);
        a_grads.push_back(a->weight.grad().detach().clone());
        for (auto& p : a->parameters()) p.mutable_grad() = at::Tensor{};
      }
      {
        const auto w = (x * 1.0).requires_grad_();
        auto fn = [w](const at::Tensor& t) { return torch::tanh(t * w); };
        head->forward(checkpointed ? nitro::checkpoint::run(fn, w) : fn(w)).pow(2).sum().backward({}, std::nullopt, create_graph);
        b_grads.push_back(w.grad().detach().clone());
      }
      {
        const auto xin = (x * 1.0).requires_grad_();
        auto outer = [a, checkpointed](const at::Tensor& t) mutable {
          const auto t2 = torch::tanh(t * 2);
          auto inner = [a, t2](const at::Tensor& u) mutable { return torch::tanh(a->forward(u)) * t2; };
          return torch::tanh(checkpointed ? nitro::checkpoint::run(inner, t * 1.5) : inner(t * 1.5));
        };
        const auto y = torch::tanh(a->forward(xin));
        head->forward(checkpointed ? nitro::checkpoint::run(outer, y) : outer(y)).pow(2).sum().backward({}, std::nullopt, create_graph);
        c_grads.push_back(torch::cat({xin.grad().detach().flatten(), a->weight.grad().detach().flatten()}));
      }
    }
    CHECK(torch::allclose(a_grads[0], a_grads[1], 1e-12, 1e-14));
    CHECK(torch::allclose(b_grads[0], b_grads[1], 1e-12, 1e-14));
    CHECK(torch::allclose(c_grads[0], c_grads[1], 1e-12, 1e-14));
  }
}

TEST_CASE("torch::autograd::grad for a parameter used outside and inside a nested checkpoint is refused, not partial") {
  QuietWarnings quiet;
  auto a = reference_linear(4, 4, 1);
  const auto x = torch::sin(torch::arange(12, torch::kDouble) * 0.3).reshape({3, 4}).requires_grad_();
  auto inner = [a](const at::Tensor& t) mutable { return a->forward(t); };
  auto outer = [inner](const at::Tensor& t) mutable { return torch::tanh(nitro::checkpoint::run(inner, t * 1.5)); };
  const auto loss = nitro::checkpoint::run(outer, x).pow(2).sum() + a->forward(x).sum();  // a also used outside
  CHECK_THROWS_WITH_AS(torch::autograd::grad({loss}, {x, a->weight}),
                       doctest::Contains("reads without taking it as an input"), nitro::Error);
}

TEST_CASE("backward(create_graph) through a checkpoint runs a gradient accumulator's pre- and post-hooks once each") {
  QuietWarnings quiet;
  for (bool nested : {false, true}) {
    CAPTURE(nested);
    for (bool checkpointed : {false, true}) {
      CAPTURE(checkpointed);
      auto a = reference_linear(4, 4, 1), head = reference_linear(4, 1, 3);
      int pre = 0, post = 0;
      auto accumulator = torch::autograd::impl::grad_accumulator(a->weight);
      accumulator->add_pre_hook(std::make_unique<CountPre>(&pre));
      accumulator->add_post_hook(std::make_unique<CountPost>(&post));
      const auto x = torch::sin(torch::arange(12, torch::kDouble) * 0.3).reshape({3, 4});
      auto fn = [a](const at::Tensor& t) mutable { return torch::tanh(a->forward(t)); };
      auto outer = [fn](const at::Tensor& t) mutable { return nitro::checkpoint::run(fn, t * 1.0) * 1.0; };
      const auto out = !checkpointed ? fn(x) : nested ? nitro::checkpoint::run(outer, x) : nitro::checkpoint::run(fn, x);
      head->forward(out).pow(2).sum().backward({}, std::nullopt, /*create_graph=*/true);
      CHECK(pre == 1);
      CHECK(post == 1);
    }
  }
}

}  // namespace nitro_test_train_checkpoint
