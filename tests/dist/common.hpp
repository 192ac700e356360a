#pragma once
// What the dist tests share: groups of real processes (this executable started as children, met
// through a FileStore), small files they leave for the test, and environment variables set for a scope.
#include <nitro/dist/process_group.hpp>

#include "child.hpp"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace nitro::test::dist {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

inline void write_text(const fs::path& file, const std::string& text) { std::ofstream(file) << text; }
inline std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Rank `rank` of `world` through the FileStore at `store`, Gloo over loopback.
inline nitro::dist::ProcessGroup join(const std::string& store, int rank, int world, std::chrono::milliseconds timeout = 60s) {
  return nitro::dist::ProcessGroup::with_store(nitro::dist::file_store(store, world), rank, world,
                                               {.timeout = timeout, .gloo_hostname = "127.0.0.1"});
}

/// Starts `world` children running `name` with (store, rank, world, extra...); their exit codes, or -1
/// for a child still running after `limit` (killed then).
inline std::vector<int> run_ranks(const std::string& name, int world, const fs::path& dir, const std::vector<std::string>& extra,
                                  std::chrono::milliseconds limit = std::chrono::minutes(5)) {
  const std::string store = (dir / "store").string();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> args{store, std::to_string(r), std::to_string(world)};
    args.insert(args.end(), extra.begin(), extra.end());
    pids.push_back(nitro::test::spawn_child(name, args));
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<int> codes;
  for (const pid_t p : pids) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    codes.push_back(nitro::test::wait_child_for(p, std::max(left, std::chrono::milliseconds(1))));
  }
  return codes;
}

/// Sets environment variables for a scope (nullopt: unset), and puts the old values back.
struct ScopedEnv {
  std::map<std::string, std::optional<std::string>> saved;
  explicit ScopedEnv(const std::map<std::string, std::optional<std::string>>& values) {
    for (const auto& [k, v] : values) {
      const char* old = std::getenv(k.c_str());
      saved[k] = old ? std::optional<std::string>(old) : std::nullopt;
      if (v) ::setenv(k.c_str(), v->c_str(), 1);
      else ::unsetenv(k.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    for (const auto& [k, v] : saved) {
      if (v) ::setenv(k.c_str(), v->c_str(), 1);
      else ::unsetenv(k.c_str());
    }
  }
};

/// No launcher's variables: a process alone.
inline const std::map<std::string, std::optional<std::string>> kNoLauncher{
    {"RANK", std::nullopt}, {"WORLD_SIZE", std::nullopt}, {"LOCAL_RANK", std::nullopt},
    {"MASTER_ADDR", std::nullopt}, {"MASTER_PORT", std::nullopt}, {"TORCHELASTIC_USE_AGENT_STORE", std::nullopt},
    {"TORCHELASTIC_RESTART_COUNT", std::nullopt}};

inline std::map<std::string, std::optional<std::string>> with(std::map<std::string, std::optional<std::string>> env,
                                                             const std::map<std::string, std::optional<std::string>>& more) {
  for (const auto& [k, v] : more) env[k] = v;
  return env;
}

/// torchrun of the python the build found (NITRO_TEST_PYTHON's bin/), or "" where there is none.
inline std::string torchrun_path() {
  const fs::path python = NITRO_TEST_PYTHON;
  if (python.empty()) return {};
  const fs::path torchrun = python.parent_path() / "torchrun";
  return fs::exists(torchrun) ? torchrun.string() : std::string();
}

}  // namespace nitro::test::dist
