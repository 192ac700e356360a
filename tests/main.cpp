// The main() of every test executable.
//
// CTest runs each case in a process of its own (`--test-case=<name>`). A case that does not run
// there exits with 77, which CTest reports as skipped (SKIP_RETURN_CODE, tests/CMakeLists.txt),
// where doctest alone would print "test cases: 0" and fail the test's FAIL_REGULAR_EXPRESSION:
//   - a case skipped by its decorator (doctest::skip(condition), nitro::test::needs_gpu(skip_anyway));
//   - a case named "gpu: ..." where no GPU is present (tests/testing.hpp, needs_gpu). Such cases are
//     also left out of a whole run there (doctest counts them as skipped), and are still listed, so
//     CTest registers them on every machine and `ctest -L gpu` finds them even where they cannot run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "child.hpp"

#include <torch/cuda.h>

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <string_view>

namespace {

// The one case a command line names exactly (no wildcard), as CTest gives it; "" otherwise.
std::string named_case(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    for (const std::string_view flag : {"--test-case=", "-tc="}) {
      if (!arg.starts_with(flag)) continue;
      std::string name;
      const auto rest = arg.substr(flag.size());
      for (std::size_t j = 0; j < rest.size(); ++j) {
        if (rest[j] == '\\' && j + 1 < rest.size() && rest[j + 1] == ',') continue;  // "\," is a comma
        name += rest[j];
      }
      return name.find_first_of("*?") == std::string::npos ? name : std::string();
    }
  }
  return {};
}

// A crash (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) prints the stack to standard error, then ends
// the process as it would have: on a machine without a debugger (the GPU machine) the log says where.
extern "C" void print_stack_and_die(int signo) {
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  const char line[] = "[nitro] crashed; the stack:\n";
  (void)!::write(2, line, sizeof line - 1);
  ::backtrace_symbols_fd(frames, n, 2);
  ::signal(signo, SIG_DFL);
  ::raise(signo);
}

void print_stack_on_crash() {
  void* warm[1];
  (void)::backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  for (const int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::signal(s, &print_stack_and_die);
}

}  // namespace

int main(int argc, char** argv) {
  print_stack_on_crash();
  // `--nitro-child <name> args...`: a test's second process (tests/child.hpp), not doctest.
  if (const int code = nitro::test::run_child_main(argc, argv); code >= 0) return code;
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  const bool gpu = torch::cuda::is_available();
  if (const auto name = named_case(argc, argv); !name.empty()) {
    for (const auto& tc : doctest::detail::getRegisteredTests()) {
      if (name != tc.m_name) continue;
      const bool no_gpu = !gpu && name.starts_with("gpu: ");
      if (tc.m_skip || no_gpu) {
        std::printf("[nitro] skipped: \"%s\" %s\n", name.c_str(),
                    no_gpu ? "needs a GPU and this process sees none" : "is skipped here by its decorator");
        return 77;
      }
    }
  }
  bool listing = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    listing = listing || arg.starts_with("--list-test-cases") || arg.starts_with("-ltc");
  }
  if (!gpu && !listing) context.addFilter("test-case-exclude", "gpu: *");
  return context.run();
}
