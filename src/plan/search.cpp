// The exhaustive strategy search; see search.h.
#include "peertrain/plan/search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "peertrain/core/error.h"
#include "peertrain/parallel/reshard.h"
#include "peertrain/parallel/schedule.h"

namespace peertrain::plan {
namespace {

constexpr long long kMaxMeshCombinations = 64;  // per pp: beyond it the mixed meshes are left out

std::string ms(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f ms", seconds * 1e3);
  return text;
}
std::string fixed(double x, int digits) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", digits, x);
  return text;
}

// Where candidate c loses most time against the winner w, in words.
std::string why_slower(const Prediction& c, const Prediction& w) {
  struct Part {
    double delta;
    std::string text;
  };
  const double idle_c = c.passes_s - c.compute_s, idle_w = w.passes_s - w.compute_s;
  std::vector<Part> parts{
      {c.compute_s - w.compute_s, str("its busiest stage computes ", ms(c.compute_s), " against ", ms(w.compute_s))},
      {idle_c - idle_w, str("idle and shared cores ", ms(idle_c), " against ", ms(idle_w), " (bubble ",
                            fixed(c.bubble, 3), " against ", fixed(w.bubble, 3), ")")},
      {c.reduce_s - w.reduce_s, str("gradient all-reduce ", ms(c.reduce_s), " against ", ms(w.reduce_s))},
      {c.overhead_s - w.overhead_s,
       str("step overhead (threads, groups) ", ms(c.overhead_s), " against ", ms(w.overhead_s))}};
  const auto worst =
      std::max_element(parts.begin(), parts.end(), [](const Part& a, const Part& b) { return a.delta < b.delta; });
  return str("+", fixed((c.step_s / w.step_s - 1) * 100, 1), "%: ", worst->text);
}

// The output layer's weights (V × d, the matrix vocabulary parallelism splits) against a
// block's (attention 4d², MLP 2·ratio·d²): the work of both is in their matrix products.
bool output_outweighs_a_block(const model::TransformerConfig& c) {
  const double d = c.d_model;
  return static_cast<double>(c.vocab) * d > (4.0 + 2.0 * c.mlp_ratio) * d * d;
}

}  // namespace

