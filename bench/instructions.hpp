#pragma once
// Instruction counts: overhead ratios that a busy machine cannot move. A wall-clock ratio of two
// steps on a shared machine swings by several percent from run to run; the number of instructions
// the steps execute repeats exactly for the same binary, arguments and environment.
//
// The benchmark runs itself once more under `valgrind --tool=callgrind` (the child). The child makes
// the model and inputs as the benchmark always does, then forks one process per variant; each runs
// its variant's warm-up steps, then its counted steps inside counted_steps(), the one function
// callgrind collects in (--toggle-collect). The parent reads each total and prints the ratio next to
// the wall-clock line. A benchmark adds it in a few lines:
//
//   int main(int argc, char** argv) {
//     nitro::bench::Instructions counts{argc, argv};   // takes its flags out of argv
//     ... model, optimizer, inputs, plain_step, watched_step (lambdas doing one step each) ...
//     counts.add("plain", plain_step, {.warmup = 20, .steps = 100});
//     counts.add("monitored", watched_step, {.warmup = 20, .steps = 100});
//     if (counts.child()) return counts.run_child();   // the valgrind child ends here
//     ... the wall-clock measurement, nitro::bench::result("monitor_overhead", ...) ...
//     counts.result("monitor_overhead_instructions", "monitored", "plain");   // goal <= 1.01
//   }
//
// which prints (bench_monitor, which adds two more variants)
//   instructions: 4 variants counted under valgrind in 82 s
//   instructions over 100 steps (after 20 uncounted): plain 1594311870, monitored 1594486558, +1747 a step
//   RESULT monitor_overhead_instructions=1 goal<=1.01 PASS
// The first result() runs the child, which counts every variant added; later ones reuse the totals.
//
// Counted by default where no GPU is present (the counts are of CPU steps; on the GPU machine the
// time is better spent on the GPU's rows). Flags (taken out of argv before the benchmark reads its own):
//   --instructions          count on a GPU machine too
//   --no-instructions       no instruction counts (result() prints nothing)
//   --instructions-out=DIR  keep the child's files in DIR: callgrind.out.<variant> (for
//                           callgrind_annotate) and log (the child's output and valgrind's);
//                           otherwise they go to a temporary directory removed at exit
//   --instructions-child    (given by the parent to the child)
//
// What the child does differently, and why:
//   - One intra-op and one inter-op thread (at::set_num_threads(1), OMP_NUM_THREADS=1): callgrind
//     collects per thread, so only the thread that calls counted_steps() is counted; with one
//     thread every kernel runs on it. Work a step hands to another thread is not counted.
//   - No GPU (CUDA_VISIBLE_DEVICES empty): the steps run on the CPU, and no CUDA driver under valgrind.
//   - MKL's SSE4.2 kernels and oneDNN's AVX ones (see child_environment), not the FMA kernels the
//     machine would use: more instructions a step than natively (bench_monitor's step: 15.9 M, not
//     5.5 M), the same in every variant, so a fixed cost a step shows about 3 times smaller.
//   - Its stdout and stderr go to the log file: a stream there is never a terminal.
// Every variant starts from the same state (the fork of one process: the same seed, model, inputs
// and counters) and a ratio's two variants run the same numbers of steps. The count covers all the
// calling thread executes in the counted steps, the allocator and LibTorch included, not the
// kernel's side of system calls. Other arguments or another environment move the count a little
// (the heap's layout changes; 0.005% of bench_loop_overhead's count when an argument grew by 18
// characters), so compare counts of one command line.
//
// Without valgrind on PATH (or when already under valgrind) result() prints a line saying the
// instruction count was skipped: not a RESULT line, not a failure.
#include "common.hpp"

#include <ATen/Parallel.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

// valgrind's client requests (valgrind/valgrind.h, callgrind.h: in Debian's valgrind package). With
// them the child runs uninstrumented (several times faster) until its counted steps begin; without
// them everything is instrumented and only the counts are the same.
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define NITRO_BENCH_CLIENT_REQUESTS 1
#define NITRO_BENCH_ON_VALGRIND() (RUNNING_ON_VALGRIND != 0)
#else
#define NITRO_BENCH_CLIENT_REQUESTS 0
#define NITRO_BENCH_ON_VALGRIND() false
#endif

extern char** environ;

