// stability::Guard: injected NaNs in the loss and in one gradient, for each action (the parameters and
// optimizer state exactly those of the last good state after a restore), spikes on a scripted loss
// curve, late detection with check_every > 1, its state, and user errors.
#include <nitro/train/stability.hpp>
#include <nitro/train/training_loop.hpp>

#include "testing.hpp"

#include <cmath>
#include <map>
#include <vector>

namespace nitro_test_train_stability {  // one namespace per file: an area is compiled as one translation unit

namespace {

namespace st = nitro::stability;
using Guarded = nitro::TrainingLoop<nitro::amp::Off, st::Guard>;
const auto x = torch::linspace(-1, 1, 12).reshape({4, 3});
const auto y = torch::tensor({{0.5}, {-0.25}, {1.0}, {0.0}});

struct Run {
  torch::nn::Linear model{3, 1};
  torch::optim::SGD optimizer;
  Guarded loop;
  std::map<std::int64_t, std::pair<at::Tensor, at::Tensor>> after;  // step -> weight, momentum of weight
  explicit Run(st::GuardOptions o, bool skip_nonfinite = false)
      : optimizer(init(model), torch::optim::SGDOptions(0.1).momentum(0.9)),
        loop(model, optimizer, {.hooks = {o}, .skip_nonfinite = skip_nonfinite}) {}
  static std::vector<at::Tensor> init(torch::nn::Linear& m) {
    torch::NoGradGuard no_grad;
    m->weight.copy_(torch::tensor({{0.2, -0.1, 0.3}}));
    m->bias.fill_(0.05);
    return m->parameters();
  }
  at::Tensor momentum() {
    auto& state = optimizer.state();
    const auto it = state.find(model->weight.unsafeGetTensorImpl());
    if (it == state.end()) return {};
    return static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer().clone();
  }
  // One step; `nan_loss` makes the loss NaN, `nan_grad` the weight's gradient.
  nitro::StepResult step(bool nan_loss = false, bool nan_grad = false) {
    unsigned hook = 0;
    if (nan_grad) hook = model->weight.register_hook([](at::Tensor g) { return g * NAN; });
    auto r = loop.step(x, [&](const at::Tensor& in) {
      auto loss = torch::mse_loss(model->forward(in), y);
      return nan_loss ? loss * NAN : loss;
    });
    if (nan_grad) model->weight.remove_hook(hook);
    after[loop.optimizer_steps()] = {model->weight.detach().clone(), momentum()};
    return r;
  }
};

}  // namespace

TEST_CASE("guard: a NaN loss is caught at the next check and the last good state comes back exactly") {
  Run run({.on_nonfinite = st::Action::restore, .check_every = 1, .backup_every = 2});
  for (int i = 0; i < 5; ++i) CHECK(run.step().restores == 0);
  // Backups at the clean checks of steps 1, 3, 5 (backup_every 2 after the first).
  const auto r = run.step(/*nan_loss=*/true);
  CHECK(r.nonfinite_found == 1);
  CHECK(r.restores == 1);
  CHECK(torch::equal(run.model->weight, run.after[5].first));
  CHECK(torch::equal(run.momentum(), run.after[5].second));
  CHECK(std::isfinite(run.model->bias.item<double>()));
  // Training goes on from there: the next step equals step 6 of a clean run.
  Run clean({.on_nonfinite = st::Action::restore, .check_every = 1, .backup_every = 2});
  for (int i = 0; i < 6; ++i) clean.step();
  run.step();
  CHECK(torch::equal(run.model->weight, clean.model->weight));
  CHECK(run.loop.hook<st::Guard>().counts().checks == 7);
}

TEST_CASE("guard: a NaN in one gradient, found late (check_every 4), restores the step-4 state and lowers the lr") {
  Run run({.on_nonfinite = st::Action::restore_scale_lr, .check_every = 4, .backup_every = 8, .lr_factor = 0.5});
  for (int i = 0; i < 5; ++i) run.step();  // steps 1-5; the clean check at 4 keeps a backup
  run.step(false, /*nan_grad=*/true);      // step 6: the weight becomes NaN
  CHECK(std::isnan(run.model->weight.sum().item<double>()));
  run.step();  // 7: still NaN, not yet checked
  CHECK(run.loop.hook<st::Guard>().counts().restores == 0);
  const auto r = run.step();  // 8: checked
  CHECK(r.restores == 1);
  CHECK(torch::equal(run.model->weight, run.after[4].first));
  CHECK(torch::equal(run.momentum(), run.after[4].second));
  CHECK(run.optimizer.param_groups()[0].options().get_lr() == doctest::Approx(0.05));
  CHECK(run.loop.hook<st::Guard>().counts().lr_scalings == 1);
}

TEST_CASE("guard: raise names the step, the first non-finite parameter and the last good loss") {
  Run run({.on_nonfinite = st::Action::raise, .check_every = 1});
  for (int i = 0; i < 3; ++i) run.step();
  const double last = run.loop.hook<st::Guard>().counts().last_good_loss;
  CHECK(std::isfinite(last));
  CHECK(run.loop.hook<st::Guard>().counts().last_good_step == 3);
  try {
    run.step(false, /*nan_grad=*/true);
    FAIL("no error");
  } catch (const nitro::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("a non-finite parameter at optimizer step 4") != std::string::npos);
    CHECK(what.find("first non-finite parameter: 'weight'") != std::string::npos);
    CHECK(what.find("last good loss") != std::string::npos);
    CHECK(what.find("at step 3") != std::string::npos);
  }
  Run loss_only({.on_nonfinite = st::Action::raise, .check_every = 1});
  loss_only.step();
  CHECK_THROWS_WITH_AS(loss_only.step(/*nan_loss=*/true), doctest::Contains("a non-finite loss at optimizer step 2"),
                       nitro::Error);
}

