// The step-time simulator and the strategy search on profiles set by hand, where the
// answer is known: a pipeline of equal stages on a core per worker replays the papers'
// bubble; on one core the passes add up; memory is the parameters' copies plus the
// micro-batches in flight; what cannot be built or does not fit is refused with the
// reason and never chosen; the profile cache reads back what it wrote.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>

#include "peertrain/core/error.h"
#include "peertrain/plan/low_communication.h"
#include "peertrain/parallel/ring_attention.h"
#include "peertrain/parallel/schedule.h"
#include "peertrain/plan/network.h"
#include "peertrain/plan/search.h"
#include "peertrain/topology/generators.h"

namespace {

using namespace peertrain;
using namespace peertrain::plan;

model::TransformerConfig tiny_gpt() {
  model::TransformerConfig c;
  c.d_model = 16;
  c.heads = 4;
  c.layers = 4;  // 6 units
  c.seq = 16;
  c.vocab = 32;
  return c;
}

constexpr double kForward = 1e-3, kBackward = 2e-3, kActivation = 1000;

// Every unit alike (F 1 ms, B 2 ms, split 1 + 1 ms), every shape; no overheads, free copies.
void set_uniform(Profiler& profiler, const model::TransformerConfig& c, int batch, int workers) {
  MachineCosts m;
  m.cores = 64;
  m.copy_bytes_per_s = 1e300;
  m.message_s = 0;
  m.slowdown = std::vector<double>(64, 1.0);
  for (int w = 1; w <= 64; ++w) m.step_overhead_s[w] = m.barrier_s[w] = 0;
  profiler.set_machine(m);
  UnitCost u{.forward_s = kForward,
             .backward_s = kBackward,
             .backward_input_s = kBackward / 2,
             .backward_weight_s = kBackward / 2,
             .forward_cpu_s = kForward,
             .backward_cpu_s = kBackward,
             .backward_input_cpu_s = kBackward / 2,
             .backward_weight_cpu_s = kBackward / 2,
             .activation_bytes = kActivation,
             .stash_bytes = kActivation / 2};
  for (int b = 1; b <= batch; ++b)
    for (int sp = 1; sp <= workers; ++sp)
      for (int tp = 1; tp <= workers; ++tp)
        for (UnitKind kind : {UnitKind::kEmbedding, UnitKind::kBlock, UnitKind::kHead})
          for (bool solo : {false, true})
            profiler.set_unit(c, {.unit = kind, .microbatch = b, .sp = sp, .tp = tp, .solo = solo}, u);
  // Vocabulary parallelism's shapes: the same units, and an output shard of a fifth of a unit.
  UnitCost output{.forward_s = kForward / 5,
                  .backward_s = kBackward / 5,
                  .forward_cpu_s = kForward / 5,
                  .backward_cpu_s = kBackward / 5,
                  .activation_bytes = kActivation / 5};
  for (int b = 1; b <= batch; ++b)
    for (int sp = 1; sp <= workers; ++sp) {
      for (UnitKind kind : {UnitKind::kEmbedding, UnitKind::kHead})  // the vocabulary left out
        profiler.set_unit(c, {.unit = kind, .microbatch = b, .sp = sp, .vocab_parallel = 1}, u);
      for (int mode : {1, 2})
        for (int ranks = 2; ranks <= workers; ++ranks)
          profiler.set_unit(
              c,
              {.unit = UnitKind::kVocabOutput, .microbatch = b, .sp = sp, .vocab_parallel = mode, .vocab_ranks = ranks},
              output);
    }
}

Strategy pipeline(int pp, int m, parallel::Schedule schedule, std::vector<int> first_units) {
  Strategy s;
  s.batch = 8;
  s.engine.pp = pp;
  s.engine.microbatches = m;
  s.engine.schedule = schedule;
  s.engine.stage_first_units = std::move(first_units);
  return s;
}

TEST(Simulator, EqualStagesOnACorePerWorkerHaveThePapersBubble) {
  const auto c = tiny_gpt();
  Profiler profiler("");
  set_uniform(profiler, c, 8, 4);
  for (auto schedule : {parallel::Schedule::kGpipe, parallel::Schedule::kOneFOneB})
    for (int m : {1, 2, 4, 8}) {
      SCOPED_TRACE(str(parallel::to_string(schedule), " m ", m));
      // 3 stages of 2 units each: F 2 ms, B 4 ms a pass.
      const auto p = simulate(c, pipeline(3, m, schedule, {0, 2, 4}), profiler, {.cores = 64});
      ASSERT_TRUE(p.feasible) << p.why_not;
      EXPECT_NEAR(p.passes_s, (m + 2) * 6e-3, 1e-9);
      EXPECT_NEAR(p.bubble, 2.0 / (m + 2), 1e-9);
      EXPECT_NEAR(p.compute_s, m * 6e-3, 1e-9);
      EXPECT_NEAR(p.step_s, p.passes_s, 1e-12);  // no overhead, no reduce (one worker a stage)
    }
}

TEST(Simulator, OnOneCoreThePassesAddUp) {
  const auto c = tiny_gpt();
  Profiler profiler("");
  set_uniform(profiler, c, 8, 4);
  const auto p = simulate(c, pipeline(3, 4, parallel::Schedule::kOneFOneB, {0, 2, 4}), profiler, {.cores = 1});
  ASSERT_TRUE(p.feasible) << p.why_not;
  EXPECT_NEAR(p.passes_s, 3 * 4 * 6e-3, 1e-9);  // every pass of every stage, one after another
}

// The profiler's machine with `cores` cores (returned).
MachineCosts with_cores(Profiler& profiler, int cores) {
  MachineCosts m = profiler.machine();
  m.cores = cores;
  profiler.set_machine(m);
  return m;
}

// More workers than cores: every pass does the hand-off's CPU work, and a mesh with more
// ranks than cores waits the sync cost at each ring step inside it; a mesh that fits the
// cores does not.
TEST(Simulator, OversubscribedPassesPayTheirHandOffs) {
  const auto c = tiny_gpt();  // 6 units: the embedding, 4 blocks, the head
  Profiler profiler("");
  set_uniform(profiler, c, 8, 4);
  const MachineCosts two_cores = with_cores(profiler, 2);
  const Contention costs{.pass_s = 1e-3, .sync_s = 0.5e-3};
  Strategy ring;
  ring.batch = 8;
  ring.engine.sp = 4;
  const auto without = simulate(c, ring, profiler);
  const auto with = simulate(c, ring, profiler, {.contention = true, .contention_costs = &costs});
  ASSERT_TRUE(without.feasible && with.feasible) << without.why_not << with.why_not;
  // One stage, two passes (F, B), each a hand-off, each over 4 blocks of ring attention:
  // the 8 sequences' 4 heads hold 4 keys a rank, so all 32 travel as one unit (up to 256
  // keys a unit), 3 hops forward and 4 backward (ring_pass's sums wait at each hop and on
  // their way home). A hand-off is CPU work, which the 4 ranks do at half speed on 2
  // cores; the hops are waits.
  ASSERT_EQ(parallel::RingAttention::ring_units({.batch = 8, .heads = 4, .tokens = 4}), 1);
  EXPECT_NEAR(with.passes_s - without.passes_s, 2 * 1e-3 * 4 / 2 + 4 * (3 + 4) * 1 * 0.5e-3, 1e-9);

  // Two stages of 3 units on one core, one micro-batch of ZB-H1: the F and B passes pay the
  // hand-off, the W passes (the stage's own data) do not. The chain F, F, B, B leaves nothing
  // to overlap its waits but stage 1's W, which shares the core with stage 0's B.
  with_cores(profiler, 1);
  const auto two_stages = pipeline(2, 1, parallel::Schedule::kZbH1, {0, 3});
  const auto alone = simulate(c, two_stages, profiler);
  const auto charged = simulate(c, two_stages, profiler, {.contention = true, .contention_costs = &costs});
  ASSERT_TRUE(alone.feasible && charged.feasible) << alone.why_not << charged.why_not;
  EXPECT_NEAR(alone.passes_s, 6 * (kForward + kBackward), 1e-9);           // one core: every pass in turn
  EXPECT_NEAR(charged.passes_s - alone.passes_s, 4 * costs.pass_s, 1e-9);  // 2 stages × (F, B)
  profiler.set_machine(two_cores);

  Strategy meshes;  // 2 stages of 2 sequence ranks: 4 workers, but each mesh fits the cores
  meshes.batch = 8;
  meshes.engine.sp = 2;
  meshes.engine.pp = 2;
  meshes.engine.microbatches = 2;
  meshes.engine.stage_first_units = {0, 3};
  const Contention syncs_only{.pass_s = 0, .sync_s = 1.0};
  const auto fits = simulate(c, meshes, profiler);
  const auto fits_with = simulate(c, meshes, profiler, {.contention = true, .contention_costs = &syncs_only});
  ASSERT_TRUE(fits.feasible && fits_with.feasible) << fits.why_not << fits_with.why_not;
  EXPECT_NEAR(fits_with.passes_s, fits.passes_s, 1e-12);
  // On a machine with a core per worker nothing is charged.
  MachineCosts four_cores = two_cores;
  four_cores.cores = 4;
  profiler.set_machine(four_cores);
  const auto roomy = simulate(c, ring, profiler, {.contention = true, .contention_costs = &costs});
  ASSERT_TRUE(roomy.feasible) << roomy.why_not;
  EXPECT_NEAR(roomy.passes_s, simulate(c, ring, profiler).passes_s, 1e-12);
}

// The hand-off costs a plan uses are those calibrated on the planned model at its batch
// (rounded to 2W micro-batches): another model's, or another batch's, are not its own.
TEST(Simulator, OversubscribedPassesUseThePlannedModelsCalibration) {
  const auto c = tiny_gpt();
  Profiler profiler("");
  set_uniform(profiler, c, 8, 4);
  with_cores(profiler, 2);
  const Contention costs{.pass_s = 1e-3, .sync_s = 0.5e-3};
  auto wider = c;
  wider.d_model = 32;
  // A different model, batch or worker count is a different calibration.
  EXPECT_NE(contention_key(c, 4, 8), contention_key(wider, 4, 8));
  EXPECT_NE(contention_key(c, 4, 8), contention_key(c, 4, 16));
  EXPECT_NE(contention_key(c, 4, 8), contention_key(c, 3, 8));
  profiler.set_contention(contention_key(wider, 4, 8), {.pass_s = 1.0, .sync_s = 1.0});  // not c's
  profiler.set_contention(contention_key(c, 4, 8), costs);
  Strategy ring;
  ring.batch = 6;  // rounded up to 8, two micro-batches of the 4-stage calibration pipeline each
  ring.engine.sp = 4;
  const auto calibrated = simulate(c, ring, profiler, {.contention = true});
  const auto given = simulate(c, ring, profiler, {.contention = true, .contention_costs = &costs});
  ASSERT_TRUE(calibrated.feasible && given.feasible) << calibrated.why_not << given.why_not;
  EXPECT_NEAR(calibrated.passes_s, given.passes_s, 1e-12);
  EXPECT_GT(calibrated.passes_s, simulate(c, ring, profiler).passes_s);
}

TEST(Simulator, MemoryIsParameterCopiesPlusMicroBatchesInFlight) {
  const auto c = tiny_gpt();
  model::Transformer model(c);
  Profiler profiler("");
  set_uniform(profiler, c, 8, 4);
  const auto p = simulate(c, pipeline(3, 8, parallel::Schedule::kOneFOneB, {0, 2, 4}), profiler, {.cores = 64});
  ASSERT_TRUE(p.feasible);
  for (int s = 0; s < 3; ++s) {
    double floats = 0;
    for (int u = 2 * s; u < 2 * s + 2; ++u) floats += static_cast<double>(model.unit_parameters(u).size);
    // 1F1B holds p − s micro-batches on stage s, each 2 units' activations.
    EXPECT_DOUBLE_EQ(p.worker_bytes[s], 4 * 4 * floats + (3 - s) * 2 * kActivation) << "stage " << s;
  }
}

TEST(Simulator, WhatCannotBeBuiltOrDoesNotFitIsRefusedWithTheReason) {
  const auto c = tiny_gpt();
  Profiler profiler("");
  set_uniform(profiler, c, 8, 4);
  Strategy three = pipeline(1, 1, parallel::Schedule::kOneFOneB, {});
  three.engine.tp = 3;  // 4 heads
  auto p = simulate(c, three, profiler);
  EXPECT_FALSE(p.feasible);
  EXPECT_NE(p.why_not.find("--tp tp=3 does not divide the 4 attention heads"), std::string::npos) << p.why_not;
  p = simulate(c, pipeline(2, 3, parallel::Schedule::kOneFOneB, {}), profiler);
  EXPECT_FALSE(p.feasible);
  EXPECT_NE(p.why_not.find("--microbatches 3 does not divide the batch of 8"), std::string::npos) << p.why_not;
  p = simulate(c, pipeline(3, 8, parallel::Schedule::kOneFOneB, {0, 2, 4}), profiler, {.memory_cap_bytes = 1024});
  EXPECT_FALSE(p.feasible);
  EXPECT_NE(p.why_not.find("does not fit: stage 0's workers need"), std::string::npos) << p.why_not;
}

// Vocabulary parallelism (Yeung et al. 2025) on two stages of 3 units, one micro-batch of
// GPipe, a core per worker, free messages: vocab-2 runs F F, then S and T on both stages
// (each ending in a barrier), then the head stage's B, which needs T's dy, then stage 0's.
// Each stage holds half of the vocabulary's two V × d matrices and keeps S's state until T.
TEST(Simulator, VocabularyParallelismAddsItsPassesBarriersAndHalfTheVocabulary) {
  const auto c = tiny_gpt();
  model::Transformer model(c);
  Profiler profiler("");
  set_uniform(profiler, c, 8, 4);
  constexpr double kS = 0.5e-3, kT = 0.25e-3, kState = 300;
  UnitCost u = profiler.unit(c, {.unit = UnitKind::kBlock, .microbatch = 8});
  for (UnitKind kind : {UnitKind::kEmbedding, UnitKind::kHead})
    profiler.set_unit(c, {.unit = kind, .microbatch = 8, .vocab_parallel = 1}, u);
  for (int mode : {1, 2}) {
    profiler.set_unit(
        c, {.unit = UnitKind::kVocabOutput, .microbatch = 8, .vocab_parallel = mode, .vocab_ranks = 2},
        UnitCost{
            .forward_s = kS, .backward_s = kT, .forward_cpu_s = kS, .backward_cpu_s = kT, .activation_bytes = kState});
  }
  Strategy plain = pipeline(2, 1, parallel::Schedule::kGpipe, {0, 3});
  const auto none = simulate(c, plain, profiler, {.cores = 64});
  ASSERT_TRUE(none.feasible) << none.why_not;
  EXPECT_NEAR(none.passes_s, 2 * 3 * kForward + 2 * 3 * kBackward, 1e-9);

  Strategy two = plain;
  two.engine.vocab_parallel = parallel::VocabParallel::kVocab2;
  const auto p2 = simulate(c, two, profiler, {.cores = 64});
  ASSERT_TRUE(p2.feasible) << p2.why_not;
  EXPECT_NEAR(p2.passes_s, 2 * 3 * kForward + kS + kT + 2 * 3 * kBackward, 1e-9);
  EXPECT_EQ(two.describe(), "sp1 tp1 pp2 m1 gpipe vocab-2");
  const double vocab = static_cast<double>(c.vocab) * c.d_model;
  for (int s = 0; s < 2; ++s) {
    double floats = 0;
    for (int unit = 3 * s; unit < 3 * s + 3; ++unit) floats += static_cast<double>(model.unit_parameters(unit).size);
    floats += -vocab + (c.tied_head ? 1 : 2) * vocab / 2;  // its own matrix out, half of each in
    EXPECT_DOUBLE_EQ(p2.worker_bytes[s], 4 * 4 * floats + 3 * kActivation + kState) << "stage " << s;
  }
  // Vocab-1: the head's B needs only S; T is off the critical path or adds itself once.
  Strategy one = plain;
  one.engine.vocab_parallel = parallel::VocabParallel::kVocab1;
  const auto p1 = simulate(c, one, profiler, {.cores = 64});
  ASSERT_TRUE(p1.feasible) << p1.why_not;
  EXPECT_GE(p1.passes_s, 2 * 3 * kForward + kS + 2 * 3 * kBackward - 1e-9);
  EXPECT_LE(p1.passes_s, 2 * 3 * kForward + kS + kT + 2 * 3 * kBackward + 1e-9);
}

TEST(Search, RanksTheFeasibleByTimeAndNeverChoosesWhatDoesNotFit) {
  const auto c = tiny_gpt();
  Profiler profiler("");
  set_uniform(profiler, c, 8, 4);
  SearchSpace space;
  space.workers = 4;
  space.batch = 8;
  const auto all = search(c, space, profiler, {.cores = 4});
  ASSERT_FALSE(all.empty());
  ASSERT_TRUE(all.front().prediction.feasible);
  for (std::size_t i = 1; i < all.size() && all[i].prediction.feasible; ++i) {
    EXPECT_LE(all[i - 1].prediction.step_s, all[i].prediction.step_s);
    EXPECT_NE(all[i].loses_because.find("%:"), std::string::npos) << all[i].loses_because;
  }
  // A cap that only some fit: the winner is one of them.
  double smallest = 1e300;
  for (const auto& k : all)
    if (k.prediction.feasible) smallest = std::min(smallest, k.prediction.peak_bytes());
  const auto capped = search(c, space, profiler, {.cores = 4, .memory_cap_bytes = smallest * 1.01});
  ASSERT_TRUE(capped.front().prediction.feasible);
  EXPECT_LE(capped.front().prediction.peak_bytes(), smallest * 1.01);
  bool refused = false;
  for (const auto& k : capped) refused |= k.prediction.why_not.find("does not fit") != std::string::npos;
  EXPECT_TRUE(refused);
}

// The search's space beyond uniform meshes: vocabulary parallelism where the engine has it
// (tensor rank 1, a GPT pipeline) and the output layer outweighs a block, and stages of
// different meshes with each resharding; neither when the space leaves them out.
TEST(Search, TriesVocabularyParallelismAndMixedStageMeshes) {
  auto c = tiny_gpt();
  c.vocab = 256;  // 256 × 16 output weights against a block's 12 × 16²
  Profiler profiler("");
  set_uniform(profiler, c, 8, 4);
  SearchSpace space;
  space.workers = 4;
  space.batch = 8;
  auto count = [&](const std::vector<Candidate>& all) {
    int vocab = 0, mixed = 0;
    std::set<std::string> names;  // every strategy reads differently (the resharding too)
    for (const auto& k : all) EXPECT_TRUE(names.insert(k.strategy.describe()).second) << k.strategy.describe();
    for (const auto& k : all) {
      if (k.strategy.engine.vocab_parallel != parallel::VocabParallel::kNone) {
        ++vocab;
        EXPECT_EQ(k.strategy.engine.tp, 1) << k.strategy.describe();
        EXPECT_GE(k.strategy.engine.pp, 2) << k.strategy.describe();
      }
      if (!k.strategy.engine.stage_meshes.empty()) {
        ++mixed;
        EXPECT_NE(k.strategy.describe().find("meshes "), std::string::npos);
      }
    }
    return std::pair{vocab, mixed};
  };
  const auto [vocab, mixed] = count(search(c, space, profiler, {.cores = 4}));
  EXPECT_GT(vocab, 0);
  EXPECT_GT(mixed, 0);
  space.vocab_parallel = space.stage_meshes = false;
  EXPECT_EQ(count(search(c, space, profiler, {.cores = 4})), (std::pair{0, 0}));
  // A vocabulary of 32: its output layer is lighter than a block, nothing to balance.
  const auto small = tiny_gpt();
  Profiler other("");
  set_uniform(other, small, 8, 4);
  space.vocab_parallel = true;
  EXPECT_EQ(count(search(small, space, other, {.cores = 4})).first, 0);
}

// A measured loser's reason pairs its rounds with the winner's: a gap that held in every
// round is a ranking, one the loser reversed in some round is a near-tie.
TEST(Search, AMeasuredLoserSaysInHowManyRoundsItWasFaster) {
  Candidate winner, clear, close;
  winner.measured_rounds_s = {30e-3, 31e-3, 29e-3};
  clear.measured_rounds_s = {33e-3, 34e-3, 32e-3};
  close.measured_rounds_s = {29.5e-3, 32e-3, 31e-3};
  for (Candidate* k : {&winner, &clear, &close}) k->measured_s = median(k->measured_rounds_s);
  EXPECT_EQ(why_measured_slower(clear, winner), "+10.0% measured (33.00 ms against 30.00 ms; slower in all 3 rounds)");
  EXPECT_EQ(why_measured_slower(close, winner),
            "+3.3% measured (31.00 ms against 30.00 ms; faster in 1 of 3 rounds: a near-tie on this machine)");
  Candidate unpaired;  // no rounds to pair (set by hand): the gap alone
  unpaired.measured_s = 36e-3;
  EXPECT_EQ(why_measured_slower(unpaired, winner), "+20.0% measured (36.00 ms against 30.00 ms)");
}

// plan --measure: the search's best K run on the engine in rounds, each round's order
// rotated, then put first by their measured medians; the rest keep the search's order, and
// a candidate the engine refuses becomes infeasible with the reason.
TEST(Search, MeasureBestRunsTheFirstKInRotatedRoundsAndRanksThemByTheirMedians) {
  const auto c = tiny_gpt();
  Profiler profiler("");
  set_uniform(profiler, c, 8, 2);
  SearchSpace space;
  space.workers = 2;
  space.batch = 8;
  auto all = search(c, space, profiler, {.cores = 2});
  ASSERT_GT(all.size(), 4u);
  // The three to run: the best of each family (degrees, stage meshes, vocabulary split)
  // first, in the search's order; then, were there fewer than three families, the best of
  // each further layout (a family's micro-batch count). Schedules never make a layout.
  auto family = [](const Candidate& k) {
    const auto& e = k.strategy.engine;
    return str(e.sp, " ", e.tp, " ", e.pp, " ", parallel::to_string(e.stage_meshes), " ", static_cast<int>(e.reshard),
               " ", static_cast<int>(e.vocab_parallel));
  };
  auto layout = [&](const Candidate& k) { return str(family(k), " ", k.strategy.engine.microbatches); };
  std::set<std::string> families, layouts;
  std::vector<std::size_t> chosen;
  for (std::size_t i = 0; i < all.size() && chosen.size() < 3; ++i)
    if (all[i].prediction.feasible && families.insert(family(all[i])).second) chosen.push_back(i);
  for (const std::size_t i : chosen) layouts.insert(layout(all[i]));
  for (std::size_t i = 0; i < all.size() && chosen.size() < 3; ++i)
    if (all[i].prediction.feasible && layouts.insert(layout(all[i])).second) chosen.push_back(i);
  ASSERT_EQ(chosen.size(), 3u);
  ASSERT_GE(families.size(), 2u) << "the space should hold more than one family";
  std::vector<std::string> best, rest;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].prediction.feasible)
      (std::find(chosen.begin(), chosen.end(), i) != chosen.end() ? best : rest).push_back(all[i].strategy.describe());
  std::vector<std::pair<int, int>> order;
  measure_best(c, all, {.best = 3, .rounds = 3, .steps = 1}, [&](int round, int index, int count) {
    EXPECT_EQ(count, 3);
    order.emplace_back(round, index);
  });
  EXPECT_EQ(order,
            (std::vector<std::pair<int, int>>{{0, 0}, {0, 1}, {0, 2}, {1, 1}, {1, 2}, {1, 0}, {2, 2}, {2, 0}, {2, 1}}));
  std::vector<std::string> measured;
  for (std::size_t i = 0; i < 3; ++i) {
    const auto& k = all[i];
    measured.push_back(k.strategy.describe());
    ASSERT_TRUE(k.prediction.feasible) << k.prediction.why_not;
    ASSERT_EQ(k.measured_rounds_s.size(), 3u);
    EXPECT_GT(k.measured_s, 0);
    EXPECT_EQ(k.measured_s, median(k.measured_rounds_s));
    if (i > 0) {
      EXPECT_LE(all[i - 1].measured_s, k.measured_s);
      EXPECT_NE(k.loses_because.find("% measured"), std::string::npos) << k.loses_because;
      EXPECT_NE(k.loses_because.find(" rounds"), std::string::npos) << k.loses_because;  // the paired tally
    }
  }
  EXPECT_TRUE(all[0].loses_because.empty());
  std::sort(measured.begin(), measured.end());
  std::sort(best.begin(), best.end());
  EXPECT_EQ(measured, best);  // the best of each family, then of each layout; no others
  std::vector<std::string> after;
  for (std::size_t i = 3; i < all.size() && all[i].prediction.feasible; ++i) {
    after.push_back(all[i].strategy.describe());
    EXPECT_EQ(all[i].measured_s, 0);
    // Signed against the winner's prediction: a schedule of a measured layout may be
    // predicted ahead of the winner, whose layout measured faster.
    const bool behind = all[i].prediction.step_s >= all[0].prediction.step_s;
    EXPECT_EQ(all[i].loses_because.rfind(behind ? "not measured; predicted +" : "not measured; predicted ", 0), 0u)
        << all[i].loses_because;
    if (!behind) {
      const bool of_layout = all[i].loses_because.find("% faster, but its layout measured slower") != std::string::npos;
      const bool of_family =
          all[i].loses_because.find("% faster, but its family's best measured slower") != std::string::npos;
      EXPECT_TRUE(of_layout || of_family) << all[i].loses_because;
      EXPECT_EQ(of_layout, layouts.count(layout(all[i])) > 0) << all[i].loses_because;
    }
  }
  EXPECT_EQ(after, rest);  // in the search's order

  // Boundaries the engine refuses (7 units of a 6-unit model): infeasible, with the reason,
  // and last; the other is measured and first. A ViT, whose steps take images.
  auto vit = c;
  vit.kind = model::TransformerKind::kVit;
  vit.image = 8;
  vit.patch = 4;
  std::vector<Candidate> two(2);
  for (int m : {2, 4}) {  // two layouts
    auto& k = two[static_cast<std::size_t>(m / 2 - 1)];
    k.strategy = pipeline(2, m, parallel::Schedule::kOneFOneB, {});
    k.strategy.batch = 4;
  }
  two[0].prediction.first_units = {0, 7};
  two[1].prediction.first_units = {0, 3};
  measure_best(vit, two, {.best = 2, .rounds = 1, .steps = 1});
  EXPECT_TRUE(two[0].prediction.feasible);
  EXPECT_GT(two[0].measured_s, 0);
  EXPECT_FALSE(two[1].prediction.feasible);
  EXPECT_NE(two[1].prediction.why_not.find("measured: the engine failed"), std::string::npos)
      << two[1].prediction.why_not;
  EXPECT_THROW(measure_best(vit, two, {.best = 0}), Error);

  // A layout is everything but the schedule: of two strategies that differ only in it, the
  // first is measured; of two that differ in vocabulary parallelism, both.
  for (const bool vocab : {false, true}) {
    std::vector<Candidate> pair(2);
    for (std::size_t i = 0; i < 2; ++i) {
      pair[i].strategy =
          pipeline(2, 2, i == 0 || vocab ? parallel::Schedule::kOneFOneB : parallel::Schedule::kGpipe, {});
      pair[i].strategy.batch = 4;
      pair[i].prediction.first_units = {0, 3};
      pair[i].prediction.step_s = 1e-3 * static_cast<double>(i + 1);
    }
    if (vocab) pair[1].strategy.engine.vocab_parallel = parallel::VocabParallel::kVocab1;
    measure_best(c, pair, {.best = 2, .rounds = 1, .steps = 1});
    int measured_count = 0;
    for (const auto& k : pair) measured_count += k.measured_s > 0;
    EXPECT_EQ(measured_count, vocab ? 2 : 1) << (vocab ? "vocab-1 is a layout of its own" : "gpipe shares 1f1b's");
  }

  // Families before layouts: three 2-stage pipelines predicted ahead of a tensor-parallel
  // pair; with two to run, the best pipeline and the pair run, not two pipelines. With three,
  // the next pipeline layout fills the last place, and the third pipeline never runs. An
  // unmeasured pipeline predicted ahead of the winner says what became of its family's best:
  // measured slower, or (boundaries the engine refuses) failed.
  for (const auto& [best, first_fails] : {std::pair{2, false}, {3, false}, {2, true}}) {
    SCOPED_TRACE(::testing::Message() << "--measure " << best << (first_fails ? ", the first fails" : ""));
    std::vector<Candidate> four(4);
    for (std::size_t i = 0; i < 4; ++i) {
      four[i].strategy = i < 3 ? pipeline(2, 2 << i, parallel::Schedule::kOneFOneB, {})
                               : pipeline(1, 1, parallel::Schedule::kOneFOneB, {});
      if (i == 3) four[i].strategy.engine.tp = 2;
      four[i].prediction.first_units = i < 3 ? std::vector<int>{0, 3} : std::vector<int>{0};
      four[i].prediction.step_s = 1e-3 * static_cast<double>(i + 1);
    }
    if (first_fails) four[0].prediction.first_units = {0, 7};  // 7 units of a 6-unit model
    const std::vector<std::string> names = {four[0].strategy.describe(), four[1].strategy.describe(),
                                            four[2].strategy.describe(), four[3].strategy.describe()};
    measure_best(c, four, {.best = best, .rounds = 1, .steps = 1});
    std::set<std::string> ran;
    std::string m4_loses, winner = four[0].strategy.describe();
    for (const auto& k : four) {
      ASSERT_EQ(k.prediction.feasible, !(first_fails && k.strategy.describe() == names[0]))
          << k.strategy.describe() << ": " << k.prediction.why_not;
      if (k.measured_s > 0) ran.insert(k.strategy.describe());
      if (k.strategy.describe() == names[1]) m4_loses = k.loses_because;
    }
    const std::set<std::string> expected = best == 3     ? std::set<std::string>{names[0], names[1], names[3]}
                                           : first_fails ? std::set<std::string>{names[3]}
                                                         : std::set<std::string>{names[0], names[3]};
    EXPECT_EQ(ran, expected);
    if (first_fails) {
      EXPECT_EQ(m4_loses, "not measured; predicted 50.0% faster, but its family's best failed on the engine");
    } else if (best == 2 && winner == names[3]) {
      EXPECT_EQ(m4_loses,
                "not measured; predicted 50.0% faster, but its family's best measured slower than the winner");
    }
  }
}

