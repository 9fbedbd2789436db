// Pipeline schedules as plain data: the ordered list of passes each stage runs over the
// micro-batches of one step, and a replay of such lists on an ideal machine (one processor
// per stage, free communication).
//
// A stage may hold several chunks of the model (virtual stages), and a backward may be
// split into B, the input gradient, and W, the weight gradient, which nothing downstream
// waits for and which therefore fills bubbles (Qi et al., "Zero Bubble Pipeline
// Parallelism", ICLR 2024).
//
//   GPipe (Huang et al. 2019): every forward, then every backward.
//   1F1B, PipeDream-Flush (Narayanan et al. 2021): stage s runs min(p − s − 1, m) warm-up
//     forwards, then alternates one forward and one backward, then drains. At most p − s
//     micro-batches in flight; the bubble is GPipe's, (p − 1)/(m + p − 1).
//   Eager 1F1B (Zhuang et al., MLSys 2023, "overlap-friendly"): 1F1B with stage s running
//     min(m, 2(p − s) − 1) forwards before its first backward instead of p − s, so that a
//     forward's output is sent (and resharded) well before the next stage needs it; same
//     bubble, up to 2(p − s) − 1 micro-batches in flight.
//   Interleaved 1F1B (Narayanan et al., SC 2021): v chunks per stage, placed round robin
//     (virtual stage c·p + s on stage s); the bubble shrinks v-fold. Needs p | m.
//   ZB-H1, ZB-H2: one chunk, B and W apart. H1 keeps 1F1B's memory (p − s micro-batches
//     on stage s) and fills the drain with W: bubble (p − 1)(T_F + T_B − T_W). H2 lets stage
//     s hold 2(p − s) − 1 and reaches (p − 1)(T_F + T_B − 2T_W), zero when the three equal.
//   ZB-V (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"): two chunks per
//     stage in a V (virtual stages s and 2p − 1 − s on stage s), B and W apart, 1F1B's peak
//     memory (p micro-batches), near-zero bubble.
//   V-Half (same paper): the V with about half of 1F1B's memory.
//   PipeDream (Narayanan et al., SOSP 2019): asynchronous 1F1B. The pipeline never drains:
//     a step's list is a cut of 1F1B's endless steady state, F(i) then B(i − w) with w =
//     p − s − 1, so stage s's last w micro-batches stay in flight and their backwards run
//     first thing in the next step, "carried", on the weights their forward used (weight
//     stashing; pipeline.h). No bubble in the papers' measure; the step's barrier leaves
//     stage s idle s forwards at its start and p − 1 − s at its end.
// ZB-H1 is 1F1B's order with stage s's W's trailing its B's by s micro-batches. ZB-H2 and
// the V schedules are built by a greedy list scheduler over nominal pass times (T_F = T_B
// = T_W): an idle stage runs a ready B, else a ready F its memory limit allows (the deeper
// chunk first), else a pending W — the heuristic of the papers' own generators; ZB-V also
// tries 64 seeded runs that break the rule now and then, keeping the best. The order
// is then fixed data; replay_schedule times it with measured passes.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace peertrain::parallel {

enum class Schedule { kGpipe, kOneFOneB, kInterleaved, kZbH1, kZbH2, kZbV, kVHalf, kPipeDream, kEager1F1B };

// "gpipe" | "1f1b" | "eager-1f1b" | "interleaved" | "zb-h1" | "zb-h2" | "zb-v" | "v-half" |
// "pipedream"; anything
// else throws Error(kInvalidArgument) naming `flag` and the choices.
Schedule parse_schedule(std::string_view text, std::string_view flag = "--schedule");
std::string_view to_string(Schedule schedule);
std::vector<Schedule> all_schedules();

// kBackward is the whole backward where the schedule does not split it, else B. kOutputS
// and kOutputT are vocabulary parallelism's output layer for one micro-batch, its S and T
// passes (vocab_parallel.h), which every stage runs: S — the shard's logits and the
// statistics' barrier — after the last virtual stage's forward of the micro-batch; T — the
// weight gradient, and for vocab-2 the input gradient with its second barrier — later.
enum class PassKind { kForward, kBackward, kWeight, kOutputS, kOutputT };
inline constexpr int kPassKinds = 5;

struct PipelineOp {
  PassKind kind = PassKind::kForward;
  int microbatch = 0;
  int chunk = 0;  // which of the stage's chunks
  // PipeDream: the backward of the previous step's micro-batch, whose forward that step ran.
  bool carried = false;
  bool operator==(const PipelineOp&) const = default;
};

struct ScheduleShape {
  Schedule schedule = Schedule::kOneFOneB;
  int stages = 1;
  int microbatches = 1;
  int interleave = 2;  // interleaved's chunks per stage (--chunks)
  // Vocabulary parallelism: 0, none; 1, vocab-1 (S a barrier, T local); 2, vocab-2 (both
  // barriers). Every stage's list gains an S and a T pass per micro-batch.
  int output_barriers = 0;