std::vector<Candidate> search(const model::TransformerConfig& config, const SearchSpace& space, Profiler& profiler,
                              const SimulationOptions& options) {
  if (space.workers < 1 || space.batch < 1)
    throw Error(ErrorKind::kInvalidArgument, "plan: --workers and --batch must be at least 1");
  std::vector<parallel::Schedule> schedules = space.schedules;
  if (schedules.empty())
    for (auto s : parallel::all_schedules())
      if (s != parallel::Schedule::kPipeDream) schedules.push_back(s);
  std::vector<Candidate> all;
  const int W = space.workers;
  // A strategy the schedule can be built for (e.g. not interleaved with p ∤ m), simulated.
  auto consider = [&](parallel::EngineConfig e) {
    e.split = space.split;
    try {
      parallel::validate(parallel::ScheduleShape{.schedule = e.schedule,
                                                 .stages = e.pp,
                                                 .microbatches = e.microbatches,
                                                 .output_barriers = parallel::output_barriers(e.vocab_parallel)});
    } catch (const Error&) {
      return;  // not a schedule for this shape: not a strategy
    }
    Candidate cand;
    cand.strategy.engine = std::move(e);
    cand.strategy.batch = space.batch;
    cand.prediction = simulate(config, cand.strategy, profiler, options);
    all.push_back(std::move(cand));
  };
  auto microbatch_counts = [&](int pp) {  // given, or every divisor of the batch up to 4·pp
    std::vector<int> ms = space.microbatches;
    if (ms.empty())
      for (int m = 1; m <= std::min(space.batch, 4 * pp); ++m)
        if (space.batch % m == 0) ms.push_back(m);
    return ms;
  };
  for (int pp = 1; pp <= W; ++pp) {
    if (W % pp) continue;
    for (int sp = 1; sp <= W / pp; ++sp) {
      if ((W / pp) % sp) continue;
      const int tp = W / pp / sp;
      // Vocabulary parallelism where the engine has it (a GPT's pipeline of tensor rank 1, its
      // vocabulary split evenly over the stages) and where it has something to balance: an
      // output layer that outweighs a block (Yeung et al.'s case; with a small vocabulary its
      // barriers cost more than the split saves, and near-ties only give the search more
      // ways to pick a mispredicted strategy).
      std::vector<parallel::VocabParallel> vocab{parallel::VocabParallel::kNone};
      if (space.vocab_parallel && pp > 1 && tp == 1 && config.kind == model::TransformerKind::kGpt &&
          config.vocab % pp == 0 && output_outweighs_a_block(config))
        vocab.insert(vocab.end(), {parallel::VocabParallel::kVocab1, parallel::VocabParallel::kVocab2});
      for (int m : microbatch_counts(pp))
        for (auto schedule : pp == 1 ? std::vector<parallel::Schedule>{parallel::Schedule::kOneFOneB} : schedules)
          for (auto vp : vocab)
            consider({.sp = sp, .tp = tp, .pp = pp, .microbatches = m, .schedule = schedule, .vocab_parallel = vp});
    }
  }
  // Heterogeneous stage meshes (Alpa's per-stage meshes, with cross-mesh resharding): pp ≥ 2
  // stages of W/pp workers each, every assignment of an (sp, tp) factorization to each stage
  // that is not uniform (the loop above has those), with each resharding strategy; 1F1B
  // and ZB-H1, as the schedules a mixed pipeline is worth trying with (those of them the
  // space allows).
  for (int pp = 2; space.stage_meshes && pp <= W; ++pp) {
    if (W % pp) continue;
    std::vector<parallel::StageMesh> shapes;
    for (int sp = 1; sp <= W / pp; ++sp)
      if ((W / pp) % sp == 0) shapes.push_back({sp, W / pp / sp});
    const auto k = static_cast<long long>(shapes.size());
    long long combos = 1;
    for (int p = 0; p < pp && combos <= kMaxMeshCombinations; ++p) combos *= k;
    if (k < 2 || combos > kMaxMeshCombinations) continue;
    for (long long code = 0; code < combos; ++code) {
      std::vector<parallel::StageMesh> meshes;
      for (long long c = code, p = 0; p < pp; ++p, c /= k) meshes.push_back(shapes[static_cast<std::size_t>(c % k)]);
      if (std::all_of(meshes.begin(), meshes.end(), [&](const auto& m) { return m == meshes[0]; })) continue;
      for (int m : microbatch_counts(pp))
        for (auto schedule : {parallel::Schedule::kOneFOneB, parallel::Schedule::kZbH1})
          if (std::find(schedules.begin(), schedules.end(), schedule) != schedules.end())
            for (auto reshard : {parallel::ReshardStrategy::kSendRecv, parallel::ReshardStrategy::kBroadcast,
                                 parallel::ReshardStrategy::kLocalAllGather})
              consider({.pp = pp, .stage_meshes = meshes, .reshard = reshard, .microbatches = m, .schedule = schedule});
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    if (a.prediction.feasible != b.prediction.feasible) return a.prediction.feasible;
    return a.prediction.feasible && a.prediction.step_s < b.prediction.step_s;
  });
  if (!all.empty() && all.front().prediction.feasible)
    for (std::size_t i = 1; i < all.size() && all[i].prediction.feasible; ++i)
      all[i].loses_because = why_slower(all[i].prediction, all.front().prediction);
  return all;
}

std::string why_measured_slower(const Candidate& c, const Candidate& winner) {
  // Paired by round: the rounds measure every candidate within seconds of each other, so a
  // slow spell of the machine moves both figures of a round. How often the loser was the
  // faster of a pair says whether the medians' gap is a ranking or a near-tie.
  const std::size_t rounds = std::min(c.measured_rounds_s.size(), winner.measured_rounds_s.size());
  int faster = 0;
  for (std::size_t r = 0; r < rounds; ++r) faster += c.measured_rounds_s[r] < winner.measured_rounds_s[r];
  const std::string tally = rounds == 0 ? std::string()
                            : faster == 0
                                ? str("; slower in all ", rounds, " rounds")
                                : str("; faster in ", faster, " of ", rounds, " rounds: a near-tie on this machine");
  return str("+", fixed((c.measured_s / winner.measured_s - 1) * 100, 1), "% measured (", ms(c.measured_s), " against ",
             ms(winner.measured_s), tally, ")");
}