TEST(Profiler, CacheReadsBackWhatItMeasured) {
  const auto path = std::filesystem::temp_directory_path() / "peertrain_plan_test_profile.tsv";
  std::filesystem::remove(path);
  auto c = tiny_gpt();
  c.layers = 1;
  const UnitShape shape{.unit = UnitKind::kBlock, .microbatch = 1, .sp = 2, .tp = 2};
  UnitCost first;
  {
    Profiler profiler(path.string(), 1);
    first = profiler.unit(c, shape);  // measured: 4 threads with real groups
    EXPECT_EQ(profiler.measured(), 1);
    EXPECT_GT(first.forward_s, 0);
    EXPECT_GT(first.activation_bytes, 0);
    profiler.save();
  }
  {
    Profiler profiler(path.string(), 1);  // adds the contention costs to the file
    profiler.set_contention("4 workers: a model", {.pass_s = 1.5e-4, .sync_s = 4.5e-4});
    profiler.save();
  }
  Profiler again(path.string(), 1);
  const UnitCost read = again.unit(c, shape);
  const Contention* costs = again.contention("4 workers: a model");
  ASSERT_NE(costs, nullptr);
  EXPECT_DOUBLE_EQ(costs->pass_s, 1.5e-4);
  EXPECT_DOUBLE_EQ(costs->sync_s, 4.5e-4);
  EXPECT_EQ(again.contention("3 workers: a model"), nullptr);
  EXPECT_EQ(again.measured(), 0);
  EXPECT_NEAR(read.forward_s, first.forward_s, 1e-7 * first.forward_s);  // 9 significant digits in the file
  EXPECT_DOUBLE_EQ(read.activation_bytes, first.activation_bytes);
  std::filesystem::remove(path);
}