  int chunks() const;  // chunks per stage
  bool split_backward() const;
  int virtual_stages() const { return stages * chunks(); }
  // Where the model's chunks sit: virtual stage k = 0..p·v−1 runs on stage_of(k) as its
  // chunk chunk_of(k); virtual_stage inverts it.
  int virtual_stage(int stage, int chunk) const;
  int stage_of(int virtual_stage) const;
  int chunk_of(int virtual_stage) const;
};

// Throws Error(kInvalidArgument) naming the flag: stages and micro-batches positive,
// interleaved needs --chunks ≥ 2 and p | m, the V schedules at least one micro-batch per
// stage pair...
void validate(const ScheduleShape& shape);

// Every stage's passes in order: each (micro-batch, chunk) once forward, once backward and,
// when split, once W after its B; with output barriers, each micro-batch's S and T passes
// once on every stage. They go into every list at fixed times of the base schedule
// replayed with nominal passes, before the passes that start then or later: S when the
// last virtual stage's forward of its micro-batch ends; T, vocab-2, when that micro-batch's
// backward starts on the head stage (it needs T's dy), vocab-1 when it ends (it needs only
// S's, so T stays off the critical path). Every pass then waits only on passes, and every
// collective only on stages, that come earlier in that time, so the lists cannot deadlock.
std::vector<std::vector<PipelineOp>> build_schedule(const ScheduleShape& shape);

// One stage's list (build_schedule(shape)[stage]).
std::vector<PipelineOp> stage_schedule(const ScheduleShape& shape, int stage);
std::vector<PipelineOp> stage_schedule(Schedule schedule, int stages, int stage, int microbatches);

// The most micro-batches held along `ops` (a chunk's activations count 1/chunks): from a
// forward until its backward, or its W when the backward is split; carried backwards are
// held from the start.
double peak_in_flight(std::span<const PipelineOp> ops, int chunks = 1, bool split_backward = false);

// The papers' bubble rate, bubble time over bubble time plus m(T_F + T_B + T_W), for the
// given pass times of one whole stage (a chunk takes 1/chunks of them):
//   gpipe, 1f1b  (p − 1)(F + B + W)           interleaved  (p − 1)(F + B + W)/v
//   zb-h1        (p − 1)(F + B − W)           zb-h2        max(0, (p − 1)(F + B − 2W))
//   zb-v         max(0, (p − 1)(F + B − 2W))/2 (H2's with half-size passes)
//   v-half       no closed form in the paper: NaN.
//   pipedream    0 (its steady state; the step barrier's (p − 1)F start offset is outside
//                the papers' measure, span_bubble below).
double theoretical_bubble(const ScheduleShape& shape, double forward = 1, double backward = 1, double weight = 1);
double theoretical_bubble(int stages, int microbatches);  // (p − 1)/(m + p − 1)
// The papers' peak activation memory of the busiest stage, in micro-batches: 1f1b, zb-h1,
// zb-v and pipedream p, zb-h2 2p − 1, gpipe m, interleaved p + (p − 1)/v, v-half NaN
// (≈ p/2). PipeDream also stashes up to 2 versions of the stage's weights.
double theoretical_peak(const ScheduleShape& shape);

// One stage's share of a replayed step.
struct ReplayedStage {
  double busy_s = 0;   // sum of its passes' durations
  double start_s = 0;  // when its first pass starts
  double end_s = 0;    // when its last pass ends
  double peak_microbatches = 0;
  std::vector<double> pass_start_s;  // of each pass of its list
};
struct Replay {
  std::vector<ReplayedStage> stages;
  double makespan_s = 0;
  // 1 − Σ busy / (p · makespan): the stages' mean idle share over the step, from the first
  // pass of stage 0 to the last pass anywhere (GPipe's count; what a synchronous step with
  // an optimizer barrier at its end pays).
  double bubble = 0;
  // 1 − Σ busy / (p · the longest stage span, first pass to last): the zero-bubble papers'
  // count, which leaves out the start-up offset of the later stages (the next step's
  // first stages fill it once the optimizer step is not a barrier). Equal to `bubble` for
  // GPipe, 1F1B and interleaved, whose stage 0 is busy first and last.
  double span_bubble = 0;
};

// Runs the lists on an ideal machine: a pass starts once its stage is free and its inputs
// are there (a forward after the forward of the virtual stage before; a backward after the
// backward of the virtual stage after, or its own forward on the last; a W after its B; a
// kOutputS after the last virtual stage's forward and, being a collective, when every
// stage has reached it; a kOutputT after its S, and under vocab-2 also when every stage
// has reached it), taking duration(stage, op) seconds.
Replay replay_schedule(const ScheduleShape& shape, const std::vector<std::vector<PipelineOp>>& ops,
                       const std::function<double(int stage, const PipelineOp& op)>& duration);
Replay replay_schedule(const ScheduleShape& shape,
                       const std::function<double(int stage, const PipelineOp& op)>& duration);
Replay replay_schedule(Schedule schedule, int stages, int microbatches,
                       const std::function<double(int stage, const PipelineOp& op)>& duration);

}  // namespace peertrain::parallel