TEST_CASE("guard: skip counts the steps the loop skipped, and needs a loop that skips") {
  Run run({.on_nonfinite = st::Action::skip, .check_every = 2}, /*skip_nonfinite=*/true);
  run.step();
  const auto before = run.model->weight.detach().clone();
  const auto r = run.step(false, /*nan_grad=*/true);
  CHECK(r.skipped);
  CHECK(r.nonfinite_found == 1);
  CHECK(torch::equal(run.model->weight, before));
  CHECK(run.loop.hook<st::Guard>().counts().skipped == 1);
  run.step();
  run.step();  // the check at 4 finds finite parameters: no error
  CHECK(run.loop.hook<st::Guard>().counts().nonfinite == 1);

  Run wrong({.on_nonfinite = st::Action::skip});
  CHECK_THROWS_WITH_AS(wrong.step(), doctest::Contains("needs a loop that skips non-finite steps"), nitro::Error);
}

TEST_CASE("guard: a spike on a scripted loss curve is found at its step, and raise stops there") {
  const auto scripted = [](st::GuardOptions o, std::int64_t spike_at) {
    torch::nn::Linear model(3, 1);
    torch::optim::SGD optimizer(model->parameters(), 0.1);
    Guarded loop{model, optimizer, {.hooks = {o}}};
    std::vector<std::int64_t> found;
    for (std::int64_t step = 1; step <= 80; ++step) {
      double value = 1.0 / std::sqrt(static_cast<double>(step)) + 0.01 * std::sin(static_cast<double>(step));
      if (step == spike_at) value = 5.0;
      const auto before = loop.hook<st::Guard>().counts().spikes;
      loop.step(x, [&](const at::Tensor& in) { return model->forward(in).sum() * 0 + value; });
      if (loop.hook<st::Guard>().counts().spikes > before) found.push_back(step);
    }
    return found;
  };
  CHECK(scripted({.on_nonfinite = st::Action::raise, .check_every = 1, .spike_window = 30, .spike_min = 10}, 50) ==
        std::vector<std::int64_t>{50});
  CHECK(scripted({.on_nonfinite = st::Action::raise, .check_every = 5, .spike_window = 30, .spike_min = 10}, 50) ==
        std::vector<std::int64_t>{50});
  CHECK(scripted({.on_nonfinite = st::Action::raise, .check_every = 1, .spike_window = 30, .spike_min = 10}, -1).empty());
  CHECK_THROWS_WITH_AS(
      scripted({.on_nonfinite = st::Action::raise, .on_spike = st::Action::raise, .check_every = 1, .spike_window = 30,
                .spike_min = 10},
               50),
      doctest::Contains("a loss spike at optimizer step 50"), nitro::Error);
}