// Deferring: the shapes a search asks for are noted, answered with a stand-in, and measured
// afterwards in rounds, each noted once; what the cache had is answered from it at once.
TEST(Profiler, DeferredShapesAreMeasuredTogetherInRounds) {
  auto c = tiny_gpt();
  c.layers = 1;
  Profiler profiler("", 3);
  const UnitShape known{.unit = UnitKind::kBlock, .microbatch = 2};
  UnitCost set{.forward_s = 0.5, .backward_s = 0.75};
  profiler.set_unit(c, known, set);
  profiler.defer_units(true);
  const UnitShape a{.unit = UnitKind::kBlock, .microbatch = 1}, b{.unit = UnitKind::kHead, .microbatch = 1};
  const UnitCost stand_in = profiler.unit(c, a);
  profiler.unit(c, b);
  profiler.unit(c, a);  // noted once
  EXPECT_DOUBLE_EQ(profiler.unit(c, known).forward_s, 0.5);
  EXPECT_EQ(profiler.measured(), 0);
  profiler.defer_units(false);
  std::vector<std::pair<int, int>> rounds;
  EXPECT_EQ(profiler.measure_deferred([&](int round, int total, int shapes) {
    EXPECT_EQ(total, 3);
    rounds.emplace_back(round, shapes);
  }),
            2);
  EXPECT_EQ(rounds, (std::vector<std::pair<int, int>>{{0, 2}, {1, 2}, {2, 2}}));
  EXPECT_EQ(profiler.measured(), 2);
  const UnitCost block = profiler.unit(c, a), head = profiler.unit(c, b);
  EXPECT_EQ(profiler.measured(), 2);  // from the cache now
  EXPECT_GT(block.forward_s, 0);
  EXPECT_NE(block.forward_s, stand_in.forward_s);
  EXPECT_GT(block.activation_bytes, 1);
  EXPECT_GT(head.backward_s, 0);
  EXPECT_EQ(profiler.measure_deferred(), 0);  // nothing left
  // Each shape's figures went to that shape: its bytes, which do not vary from run to run,
  // are those a profiler measuring it at once finds.
  Profiler at_once("", 1);
  for (const auto& [shape, deferred] : {std::pair{a, block}, std::pair{b, head}}) {
    const UnitCost direct = at_once.unit(c, shape);
    EXPECT_EQ(deferred.activation_bytes, direct.activation_bytes);
    EXPECT_EQ(deferred.stash_bytes, direct.stash_bytes);
  }
  EXPECT_NE(block.activation_bytes, head.activation_bytes);
}

