// The schedules of schedule.h as lists of passes, the greedy list scheduler behind the
// zero-bubble and V schedules, and the replay.
#include "peertrain/parallel/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "peertrain/core/error.h"

namespace peertrain::parallel {
namespace {

struct Named {
  Schedule schedule;
  std::string_view name;
};
constexpr Named kNames[] = {
    {Schedule::kGpipe, "gpipe"},  {Schedule::kOneFOneB, "1f1b"},       {Schedule::kInterleaved, "interleaved"},
    {Schedule::kZbH1, "zb-h1"},   {Schedule::kZbH2, "zb-h2"},          {Schedule::kZbV, "zb-v"},
    {Schedule::kVHalf, "v-half"}, {Schedule::kPipeDream, "pipedream"}, {Schedule::kEager1F1B, "eager-1f1b"}};

Error invalid(const std::string& message) { return Error(ErrorKind::kInvalidArgument, message); }

// eager: Alpa's overlap-friendly variant, 2(p − s) − 1 forwards before the first backward.
std::vector<PipelineOp> one_f_one_b(int stages, int stage, int microbatches, bool eager = false) {
  std::vector<PipelineOp> ops;
  // Warm-up fills the pipe below this stage: the last stage's first backward can start
  // once stage s has sent p − s forwards, the p − s − 1 of the warm-up and the first of
  // the steady phase.
  const int warmup = std::min(eager ? 2 * (stages - stage) - 2 : stages - stage - 1, microbatches);
  for (int i = 0; i < warmup; ++i) ops.push_back({PassKind::kForward, i});
  for (int i = warmup; i < microbatches; ++i) {
    ops.push_back({PassKind::kForward, i});
    ops.push_back({PassKind::kBackward, i - warmup});
  }
  for (int i = microbatches - warmup; i < microbatches; ++i) ops.push_back({PassKind::kBackward, i});
  return ops;
}

// PipeDream's asynchronous 1F1B, one step of it: F(i) then the backward of the micro-batch
// w = p − s − 1 earlier in the endless stream, which for i < w is the previous step's
// micro-batch M − w + i (carried). Needs M ≥ w.
std::vector<PipelineOp> pipedream(int stages, int stage, int microbatches) {
  const int w = stages - stage - 1;
  std::vector<PipelineOp> ops;
  for (int i = 0; i < microbatches; ++i) {
    ops.push_back({PassKind::kForward, i});
    if (i < w)
      ops.push_back({PassKind::kBackward, microbatches - w + i, 0, /*carried=*/true});
    else
      ops.push_back({PassKind::kBackward, i - w});
  }
  return ops;
}

// ZB-H1 (Qi et al. 2024): 1F1B's order of forwards and B's, and each W as late as the
// memory budget allows: stage s, which 1F1B leaves p − s micro-batches, may hold p, so its
// W's trail its B's by s micro-batches and the last s come at the end, where they fill the
// drain. Replayed with F = B = W this gives the paper's (p − 1)(F + B − W) exactly.
std::vector<PipelineOp> zero_bubble_h1(int stages, int stage, int microbatches) {
  std::vector<PipelineOp> ops;
  int backwards = 0, weights = 0;
  for (const PipelineOp& op : one_f_one_b(stages, stage, microbatches)) {
    ops.push_back(op);
    if (op.kind != PassKind::kBackward) continue;
    if (++backwards > stage) ops.push_back({PassKind::kWeight, weights++});
  }
  while (weights < microbatches) ops.push_back({PassKind::kWeight, weights++});
  return ops;
}

// Megatron-LM's interleaved 1F1B: the k-th forward of stage s is micro-batch
// (k / (p·v))·p + k mod p of chunk (k / p) mod v; backwards walk the chunks in reverse.
std::vector<PipelineOp> interleaved(int stages, int stage, int microbatches, int v) {
  const int total = microbatches * v;
  auto pass = [&](PassKind kind, int k) {
    const int group = k / stages;
    int chunk = group % v;
    if (kind == PassKind::kBackward) chunk = v - 1 - chunk;
    return PipelineOp{kind, (k / (stages * v)) * stages + k % stages, chunk};
  };
  const int warmup = std::min(total, (stages - stage - 1) * 2 + (v - 1) * stages);
  std::vector<PipelineOp> ops;
  for (int k = 0; k < warmup; ++k) ops.push_back(pass(PassKind::kForward, k));
  for (int k = 0; k + warmup < total; ++k) {
    ops.push_back(pass(PassKind::kForward, k + warmup));
    ops.push_back(pass(PassKind::kBackward, k));
  }
  for (int k = std::max(0, total - warmup); k < total; ++k) ops.push_back(pass(PassKind::kBackward, k));
  return ops;
}

// The memory limit of a stage in chunk activations (a whole micro-batch is `chunks` of
// them) for the greedy schedules.
int memory_limit(const ScheduleShape& s) {
  const int p = s.stages;
  switch (s.schedule) {
    case Schedule::kZbH1:
      return p;
    case Schedule::kZbH2:
      return 2 * p - 1;
    case Schedule::kZbV:
      return 2 * p;
    case Schedule::kVHalf:
      return p + 1;  // (p + 1)/2 micro-batches: about half of 1F1B's p
    default:
      break;
  }
  PEERTRAIN_CHECK(false, "no memory limit for ", to_string(s.schedule));
  return 0;
}

// The greedy list scheduler: time in steps of one chunk's pass (F = B = W), every stage
// idle at time t takes, among the passes whose inputs are there, a B (lowest micro-batch
// first: it is on the critical path), else an F its memory allows (the later chunk
// first, so that micro-batches already inside the stage finish), else the oldest pending
// W. A micro-batch enters a stage (its chunk-0 forward) only with room for all its chunks
// there, so that the V cannot fill up with half-done micro-batches and stall.
struct GreedyKnobs {
  bool weight_before_forward = false;  // with no B ready: a pending W before a new F
  bool cap_warmup = false;             // before its first B, a stage runs only the F's that fit before the B arrives
  // Memory kept for the micro-batches already inside a stage: kAll, one entering reserves
  // room for all its chunks there; kOne, an entering micro-batch leaves room for one more
  // chunk (the V's first micro-batch can always go on); kNone, only the budget.
  enum class Reserve { kAll, kOne, kNone } reserve = Reserve::kAll;
  // Non-zero: break the rule now and then, at random (seeded, so reproducible) — a W or an
  // F before a ready B, the other chunk's F first — as a search around the rule.
  std::uint64_t seed = 0;
};

std::vector<std::vector<PipelineOp>> greedy(const ScheduleShape& s, GreedyKnobs knobs) {
  const int p = s.stages, m = s.microbatches, v = s.chunks(), V = s.virtual_stages();
  constexpr long kNotYet = std::numeric_limits<long>::max();
  // end[kind][virtual stage][micro-batch]: the step at which the pass ends.
  std::vector<std::vector<std::vector<long>>> end(3, std::vector<std::vector<long>>(V, std::vector<long>(m, kNotYet)));
  std::vector<std::vector<PipelineOp>> ops(p);
  std::vector<long> free_at(p, 0);
  // Chunk activations reserved on each stage: a micro-batch entering (its chunk-0
  // forward) reserves all its chunks there; each W gives one back.
  std::vector<int> reserved(p, 0), held(p, 0);
  const std::size_t per_stage = static_cast<std::size_t>(3 * m * v);
  auto ended = [&](PassKind kind, int vs, int i, long t) { return end[static_cast<int>(kind)][vs][i] <= t; };
  // open[kind][vs]: the lowest micro-batch whose pass is not yet placed. Passes are only
  // ever placed, so the scans below start there and skip a prefix they would pass over
  // anyway: the same picks, without rescanning every finished micro-batch at every step
  // (the ZB-V search runs this 780 times a shape).
  std::vector<std::vector<int>> open(3, std::vector<int>(V, 0));
  auto lowest_open = [&](int kind, int st) {
    int lo = m;
    for (int c = 0; c < v; ++c) lo = std::min(lo, open[kind][s.virtual_stage(st, c)]);
    return lo;
  };
  // Each virtual stage places its F's in micro-batch order (the lowest ready one first,
  // and the one before's F ended earlier), so its B's and then its W's too: a B or a W
  // past the highest placed pass it waits on cannot be ready, and the scan stops there.
  auto highest_placed = [&](int kind, int st) {
    int hi = 0;
    for (int c = 0; c < v; ++c) hi = std::max(hi, open[kind][s.virtual_stage(st, c)]);
    return hi;
  };
  std::vector<char> has_backward(p, 0);
  std::uint64_t state = knobs.seed;
  auto coin = [&](int sides) {  // xorshift64
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return static_cast<int>(state % static_cast<std::uint64_t>(sides));
  };
  for (long t = 0;; ++t) {
    bool done = true;
    for (int st = 0; st < p; ++st) done = done && ops[st].size() == per_stage;
    if (done) break;
    if (t > 4L * (m + p) * v * 3) return {};  // stalled: memory full of half-done micro-batches
    bool placed = false;
    for (int st = 0; st < p; ++st) {
      if (free_at[st] > t || ops[st].size() == per_stage) continue;
      std::optional<PipelineOp> pick;
      const int deviation = knobs.seed != 0 ? coin(8) : -1;  // 0: W first, 1: F first, 2: the other chunk's F first
      auto backward = [&] {
        // B: a micro-batch's backward of chunk c once the virtual stage after has sent it.
        for (int i = lowest_open(1, st), hi = highest_placed(0, st); i < hi && !pick; ++i)
          for (int c = v; c-- > 0 && !pick;) {
            const int vs = s.virtual_stage(st, c);
            if (end[1][vs][i] != kNotYet || !ended(PassKind::kForward, vs, i, t)) continue;
            if (vs + 1 < V ? ended(PassKind::kBackward, vs + 1, i, t) : true)
              pick = PipelineOp{PassKind::kBackward, i, c};
          }
      };
      const int limit = memory_limit(s);
      // The first B reaches stage j after the first micro-batch's forward went down to the
      // last virtual stage and its backward came back: 2(V − k) − 1 chunk passes after
      // the stage started, k its first virtual stage; F's beyond that only add memory.
      const bool before_first_b = !has_backward[st];
      const int warmup_cap = 2 * (V - s.virtual_stage(st, 0)) - 1;
      auto weight = [&] {
        for (int i = lowest_open(2, st), hi = highest_placed(1, st); i < hi && !pick; ++i)
          for (int c = v; c-- > 0 && !pick;) {
            const int vs = s.virtual_stage(st, c);
            if (end[2][vs][i] == kNotYet && ended(PassKind::kBackward, vs, i, t))
              pick = PipelineOp{PassKind::kWeight, i, c};
          }
      };
      const bool capped = knobs.cap_warmup && before_first_b && static_cast<int>(ops[st].size()) >= warmup_cap;
      auto forward = [&] {
        // F's go in micro-batch order, so each chunk's one candidate is its lowest open F.
        for (int n = 0; n < v && !pick && !capped; ++n) {
          const int c = deviation == 2 ? n : v - 1 - n;
          const int vs = s.virtual_stage(st, c), i = open[0][vs];
          if (i == m || (vs > 0 && !ended(PassKind::kForward, vs - 1, i, t))) continue;
          const bool full = knobs.reserve == GreedyKnobs::Reserve::kAll   ? c == 0 && reserved[st] + v > limit
                            : knobs.reserve == GreedyKnobs::Reserve::kOne ? held[st] + (c == 0 ? v : 1) > limit
                                                                          : held[st] + 1 > limit;
          if (!full) pick = PipelineOp{PassKind::kForward, i, c};
        }
      };
      if (deviation == 0) weight();
      if (deviation == 1) forward();
      backward();
      if (knobs.weight_before_forward) weight();
      forward();
      weight();
      if (!pick) continue;
      const int vs = s.virtual_stage(st, pick->chunk);
      const int kind = static_cast<int>(pick->kind);
      end[kind][vs][pick->microbatch] = t + 1;
      while (open[kind][vs] < m && end[kind][vs][open[kind][vs]] != kNotYet) ++open[kind][vs];
      if (pick->kind == PassKind::kBackward) has_backward[st] = 1;
      if (pick->kind == PassKind::kForward && pick->chunk == 0) reserved[st] += v;
      if (pick->kind == PassKind::kWeight) --reserved[st];
      held[st] += pick->kind == PassKind::kForward ? 1 : pick->kind == PassKind::kWeight ? -1 : 0;
      free_at[st] = t + 1;
      ops[st].push_back(*pick);
      placed = true;
    }
    // Every pass takes one step, so a step that placed nothing leaves the next one the same
    // state: stalled for good (the coin only reorders the same three scans).
    if (!placed) return {};
  }
  return ops;
}

}  // namespace

Schedule parse_schedule(std::string_view text, std::string_view flag) {
  for (const Named& n : kNames)
    if (n.name == text) return n.schedule;
  std::string names;
  for (std::size_t i = 0; i < std::size(kNames); ++i)
    names += str(i == 0 ? "" : i + 1 == std::size(kNames) ? " or " : ", ", kNames[i].name);
  throw invalid(str(flag, " '", text, "': expected ", names));
}

std::string_view to_string(Schedule schedule) {
  for (const Named& n : kNames)
    if (n.schedule == schedule) return n.name;
  return "?";
}

std::vector<Schedule> all_schedules() {
  std::vector<Schedule> all;
  for (const Named& n : kNames) all.push_back(n.schedule);
  return all;
}

int ScheduleShape::chunks() const {
  switch (schedule) {
    case Schedule::kInterleaved:
      return interleave;
    case Schedule::kZbV:
    case Schedule::kVHalf:
      return 2;
    default:
      return 1;
  }
}

bool ScheduleShape::split_backward() const {
  return schedule == Schedule::kZbH1 || schedule == Schedule::kZbH2 || schedule == Schedule::kZbV ||
         schedule == Schedule::kVHalf;
}

int ScheduleShape::virtual_stage(int stage, int chunk) const {
  if (schedule == Schedule::kZbV || schedule == Schedule::kVHalf) return chunk == 0 ? stage : 2 * stages - 1 - stage;
  return chunk * stages + stage;
}

int ScheduleShape::stage_of(int k) const {
  if (schedule == Schedule::kZbV || schedule == Schedule::kVHalf) return k < stages ? k : 2 * stages - 1 - k;
  return k % stages;
}

int ScheduleShape::chunk_of(int k) const { return k / stages; }

void validate(const ScheduleShape& s) {
  if (s.stages < 1) throw invalid(str("--pp ", s.stages, ": expected at least 1 stage"));
  if (s.microbatches < 1) throw invalid(str("--microbatches ", s.microbatches, ": expected at least 1"));
  if (s.schedule == Schedule::kInterleaved) {
    if (s.interleave < 2)
      throw invalid(str("--schedule interleaved --chunks ", s.interleave, ": expected at least 2 chunks per stage"));
    if (s.microbatches % s.stages != 0)
      throw invalid(str("--schedule interleaved: --microbatches ", s.microbatches, " must be a multiple of --pp ",
                        s.stages, " (micro-batches go round the stages in groups of p)"));
  } else if (s.schedule == Schedule::kPipeDream && s.output_barriers > 0) {
    throw invalid(
        "--schedule pipedream with --vocab-parallel: the vocabulary's collectives need every stage's passes of a "
        "micro-batch in one step, and PipeDream carries backwards into the next; use --vocab-parallel none");
  } else if (s.schedule == Schedule::kPipeDream && s.microbatches < s.stages - 1) {
    throw invalid(str("--schedule pipedream: --microbatches ", s.microbatches, " is too few for --pp ", s.stages,
                      ": stage 0 carries p − 1 = ", s.stages - 1, " micro-batches into the next step"));
  } else if (s.interleave != 2 && s.schedule != Schedule::kInterleaved) {
    // --chunks belongs to interleaved; the V schedules have exactly 2 per stage.
    if (s.schedule == Schedule::kZbV || s.schedule == Schedule::kVHalf)
      throw invalid(str("--schedule ", to_string(s.schedule), " --chunks ", s.interleave,
                        ": a V schedule has exactly 2 chunks per stage"));
  }
}

namespace {

// The nominal pass times that the greedy generator assumes and the output passes are
// placed by: one unit per chunk pass, a fused backward two.
double nominal_seconds(const ScheduleShape& s, const PipelineOp& op) {
  return op.kind == PassKind::kBackward && !s.split_backward() ? 2.0 : 1.0;
}

std::vector<std::vector<PipelineOp>> base_schedule(const ScheduleShape& s);

std::vector<std::vector<PipelineOp>> with_output_passes(const ScheduleShape& s,
                                                        std::vector<std::vector<PipelineOp>> base) {
  const int p = s.stages, last = s.virtual_stages() - 1;
  ScheduleShape plain = s;
  plain.output_barriers = 0;
  const Replay nominal =
      replay_schedule(plain, base, [&](int, const PipelineOp& op) { return nominal_seconds(s, op); });
  // When each micro-batch's S and T run, from the head stage's passes of it.
  struct Event {
    double time;
    PassKind kind;
    int microbatch;
    bool operator<(const Event& o) const {
      return std::tie(time, kind, microbatch) < std::tie(o.time, o.kind, o.microbatch);
    }
  };
  std::vector<Event> events;
  const int head = s.stage_of(last);
  for (std::size_t k = 0; k < base[head].size(); ++k) {
    const PipelineOp& op = base[head][k];
    if (s.virtual_stage(head, op.chunk) != last) continue;
    const double start = nominal.stages[head].pass_start_s[k], end = start + nominal_seconds(s, op);
    if (op.kind == PassKind::kForward) events.push_back({end, PassKind::kOutputS, op.microbatch});
    if (op.kind == PassKind::kBackward)
      events.push_back({s.output_barriers == 2 ? start : end, PassKind::kOutputT, op.microbatch});
  }
  std::sort(events.begin(), events.end());
  std::vector<std::vector<PipelineOp>> ops(p);
  for (int st = 0; st < p; ++st) {
    std::size_t next = 0;
    for (std::size_t k = 0; k < base[st].size(); ++k) {
      for (; next < events.size() && events[next].time <= nominal.stages[st].pass_start_s[k] + 1e-9; ++next)
        ops[st].push_back({events[next].kind, events[next].microbatch, 0});
      ops[st].push_back(base[st][k]);
    }
    for (; next < events.size(); ++next) ops[st].push_back({events[next].kind, events[next].microbatch, 0});
  }
  return ops;
}

}  // namespace

std::vector<std::vector<PipelineOp>> build_schedule(const ScheduleShape& s) {
  validate(s);
  auto base = base_schedule(s);
  PEERTRAIN_CHECK(s.output_barriers >= 0 && s.output_barriers <= 2, "output barriers ", s.output_barriers);
  return s.output_barriers > 0 ? with_output_passes(s, std::move(base)) : base;
}

namespace {

std::vector<std::vector<PipelineOp>> base_schedule(const ScheduleShape& s) {
  const int p = s.stages, m = s.microbatches;
  std::vector<std::vector<PipelineOp>> ops(p);
  switch (s.schedule) {
    case Schedule::kGpipe:
      for (auto& stage : ops) {
        for (int i = 0; i < m; ++i) stage.push_back({PassKind::kForward, i});
        for (int i = 0; i < m; ++i) stage.push_back({PassKind::kBackward, i});
      }
      return ops;
    case Schedule::kOneFOneB:
    case Schedule::kEager1F1B:
      for (int st = 0; st < p; ++st) ops[st] = one_f_one_b(p, st, m, s.schedule == Schedule::kEager1F1B);
      return ops;
    case Schedule::kInterleaved:
      for (int st = 0; st < p; ++st) ops[st] = interleaved(p, st, m, s.interleave);
      return ops;
    case Schedule::kZbH1:
      for (int st = 0; st < p; ++st) ops[st] = zero_bubble_h1(p, st, m);
      return ops;
    case Schedule::kPipeDream:
      for (int st = 0; st < p; ++st) ops[st] = pipedream(p, st, m);
      return ops;
    default:
      break;
  }
  // The papers' generators try a few orderings and keep the shortest; so does this, timing
  // each with nominal passes (F = B = W) and the papers' measure, the longest stage's span.
  std::vector<std::vector<PipelineOp>> best;
  double best_bubble = 0;
  for (bool weight_first : {false, true})
    for (bool cap : {false, true})
      for (auto reserve : {GreedyKnobs::Reserve::kAll, GreedyKnobs::Reserve::kOne, GreedyKnobs::Reserve::kNone})
        for (std::uint64_t seed = 0; seed <= (s.schedule == Schedule::kZbV ? 64u : 0u); ++seed) {
          auto candidate = greedy(s, {weight_first, cap, reserve, seed * 0x9E3779B97F4A7C15ull});
          if (candidate.empty()) continue;
          const double bubble = replay_schedule(s, candidate, [&](int, const PipelineOp&) { return 1.0; }).span_bubble;
          if (best.empty() || bubble < best_bubble - 1e-9) {
            best = std::move(candidate);
            best_bubble = bubble;
          }
        }
  PEERTRAIN_CHECK(!best.empty(), "no greedy ", to_string(s.schedule), " schedule fits its memory");
  return best;
}

}  // namespace

std::vector<PipelineOp> stage_schedule(const ScheduleShape& shape, int stage) {
  PEERTRAIN_CHECK(stage >= 0 && stage < shape.stages, "stage ", stage, " of ", shape.stages);
  return build_schedule(shape)[static_cast<std::size_t>(stage)];
}

std::vector<PipelineOp> stage_schedule(Schedule schedule, int stages, int stage, int microbatches) {
  return stage_schedule(ScheduleShape{.schedule = schedule, .stages = stages, .microbatches = microbatches}, stage);
}

double peak_in_flight(std::span<const PipelineOp> ops, int chunks, bool split_backward) {
  const PassKind release = split_backward ? PassKind::kWeight : PassKind::kBackward;
  int now = static_cast<int>(
      std::count_if(ops.begin(), ops.end(), [&](const PipelineOp& op) { return op.carried && op.kind == release; }));
  int peak = now;
  for (const auto& op : ops) {
    if (op.kind == PassKind::kForward) ++now;
    if (op.kind == release) --now;
    peak = std::max(peak, now);
  }
  return static_cast<double>(peak) / chunks;
}

double theoretical_bubble(int stages, int microbatches) {
  return static_cast<double>(stages - 1) / (microbatches + stages - 1);
}

double theoretical_bubble(const ScheduleShape& s, double f, double b, double w) {
  const double p1 = s.stages - 1, work = s.microbatches * (f + b + w);
  double bubble = 0;
  switch (s.schedule) {
    case Schedule::kGpipe:
    case Schedule::kOneFOneB:
    case Schedule::kEager1F1B:
      bubble = p1 * (f + b + w);
      break;
    case Schedule::kInterleaved:
      bubble = p1 * (f + b + w) / s.interleave;
      break;
    case Schedule::kZbH1:
      bubble = p1 * (f + b - w);
      break;
    case Schedule::kZbH2:
      bubble = std::max(0.0, p1 * (f + b - 2 * w));
      break;
    case Schedule::kZbV:
      bubble = std::max(0.0, p1 * (f + b - 2 * w)) / 2;
      break;
    case Schedule::kVHalf:
      return std::nan("");
    case Schedule::kPipeDream:
      return 0;
  }
  return bubble / (bubble + work);
}

double theoretical_peak(const ScheduleShape& s) {
  const double p = s.stages;
  switch (s.schedule) {
    case Schedule::kGpipe:
      return s.microbatches;
    case Schedule::kOneFOneB:
    case Schedule::kZbH1:
    case Schedule::kZbV:
    case Schedule::kPipeDream:
      return std::min<double>(p, s.microbatches);
    case Schedule::kZbH2:
    case Schedule::kEager1F1B:
      return std::min<double>(2 * p - 1, s.microbatches);
    case Schedule::kInterleaved:
      return std::min<double>(p + (p - 1) / s.interleave, s.microbatches);
    case Schedule::kVHalf:
      break;
  }
  return std::nan("");
}

Replay replay_schedule(const ScheduleShape& shape, const std::vector<std::vector<PipelineOp>>& ops,
                       const std::function<double(int stage, const PipelineOp& op)>& duration) {
  const int p = shape.stages, m = shape.microbatches, V = shape.virtual_stages(), v = shape.chunks();
  PEERTRAIN_CHECK(static_cast<int>(ops.size()) == p, ops.size(), " stage lists for ", p, " stages");
  // end[kind][virtual stage][micro-batch]; negative: not run yet.
  std::vector<std::vector<std::vector<double>>> end(kPassKinds,
                                                    std::vector<std::vector<double>>(V, std::vector<double>(m, -1)));
  std::vector<std::size_t> next(p, 0);
  std::vector<double> free_at(p, 0);
  std::vector<int> held(p, 0), peak(p, 0);
  // A collective output pass's arrivals, [S or T][micro-batch][stage]: when each stage could
  // start it (negative: not there yet).
  std::vector<std::vector<std::vector<double>>> arrived(
      2, std::vector<std::vector<double>>(m, std::vector<double>(p, -1)));
  // Carried backwards (PipeDream): which virtual stages run one this step, and when it ends.
  std::vector<std::vector<double>> carried_end(V, std::vector<double>(m, 0));
  for (int st = 0; st < p; ++st)
    for (const PipelineOp& op : ops[st])
      if (op.carried) {
        carried_end[shape.virtual_stage(st, op.chunk)][op.microbatch] = -1;
        peak[st] = ++held[st];  // held since the last step
      }
  const PassKind release = shape.split_backward() ? PassKind::kWeight : PassKind::kBackward;
  Replay replay;
  replay.stages.resize(p);
  auto run = [&](int st, double ready) {
    const PipelineOp& op = ops[st][next[st]];
    const double seconds = duration(st, op);
    if (next[st] == 0) replay.stages[st].start_s = ready;
    replay.stages[st].pass_start_s.push_back(ready);
    free_at[st] = ready + seconds;
    const int vs = shape.virtual_stage(st, op.chunk);
    (op.carried ? carried_end[vs][op.microbatch] : end[static_cast<int>(op.kind)][vs][op.microbatch]) = free_at[st];
    if (op.kind == PassKind::kForward) peak[st] = std::max(peak[st], ++held[st]);
    if (op.kind == release) --held[st];
    replay.stages[st].busy_s += seconds;
    replay.stages[st].end_s = free_at[st];
    ++next[st];
  };
  // Sweep the stages until none can advance: a pass waits only on passes that some stage's
  // list runs earlier, so for a valid schedule this ends with every pass run.
  for (bool advanced = true; advanced;) {
    advanced = false;
    for (int st = 0; st < p; ++st) {
      while (next[st] < ops[st].size()) {
        const PipelineOp& op = ops[st][next[st]];
        const int vs = shape.virtual_stage(st, op.chunk);
        double ready = free_at[st];
        auto after = [&](PassKind kind, int k) {
          const double e = end[static_cast<int>(kind)][k][op.microbatch];
          if (e < 0) return false;
          ready = std::max(ready, e);
          return true;
        };
        bool can = true;
        if (op.carried) {  // its forward ran last step; the gradient from the stage after maybe too
          const double e = vs + 1 < V ? carried_end[vs + 1][op.microbatch] : 0;
          if (e < 0) break;
          run(st, std::max(ready, e));
          advanced = true;
          continue;
        }
        if (op.kind == PassKind::kForward && vs > 0) can = after(PassKind::kForward, vs - 1);
        if (op.kind == PassKind::kBackward)
          can = vs + 1 < V ? after(PassKind::kBackward, vs + 1) : after(PassKind::kForward, vs);
        if (op.kind == PassKind::kWeight) can = after(PassKind::kBackward, vs);
        if (op.kind == PassKind::kOutputS && !after(PassKind::kForward, V - 1)) break;
        if (op.kind == PassKind::kOutputS || (op.kind == PassKind::kOutputT && shape.output_barriers == 2)) {
          auto& at = arrived[op.kind == PassKind::kOutputT][static_cast<std::size_t>(op.microbatch)];
          at[st] = ready;
          if (std::any_of(at.begin(), at.end(), [](double t) { return t < 0; })) break;  // the others come later
          const double start = *std::max_element(at.begin(), at.end());
          for (int other = 0; other < p; ++other) run(other, start);
          advanced = true;
          continue;
        }
        if (!can) break;
        run(st, ready);
        advanced = true;
      }
    }
  }
  double busy = 0, span = 0;
  for (int st = 0; st < p; ++st) {
    PEERTRAIN_CHECK(next[st] == ops[st].size(), "the replay of stage ", st, " stalled at pass ", next[st]);
    replay.makespan_s = std::max(replay.makespan_s, replay.stages[st].end_s);
    span = std::max(span, replay.stages[st].end_s - replay.stages[st].start_s);
    replay.stages[st].peak_microbatches = static_cast<double>(peak[st]) / v;
    busy += replay.stages[st].busy_s;
  }
  replay.bubble = replay.makespan_s > 0 ? 1.0 - busy / (p * replay.makespan_s) : 0.0;
  replay.span_bubble = span > 0 ? 1.0 - busy / (p * span) : 0.0;
  return replay;
}

Replay replay_schedule(const ScheduleShape& shape,
                       const std::function<double(int stage, const PipelineOp& op)>& duration) {
  return replay_schedule(shape, build_schedule(shape), duration);
}

Replay replay_schedule(Schedule schedule, int stages, int microbatches,
                       const std::function<double(int stage, const PipelineOp& op)>& duration) {
  return replay_schedule(ScheduleShape{.schedule = schedule, .stages = stages, .microbatches = microbatches}, duration);
}

}  // namespace peertrain::parallel
