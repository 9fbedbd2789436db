// Pipeline schedules as plain data: the ordered list of forward and backward passes each
// stage runs over the micro-batches of one step, and a replay of such lists on an ideal
// machine (one processor per stage, free communication).
//
//   GPipe (Huang et al., NeurIPS 2019): every forward, then every backward. Each stage
//     holds the activations of all m micro-batches at the turn.
//   1F1B, PipeDream-Flush (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN
//     Training", ICML 2021): stage s runs min(p − s − 1, m) warm-up forwards, then
//     alternates one forward and one backward, then drains the remaining backwards. At most
//     p − s micro-batches are in flight, yet the bubble is GPipe's, (p − 1)/(m + p − 1),
//     and the gradients are the same synchronous ones (the flush at the end of the step).
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace peertrain::parallel {

enum class Schedule { kGpipe, kOneFOneB };

// "gpipe" | "1f1b"; anything else throws Error(kInvalidArgument) naming `flag`.
Schedule parse_schedule(std::string_view text, std::string_view flag = "--schedule");
std::string_view to_string(Schedule schedule);

enum class PassKind { kForward, kBackward };

struct PipelineOp {
  PassKind kind = PassKind::kForward;
  int microbatch = 0;
  bool operator==(const PipelineOp&) const = default;
};

// What stage `stage` of `stages` runs, in order, for `microbatches` micro-batches: every
// micro-batch's forward once and its backward once, the backward after the forward.
std::vector<PipelineOp> stage_schedule(Schedule schedule, int stages, int stage, int microbatches);

// The most micro-batches whose forward has run and backward not yet, along `ops`.
int peak_in_flight(std::span<const PipelineOp> ops);

// GPipe's bubble with uniform stages: (p − 1)/(m + p − 1).
double theoretical_bubble(int stages, int microbatches);

// One stage's share of a replayed step.
struct ReplayedStage {
  double busy_s = 0;  // sum of its passes' durations
  double end_s = 0;   // when its last pass ends
};
struct Replay {
  std::vector<ReplayedStage> stages;
  double makespan_s = 0;
  // 1 − Σ busy / (p · makespan): the stages' mean idle share, as GPipe's paper counts it.
  double bubble = 0;
};

// Runs the schedules of every stage on an ideal machine: a pass starts once its stage is
// free and its input is there (forward of micro-batch i on stage s after that forward on
// s − 1; backward after the backward on s + 1), taking duration(stage, op) seconds. Fed
// the measured duration of every pass, it gives the bubble the schedule would have with
// one processor per stage, whatever the machine it was measured on shares.
Replay replay_schedule(Schedule schedule, int stages, int microbatches,
                       const std::function<double(int stage, const PipelineOp& op)>& duration);

}  // namespace peertrain::parallel