void measure_best(const model::TransformerConfig& config, std::vector<Candidate>& candidates,
                  const MeasureOptions& options, const MeasureProgress& progress) {
  if (options.best < 1 || options.rounds < 1 || options.steps < 1)
    throw Error(ErrorKind::kInvalidArgument, "plan --measure: the candidates, rounds and steps must be at least 1");
  // Which to run. The simulator's error is shared within a family of strategies (the same
  // degrees, stage meshes and vocabulary split: the same kinds of unit and collective), and
  // differs between families. So the best of each family comes first, and only then the
  // best of each further layout (a family's other micro-batch counts). One run: the best
  // three predicted were three 2-stage pipelines while `--tp 2`, predicted 15 % slow,
  // measured fastest. Of strategies that differ only in their schedule no second is run:
  // they are built of the same unit profiles and share their error (one run: the three
  // best predicted were 4-stage schedules of 4 micro-batches, all predicted 14 % fast).
  auto family = [](const Candidate& c) {
    const auto& e = c.strategy.engine;
    return str(e.sp, " ", e.tp, " ", e.pp, " ", parallel::to_string(e.stage_meshes), " ",
               parallel::to_string(e.reshard), " ", parallel::to_string(e.vocab_parallel));
  };
  auto layout = [&](const Candidate& c) { return str(family(c), " ", c.strategy.engine.microbatches); };
  std::vector<std::size_t> chosen;
  std::vector<std::string> taken;  // the families, then the layouts, chosen so far
  auto choose = [&](const auto& key) {
    for (std::size_t i = 0; i < candidates.size() && static_cast<int>(chosen.size()) < options.best; ++i)
      if (candidates[i].prediction.feasible &&
          std::find(taken.begin(), taken.end(), key(candidates[i])) == taken.end() &&
          std::find(chosen.begin(), chosen.end(), i) == chosen.end()) {
        chosen.push_back(i);
        taken.push_back(key(candidates[i]));
      }
  };
  choose(family);
  taken.clear();
  for (const std::size_t i : chosen) taken.push_back(layout(candidates[i]));
  choose(layout);
  std::sort(chosen.begin(), chosen.end());  // in the search's order
  const auto k = chosen.size();
  for (int round = 0; round < options.rounds; ++round)
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t index = (j + static_cast<std::size_t>(round)) % k;  // rotated: each starts a round in turn
      Candidate& c = candidates[chosen[index]];
      if (!c.prediction.feasible) continue;  // failed in an earlier round
      if (progress) progress(round, static_cast<int>(index), static_cast<int>(k));
      parallel::EngineConfig e = c.strategy.engine;
      e.stage_first_units = c.prediction.first_units;  // the boundaries it was predicted with
      try {
        c.measured_rounds_s.push_back(measure_engine_step_s(config, e, c.strategy.batch, options.steps));
      } catch (const Error& err) {
        c.prediction.feasible = false;
        c.prediction.why_not = str("measured: the engine failed: ", err.what());
        c.measured_rounds_s.clear();
      }
    }
  std::set<std::string> measured_layouts, measured_families, failed_families;
  for (auto i : chosen) {
    if (candidates[i].measured_rounds_s.empty()) {
      failed_families.insert(family(candidates[i]));
      continue;
    }
    candidates[i].measured_s = median(candidates[i].measured_rounds_s);
    measured_layouts.insert(layout(candidates[i]));
    measured_families.insert(family(candidates[i]));
  }
  // The measured first, by their medians; then the other feasible ones in the search's
  // order; then the infeasible ones (those that failed here among them).
  auto rank = [](const Candidate& c) { return !c.prediction.feasible ? 2 : c.measured_s > 0 ? 0 : 1; };
  std::stable_sort(candidates.begin(), candidates.end(), [&](const Candidate& a, const Candidate& b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    return rank(a) == 0 && a.measured_s < b.measured_s;
  });
  for (auto& c : candidates) c.loses_because.clear();
  if (candidates.empty() || !candidates.front().prediction.feasible) return;
  const Candidate& first = candidates.front();
  for (std::size_t i = 1; i < candidates.size() && candidates[i].prediction.feasible; ++i) {
    Candidate& c = candidates[i];
    if (c.measured_s > 0)
      c.loses_because = why_measured_slower(c, first);
    else if (c.prediction.step_s >= first.prediction.step_s)
      c.loses_because = str("not measured; predicted ", why_slower(c.prediction, first.prediction));
    else {  // predicted ahead of the winner: its family's best was chosen (the search's order)
      const std::string ahead =
          str("not measured; predicted ", fixed((1 - c.prediction.step_s / first.prediction.step_s) * 100, 1),
              "% faster, but ");
      if (measured_layouts.count(layout(c)) > 0)
        c.loses_because = ahead + "its layout measured slower than the winner";
      else if (measured_families.count(family(c)) > 0)
        c.loses_because = ahead + "its family's best measured slower than the winner";
      else if (failed_families.count(family(c)) > 0)
        c.loses_because = ahead + "its family's best failed on the engine";
      else  // candidates not in the search's order
        c.loses_because = ahead + "its family was not measured";
    }
  }
}

}  // namespace peertrain::plan