namespace nitro::bench {

/// Runs step() n times; the only function callgrind collects in (--toggle-collect matches its
/// name), so its instructions and those of everything it calls are the count. Never inlined, cloned
/// or merged with another function, so the name always stands for exactly this code.
#if defined(__GNUC__) && !defined(__clang__)
[[gnu::noipa]]
#else
[[gnu::noinline]]
#endif
inline void counted_steps(const std::function<void()>& step, int n) {
  for (int i = 0; i < n; ++i) step();
}

/// What a variant's process runs: `before()` (if given) and `warmup` steps uncounted, then `steps`
/// steps counted. A step that does something every k steps wants `steps` a multiple of each such k,
/// so that every count holds it equally often.
struct CountOptions {
  int warmup = 3;
  int steps = 5;
  /// Run first in the variant's own process: what must not be made before the fork, such as a
  /// process group (its threads do not survive a fork) or a peer process to talk to.
  std::function<void()> before;
};

/// The instruction-count mode of a benchmark: see the top of this file.
class Instructions {
 public:
  /// Takes the --instructions* flags out of argv (argc shrinks), so that the benchmark's own
  /// arguments read as before. In the valgrind child, also limits LibTorch to one thread.
  Instructions(int& argc, char** argv) {
    char self[4096];
    const auto n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    self_ = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(argv[0]);
    int kept = 1;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--instructions") {
        requested_ = true;
      } else if (a == "--no-instructions") {
        requested_ = false;
      } else if (a.rfind("--instructions-out=", 0) == 0) {
        out_dir_ = a.substr(std::strlen("--instructions-out="));
      } else if (a == "--instructions-child") {
        child_ = true;
      } else {
        args_.push_back(a);
        argv[kept++] = argv[i];
      }
    }
    argc = kept;
    argv[argc] = nullptr;
    if (child_) {
      at::set_num_threads(1);
      at::set_num_interop_threads(1);
    }
  }

  Instructions(const Instructions&) = delete;
  Instructions& operator=(const Instructions&) = delete;

  // Plain POSIX calls for files here: libtorch.so exports std::filesystem functions of its own
  // (nitro/io/file.hpp says why its remove_all crashes).
  ~Instructions() {
    if (!temp_dir_.empty()) {  // only the files this object made, then the directory
      for (const auto& f : made_) ::unlink(f.c_str());
      ::rmdir(temp_dir_.c_str());
    }
  }

  /// Whether this process is the valgrind child, started to count the variants.
  [[nodiscard]] bool child() const noexcept { return child_; }
  /// Whether instructions are counted in this run: --instructions, --no-instructions, else where no
  /// GPU is present (the count is of CPU steps: on a GPU machine it would only spend its time).
  [[nodiscard]] bool enabled() const { return requested_.value_or(!Cuda::available()); }

  /// A variant: its name (unique, used in file names) and one step of it, run only in the variant's
  /// own process (forked from the valgrind child once the benchmark has made its model and inputs).
  /// Every variant starts from that same state: the same model, inputs and counters.
  void add(std::string name, std::function<void()> step, CountOptions options = {}) {
    const bool word = !name.empty() && std::all_of(name.begin(), name.end(), [](unsigned char c) {
      return std::isalnum(c) != 0 || c == '-' || c == '_' || c == '.';
    });
    NITRO_CHECK(word, "Instructions::add: a variant's name is one word of letters, digits, '-', '_' or '.' (it ",
                "names a file), got '", name, "'");
    NITRO_CHECK(find(name) == nullptr, "Instructions::add: a variant named '", name, "' was added already");
    NITRO_CHECK(options.warmup >= 0 && options.steps >= 1, "Instructions::add(", name,
                "): warmup must be >= 0 and steps >= 1, got ", options.warmup, " and ", options.steps);
    variants_.push_back({std::move(name), std::move(step), std::move(options)});
  }

  /// In the valgrind child: counts each variant in a process of its own, forked from this one;
  /// returns the exit status (0 when every variant ran).
  [[nodiscard]] int run_child() {
    int failed = 0;
    for (const auto& v : variants_) {
      std::fflush(nullptr);  // else what is buffered now would be written by every fork too
      const pid_t pid = ::fork();
      if (pid < 0) {
        std::printf("instructions: cannot fork for %s: %s\n", v.name.c_str(), std::strerror(errno));
        return 1;
      }
      if (pid == 0) {
        count_here(v);
        std::fflush(nullptr);
        ::_exit(0);  // no destructors: they belong to the process this was forked from
      }
      int status = 0;
      ::waitpid(pid, &status, 0);
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        std::printf("instructions: counted %s in process %d\n", v.name.c_str(), static_cast<int>(pid));  // read by the parent
      } else {
        std::printf("instructions: the process counting %s failed (status %d)\n", v.name.c_str(), status);
        ++failed;
      }
    }
    std::fflush(stdout);
    return failed == 0 ? 0 : 1;
  }

  /// The instructions the variant's counted steps executed (every variant is counted, in one
  /// valgrind run, on the first call); nullopt when they could not be counted (why_not() says why).
  std::optional<std::uint64_t> count(const std::string& name) {
    if (!counted_) {
      counted_ = true;
      why_not_ = unavailable();
      if (why_not_.empty()) run_valgrind();
    }
    const auto it = totals_.find(name);
    return it == totals_.end() ? std::nullopt : it->second;
  }

  /// Why the counts are missing, after count(); empty when the child ran.
  [[nodiscard]] const std::string& why_not() const noexcept { return why_not_; }

  /// Prints `RESULT <name>=<variant / baseline instructions> goal<=<goal> PASS|MISS` and a line of
  /// both totals above it; without counts (no valgrind, a failed child) a line saying the count was
  /// skipped and why; with --no-instructions nothing. Returns whether the goal was met (false when
  /// not measured).
  bool result(const std::string& name, const std::string& variant, const std::string& baseline, double goal = 1.01) {
    const Variant *v = find(variant), *b = find(baseline);
    NITRO_CHECK(v != nullptr && b != nullptr, "Instructions::result(", name, "): add() variants '", variant,
                "' and '", baseline, "' first");
    NITRO_CHECK(v->options.steps == b->options.steps && v->options.warmup == b->options.warmup,
                "Instructions::result(", name, "): '", variant, "' and '", baseline,
                "' must run the same numbers of warm-up and counted steps");
    if (!enabled()) {
      if (!requested_ && !skip_said_) {
        skip_said_ = true;
        std::printf("instructions: not counted on a machine with a GPU (the counts are of CPU steps); "
                    "--instructions counts them\n");
      }
      return false;
    }
    const auto base = count(baseline), cand = count(variant);
    if (!base || !cand || *base == 0) {
      std::printf("instructions: %s skipped: %s\n", name.c_str(),
                  why_not_.empty() ? "a variant was not counted (see above)" : why_not_.c_str());
      std::fflush(stdout);
      return false;
    }
    const auto& o = v->options;
    std::printf("instructions over %d steps (after %d uncounted): %s %llu, %s %llu, %+.0f a step\n", o.steps, o.warmup,
                baseline.c_str(), static_cast<unsigned long long>(*base), variant.c_str(),
                static_cast<unsigned long long>(*cand),
                (static_cast<double>(*cand) - static_cast<double>(*base)) / o.steps);
    return nitro::bench::result(name, static_cast<double>(*cand) / static_cast<double>(*base), "<=", goal);
  }

 private:
  struct Variant {
    std::string name;
    std::function<void()> step;
    CountOptions options;
  };

  // Set for the valgrind child, whatever the parent has. valgrind runs FMA instructions (vfmadd...,
  // in MKL's and oneDNN's AVX2 kernels) in software, lane by lane: the bench_monitor step took 2.3 s
  // under valgrind with them and 0.08 s with MKL's AVX kernels, so the child's kernels are those.
  static constexpr const char* child_environment[] = {"CUDA_VISIBLE_DEVICES=", "OMP_NUM_THREADS=1",
                                                      "MKL_NUM_THREADS=1", "MKL_ENABLE_INSTRUCTIONS=SSE4_2",
                                                      "ONEDNN_MAX_CPU_ISA=AVX", "DNNL_MAX_CPU_ISA=AVX"};

  const Variant* find(const std::string& name) const {
    for (const auto& v : variants_)
      if (v.name == name) return &v;
    return nullptr;
  }

  // In a variant's process: the uncounted part, then the counted steps; prints how long each took.
  void count_here(const Variant& v) const {
    const auto t0 = std::chrono::steady_clock::now();
    if (v.options.before) v.options.before();
    for (int i = 0; i < v.options.warmup; ++i) v.step();
    const auto t1 = std::chrono::steady_clock::now();
#if NITRO_BENCH_CLIENT_REQUESTS
    CALLGRIND_START_INSTRUMENTATION;
#endif
    counted_steps(v.step, v.options.steps);
#if NITRO_BENCH_CLIENT_REQUESTS
    CALLGRIND_STOP_INSTRUMENTATION;
#endif
    const auto t2 = std::chrono::steady_clock::now();
    const auto s = [](auto d) { return std::chrono::duration<double>(d).count(); };
    std::printf("instructions: %s: %d warm-up steps %.1f s, %d counted steps %.1f s\n", v.name.c_str(),
                v.options.warmup, s(t1 - t0), v.options.steps, s(t2 - t1));
  }

  // Why instructions cannot be counted here; empty when they can.
  std::string unavailable() {
    if (NITRO_BENCH_ON_VALGRIND()) return "this process already runs under valgrind";
    const char* path = std::getenv("PATH");
    std::stringstream dirs(path ? path : "");
    for (std::string dir; std::getline(dirs, dir, ':');) {
      const auto candidate = (dir.empty() ? std::string(".") : dir) + "/valgrind";
      if (::access(candidate.c_str(), X_OK) == 0) {
        valgrind_ = candidate;
        return {};
      }
    }
    return "valgrind is not on PATH";
  }

  // Where the child's files go; empty if it cannot be made (why_not_ says why).
  std::string directory() {
    if (!out_dir_.empty()) {
      if (::mkdir(out_dir_.c_str(), 0755) != 0 && errno != EEXIST) {
        why_not_ = "cannot make " + out_dir_ + ": " + std::strerror(errno);
        return {};
      }
      return out_dir_;
    }
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/nitro-bench-instructions-XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) {
      why_not_ = "cannot make " + dir + ": " + std::strerror(errno);
      return {};
    }
    temp_dir_ = dir;
    return dir;
  }

  // Runs this program under callgrind once (--instructions-child); it counts every variant.
  void run_valgrind() {
    const auto dir = directory();
    if (dir.empty()) return;
    const auto log = dir + "/log";
    std::vector<std::string> client{self_};  // the child's own argv
    client.insert(client.end(), args_.begin(), args_.end());
    client.push_back("--instructions-child");
    std::vector<std::string> args{valgrind_,
                                  "--tool=callgrind",
                                  NITRO_BENCH_CLIENT_REQUESTS ? "--instr-atstart=no" : "--instr-atstart=yes",
                                  "--collect-atstart=no",
                                  "--toggle-collect=nitro::bench::counted_steps(*",
                                  "--callgrind-out-file=" + dir + "/callgrind.out.%p"};
    args.insert(args.end(), client.begin(), client.end());

    std::vector<std::string> env(std::begin(child_environment), std::end(child_environment));
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e, key = kv.substr(0, kv.find('=') + 1);
      bool replaced = false;
      for (const char* ours : child_environment) replaced = replaced || std::string(ours).rfind(key, 0) == 0;
      if (!replaced) env.push_back(kv);
    }
    std::vector<char*> argv_c, env_c;
    for (auto& a : args) argv_c.push_back(a.data());
    argv_c.push_back(nullptr);
    for (auto& e : env) env_c.push_back(e.data());
    env_c.push_back(nullptr);

    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&files, 1, 2);
    std::fflush(nullptr);
    const auto start = std::chrono::steady_clock::now();
    pid_t pid = 0;
    const int spawned = ::posix_spawn(&pid, valgrind_.c_str(), &files, nullptr, argv_c.data(), env_c.data());
    posix_spawn_file_actions_destroy(&files);
    if (spawned != 0) {
      why_not_ = "cannot start " + valgrind_ + ": " + std::strerror(spawned);
      return;
    }
    if (!temp_dir_.empty()) made_.push_back(log);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ::unlink((dir + "/callgrind.out." + std::to_string(pid)).c_str());  // the child's own: nothing counted
    // Each variant's process wrote callgrind.out.<its pid>; the child's log says which is which.
    std::ifstream lines(log);
    for (std::string line; std::getline(lines, line);) {
      char name[256];
      int counted_in = 0;
      if (std::sscanf(line.c_str(), "instructions: counted %255s in process %d", name, &counted_in) != 2) continue;
      const auto from = dir + "/callgrind.out." + std::to_string(counted_in), to = dir + "/callgrind.out." + name;
      if (::rename(from.c_str(), to.c_str()) != 0) continue;
      if (!temp_dir_.empty()) made_.push_back(to);
      totals_[name] = read_total(to);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::printf("instructions: the valgrind child failed (status %d); its output: %s%s\n", status, log.c_str(),
                  temp_dir_.empty() ? "" : " (removed at exit: keep it with --instructions-out=DIR)");
    } else {
      std::printf("instructions: %zu variants counted under valgrind in %.0f s\n", variants_.size(), seconds);
    }
    std::fflush(stdout);
  }

  // The first number of the `totals:` line (the instructions, Ir, callgrind's first event), else of
  // the `summary:` line (0 in a file whose instrumentation began late).
  static std::optional<std::uint64_t> read_total(const std::string& file) {
    std::ifstream in(file);
    std::optional<std::uint64_t> summary, totals;
    for (std::string line; std::getline(in, line);) {
      for (const char* key : {"summary:", "totals:"}) {
        if (line.rfind(key, 0) != 0) continue;
        std::istringstream fields(line.substr(std::strlen(key)));
        std::uint64_t value = 0;
        if (fields >> value) (key[0] == 's' ? summary : totals) = value;
      }
    }
    return totals ? totals : summary;
  }

  std::string self_;
  std::vector<std::string> args_;
  std::optional<bool> requested_;
  bool child_ = false, counted_ = false, skip_said_ = false;
  std::string out_dir_, temp_dir_, valgrind_, why_not_;
  std::vector<std::string> made_;
  std::vector<Variant> variants_;
  std::map<std::string, std::optional<std::uint64_t>> totals_;
};

}  // namespace nitro::bench
