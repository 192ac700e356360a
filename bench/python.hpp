#pragma once
// Running the Python side of a benchmark from C++: the interpreter to use and a command's output.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace nitro::bench {

/// `s` as one word of a POSIX shell command line.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// $NITRO_PYTHON, else the environment cmake/deps.sh makes where it exists, else python3.
inline std::string find_python() {
  if (const char* p = std::getenv("NITRO_PYTHON"); p != nullptr && *p != '\0') return p;
  const std::string cached = "/root/.cache/nitro/torch-2.11.0/bin/python";
  std::error_code ec;
  if (std::filesystem::exists(cached, ec)) return cached;
  return "python3";
}

/// Runs `command` (stderr joined to stdout); its lines, and whether it exited with 0.
inline std::pair<std::vector<std::string>, bool> run_lines(const std::string& command) {
  std::vector<std::string> lines;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return {lines, false};
  std::string line;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, p) != nullptr) {
    line += buffer;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      lines.push_back(std::move(line));
      line.clear();
    }
  }
  if (!line.empty()) lines.push_back(line);
  return {lines, ::pclose(p) == 0};
}

/// The number after `key=` on the last of `lines` that has it (at a line's start or after a space).
inline std::optional<double> value_of(const std::vector<std::string>& lines, const std::string& key) {
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    const auto at = it->find(key + "=");
    if (at == std::string::npos || (at > 0 && (*it)[at - 1] != ' ')) continue;
    return std::strtod(it->c_str() + at + key.size() + 1, nullptr);
  }
  return std::nullopt;
}

}  // namespace nitro::bench
