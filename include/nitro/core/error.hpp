#pragma once
// nitro::Error and the contract macros.
//
// Two kinds of failure, kept apart:
//  - a user's mistake (a bad option, a wrong shape, a corrupt file): `throw nitro::Error`, whose
//    message says what was wrong and what to do. NITRO_CHECK(cond, parts...) is the shorthand.
//  - a broken internal invariant (a bug in Nitro): NITRO_EXPECTS / NITRO_ENSURES, which are GSL's
//    Expects / Ensures (terminate) unless NITRO_THROW_ON_CONTRACT_VIOLATION is defined, in which
//    case they throw nitro::ContractViolation, so tests can check them with CHECK_THROWS (with the
//    compiled library too: its checks throw once any translation unit of the program defines it).
#include <nitro/core/config.hpp>

#include <gsl/assert>

#include <initializer_list>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace nitro {

/// What Nitro throws for a user's mistake. The message names the problem and the remedy.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown instead of terminating on a violated contract when NITRO_THROW_ON_CONTRACT_VIOLATION is defined.
class ContractViolation : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {

template <class... Parts>
[[nodiscard]] std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return std::move(out).str();
}

/// One part of a failure message with its type erased: the message is streamed by one function per
/// type of part, not by a stream expression per NITRO_CHECK, whose parts' types (string literals of
/// every length) are different at almost every call. That keeps the compile time of a translation
/// unit that includes Nitro's headers down.
struct MessagePart {
  const void* value;
  void (*write)(std::ostream& out, const void* value);
};

template <class T>
void write_message_part(std::ostream& out, const void* value) {
  out << *static_cast<const T*>(value);
}

inline void write_c_string(std::ostream& out, const void* value) { out << static_cast<const char*>(value); }

// String literals (char arrays of any length) and const char* stream as C strings.
inline MessagePart message_part(const char* s) noexcept { return {s, &write_c_string}; }

template <class T>
MessagePart message_part(const T& value) noexcept {
  return {&value, &write_message_part<T>};
}

[[noreturn, gnu::cold, gnu::noinline]] inline void fail_with(std::initializer_list<MessagePart> parts) {
  std::ostringstream out;
  for (const MessagePart& part : parts) part.write(out, part.value);
  throw Error(std::move(out).str());
}

/// Out of line and cold, so the check at the call site stays one compare and one branch.
template <class... Parts>
[[noreturn, gnu::cold, gnu::noinline]] void fail(const Parts&... parts) {
  fail_with({message_part(parts)...});
}

[[noreturn, gnu::cold, gnu::noinline]] inline void contract_violation(const char* kind, const char* cond,
                                                                     const char* file, int line) {
  throw ContractViolation(concat("nitro: ", kind, " violated: ", cond, " at ", file, ":", line));
}

#if NITRO_COMPILED
/// With NITRO_COMPILED the library's own contract checks follow the program's choice: every
/// translation unit built with NITRO_THROW_ON_CONTRACT_VIOLATION tells the library so when the
/// program starts (the library is compiled once, without the program's defines).
void throw_on_contract_violation() noexcept;
/// The library's contract check: ContractViolation once a translation unit asked for it, else
/// std::terminate (as GSL's Expects).
[[noreturn, gnu::cold, gnu::noinline]] void library_contract_violation(const char* kind, const char* cond,
                                                                      const char* file, int line);
#if defined(NITRO_THROW_ON_CONTRACT_VIOLATION) && !defined(NITRO_COMPILED_SOURCE)
[[gnu::used]] inline const bool contract_violation_throws = (throw_on_contract_violation(), true);
#endif

/// With NITRO_COMPILED: throws nitro::Error when the headers the program was built with and the
/// compiled library it links are of different versions (a library left from another Nitro). Called
/// where a program begins to use Nitro: a TrainingLoop, a Prefetcher, a Cache, a monitor, a snapshot.
void check_library_version();
#else
inline void check_library_version() noexcept {}
#endif

}  // namespace detail
}  // namespace nitro

/// Throws nitro::Error with the parts streamed together when `cond` is false.
/// NITRO_CHECK(threads > 0, "hw::Settings: intra_op_threads must be >= 1, got ", threads);
#define NITRO_CHECK(cond, ...)                \
  do {                                        \
    if (!(cond)) [[unlikely]] {               \
      ::nitro::detail::fail(__VA_ARGS__);     \
    }                                         \
  } while (false)

#if NITRO_COMPILED && defined(NITRO_COMPILED_SOURCE)
#define NITRO_EXPECTS(cond)                    \
  ((cond) ? static_cast<void>(0)               \
          : ::nitro::detail::library_contract_violation("precondition", #cond, __FILE__, __LINE__))
#define NITRO_ENSURES(cond)                    \
  ((cond) ? static_cast<void>(0)               \
          : ::nitro::detail::library_contract_violation("postcondition", #cond, __FILE__, __LINE__))
#elif defined(NITRO_THROW_ON_CONTRACT_VIOLATION)
#define NITRO_EXPECTS(cond) \
  ((cond) ? static_cast<void>(0) : ::nitro::detail::contract_violation("precondition", #cond, __FILE__, __LINE__))
#define NITRO_ENSURES(cond) \
  ((cond) ? static_cast<void>(0) : ::nitro::detail::contract_violation("postcondition", #cond, __FILE__, __LINE__))
#else
#define NITRO_EXPECTS(cond) Expects(cond)
#define NITRO_ENSURES(cond) Ensures(cond)
#endif

#if !NITRO_COMPILED
#include <nitro/core/error-inl.hpp>
#endif
