// One error type for every recoverable failure at a boundary (a file, a socket, a flag).
// The message names the input, the place and what was expected; the CLI prints it as
// "error: <message>". Broken invariants use PEERTRAIN_CHECK, which prints both values.
// See docs/errors.md for the policy.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace peertrain {

enum class ErrorKind {
  kInvalidArgument,  // a flag or a value in a file is wrong
  kParse,            // a file or a frame does not follow its format
  kIo,               // a file or socket could not be read or written
  kNotConverged,     // a numerical method did not reach its tolerance
  kTimeout,          // a wait ran past its deadline
  kPeerLost,         // a peer vanished or broke the protocol
  kInternal,         // a broken invariant (a bug)
};

std::string_view to_string(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Concatenates anything that streams: str("peer ", id, " at step ", step).
template <typename... Parts>
std::string str(const Parts&... parts) {
  std::ostringstream out;
  out.precision(17);
  ((out << parts), ...);
  return out.str();
}

[[noreturn]] void fail_check(const char* expression, const std::string& detail, const char* file,
                             int line);

}  // namespace peertrain

// A broken invariant: a bug in peertrain, not bad input.
#define PEERTRAIN_CHECK(condition, ...)                                                     \
  do {                                                                                      \
    if (!(condition))                                                                       \
      ::peertrain::fail_check(#condition, ::peertrain::str(__VA_ARGS__), __FILE__, __LINE__); \
  } while (false)
