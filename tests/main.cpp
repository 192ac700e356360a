// The main() of every test executable.
//
// Test cases named "gpu: ..." need a GPU (tests/testing.hpp, needs_gpu). Where none is present they
// are left out of a run (doctest counts them as skipped), and a run that names one, as CTest runs
// each case in a process of its own, exits with 77, which CTest reports as skipped
// (SKIP_RETURN_CODE, tests/CMakeLists.txt). They are still listed, so CTest registers them on every
// machine and `ctest -L gpu` finds them even where they cannot run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <torch/cuda.h>

#include <cstdio>
#include <string_view>

int main(int argc, char** argv) {
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  if (!torch::cuda::is_available()) {
    bool listing = false;
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      listing = listing || arg.starts_with("--list-test-cases") || arg.starts_with("-ltc");
      for (const std::string_view flag : {"--test-case=gpu: ", "-tc=gpu: "}) {
        if (arg.starts_with(flag)) {
          std::printf("[nitro] skipped: \"%.*s\" needs a GPU and this process sees none\n",
                      static_cast<int>(arg.size() - flag.size() + 5), argv[i] + flag.size() - 5);
          return 77;
        }
      }
    }
    if (!listing) context.addFilter("test-case-exclude", "gpu: *");
  }
  return context.run();
}
