// What `launch` shows, for the peers it starts as processes and for a simulated cluster
// alike: the live progress line drawn from the coordinator's progress reports, and the
// summary table at the end.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "peertrain/core/clock.h"

namespace peertrain::cli {

using Json = nlohmann::ordered_json;

// The number under `key` in a one-line JSON object (the progress and evaluation lines), or
// `fallback` when the line has none.
double field(const Json& line, const char* key, double fallback = NAN);
// The object a line holds, or an empty one.
Json parse_line(const std::string& text);
std::string human_bytes(double bytes);

// One line that follows the run: in place on a terminal, every 10 s (and at each
// evaluation) otherwise. For a simulated cluster it shows the simulated and the real time.
class ProgressLine {
 public:
  explicit ProgressLine(bool tty, bool simulated = false);
  void update(const std::string& line_text);  // one progress report (JSON)
  void end();

 private:
  bool tty_;
  bool simulated_;
  SteadyClock::time_point start_ = SteadyClock::now();
  SteadyClock::time_point last_ = SteadyClock::now();
};

// The summary table of the run in `out` (its summary.json and metrics.csv).
void print_summary(const std::filesystem::path& out);
// The text of a file without its trailing blanks, or `fallback`.
std::string read_text(const std::filesystem::path& path, const std::string& fallback);

}  // namespace peertrain::cli
