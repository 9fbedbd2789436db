#include "peertrain/core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace peertrain::log {
namespace {
std::atomic<Level> g_level{Level::kInfo};
std::mutex g_mutex;  // keeps lines from different threads whole
std::string g_prefix;
// A peer of a simulated cluster runs as a thread of one process: its own prefix.
thread_local std::string t_prefix;
std::FILE* g_output = nullptr;  // stderr unless set
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

void set_output(std::FILE* file) {
  std::lock_guard lock(g_mutex);
  g_output = file;
}

void set_thread_prefix(std::string prefix) { t_prefix = std::move(prefix); }

void write(Level level, const std::string& message) {
  static constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
  std::lock_guard lock(g_mutex);
  const char* name = kNames[static_cast<int>(level) < 4 ? static_cast<int>(level) : 3];
  const std::string& prefix = t_prefix.empty() ? g_prefix : t_prefix;
  std::FILE* out = g_output ? g_output : stderr;
  if (prefix.empty())
    std::fprintf(out, "[%s] %s\n", name, message.c_str());
  else
    std::fprintf(out, "[%s %s] %s\n", name, prefix.c_str(), message.c_str());
}

}  // namespace peertrain::log