// A damaged line of the cache is left out (and measured again), never a crash: a count that
// is not a number, a number missing, an unknown kind. The good lines around them still count.
TEST(Profiler, CacheSkipsLinesItCannotRead) {
  const auto path = std::filesystem::temp_directory_path() / "peertrain_plan_test_damaged.tsv";
  {
    std::ofstream out(path);
    out << "machine\t" << Profiler::machine_key() << "\n"
        << "machine\t-\t1 1e10 1e-5 1e-5 1 1\n"      // so that machine() reads, not measures
        << "barrier\t3\t2e-4\n"                      // good
        << "barrier\tfour\t1e-4\n"                   // count not a number: std::stoi threw here once
        << "handoff\t4 workers: m\t1.5e-4 4.5e-4\n"  // good
        << "barrier\t4x\t1e-4\n"                     // trailing junk
        << "barrier\t0\t1e-4\n"                      // not a positive count
        << "overhead\t-2\t1e-4\n"                    // nor this
        << "handoff\t3 workers: m\t1e-4\n"           // a number missing
        << "handoff\t5 workers: m\tx y\n"            // not numbers
        << "overhead\t99999999999\t1e-3\n"           // out of range
        << "whatever\t1\t2\n"                        // unknown kind
        << "handoff\t6 workers: m\t2e-4 5e-4\n";     // good, after the damage
  }
  Profiler profiler(path.string(), 1);
  const Contention* four = profiler.contention("4 workers: m");
  ASSERT_NE(four, nullptr);
  EXPECT_DOUBLE_EQ(four->pass_s, 1.5e-4);
  EXPECT_DOUBLE_EQ(four->sync_s, 4.5e-4);
  for (const char* left_out : {"3 workers: m", "5 workers: m"})
    EXPECT_EQ(profiler.contention(left_out), nullptr) << left_out;
  const Contention* six = profiler.contention("6 workers: m");
  ASSERT_NE(six, nullptr);
  EXPECT_DOUBLE_EQ(six->sync_s, 5e-4);
  // The count-keyed lines: only the good one was read.
  const MachineCosts& m = profiler.machine();
  EXPECT_EQ(m.cores, 1);
  ASSERT_EQ(m.barrier_s.size(), 1u);
  EXPECT_DOUBLE_EQ(m.barrier_s.at(3), 2e-4);
  EXPECT_TRUE(m.step_overhead_s.empty());
  std::filesystem::remove(path);
}

