#include <nitro/hw/settings.hpp>
#include <nitro/train/training_loop.hpp>

#include "testing.hpp"

#include <cstdio>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace nitro_test_train_amp {  // one namespace per file: an area is compiled as one translation unit

namespace {

struct Reference {
  std::vector<double> scales;
  std::vector<int> skipped;
  std::vector<double> params;
};

// Runs tests/train/gradscaler_reference.py with the Python of the build environment.
Reference python_reference(int steps, int growth_interval, const std::string& inject, const std::string& device) {
  const std::string command = std::string("\"") + NITRO_TEST_PYTHON + "\" \"" NITRO_SOURCE_DIR
                              "/tests/train/gradscaler_reference.py\" " + std::to_string(steps) + " " +
                              std::to_string(growth_interval) + " " + inject + " " + device + " 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  REQUIRE(pipe != nullptr);
  Reference ref;
  char line[4096];
  while (std::fgets(line, sizeof line, pipe.get())) {
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    if (kind == "step") {
      int k = 0, skipped = 0;
      double scale = 0;
      in >> k >> scale >> skipped;
      ref.scales.push_back(scale);
      ref.skipped.push_back(skipped);
    } else if (kind == "param") {
      for (double v; in >> v;) ref.params.push_back(v);
    }
  }
  return ref;
}

bool have_python() { return std::string(NITRO_TEST_PYTHON).size() > 0; }

// The C++ loop against Python's GradScaler on `device`: 14 steps, growth interval 3, inf at 4 steps.
void check_against_gradscaler(const c10::Device& device) {
  nitro::hw::ScopedSettings one_thread{{.intra_op_threads = 1}};
  const int steps = 14, growth_interval = 3;
  const std::string inject = "2,7,8,12";
  const auto ref = python_reference(steps, growth_interval, inject, device.is_cuda() ? "cuda" : "cpu");
  REQUIRE(ref.scales.size() == steps);
  REQUIRE(ref.params.size() == 15);

  torch::nn::Linear model(4, 3);
  {
    torch::NoGradGuard no_grad;
    model->weight.copy_(torch::linspace(-0.5, 0.5, 12).reshape({3, 4}));
    model->bias.copy_(torch::linspace(-0.1, 0.1, 3));
  }
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  using Loop = nitro::TrainingLoop<nitro::amp::Fp16<nitro::DynamicLossScale>>;
  Loop loop{model, optimizer, {.amp = {.init_scale = 1024.0, .growth_interval = growth_interval}}};
  const std::set<int> infs{2, 7, 8, 12};

  for (int k = 0; k < steps; ++k) {
    CAPTURE(k);
    const auto x = torch::sin(torch::arange(32, torch::kFloat).reshape({8, 4}) * 0.37 + k).to(device);
    const auto y = ((torch::arange(8) + k) % 3).to(device);
    const auto r = loop.step(std::make_pair(x, y), [&](const auto& b) {
      auto loss = torch::cross_entropy_loss(model->forward(b.first), b.second);
      return infs.count(k) ? loss * std::numeric_limits<double>::infinity() : loss;
    });
    CHECK(r.stepped == !ref.skipped[static_cast<size_t>(k)]);
    CHECK(r.skipped == static_cast<bool>(ref.skipped[static_cast<size_t>(k)]));
    CHECK(r.loss_scale.item<double>() == ref.scales[static_cast<size_t>(k)]);  // exactly: powers of two
  }
  CHECK(loop.skipped_steps() == 4);
  std::vector<double> params;
  for (const auto& p : model->parameters())
    for (auto v : p.detach().flatten().to(torch::kCPU, torch::kDouble).contiguous().view(-1).unbind()) params.push_back(v.item<double>());
  REQUIRE(params.size() == ref.params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    CAPTURE(i);
    CHECK(params[i] == doctest::Approx(ref.params[i]).epsilon(1e-6));
  }
}

}  // namespace

TEST_CASE("amp::Fp16 with DynamicLossScale follows torch.amp.GradScaler step for step" *
          doctest::skip(!have_python())) {
  check_against_gradscaler(c10::Device(c10::kCPU));
}

TEST_CASE("gpu: amp::Fp16 on the GPU follows torch.amp.GradScaler on the same GPU" * nitro::test::needs_gpu(!have_python())) {
  check_against_gradscaler(nitro::Cuda::device(0));
}