TEST_CASE("guard: its state round-trips, and wrong options say what to do") {
  Run run({.on_nonfinite = st::Action::restore, .check_every = 2, .backup_every = 2});
  for (int i = 0; i < 5; ++i) run.step();
  const auto saved = run.loop.hook<st::Guard>().state_dict();
  CHECK(saved.integer("checks") == 2);
  CHECK(saved.integer("since_check") == 1);
  CHECK(saved.tensor("window").numel() == 4);
  Run other({.on_nonfinite = st::Action::restore, .check_every = 2, .backup_every = 2});
  other.loop.hook<st::Guard>().load_state_dict(saved);
  CHECK(other.loop.hook<st::Guard>().counts().checks == 2);
  CHECK(other.loop.hook<st::Guard>().state_dict().tensor("window").equal(saved.tensor("window")));
  Run strict({.on_nonfinite = st::Action::restore, .check_every = 1, .backup_every = 1});
  CHECK_THROWS_WITH_AS(strict.loop.hook<st::Guard>().load_state_dict(saved), doctest::Contains("since_check"),
                       nitro::Error);

  const auto error_of = [](st::GuardOptions o) -> std::string {
    try {
      st::Guard g(o);
    } catch (const nitro::Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(error_of({.on_nonfinite = st::Action::none}).find("guards nothing") != std::string::npos);
  CHECK(error_of({.on_spike = st::Action::skip}).find("on_spike cannot be skip") != std::string::npos);
  CHECK(error_of({.check_every = 0}).find("check_every must be >= 1") != std::string::npos);
  CHECK(error_of({.check_every = 4, .backup_every = 6}).find("multiple of check_every") != std::string::npos);
  CHECK(error_of({.lr_factor = 0}).find("lr_factor") != std::string::npos);
  CHECK(error_of({.spike_window = 1}).find("spike_window") != std::string::npos);
  CHECK(error_of({.spike_min = 1}).find("spike_min") != std::string::npos);
  CHECK(error_of({.spike_z = -1}).find("spike_z") != std::string::npos);
  // A failure before any good state was kept cannot be restored: it raises.
  Run early({.on_nonfinite = st::Action::restore, .check_every = 1});
  CHECK_THROWS_WITH_AS(early.step(true), doctest::Contains("before any good state was kept"), nitro::Error);
}

TEST_CASE("guard: a lasting rise of the loss is a new level, counting spikes does not stop the backups, a flat loss is no trigger") {
  torch::nn::Linear model(3, 1);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  Guarded loop{model, optimizer,
               {.hooks = {st::GuardOptions{.on_nonfinite = st::Action::restore, .check_every = 1, .backup_every = 1,
                                           .spike_window = 20, .spike_min = 5}}}};
  const auto step = [&](double value) {
    return loop.step(x, [&](const at::Tensor& in) { return model->forward(in).sum() * 0 + value; });
  };
  for (int i = 0; i < 25; ++i) step(0.5);  // flat: the deviation floor keeps a tiny change from being a spike
  step(0.5000001);
  CHECK(loop.hook<st::Guard>().counts().spikes == 0);
  for (int i = 0; i < 40; ++i) step(10.0 + 0.01 * (i % 3));  // a new level
  const auto& c = loop.hook<st::Guard>().counts();
  CHECK(c.spikes == 5);  // the first spike_min of the new level, then it is the window
  CHECK(c.last_good_step == loop.optimizer_steps());  // backups and the last good loss went on
  CHECK(c.last_good_loss > 9.0);
}

TEST_CASE("guard: restores in a row are bounded, a loaded state drops the kept backup, a skipped step counts once") {
  Run diverging({.on_nonfinite = st::Action::restore, .check_every = 1, .backup_every = 1, .max_restores = 3});
  diverging.step();
  for (int i = 0; i < 3; ++i) CHECK(diverging.step(true).restores == i + 1);
  CHECK_THROWS_WITH_AS(diverging.step(true), doctest::Contains("again after 3 restores in a row of the state of step 1"),
                       nitro::Error);

  Run run({.on_nonfinite = st::Action::restore, .check_every = 2, .backup_every = 2});
  for (int i = 0; i < 5; ++i) run.step();
  CHECK(run.loop.hook<st::Guard>().has_backup());
  const auto saved = run.loop.hook<st::Guard>().state_dict();
  CHECK(saved.tensor("kept_losses").numel() == 1);  // step 5's loss, not yet checked
  run.loop.hook<st::Guard>().load_state_dict(saved);
  CHECK_FALSE(run.loop.hook<st::Guard>().has_backup());
  // The kept loss of step 5 and a NaN, checked at step 6: no good state was kept since the load.
  CHECK_THROWS_WITH_AS(run.step(true), doctest::Contains("before any good state was kept"), nitro::Error);

  Run skipping({.on_nonfinite = st::Action::skip, .check_every = 1}, /*skip_nonfinite=*/true);
  skipping.step();
  CHECK(skipping.step(/*nan_loss=*/true).skipped);
  CHECK(skipping.loop.hook<st::Guard>().counts().nonfinite == 1);
  CHECK(skipping.loop.hook<st::Guard>().counts().skipped == 1);
}

}  // namespace nitro_test_train_stability
