// The translation unit that builds the precompiled header every test executable reuses (main.cpp
// cannot: it must see doctest's implementation, which the precompiled doctest.h would hide).
#include "testing.hpp"

#include "child.hpp"

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string_view>

extern char** environ;

namespace nitro::test {
namespace {
std::map<std::string, ChildMain>& children() {
  static std::map<std::string, ChildMain> registry;
  return registry;
}
}  // namespace

RegisterChild::RegisterChild(const char* name, ChildMain main) { children()[name] = main; }

int run_child_main(int argc, char** argv) {
  if (argc < 3 || std::string_view(argv[1]) != "--nitro-child") return -1;
  const auto it = children().find(argv[2]);
  if (it == children().end()) {
    std::fprintf(stderr, "no child main named %s\n", argv[2]);
    return 2;
  }
  try {
    return it->second(std::vector<std::string>(argv + 3, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child %s threw: %s\n", argv[2], e.what());
    return 3;
  }
}

pid_t spawn_child(const std::string& name, const std::vector<std::string>& args) {
  std::vector<std::string> all{"/proc/self/exe", "--nitro-child", name};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int err = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ);
  if (err != 0) throw std::runtime_error("posix_spawn failed: " + std::to_string(err));
  return pid;
}

int wait_child(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error("waitpid failed");
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

int run_child(const std::string& name, const std::vector<std::string>& args) {
  return wait_child(spawn_child(name, args));
}

}  // namespace nitro::test