TEST_CASE("DynamicLossScale: growth, backoff and state_dict round trip") {
  nitro::DynamicLossScale scaler{{.init_scale = 8.0, .growth_factor = 4.0, .backoff_factor = 0.25, .growth_interval = 2}};
  CHECK(scaler.current_scale() == 8.0);
  const auto scaled = scaler.scale(torch::tensor(1.5));
  CHECK(scaled.item<double>() == 12.0);
  const auto finite = torch::zeros({}), inf = torch::ones({});
  scaler.update(finite);
  CHECK(scaler.current_scale() == 8.0);   // one finite step of two
  scaler.update(finite);
  CHECK(scaler.current_scale() == 32.0);  // grown by 4
  scaler.update(finite);
  const auto saved = scaler.state_dict();
  CHECK(saved.scale == 32.0);
  CHECK(saved.growth_tracker == 1);
  CHECK(saved.growth_interval == 2);
  scaler.update(inf);
  CHECK(scaler.current_scale() == 8.0);   // backed off by 4

  nitro::DynamicLossScale restored;
  restored.load_state_dict(saved);
  CHECK(restored.current_scale() == 32.0);
  restored.scale(torch::tensor(1.0));
  restored.update(finite);                // the loaded tracker (1) completes the interval
  CHECK(restored.current_scale() == 128.0);
}

// DynamicLossScale::update is compiled into the library in compiled mode: its contract check follows
// the program's NITRO_THROW_ON_CONTRACT_VIOLATION there too (the library is built without it).
TEST_CASE("a contract broken inside the compiled library throws ContractViolation as header-only code does") {
  nitro::DynamicLossScale scaler;
  try {
    scaler.update(torch::zeros({}));  // no loss scaled yet: a broken precondition, not a user's option
    FAIL("NITRO_EXPECTS in DynamicLossScale::update did not throw");
  } catch (const nitro::ContractViolation& e) {
    CHECK(std::string(e.what()).find("precondition violated: scale_.defined()") != std::string::npos);
  }
}

TEST_CASE("a gradient that is inf or NaN is found and its step skipped, and StaticLossScale keeps its scale") {
  torch::nn::Linear model(2, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::TrainingLoop<nitro::amp::Fp16<nitro::StaticLossScale>> loop{model, optimizer, {.amp = {.scale = 256.0}}};
  const auto before = model->weight.detach().clone();
  const auto x = torch::ones({4, 2});
  auto r = loop.step(x, [&](const at::Tensor& b) { return model->forward(b).sum() * std::nan(""); });
  CHECK(r.skipped);
  CHECK(model->weight.equal(before));
  CHECK(r.loss_scale.item<double>() == 256.0);
  r = loop.step(x, [&](const at::Tensor& b) { return model->forward(b).mean(); });
  CHECK(r.stepped);
  CHECK_FALSE(model->weight.equal(before));
}

TEST_CASE("AutocastGuard runs matmuls in bf16 and restores the state, nested too") {
  const auto a = torch::randn({4, 4});
  const bool was = at::autocast::is_autocast_enabled(c10::DeviceType::CPU);
  const auto was_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CPU);
  {
    nitro::AutocastGuard outer{c10::DeviceType::CPU, torch::kBFloat16};
    CHECK(torch::mm(a, a).scalar_type() == torch::kBFloat16);
    {
      nitro::AutocastGuard off{c10::DeviceType::CPU, torch::kBFloat16, /*enabled=*/false};
      CHECK(torch::mm(a, a).scalar_type() == torch::kFloat);
    }
    CHECK(torch::mm(a, a).scalar_type() == torch::kBFloat16);
  }
  CHECK(at::autocast::is_autocast_enabled(c10::DeviceType::CPU) == was);
  CHECK(at::autocast::get_autocast_dtype(c10::DeviceType::CPU) == was_dtype);
  CHECK(torch::mm(a, a).scalar_type() == torch::kFloat);
}

TEST_CASE("amp::Bf16 in the loop: the forward runs in bf16, the parameters stay fp32") {
  torch::nn::Linear model(8, 4);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  nitro::TrainingLoop<nitro::amp::Bf16> loop{model, optimizer};
  c10::ScalarType seen = torch::kFloat;
  loop.step(torch::randn({16, 8}), [&](const at::Tensor& b) {
    const auto out = model->forward(b);
    seen = out.scalar_type();
    return out.to(torch::kFloat).pow(2).mean();
  });
  CHECK(seen == torch::kBFloat16);
  CHECK(model->weight.scalar_type() == torch::kFloat);
  CHECK_FALSE(at::autocast::is_autocast_enabled(c10::DeviceType::CPU));
}

TEST_CASE("bad loss-scale options name the option") {
  CHECK_THROWS_WITH_AS(nitro::DynamicLossScale({.growth_factor = 1.0}), doctest::Contains("growth_factor must be > 1"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::DynamicLossScale({.backoff_factor = 1.5}), doctest::Contains("backoff_factor must be in (0, 1)"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::DynamicLossScale({.growth_interval = 0}), doctest::Contains("growth_interval must be >= 1"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::StaticLossScale({.scale = -1}), doctest::Contains("scale must be > 0"), nitro::Error);
}

}  // namespace nitro_test_train_amp
