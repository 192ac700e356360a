#pragma once
// Child processes for tests that need a real second process (a resume in a fresh process, a kill
// during a save, a signal): a test executable runs a registered child main when started as
//   test_<area> --nitro-child <name> [args...]
// (tests/main.cpp). Not in the precompiled header: only the tests that start children include it.
//
//   NITRO_TEST_CHILD(train_some) { ...; return 0; }          // int(const std::vector<std::string>& args)
//   const int status = nitro::test::run_child("train_some", {"a", "b"});   // its exit code
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace nitro::test {

using ChildMain = int (*)(const std::vector<std::string>& args);

/// Registers a child main under a name (NITRO_TEST_CHILD does it at static initialisation).
struct RegisterChild {
  RegisterChild(const char* name, ChildMain main);
};

/// Runs the child `name` if argv asks for one: its exit code; -1 when argv is not a child's.
int run_child_main(int argc, char** argv);

/// Starts this executable as child `name` with `args`; returns its pid.
pid_t spawn_child(const std::string& name, const std::vector<std::string>& args);
/// Waits for a child: its exit code, or 128 + the signal that ended it.
int wait_child(pid_t pid);
/// spawn_child, then wait_child.
int run_child(const std::string& name, const std::vector<std::string>& args);
/// Waits at most `limit` for a child: its exit code (as wait_child), or -1 when it was still running
/// then (it is killed with SIGKILL and reaped).
int wait_child_for(pid_t pid, std::chrono::milliseconds limit);
/// Starts any program (`argv[0]` is its path) with standard output and error appended to `log`, in a
/// process group of its own (so that killpg(pid, ...) reaches it and everything it starts); its pid.
pid_t spawn_program(const std::vector<std::string>& argv, const std::string& log);

}  // namespace nitro::test

#define NITRO_TEST_CHILD(name)                                                            \
  static int name(const std::vector<std::string>& args);                                 \
  static const ::nitro::test::RegisterChild nitro_register_child_##name(#name, &name);    \
  static int name(const std::vector<std::string>& args)
