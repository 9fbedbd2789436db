// Minimal leveled logging to stderr. One line per message, prefixed with the level and,
// when set, the peer that logs it, so the interleaved output of many peers stays readable.
#pragma once

#include <cstdio>

#include <string>

#include "peertrain/core/error.h"

namespace peertrain::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_level(Level level);
Level level();
Level parse_level(const std::string& name);  // throws Error on an unknown name
void set_prefix(std::string prefix);         // e.g. "peer 3"
void set_thread_prefix(std::string prefix);
void set_output(
    std::FILE*
        file);  // where lines go (nullptr: stderr); the caller keeps it open  // the calling thread's own, over set_prefix's
void write(Level level, const std::string& message);

template <typename... Parts>
void debug(const Parts&... parts) {
  if (level() <= Level::kDebug) write(Level::kDebug, str(parts...));
}
template <typename... Parts>
void info(const Parts&... parts) {
  if (level() <= Level::kInfo) write(Level::kInfo, str(parts...));
}
template <typename... Parts>
void warn(const Parts&... parts) {
  if (level() <= Level::kWarn) write(Level::kWarn, str(parts...));
}
template <typename... Parts>
void error(const Parts&... parts) {
  if (level() <= Level::kError) write(Level::kError, str(parts...));
}

}  // namespace peertrain::log
