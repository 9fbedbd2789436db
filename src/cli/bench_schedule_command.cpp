// peertrain bench schedule: every pipeline schedule of parallel/schedule.h replayed on an
// ideal machine with given pass times, next to the papers' bubble and memory, and its
// timeline drawn as text.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "options.h"
#include "peertrain/core/error.h"
#include "peertrain/parallel/schedule.h"

namespace peertrain::cli {

using Json = nlohmann::ordered_json;
namespace {

using parallel::PassKind;
using parallel::PipelineOp;
using parallel::Schedule;
using parallel::ScheduleShape;

struct PassTimes {
  double forward = 1, backward = 1, weight = 1;  // of a whole stage; a chunk takes 1/chunks
};

PassTimes parse_times(const std::string& text) {
  std::vector<double> values;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    try {
      std::size_t used = 0;
      const double value = std::stod(item, &used);
      if (used != item.size() || !(value > 0)) throw std::invalid_argument(item);
      values.push_back(value);
    } catch (const std::exception&) {
      values.clear();
      break;
    }
  }
  if (values.size() != 3) throw UsageError("--times '" + text + "': expected three positive numbers F,B,W, e.g. 1,1,1");
  return {values[0], values[1], values[2]};
}

// Three characters per time unit (the shortest pass): a pass is its kind (F, B, W; lower
// case for a stage's second chunk) and its micro-batch's last digit, '-' while it lasts,
// '.' where the stage idles.
std::string timeline(const std::vector<PipelineOp>& ops, const parallel::ReplayedStage& stage, double unit,
                     const std::function<double(const PipelineOp&)>& duration) {
  std::string line;
  auto column = [&](double t) { return static_cast<std::size_t>(std::lround(3 * t / unit)); };
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const std::size_t from = column(stage.pass_start_s[k]), to = column(stage.pass_start_s[k] + duration(ops[k]));
    if (line.size() < from) line.append(from - line.size(), '.');
    const PipelineOp& op = ops[k];
    const char kind = "FBW"[static_cast<int>(op.kind)];
    line += op.chunk == 0 ? kind : static_cast<char>(kind - 'A' + 'a');
    line += static_cast<char>('0' + op.microbatch % 10);
    if (line.size() < to) line.append(to - line.size(), to - line.size() == 1 ? ' ' : '-');
    if (line.size() >= 1 && line.back() == '-') line.back() = ' ';
  }
  return line;
}

std::string cell(double x, int decimals) {
  if (std::isnan(x)) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", decimals, x);
  return text;
}

}  // namespace

