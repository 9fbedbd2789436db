// The exhaustive strategy search; see search.h.
#include "peertrain/plan/search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "peertrain/core/error.h"
#include "peertrain/parallel/schedule.h"

namespace peertrain::plan {
namespace {

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
  for (int pp = 1; pp <= W; ++pp) {
    if (W % pp) continue;
    for (int sp = 1; sp <= W / pp; ++sp) {
      if ((W / pp) % sp) continue;
      const int tp = W / pp / sp;
      std::vector<int> ms = space.microbatches;
      if (ms.empty())
        for (int m = 1; m <= std::min(space.batch, 4 * pp); ++m)
          if (space.batch % m == 0) ms.push_back(m);
      for (int m : ms)
        for (auto schedule : pp == 1 ? std::vector<parallel::Schedule>{parallel::Schedule::kOneFOneB} : schedules) {
          Candidate cand;
          auto& e = cand.strategy.engine;
          e.sp = sp;
          e.tp = tp;
          e.pp = pp;
          e.microbatches = m;
          e.schedule = schedule;
          e.split = space.split;
          cand.strategy.batch = space.batch;
          try {
            parallel::validate(parallel::ScheduleShape{.schedule = schedule, .stages = pp, .microbatches = m});
          } catch (const Error&) {
            continue;  // not a schedule for this shape (e.g. interleaved with p ∤ m): not a strategy
          }
          cand.prediction = simulate(config, cand.strategy, profiler, options);
          all.push_back(std::move(cand));
        }
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

}  // namespace peertrain::plan
