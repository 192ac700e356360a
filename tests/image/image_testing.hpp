#pragma once
// What the image tests share: the message of the nitro::Error a call throws.
#include <nitro/core/error.hpp>

#include <exception>
#include <functional>
#include <string>

namespace nitro::test {

/// The message of the nitro::Error that `f` throws; "(no error)" or "(not a nitro::Error: ...)" otherwise.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const nitro::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(not a nitro::Error: ") + e.what() + ")";
  }
  return "(no error)";
}
inline bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace nitro::test
