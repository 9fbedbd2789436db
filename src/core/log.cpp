#include "peertrain/core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace peertrain::log {
namespace {
std::atomic<Level> g_level{Level::kInfo};
std::mutex g_mutex;  // keeps lines from different threads whole
std::string g_prefix;
}  // namespace

void set_level(Level level) { g_level = level; }
Level level() { return g_level; }

Level parse_level(const std::string& name) {
  if (name == "debug") return Level::kDebug;
  if (name == "info") return Level::kInfo;
  if (name == "warn") return Level::kWarn;
  if (name == "error") return Level::kError;
  if (name == "off") return Level::kOff;
  throw Error(ErrorKind::kInvalidArgument,
              str("log level '", name, "' is not one of debug, info, warn, error, off"));
}

void set_prefix(std::string prefix) {
  std::lock_guard lock(g_mutex);
  g_prefix = std::move(prefix);
}

void write(Level level, const std::string& message) {
  static constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
  std::lock_guard lock(g_mutex);
  const char* name = kNames[static_cast<int>(level) < 4 ? static_cast<int>(level) : 3];
  if (g_prefix.empty())
    std::fprintf(stderr, "[%s] %s\n", name, message.c_str());
  else
    std::fprintf(stderr, "[%s %s] %s\n", name, g_prefix.c_str(), message.c_str());
}

}  // namespace peertrain::log