// Across peers, on links where the answer is arithmetic: 4 peers, S = 1.25 MB, a free
// loopback (the probe's rate far above the caps, no software cost).
topology::Topology ring_of_four(double latency_ms, double mbps, double node_mbps) {
  auto t =
      topology::make_topology("ring4", {}, topology::generate("ring", {.n = 4}), topology::WeightScheme::kMetropolis);
  t.default_link = {latency_ms, mbps};
  t.node_bandwidth_mbps = node_mbps;
  return t;
}
constexpr double kS = 1.25e6, kCompute = 1e-3;  // 1.25 MB is 1 s at 10 Mbit/s
const NetworkProbe kFreeLoopback{.message_s = 0, .message_cpu_s = 0, .bytes_per_s = 1e15, .copy_bytes_per_s = 1e15};

TEST(Network, DpsgdWaitsForItsSlowestNeighbourOrItsCard) {
  // Latency only: the gossip overlaps the gradient, so 10 ms of link beats 1 ms of compute.
  auto p = predict_network(ring_of_four(10, 0, 0), PeerAlgorithm::kDpsgd, kS, kCompute, kFreeLoopback, 0);
  EXPECT_NEAR(p.step_s, 10e-3, 1e-6);  // the free loopback's nanoseconds
  EXPECT_NE(p.where.find("link 0-1 (10 ms"), std::string::npos) << p.where;
  // A 10 Mbit/s card for both neighbours' sends: 2 s.
  p = predict_network(ring_of_four(0, 0, 10), PeerAlgorithm::kDpsgd, kS, kCompute, kFreeLoopback, 0);
  EXPECT_NEAR(p.step_s, 2.0, 1e-6);  // the free loopback's nanoseconds
  EXPECT_NE(p.where.find("card"), std::string::npos) << p.where;
}

