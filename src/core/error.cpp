#include "peertrain/core/error.h"

namespace peertrain {

std::string_view to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kParse: return "parse error";
    case ErrorKind::kIo: return "I/O error";
    case ErrorKind::kNotConverged: return "not converged";
    case ErrorKind::kTimeout: return "timeout";
    case ErrorKind::kPeerLost: return "peer lost";
    case ErrorKind::kInternal: return "internal error";
  }
  return "unknown error";
}

void fail_check(const char* expression, const std::string& detail, const char* file, int line) {
  throw Error(ErrorKind::kInternal,
              str("internal check failed at ", file, ":", line, ": ", expression,
                  detail.empty() ? "" : " (", detail, detail.empty() ? "" : ")"));
}

}  // namespace peertrain
