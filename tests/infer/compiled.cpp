#include <nitro/infer/batcher.hpp>
#include <nitro/infer/compiled.hpp>
#include <nitro/infer/runner.hpp>

#include "testing.hpp"

#include <cstdio>
#include <fstream>
#include <future>
#include <string>
#include <vector>

namespace nitro_test_infer_compiled {  // one namespace per file: an area is compiled as one translation unit

namespace {

at::Tensor read_floats(const std::filesystem::path& path, std::vector<int64_t> shape) {
  auto t = torch::empty(shape);
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  in.read(reinterpret_cast<char*>(t.data_ptr<float>()), static_cast<std::streamsize>(t.numel() * sizeof(float)));
  REQUIRE(in.gcount() == static_cast<std::streamsize>(t.numel() * sizeof(float)));
  return t;
}

// tests/infer/export_models.py run once for this process: false where no Python with torch is there.
const nitro::test::TempDir& exported(bool& ok) {
  static nitro::test::TempDir dir("nitro-infer-export", true);
  static const bool done = [] {
    if (std::string(NITRO_TEST_PYTHON).empty()) return false;
    const std::string command = std::string("\"") + NITRO_TEST_PYTHON + "\" \"" NITRO_SOURCE_DIR
                                "/tests/infer/export_models.py\" \"" + dir.path.string() + "\" > \"" +
                                (dir.path / "export.log").string() + "\" 2>&1";
    return std::system(command.c_str()) == 0;
  }();
  ok = done;
  return dir;
}

}  // namespace

TEST_CASE("AOTInductor package and TorchScript file from Python: their outputs equal the eager model's") {
  bool ok = false;
  const auto& dir = exported(ok);
  if (!ok) {
    std::ifstream log(dir.path / "export.log");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    // A Python with torch is part of the test environment (cmake/deps.sh); not having it is a failure.
    FAIL("export_models.py failed (NITRO_TEST_PYTHON='" << NITRO_TEST_PYTHON << "'): " << text);
  }
  const auto x = read_floats(dir.path / "x.bin", {5, 3, 8, 8});
  const auto expected = read_floats(dir.path / "expected.bin", {5, 4});

  auto aoti = nitro::infer::load_aoti((dir.path / "cnn.pt2").string());
  CHECK(aoti->kind() == "aoti");
  CHECK(aoti->device() == c10::Device(c10::kCPU));
  nitro::infer::Runner<> run_aoti{aoti};
  const auto got = run_aoti(x);  // batch 5, exported with 2: the dynamic batch dimension
  CHECK(got.sizes() == expected.sizes());
  CHECK((got - expected).abs().max().item<double>() < 1e-4);
  CHECK((run_aoti(x.slice(0, 0, 1)) - expected.slice(0, 0, 1)).abs().max().item<double>() < 1e-4);
  // A compiled model does not check its inputs; Nitro refuses a dtype or sample shape unlike the first run's.
  CHECK_THROWS_WITH_AS(aoti->run({x.to(at::kDouble)}), doctest::Contains("first run with"), nitro::Error);
  CHECK_THROWS_WITH_AS(aoti->run({torch::randn({5, 3, 16, 16})}), doctest::Contains("first run with"), nitro::Error);

  for (bool optimize : {true, false}) {
    CAPTURE(optimize);
    auto ts = nitro::infer::load_torchscript((dir.path / "cnn.ts").string(), c10::kCPU,
                                             {.freeze = optimize, .optimize_for_inference = optimize});
    CHECK(ts->kind() == "torchscript");
    nitro::infer::Runner<> run_ts{ts};
    CHECK((run_ts(x) - expected).abs().max().item<double>() < 1e-4);
  }

  // The compiled model behind the batcher: each caller its own row.
  nitro::infer::DynamicBatcher batcher{nitro::infer::Runner<>{aoti}, {.max_batch = 4}};
  std::vector<std::future<at::Tensor>> answers;
  for (int64_t i = 0; i < 5; ++i) answers.push_back(batcher.submit(x[i]));
  for (int64_t i = 0; i < 5; ++i) CHECK((answers[i].get() - expected[i]).abs().max().item<double>() < 1e-4);
}

TEST_CASE("load_aoti and load_torchscript: a missing or foreign file is a nitro::Error that says what to do") {
  CHECK_THROWS_WITH_AS(nitro::infer::load_aoti("/nonexistent/model.pt2"), doctest::Contains("no such file"),
                       nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::infer::load_torchscript("/nonexistent/model.ts"), doctest::Contains("no such file"),
                       nitro::Error);
  nitro::test::TempDir dir("nitro-infer-foreign", true);
  const auto junk = (dir.path / "junk.pt2").string();
  std::ofstream(junk) << "not a model";
  CHECK_THROWS_WITH_AS(nitro::infer::load_aoti(junk), doctest::Contains("could not be loaded"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::infer::load_torchscript(junk), doctest::Contains("could not be loaded"), nitro::Error);
  CHECK_THROWS_WITH_AS(nitro::infer::load_torchscript(junk, c10::kCPU, {.freeze = false}),
                       doctest::Contains("frozen module"), nitro::Error);
}

}  // namespace nitro_test_infer_compiled