TEST(Network, AllReduceAndTheServerScaleAsTheyShould) {
  // Ring all-reduce: 2(n − 1) steps of S/n over 10 Mbit/s links: 6 × 0.25 s + compute.
  auto p = predict_network(ring_of_four(0, 10, 0), PeerAlgorithm::kAllReduce, kS, kCompute, kFreeLoopback, 0);
  EXPECT_NEAR(p.step_s, kCompute + 6 * 0.25, 1e-6);  // the free loopback's nanoseconds
  // A parameter server behind a 10 Mbit/s card sends n − 1 = 3 parameter vectors: 3 s.
  p = predict_network(ring_of_four(0, 0, 10), PeerAlgorithm::kPs, kS, kCompute, kFreeLoopback, 0);
  EXPECT_NEAR(p.step_s, kCompute + 3.0, 1e-6);  // the free loopback's nanoseconds
  EXPECT_EQ(p.slowest, 0);
  // With 10 Mbit/s links as well, the last worker served sends its gradient after the
  // broadcast: 3 s out and 1 s in.
  p = predict_network(ring_of_four(0, 10, 10), PeerAlgorithm::kPs, kS, kCompute, kFreeLoopback, 0);
  EXPECT_NEAR(p.step_s, kCompute + 4.0, 1e-6);
  // Its latencies add up: gradients in, parameters out.
  p = predict_network(ring_of_four(10, 0, 0), PeerAlgorithm::kPs, kS, kCompute, kFreeLoopback, 0);
  EXPECT_NEAR(p.step_s, kCompute + 20e-3, 1e-6);  // the free loopback's nanoseconds
}

topology::Topology ring_of(int n, double latency_ms) {
  auto t =
      topology::make_topology("ring", {}, topology::generate("ring", {.n = n}), topology::WeightScheme::kMetropolis);
  t.default_link = {latency_ms, 0};
  return t;
}

double log_allreduce_s(const topology::Topology& t, PeerAlgorithm a) {
  return predict_network(t, a, kS, kCompute, kFreeLoopback, 0).step_s - kCompute;
}

