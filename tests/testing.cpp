// The translation unit that builds the precompiled header every test executable reuses (main.cpp
// cannot: it must see doctest's implementation, which the precompiled doctest.h would hide).
#include "testing.hpp"

#include "child.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

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

int wait_child_for(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  for (;;) {
    const pid_t got = ::waitpid(pid, &status, WNOHANG);
    if (got == pid) break;
    if (got < 0 && errno != EINTR) throw std::runtime_error("waitpid failed");
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      (void)wait_child(pid);
      return -1;
    }
    ::usleep(10000);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

pid_t spawn_program(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<std::string> all = argv;
  std::vector<char*> args;
  for (auto& a : all) args.push_back(a.data());
  args.push_back(nullptr);
  ::posix_spawn_file_actions_t files;
  ::posix_spawn_file_actions_init(&files);
  ::posix_spawn_file_actions_addopen(&files, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  ::posix_spawn_file_actions_adddup2(&files, 1, 2);
  ::posix_spawnattr_t attr;
  ::posix_spawnattr_init(&attr);
  ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  ::posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = 0;
  const int err = ::posix_spawn(&pid, all[0].c_str(), &files, &attr, args.data(), environ);
  ::posix_spawn_file_actions_destroy(&files);
  ::posix_spawnattr_destroy(&attr);
  if (err != 0) throw std::runtime_error("posix_spawn " + all[0] + " failed: " + std::to_string(err));
  return pid;
}

}  // namespace nitro::test