int bench_schedule(int argc, char** argv) {
  cxxopts::Options options("peertrain bench schedule",
                           "Replay pipeline schedules on an ideal machine (a processor per stage, free links): "
                           "bubble and peak activation memory against the papers' values");
  options.add_options()("pp", "pipeline stages p", cxxopts::value<std::string>()->default_value("4"))(
      "microbatches", "micro-batches m per step", cxxopts::value<std::string>()->default_value("8"))(
      "schedule", "gpipe, 1f1b, eager-1f1b, interleaved, zb-h1, zb-h2, zb-v, v-half, pipedream, or all",
      cxxopts::value<std::string>()->default_value("all"))("chunks", "interleaved: chunks per stage v",
                                                           cxxopts::value<std::string>()->default_value("2"))(
      "times", "F,B,W: a stage's forward, input-gradient and weight-gradient times",
      cxxopts::value<std::string>()->default_value("1,1,1"))(
      "timeline", "draw each stage's passes in time (F/B/W forward/input/weight, lower case the second chunk)")(
      "format", "table or json", cxxopts::value<std::string>()->default_value("table"))("h,help", "this help");
  options.custom_help(
      "[--pp 4] [--microbatches 8] [--schedule all|NAME] [--chunks 2] [--times F,B,W] [--timeline] [--format "
      "table|json]");
  cxxopts::ParseResult args;
  if (auto code = parse_or_exit(options, argc, argv, &args)) return *code;
  try {
    const int stages = number_flag<int>(args, "pp");
    const int microbatches = number_flag<int>(args, "microbatches");
    const int chunks = number_flag<int>(args, "chunks");
    const PassTimes times = parse_times(args["times"].as<std::string>());
    const std::string format = args["format"].as<std::string>();
    if (format != "table" && format != "json") throw UsageError("--format '" + format + "': expected table or json");
    std::vector<Schedule> schedules;
    const std::string which = args["schedule"].as<std::string>();
    if (which == "all")
      schedules = parallel::all_schedules();
    else
      schedules.push_back(parallel::parse_schedule(which));
    auto shape_of = [&](Schedule schedule) {
      return ScheduleShape{.schedule = schedule, .stages = stages, .microbatches = microbatches, .interleave = chunks};
    };
    // An "all" sweep leaves out interleaved where p does not divide m; a named schedule
    // that cannot run is an error before anything is printed.
    if (which == "all" && microbatches % stages != 0) std::erase(schedules, Schedule::kInterleaved);
    for (Schedule schedule : schedules) parallel::validate(shape_of(schedule));
    auto pass_time = [&](const ScheduleShape& shape) {
      return [&times, shape](const PipelineOp& op) {
        const double whole = op.kind == PassKind::kForward  ? times.forward
                             : op.kind == PassKind::kWeight ? times.weight
                             : shape.split_backward()       ? times.backward
                                                            : times.backward + times.weight;
        return whole / shape.chunks();
      };
    };
    auto replay = [&](const ScheduleShape& shape, const std::vector<std::vector<PipelineOp>>& ops) {
      const auto time = pass_time(shape);
      return parallel::replay_schedule(shape, ops, [&](int, const PipelineOp& op) { return time(op); });
    };
    const ScheduleShape baseline = shape_of(Schedule::kOneFOneB);
    const double one_f_one_b = replay(baseline, parallel::build_schedule(baseline)).span_bubble;
    std::vector<std::string> rows;
    if (format == "table")
      std::printf("%-12s %8s %8s %8s %8s %6s %7s  %s\n", "schedule", "bubble", "theory", "step", "vs 1f1b", "peak",
                  "theory", "peak by stage (micro-batches)");
    for (Schedule schedule : schedules) {
      const ScheduleShape shape = shape_of(schedule);
      const auto ops = parallel::build_schedule(shape);
      const auto result = replay(shape, ops);
      double peak = 0;
      std::vector<double> peaks;
      for (const auto& st : result.stages) {
        peak = std::max(peak, st.peak_microbatches);
        peaks.push_back(st.peak_microbatches);
      }
      const double theory = parallel::theoretical_bubble(shape, times.forward, times.backward, times.weight);
      const double theory_peak = parallel::theoretical_peak(shape);
      const double ratio = one_f_one_b > 0 ? result.span_bubble / one_f_one_b : std::nan("");
      if (format == "json") {
        Json o;
        o["schedule"] = parallel::to_string(schedule);
        o["stages"] = stages;
        o["microbatches"] = microbatches;
        o["chunks"] = shape.chunks();
        o["bubble"] = result.span_bubble;
        o["theoretical_bubble"] = theory;
        o["step_bubble"] = result.bubble;
        o["bubble_vs_1f1b"] = ratio;
        o["peak_microbatches"] = peak;
        o["theoretical_peak_microbatches"] = theory_peak;
        o["peak_by_stage"] = peaks;
        rows.push_back(o.dump());
        continue;
      }
      std::string by_stage;
      for (double x : peaks) by_stage += (by_stage.empty() ? "" : " ") + cell(x, x == std::floor(x) ? 0 : 1);
      std::printf("%-12s %8s %8s %8s %8s %6s %7s  %s\n", std::string(parallel::to_string(schedule)).c_str(),
                  cell(result.span_bubble, 4).c_str(), cell(theory, 4).c_str(), cell(result.bubble, 4).c_str(),
                  cell(ratio, 2).c_str(), cell(peak, 1).c_str(), cell(theory_peak, 1).c_str(), by_stage.c_str());
      if (args.count("timeline")) {
        const double unit = std::min({times.forward, times.backward, times.weight}) / shape.chunks();
        for (int s = 0; s < stages; ++s)
          std::printf("    stage %d  %s\n", s, timeline(ops[s], result.stages[s], unit, pass_time(shape)).c_str());
      }
    }
    if (format == "json") {
      std::printf("[\n");
      for (std::size_t i = 0; i < rows.size(); ++i)
        std::printf("  %s%s\n", rows[i].c_str(), i + 1 < rows.size() ? "," : "");
      std::printf("]\n");
    } else {
      std::printf(
          "\nbubble: 1 - busy/(p * longest stage span), the zero-bubble papers' measure; step: from the first pass "
          "to the last anywhere (a synchronous step's).\ntheory: the papers' closed forms for these times (v-half: "
          "none). peak: activations held, in micro-batches.\n");
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s (see 'peertrain bench schedule --help')\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}

}  // namespace peertrain::cli
