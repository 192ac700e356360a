// Several loops in one snapshot (snapshot::Named) and snapshot::Run: one file, one step number, taken
// at the end of an iteration of the caller's loop; a resume continues exactly; signals are seen once
// for the run, whichever loop's step they came in.
#include "testing.hpp"

#include "child.hpp"
#include "tiny_gan.hpp"

#include <nitro/snapshot/policy.hpp>
#include <nitro/snapshot/snapshot.hpp>
#include <nitro/train/ema.hpp>
#include <nitro/train/training_loop.hpp>

#include <signal.h>

#include <fstream>
#include <stdexcept>
#include <string>

namespace nitro_test_snapshot_run {  // one namespace per file: an area is compiled as one translation unit

namespace fs = std::filesystem;
using nitro::test::TempDir;
using nitro::test::TinyGan;

namespace {

using DLoop = nitro::TrainingLoop<>;
using GLoop = nitro::TrainingLoop<nitro::clip::Norm>;

struct Gan {
  TinyGan m;
  DLoop d_loop;
  GLoop g_loop;
  explicit Gan(std::uint64_t seed)
      : m(seed), d_loop(m.d, *m.d_opt), g_loop(m.g, *m.g_opt, {.clip = {.max_norm = 1.0}}) {}
  nitro::snapshot::Run run(const fs::path& dir, std::int64_t every, int keep_last = 3) {
    return {{.directory = dir, .every = every, .keep_last = keep_last, .on_signal = false},
            {{"generator", g_loop}, {"discriminator", d_loop}}};
  }
};

}  // namespace

TEST_CASE("snapshot::Run: a run of two loops resumed from one snapshot ends bit for bit as one never stopped") {
  TempDir dir("nitro-run", true);
  at::set_num_threads(1);
  Gan a(3);
  {
    nitro::snapshot::Run run{{.directory = dir / "a", .every = 4, .on_signal = false},
                             {{"generator", a.g_loop}, {"discriminator", a.d_loop}}};
    CHECK_FALSE(run.resume());
    torch::manual_seed(5);
    for (std::int64_t i = 0; i < 8; ++i) {
      a.m.iterate(a.d_loop, a.g_loop, i);
      const auto end = run.end_iteration();
      CHECK_FALSE(end.stop);
      CHECK(end.saved.has_value() == ((i + 1) % 4 == 0));
    }
    CHECK(run.snapshots_written() == 2);
  }
  {
    Gan b(3);
    nitro::snapshot::Run run{{.directory = dir / "b", .every = 4, .on_signal = false},
                             {{"generator", b.g_loop}, {"discriminator", b.d_loop}}};
    torch::manual_seed(5);
    for (std::int64_t i = 0; i < 6; ++i) {
      b.m.iterate(b.d_loop, b.g_loop, i);
      (void)run.end_iteration();
    }
  }  // "preempted" after iteration 6: the snapshot of iteration 4 is the newest
  Gan c(99);  // other initial weights and generator state: the snapshot replaces them
  nitro::snapshot::Run run{{.directory = dir / "b", .every = 4, .on_signal = false},
                           {{"generator", c.g_loop}, {"discriminator", c.d_loop}}};
  const auto file = run.resume();
  REQUIRE(file.has_value());
  CHECK(file->filename() == nitro::snapshot::file_name(4, 0));
  CHECK(run.iteration() == 4);
  CHECK(c.d_loop.optimizer_steps() == 4);
  CHECK(c.g_loop.optimizer_steps() == 4);
  for (std::int64_t i = run.iteration(); i < 8; ++i) {
    c.m.iterate(c.d_loop, c.g_loop, i);
    (void)run.end_iteration();
  }
  CHECK(run.iteration() == 8);
  CHECK(c.m.same_as(a.m));
  // Every part of both loops is in the one file, under the loop's name.
  nitro::snapshot::Reader reader(*file);
  for (const char* part : {"generator/model", "generator/grads", "generator/optimizer", "generator/loop",
                           "discriminator/model", "discriminator/optimizer", "discriminator/loop", "rng"})
    CHECK_MESSAGE(reader.has(part), part);
  CHECK(reader.manifest().step == 4);
}

TEST_CASE("snapshot::Run keeps keep_last snapshots and saves once per iteration") {
  TempDir dir("nitro-run", true);
  Gan g(1);
  auto run = g.run(dir.path, 1, 2);
  for (std::int64_t i = 0; i < 5; ++i) {
    g.m.iterate(g.d_loop, g.g_loop, i);
    (void)run.end_iteration();
  }
  const auto files = nitro::snapshot::list(dir.path);
  REQUIRE(files.size() == 2);
  CHECK(files[0].filename() == nitro::snapshot::file_name(5, 0));
  CHECK(files[1].filename() == nitro::snapshot::file_name(4, 0));
  CHECK(run.save_now() == files[0]);  // the same iteration: not written again
  CHECK(run.snapshots_written() == 5);
}

TEST_CASE("several loops: a snapshot of other loops is refused with the part named, and nothing changes") {
  TempDir dir("nitro-run", true);
  Gan g(1);
  g.m.iterate(g.d_loop, g.g_loop, 0);
  const fs::path file = dir / "two.nitro";
  nitro::snapshot::save(file, {{"generator", g.g_loop}, {"discriminator", g.d_loop}}, {}, {.step = 1});
  Gan other(2);
  const auto before = other.m.g->parameters()[0].clone();
  // Other names: the parts are not there.
  CHECK_THROWS_WITH_AS(nitro::snapshot::load(file, {{"gen", other.g_loop}, {"discriminator", other.d_loop}}),
                       doctest::Contains("gen/model"), nitro::Error);
  // The loops the other way round: the generator's parameters do not fit the discriminator's part.
  CHECK_THROWS_WITH_AS(nitro::snapshot::load(file, {{"generator", other.d_loop}, {"discriminator", other.g_loop}}),
                       doctest::Contains("generator/model"), nitro::Error);
  CHECK(torch::equal(other.m.g->parameters()[0], before));
  CHECK(other.d_loop.optimizer_steps() == 0);
  // A file of one loop is not a file of two, nor the reverse.
  nitro::snapshot::save(dir / "one.nitro", g.d_loop);
  CHECK_THROWS_AS(nitro::snapshot::load(dir / "one.nitro", {{"generator", other.g_loop}, {"discriminator", other.d_loop}}),
                  nitro::Error);
  CHECK_THROWS_AS(nitro::snapshot::load(file, other.d_loop), nitro::Error);
  CHECK(other.d_loop.optimizer_steps() == 0);
  const auto m = nitro::snapshot::load(file, {{"generator", other.g_loop}, {"discriminator", other.d_loop}});
  CHECK(m.step == 1);
  CHECK(other.m.same_as(g.m));
  CHECK(other.d_loop.optimizer_steps() == 1);
}

TEST_CASE("several loops and snapshot::Run: every mistake is a nitro::Error saying what to do") {
  TempDir dir("nitro-run", true);
  Gan g(1);
  const fs::path file = dir / "x.nitro";
  CHECK_THROWS_WITH_AS(nitro::snapshot::save(file, {{"", g.g_loop}}), doctest::Contains("[A-Za-z0-9_.-]"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::snapshot::save(file, {{"a/b", g.g_loop}}), doctest::Contains("[A-Za-z0-9_.-]"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::snapshot::save(file, {{"a", g.g_loop}, {"a", g.d_loop}}), doctest::Contains("two loops are named"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::snapshot::save(file, {{"a", g.g_loop}, {"b", g.g_loop}}), doctest::Contains("share a model"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::snapshot::save(file, {{"a", g.g_loop}}, {.model = g.m.d.ptr().get()}),
                       doctest::Contains("must be null"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::snapshot::save(file, {{"a", g.g_loop}}, {}, {.step = -1}), doctest::Contains("step must be >= 0"),
                       nitro::Error);
  CHECK_FALSE(fs::exists(file));
  using Run = nitro::snapshot::Run;
  const auto loops = [&] { return std::vector<nitro::snapshot::Named>{{"generator", g.g_loop}, {"discriminator", g.d_loop}}; };
  CHECK_THROWS_WITH_AS(Run({.directory = dir.path, .every = -1}, loops()), doctest::Contains("every must be >= 0"), nitro::Error);
  CHECK_THROWS_WITH_AS(Run({.directory = dir.path, .every_minutes = -1}, loops()), doctest::Contains("every_minutes"), nitro::Error);
  CHECK_THROWS_WITH_AS(Run({.directory = dir.path, .keep_last = 0}, loops()), doctest::Contains("keep_last"), nitro::Error);
  CHECK_THROWS_WITH_AS(Run({.directory = dir.path, .on_signal = false}, loops()), doctest::Contains("nothing would ever be saved"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(Run({.directory = "", .every = 1}, loops()), doctest::Contains("directory is empty"), nitro::Error);
  CHECK_THROWS_WITH_AS(Run({.directory = dir.path, .every = 1}, {}), doctest::Contains("no loops given"), nitro::Error);
}

// args: directory. SIGTERM arrives inside the generator's step of iteration 3: both loops finish the
// iteration, end_iteration() writes the snapshot of iteration 3 and says stop, once.
NITRO_TEST_CHILD(run_signal) {
  at::set_num_threads(1);
  const fs::path dir = args.at(0);
  Gan g(1);
  nitro::snapshot::Run run{{.directory = dir / "snapshots", .every = 100}, {{"generator", g.g_loop}, {"discriminator", g.d_loop}}};
  int stops = 0;
  std::string said;
  for (std::int64_t i = 0; i < 6; ++i) {
    at::Tensor fake;
    g.d_loop.step(TinyGan::real(i), [&](const at::Tensor& r) { return g.m.d_loss(r, fake); });
    g.g_loop.step(fake, [&](const at::Tensor& f) {
      if (i == 2) ::raise(SIGTERM);
      return g.m.g_loss(f);
    });
    const auto end = run.end_iteration();
    if (end.stop) {
      ++stops;
      said = std::to_string(run.iteration()) + " " + std::string(end.stop_reason) + " " +
             (end.saved ? end.saved->filename().string() : std::string("none")) + " " +
             std::to_string(run.snapshots_written());
      break;
    }
  }
  std::ofstream(dir / "stopped") << said << " " << stops;
  return 0;
}

TEST_CASE("snapshot::Run: SIGTERM in one loop's step stops the run after the iteration, with its snapshot") {
  TempDir dir("nitro-run", true);
  REQUIRE(nitro::test::run_child("run_signal", {dir.path.string()}) == 0);
  std::ifstream in(dir / "stopped");
  std::string line;
  std::getline(in, line);
  CHECK(line == "3 SIGTERM " + nitro::snapshot::file_name(3, 0) + " 1 1");
  Gan g(9);
  const auto m = nitro::snapshot::load(dir / "snapshots" / nitro::snapshot::file_name(3, 0),
                                       {{"generator", g.g_loop}, {"discriminator", g.d_loop}});
  CHECK(m.step == 3);
  CHECK(g.d_loop.optimizer_steps() == 3);
  CHECK(g.g_loop.optimizer_steps() == 3);
}

TEST_CASE("snapshot::Policy listed before ema::Model saves the average of the step it saves") {
  // Policy saves in after_optimizer_step; it runs after every other hook's, whatever the order of the
  // types, so the snapshot of step 4 holds the average updated by step 4.
  TempDir dir("nitro-run", true);
  using Loop = nitro::TrainingLoop<nitro::snapshot::Policy, nitro::ema::Model>;
  const auto train = [&](const fs::path& where, int from, int to, bool resume) {
    TinyGan m(4);
    Loop loop{m.d, *m.d_opt, {.hooks = {{.directory = where, .every_steps = 2, .on_signal = false},
                                        nitro::ema::Model::Options{.decay = 0.9, .tau = 0}}}};
    if (resume) nitro::snapshot::load(where / nitro::snapshot::file_name(from, 0), loop);
    for (int i = from; i < to; ++i)
      loop.step(TinyGan::real(i), [&](const at::Tensor& r) { return m.d->forward(r).square().mean(); });
    return loop.hook<nitro::ema::Model>().named_tensors();
  };
  const auto whole = train(dir / "a", 0, 6, false);
  (void)train(dir / "b", 0, 5, false);
  const auto resumed = train(dir / "b", 4, 6, true);
  REQUIRE(whole.size() == resumed.size());
  for (std::size_t i = 0; i < whole.size(); ++i) CHECK_MESSAGE(torch::equal(whole[i].second, resumed[i].second), whole[i].first);
}

TEST_CASE("snapshot::Run and a snapshot::Policy with on_signal are never live together") {
  TempDir dir("nitro-run", true);
  Gan g(1);
  {
    nitro::snapshot::Run run{{.directory = dir / "run"}, {{"generator", g.g_loop}, {"discriminator", g.d_loop}}};
    CHECK_THROWS_WITH_AS(nitro::snapshot::Policy({.directory = dir / "policy"}), doctest::Contains("snapshot::Run is live"),
                         nitro::Error);
    nitro::snapshot::Policy by_steps({.directory = dir / "policy", .every_steps = 5, .on_signal = false});  // allowed
  }
  nitro::snapshot::Policy policy({.directory = dir / "policy"});
  CHECK_THROWS_WITH_AS((nitro::snapshot::Run{{.directory = dir / "run"}, {{"generator", g.g_loop}, {"discriminator", g.d_loop}}}),
                       doctest::Contains("Policy with on_signal is live"), nitro::Error);
  nitro::snapshot::Run quiet{{.directory = dir / "run", .every = 1, .on_signal = false},
                             {{"generator", g.g_loop}, {"discriminator", g.d_loop}}};  // allowed
}

namespace {
// A hook whose state load fails with an exception that is not a nitro::Error, when told to.
struct Picky {
  using family = nitro::family::Hook;
  static constexpr std::string_view name = "picky";
  static constexpr bool enabled = true;
  struct Options {};
  explicit Picky(const Options&) {}
  template <class Loop>
  void after_optimizer_step(Loop&, nitro::StepResult&) {
    ++count;
  }
  nitro::StateDict state_dict() const {
    nitro::StateDict d;
    d.integers["count"] = count;
    d.strings["number"] = number;
    return d;
  }
  void load_state_dict(const nitro::StateDict& d) {
    (void)std::stoll(d.strings.at("number"));  // std::invalid_argument for "x"
    count = d.integers.at("count");
    number = d.strings.at("number");
  }
  std::int64_t count = 0;
  std::string number = "1";
};
}  // namespace

TEST_CASE("several loops: a loop whose hook refuses its state with any exception puts back the loops loaded before it") {
  TempDir dir("nitro-run", true);
  using Loop = nitro::TrainingLoop<Picky>;
  TinyGan a(1);
  Loop g(a.g, *a.g_opt), d(a.d, *a.d_opt);
  for (int i = 0; i < 2; ++i) a.iterate(d, g, i);
  d.hook<Picky>().number = "x";  // its load will throw std::invalid_argument
  nitro::snapshot::save(dir / "s.nitro", {{"generator", g}, {"discriminator", d}});
  TinyGan b(2);
  Loop g2(b.g, *b.g_opt), d2(b.d, *b.d_opt);
  for (int i = 0; i < 5; ++i) b.iterate(d2, g2, i);
  CHECK_THROWS_WITH_AS(nitro::snapshot::load(dir / "s.nitro", {{"generator", g2}, {"discriminator", d2}}),
                       doctest::Contains("part \"discriminator/loop\""), nitro::Error);
  CHECK(g2.optimizer_steps() == 5);  // put back, not 2
  CHECK(g2.hook<Picky>().count == 5);
  CHECK(d2.optimizer_steps() == 5);
}

}  // namespace nitro_test_snapshot_run
