// See cache_dir.h.
#include "peertrain/core/cache_dir.h"

#include <cstdlib>

namespace peertrain {

std::string user_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
    return std::string(xdg) + "/peertrain";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return std::string(home) + "/.cache/peertrain";
  return "";
}

}  // namespace peertrain
