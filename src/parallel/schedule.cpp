// GPipe (Huang et al. 2019) and 1F1B / PipeDream-Flush (Narayanan et al. 2021) as lists of
// passes, and their replay on an ideal machine. See schedule.h.
#include "peertrain/parallel/schedule.h"

#include <algorithm>

#include "peertrain/core/error.h"

namespace peertrain::parallel {

Schedule parse_schedule(std::string_view text, std::string_view flag) {
  if (text == "gpipe") return Schedule::kGpipe;
  if (text == "1f1b") return Schedule::kOneFOneB;
  throw Error(ErrorKind::kInvalidArgument, str(flag, " '", text, "': expected gpipe or 1f1b"));
}

std::string_view to_string(Schedule schedule) {
  return schedule == Schedule::kGpipe ? "gpipe" : "1f1b";
}

std::vector<PipelineOp> stage_schedule(Schedule schedule, int stages, int stage, int microbatches) {
  PEERTRAIN_CHECK(stages >= 1 && stage >= 0 && stage < stages && microbatches >= 1, "stages ", stages, ", stage ",
                  stage, ", micro-batches ", microbatches);
  std::vector<PipelineOp> ops;
  ops.reserve(2 * static_cast<std::size_t>(microbatches));
  auto forward = [&](int i) { ops.push_back({PassKind::kForward, i}); };
  auto backward = [&](int i) { ops.push_back({PassKind::kBackward, i}); };
  if (schedule == Schedule::kGpipe) {
    for (int i = 0; i < microbatches; ++i) forward(i);
    for (int i = 0; i < microbatches; ++i) backward(i);
    return ops;
  }
  // Warm-up fills the pipe below this stage: the last stage's first backward can start
  // once stage s has sent p − s forwards, the p − s − 1 of the warm-up and the first of
  // the steady phase.
  const int warmup = std::min(stages - stage - 1, microbatches);
  for (int i = 0; i < warmup; ++i) forward(i);
  for (int i = warmup; i < microbatches; ++i) {
    forward(i);
    backward(i - warmup);
  }
  for (int i = microbatches - warmup; i < microbatches; ++i) backward(i);
  return ops;
}

int peak_in_flight(std::span<const PipelineOp> ops) {
  int now = 0, peak = 0;
  for (const auto& op : ops) {
    now += op.kind == PassKind::kForward ? 1 : -1;
    peak = std::max(peak, now);
  }
  return peak;
}

double theoretical_bubble(int stages, int microbatches) {
  return static_cast<double>(stages - 1) / (microbatches + stages - 1);
}

Replay replay_schedule(Schedule schedule, int stages, int microbatches,
                       const std::function<double(int stage, const PipelineOp& op)>& duration) {
  std::vector<std::vector<PipelineOp>> ops(stages);
  for (int s = 0; s < stages; ++s) ops[s] = stage_schedule(schedule, stages, s, microbatches);
  // forward_end[s][i], backward_end[s][i]; negative: not run yet.
  std::vector<std::vector<double>> forward_end(stages, std::vector<double>(microbatches, -1));
  std::vector<std::vector<double>> backward_end(stages, std::vector<double>(microbatches, -1));
  std::vector<std::size_t> next(stages, 0);
  std::vector<double> free_at(stages, 0);
  Replay replay;
  replay.stages.resize(stages);
  // Sweep the stages until none can advance: every pass waits only on passes of
  // neighbouring stages, and the schedules are deadlock-free, so this ends with all run.
  for (bool advanced = true; advanced;) {
    advanced = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < ops[s].size()) {
        const PipelineOp& op = ops[s][next[s]];
        double ready = free_at[s];
        if (op.kind == PassKind::kForward && s > 0) {
          if (forward_end[s - 1][op.microbatch] < 0) break;
          ready = std::max(ready, forward_end[s - 1][op.microbatch]);
        }
        if (op.kind == PassKind::kBackward && s + 1 < stages) {
          if (backward_end[s + 1][op.microbatch] < 0) break;
          ready = std::max(ready, backward_end[s + 1][op.microbatch]);
        }
        const double seconds = duration(s, op);
        free_at[s] = ready + seconds;
        (op.kind == PassKind::kForward ? forward_end : backward_end)[s][op.microbatch] = free_at[s];
        replay.stages[s].busy_s += seconds;
        replay.stages[s].end_s = free_at[s];
        ++next[s];
        advanced = true;
      }
    }
  }
  double busy = 0;
  for (int s = 0; s < stages; ++s) {
    PEERTRAIN_CHECK(next[s] == ops[s].size(), "the replay of stage ", s, " stalled at pass ", next[s]);
    replay.makespan_s = std::max(replay.makespan_s, replay.stages[s].end_s);
    busy += replay.stages[s].busy_s;
  }
  replay.bubble = replay.makespan_s > 0 ? 1.0 - busy / (stages * replay.makespan_s) : 0.0;
  return replay;
}

}  // namespace peertrain::parallel