TEST(Network, TreeAndRecursiveDoublingReplayTheirMessages) {
  // n = 4: the binomial tree's longest chain is 4 messages of the whole S (1→0, 2→0 after
  // 3→2; 0→2, then 0→1 and 2→3), recursive doubling 2 exchanges: 10 ms of latency each,
  // or 1 s at 10 Mbit/s.
  EXPECT_NEAR(log_allreduce_s(ring_of_four(10, 0, 0), PeerAlgorithm::kTreeAllReduce), 4 * 10e-3, 1e-6);
  EXPECT_NEAR(log_allreduce_s(ring_of_four(0, 10, 0), PeerAlgorithm::kRdAllReduce), 2 * 1.0, 1e-6);
  const auto p = predict_network(ring_of_four(10, 0, 0), PeerAlgorithm::kTreeAllReduce, kS, kCompute, kFreeLoopback, 0);
  EXPECT_NE(p.where.find("binomial tree"), std::string::npos) << p.where;
  // A 10 Mbit/s card is never shared: a sender sends one message at a time.
  EXPECT_NEAR(log_allreduce_s(ring_of_four(0, 0, 10), PeerAlgorithm::kTreeAllReduce), 4 * 1.0, 1e-6);
  // Other n, by hand (t = 10 ms a message). The tree: n = 2: 1→0, 0→1; n = 3: 1→0 and 2→0
  // both at t, then 0→2, 0→1; n = 5 and 6: 0 has every sum at 2t, then sends to 4, 2, 1 in
  // turn (and 2→3, 4→5 overlap those): 5t, not the 6 rounds a round-by-round count gives.
  // Recursive doubling: n = 2 one exchange; n = 3: 0→1, the exchange 1↔2, 1→0; n = 5, 6:
  // the extra peers hand over, 2 exchanges among 4, the sums handed back: 4t.
  const std::pair<int, double> tree[] = {{1, 0}, {2, 2}, {3, 3}, {4, 4}, {5, 5}, {6, 5}, {8, 6}};
  for (const auto& [n, hops] : tree)
    EXPECT_NEAR(log_allreduce_s(ring_of(n, 10), PeerAlgorithm::kTreeAllReduce), hops * 10e-3, 1e-6) << "n = " << n;
  const std::pair<int, double> rd[] = {{1, 0}, {2, 1}, {3, 3}, {4, 2}, {5, 4}, {6, 4}, {8, 3}};
  for (const auto& [n, hops] : rd)
    EXPECT_NEAR(log_allreduce_s(ring_of(n, 10), PeerAlgorithm::kRdAllReduce), hops * 10e-3, 1e-6) << "n = " << n;
  // The pairings matter: a slow link 1-3 is recursive doubling's second exchange, not a tree
  // edge (the tree at n = 4 uses 1-0, 3-2, 2-0).
  auto slow = ring_of_four(10, 0, 0);
  slow.link_overrides.push_back({1, 3, {100, 0}});
  EXPECT_NEAR(log_allreduce_s(slow, PeerAlgorithm::kRdAllReduce), 10e-3 + 100e-3, 1e-6);
  EXPECT_NEAR(log_allreduce_s(slow, PeerAlgorithm::kTreeAllReduce), 4 * 10e-3, 1e-6);
  // Their messages' CPU on shared cores (free links): the tree at n = 4 sends 6 messages
  // (12 ends), recursive doubling 8 (16 ends); each end pays half of 1 ms, each peer 1 ms
  // of compute: (4 + 6) ms and (4 + 8) ms over 2 cores. Recursive doubling's exchanges
  // keep both cores busy; the tree's chain leaves them idle (peer 0 waits for 2, which
  // waits for 3), so its replay on the cores takes longer than its CPU.
  const NetworkProbe costly{.message_s = 0, .message_cpu_s = 1e-3, .bytes_per_s = 1e15, .copy_bytes_per_s = 1e15};
  const auto chain = predict_network(ring_of_four(0, 0, 0), PeerAlgorithm::kTreeAllReduce, kS, kCompute, costly, 2);
  EXPECT_GT(chain.step_s, 10e-3 / 2 * 1.1);
  EXPECT_NE(chain.where.find("busy only"), std::string::npos) << chain.where;
  EXPECT_NEAR(predict_network(ring_of_four(0, 0, 0), PeerAlgorithm::kRdAllReduce, kS, kCompute, costly, 2).step_s,
              12e-3 / 2, 1e-6);
  EXPECT_EQ(parse_peer_algorithm("allreduce", "tree"), PeerAlgorithm::kTreeAllReduce);
  EXPECT_EQ(parse_peer_algorithm("allreduce", "rd"), PeerAlgorithm::kRdAllReduce);
  EXPECT_EQ(parse_peer_algorithm("allreduce"), PeerAlgorithm::kAllReduce);
  EXPECT_THROW(parse_peer_algorithm("allreduce", "star"), Error);
  EXPECT_THROW(parse_peer_algorithm("dpsgd", "tree"), Error);  // as launch refuses it
}

TEST(Network, PeersSharingCoresAreBoundByTheirCpu) {
  const NetworkProbe costly{.message_s = 0, .message_cpu_s = 1e-3, .bytes_per_s = 1e15, .copy_bytes_per_s = 1e15};
  // Each peer: 1 ms of compute and 2 messages' CPU (each end pays half of 1 ms): 3 ms;
  // 4 peers on 2 cores: 6 ms.
  const auto p = predict_network(ring_of_four(0, 0, 0), PeerAlgorithm::kDpsgd, kS, kCompute, costly, 2);
  EXPECT_NEAR(p.step_s, 4 * 3e-3 / 2, 1e-6);  // the free loopback's nanoseconds
  EXPECT_NE(p.where.find("sharing 2 cores"), std::string::npos) << p.where;
  EXPECT_THROW(parse_peer_algorithm("gossip"), Error);
  // Ring all-reduce's 2(n − 1) sends and receives of S/n each pay a message's fixed cost
  // (the small message's 0.5 ms) and a quarter of S's per-byte 0.5 ms: 12 message ends of
  // 0.625 ms, half each, plus 1 ms of compute, is 4.75 ms a peer; 4 peers on 2 cores: 9.5 ms.
  NetworkProbe split = costly;
  split.small_message_cpu_s = 0.5e-3;
  const auto ring = predict_network(ring_of_four(0, 0, 0), PeerAlgorithm::kAllReduce, kS, kCompute, split, 2);
  EXPECT_NEAR(ring.step_s, 4 * 4.75e-3 / 2, 1e-6);
}

