// Shared handling of cxxopts for every subcommand: --help, and wrong flags reported as
// "error: ..." with exit code 2.
#pragma once

#include <cctype>
#include <charconv>
#include <cstdio>
#include <cxxopts.hpp>
#include <initializer_list>
#include <vector>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <string>

#include "peertrain/core/error.h"

namespace peertrain::cli {

// Parses; returns the exit code to stop with (0 after --help, 2 on a bad flag), or nothing
// to go on.
inline std::optional<int> parse_or_exit(cxxopts::Options& options, int argc, char** argv,
                                        cxxopts::ParseResult* result) {
  // cxxopts reads a one-letter name as a short option, so "--p 0.2" would be refused;
  // accept it (and "--p=0.2") as users write it.
  std::vector<std::string> rewritten(argv, argv + argc);
  for (auto& arg : rewritten)
    if (arg.size() >= 3 && arg[0] == '-' && arg[1] == '-' && std::isalpha(static_cast<unsigned char>(arg[2])) &&
        (arg.size() == 3 || arg[3] == '='))
      arg = arg.size() == 3 ? arg.substr(1) : "-" + arg.substr(2, 1) + arg.substr(4);
  std::vector<char*> args;
  for (auto& arg : rewritten) args.push_back(arg.data());
  try {
    *result = options.parse(static_cast<int>(args.size()), args.data());
  } catch (const cxxopts::exceptions::exception& e) {
    std::fprintf(stderr, "error: %s (see '%s --help')\n", e.what(), options.program().c_str());
    return 2;
  }
  if (result->count("help")) {
    std::printf("%s", options.help().c_str());
    return 0;
  }
  return std::nullopt;
}

// Numeric flags are read as text and converted here, so a bad value is reported with the
// flag's name ("--peers 'many' is not an integer"), which cxxopts does not do.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename T>
T number_flag(const cxxopts::ParseResult& args, const std::string& name) {
  const std::string text = args[name].as<std::string>();
  T value{};
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size())
    throw UsageError("--" + name + " '" + text + "' is not " +
                     (std::is_integral_v<T> ? "an integer in range" : "a number"));
  return value;
}

// number_flag that must be above 0 (or, zero_ok, at least 0), the error naming the flag
// and the text it got ("--lr must be positive, got 0").
template <typename T>
T positive(const cxxopts::ParseResult& args, const std::string& name, bool zero_ok = false) {
  const T value = number_flag<T>(args, name);
  if (zero_ok ? !(value >= 0) : !(value > 0))  // written so that a NaN fails too
    throw UsageError("--" + name + " must be " + (zero_ok ? "0 or more" : "positive") + ", got " +
                     args[name].as<std::string>());
  return value;
}

// number_flag with a lower bound, the error naming the flag and the value it got
// ("--top must be at least 1, got 0").
template <typename T>
T at_least_flag(const cxxopts::ParseResult& args, const std::string& name, T minimum) {
  const T value = number_flag<T>(args, name);
  if (value < minimum)
    throw UsageError("--" + name + " must be at least " + std::to_string(minimum) + ", got " + std::to_string(value));
  return value;
}

// Refuses each of `flags` given on the command line: a flag of another mode or model would
// otherwise be read by nothing, and the answer would be for something else than asked.
// `for_what` completes "--FLAG is for ...".
inline void refuse_flags(const cxxopts::ParseResult& args, std::initializer_list<const char*> flags,
                         const std::string& for_what) {
  for (const char* flag : flags)
    if (args.count(flag)) throw UsageError(std::string("--") + flag + " is for " + for_what);
}

// Runs a bench command's body and turns its errors into the exit codes: a wrong command
// line or bad input 2 ("error: …", with where to find help for usage errors), a failure
// at run time 1.
template <typename Body>
int exit_code_of(const char* command, Body&& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s (see 'peertrain %s --help')\n", e.what(), command);
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.kind() == ErrorKind::kInvalidArgument ? 2 : 1;
  }
}

}  // namespace peertrain::cli