// On shared cores each step is also replayed task by task (plan/shared_cores.h). Every
// message costs 1 ms of CPU (0.5 at each end, the same for S/4 as for S), each peer 1 ms of
// compute; links are free. Worked by hand, in cases where only the replay gives the answer:
//  - ring all-reduce at n = 4, with cores to spare and 1 ms on the loopback beyond each
//    message's CPU: a round is a send (0.5 ms on the sender's I/O thread), the wire (1),
//    the receive (0.5 on the receiver's, after its own send): 2 ms, 6 rounds after the
//    compute: 13 ms. Each peer's own CPU is 7 ms, Σ CPU / cores 0.44.
//  - the same ring on 2 cores and no wire: the CPU decides, 4 × (1 + 12 × 0.5) ms over 2
//    cores, 14 ms; the replay packs each round's 8 half-messages onto both cores.
//  - a server and one worker, cores to spare: the worker computes (1), sends its gradient
//    (0.5 + 0.5), the server sends x back (0.5 + 0.5), and only then computes again: 3 ms a
//    step, where each peer's own CPU is 2 ms.
TEST(Network, PeersOnSharedCoresReplayTheirTasks) {
  NetworkProbe costly{.message_s = 0,
                      .message_cpu_s = 1e-3,
                      .small_message_cpu_s = 1e-3,
                      .bytes_per_s = 1e15,
                      .copy_bytes_per_s = 1e15};
  NetworkProbe wired = costly;
  wired.message_s = wired.small_message_s = 2e-3;  // one way: 1 ms of CPU and 1 ms of wire
  const auto chain = predict_network(ring_of_four(0, 0, 0), PeerAlgorithm::kAllReduce, kS, kCompute, wired, 64);
  EXPECT_NEAR(chain.step_s, 13e-3, 1e-6);
  EXPECT_NE(chain.where.find("busy only"), std::string::npos) << chain.where;
  const auto two = predict_network(ring_of_four(0, 0, 0), PeerAlgorithm::kAllReduce, kS, kCompute, costly, 2);
  EXPECT_NEAR(two.step_s, 14e-3, 1e-6);
  auto pair =
      topology::make_topology("pair", {}, topology::generate("ring", {.n = 2}), topology::WeightScheme::kMetropolis);
  const auto ps = predict_network(pair, PeerAlgorithm::kPs, kS, kCompute, costly, 64);
  EXPECT_NEAR(ps.step_s, 3e-3, 1e-6);
  EXPECT_NEAR(ps.peers[1].cpu_s, 2e-3, 1e-6);
  // A training thread that slept and finds every core busy pays a wake-up: with cores to
  // spare the chain is unchanged; on 2 cores the ring's steps cost more than their CPU,
  // at most 0.1 ms for each of a peer's 12 waits (a take and a send's wait in each of 6
  // rounds), 4 peers over 2 cores, if the cores stay packed.
  wired.busy_wake_cpu_s = costly.busy_wake_cpu_s = 0.1e-3;
  EXPECT_NEAR(predict_network(ring_of_four(0, 0, 0), PeerAlgorithm::kAllReduce, kS, kCompute, wired, 64).step_s, 13e-3,
              1e-6);
  const auto woken = predict_network(ring_of_four(0, 0, 0), PeerAlgorithm::kAllReduce, kS, kCompute, costly, 2);
  EXPECT_GT(woken.step_s, 14e-3 + 1e-4);
  EXPECT_LE(woken.step_s, 14e-3 + 12 * 4 * 0.1e-3 / 2 + 1e-9);
  EXPECT_NE(woken.where.find("threads woken onto busy cores"), std::string::npos) << woken.where;
}

// Evaluation rounds on shared cores: kTestsLanding (0.4) of the other n − 1 peers' test
// passes, once every `every` steps, add to the CPU the cores share; on machines of their
// own they add nothing.
TEST(Network, OtherPeersTestPassesLandInTheStepOnSharedCores) {
  const NetworkProbe costly{.message_s = 0, .message_cpu_s = 1e-3, .bytes_per_s = 1e15, .copy_bytes_per_s = 1e15};
  const Evaluation tests{.one_s = 10e-3, .every = 5};
  // As above, 12 ms of CPU a step on 2 cores, plus 0.4 × 3 test passes of 10 ms every 5
  // steps (the replay on the cores, which spreads them over the peers' steps, gives no more).
  const auto p = predict_network(ring_of_four(0, 0, 0), PeerAlgorithm::kDpsgd, kS, kCompute, costly, 2, tests);
  EXPECT_GE(p.step_s, (4 * 3e-3 + 1.2 * 10e-3 / 5) / 2 - 1e-9);
  EXPECT_LT(p.step_s, (4 * 3e-3 + 1.2 * 10e-3 / 5) / 2 * 1.02);
  EXPECT_NE(p.where.find("tests every 5 steps"), std::string::npos) << p.where;
  const auto apart = predict_network(ring_of_four(0, 0, 0), PeerAlgorithm::kDpsgd, kS, kCompute, costly, 0, tests);
  EXPECT_NEAR(apart.step_s,
              predict_network(ring_of_four(0, 0, 0), PeerAlgorithm::kDpsgd, kS, kCompute, costly, 0).step_s, 1e-12);
}

}  // namespace

namespace peertrain::plan {
namespace {

// The utilisation model by hand: C = 0.1 s, T = 0.5 s. Data-parallel 0.1/0.6; DiLoCo H = 50
// 5/5.5; Streaming F = 4, τ = 1: each fragment 0.125 s, 0.1 of it hidden, 4 · 0.025 blocked;
// int8 (b = 1): fragments of 0.03125 s, all hidden.
TEST(LowCommunication, UtilisationIsTheModelsFormula) {
  EXPECT_NEAR(compute_utilisation({"dp", 1, 1, 0, 4}, 0.1, 0.5), 0.1 / 0.6, 1e-12);
  EXPECT_NEAR(compute_utilisation({"diloco", 50, 1, 0, 4}, 0.1, 0.5), 5.0 / 5.5, 1e-12);
  EXPECT_NEAR(compute_utilisation({"streaming", 50, 4, 1, 4}, 0.1, 0.5), 5.0 / 5.1, 1e-12);
  EXPECT_DOUBLE_EQ(compute_utilisation({"int8", 50, 4, 1, 1}, 0.1, 0.5), 1.0);
}

// And back: at the bandwidth found for u, the exchange's time (bytes over it plus the ring's
// latency) gives u again; below the latency no bandwidth does.
TEST(LowCommunication, TheBandwidthForAUtilisationGivesItBack) {
  const double c = 0.05, model = 4e8, latency = 1e-5;
  const int n = 8;
  for (const LowCommunication& m : {LowCommunication{"dp", 1, 1, 0, 4}, LowCommunication{"diloco", 50, 1, 0, 4},
                                    LowCommunication{"streaming", 48, 4, 2, 1.0078125}})
    for (double u : {0.5, 0.9, 0.99}) {
      SCOPED_TRACE(m.name + " " + std::to_string(u));
      const auto b = bandwidth_for_utilisation(m, u, c, model, n, latency);
      ASSERT_TRUE(b.has_value());
      const double hops = 2.0 * (n - 1);
      const double fragment_s = m.bytes_per_value / 4 * hops / n * model / m.fragments / *b + hops * latency;
      const double blocked = m.fragments * std::max(0.0, fragment_s - m.overlap * c);
      EXPECT_NEAR(m.inner_steps * c / (m.inner_steps * c + blocked), u, 1e-9);
    }
  EXPECT_FALSE(bandwidth_for_utilisation({"dp", 1, 1, 0, 4}, 0.99, 0.05, model, n, 0.01).has_value());
}

}  // namespace
}  // namespace peertrain::plan
