// The pipeline engine against its serial twin: for every stage count, micro-batch count and
// schedule, one step's loss and gradient equal those of the unsplit
// Transformer::forward_backward over the whole batch, by normalized error, on fresh random
// parameters and data; then the memory bound of 1F1B, the overrides, and failures that
// must end the step at once instead of hanging.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/parallel/partitioner.h"
#include "peertrain/parallel/pipeline.h"
#include "pipeline_twin.h"

namespace {

using namespace peertrain;
using namespace peertrain::parallel;
using namespace peertrain::pipeline_twin;
using model::TransformerKind;

// Every schedule the engine runs; zb-h1 and zb-h2 split each backward into B and W.
constexpr Schedule kEngineSchedules[] = {Schedule::kGpipe, Schedule::kOneFOneB, Schedule::kZbH1, Schedule::kZbH2};

TEST(PipelineEngine, MatchesTheUnsplitModelForEveryStageCountMicroBatchCountAndSchedule) {
  std::uint64_t seed = 10;
  for (const auto& model : {small_gpt(), small_vit()})
    for (int pp : {1, 2, 4})
      for (int m : {1, 4, 8})
        for (Schedule schedule : kEngineSchedules) {
          Case k;
          k.model = model;
          k.engine.pp = pp;
          k.engine.microbatches = m;
          k.engine.schedule = schedule;
          k.seed = ++seed;
          expect_matches_unsplit(k);
        }
}

TEST(PipelineEngine, TiedHeadGradientsOfTwoStagesAddUp) {
  // The head on the last stage adds into the embedding's range, which stage 0 owns.
  for (int pp : {2, 3})
    for (Schedule schedule : kEngineSchedules) {
      Case k;
      k.model = small_gpt(/*tied=*/true);
      k.engine.pp = pp;
      k.engine.microbatches = 4;
      k.engine.schedule = schedule;
      k.seed = 40 + pp;
      expect_matches_unsplit(k);
    }
}

TEST(PipelineEngine, FewerMicroBatchesThanStagesCompletes) {
  for (Schedule schedule : kEngineSchedules) {
    Case k;
    k.model = small_gpt();
    k.engine.pp = 4;
    k.engine.microbatches = 2;
    k.engine.schedule = schedule;
    k.seed = 50;
    StepStats stats;
    expect_matches_unsplit(k, &stats);
    for (const auto& stage : stats.stages) EXPECT_LE(stage.peak_in_flight, 2);
  }
}

TEST(PipelineEngine, SequenceRanksTimesStagesMatchTheUnsplitModel) {
  for (const auto& model : {small_gpt(), small_gpt(/*tied=*/true), small_vit()})
    for (Schedule schedule : kEngineSchedules)
      for (SequenceSplit split : {SequenceSplit::kZigzag, SequenceSplit::kContiguous}) {
        Case k;
        k.model = model;
        k.engine.sp = 2;
        k.engine.pp = 2;
        k.engine.microbatches = 4;
        k.engine.schedule = schedule;
        k.engine.split = split;
        k.seed = 60;
        expect_matches_unsplit(k);
      }
}

TEST(PipelineEngine, SequenceRanksAloneMatchTheUnsplitModel) {
  Case k;
  k.model = small_gpt();
  k.engine.sp = 2;
  k.engine.microbatches = 2;
  k.seed = 70;
  expect_matches_unsplit(k);
}

TEST(PipelineEngine, FirstUnitsOverrideIsUsed) {
  Case k;
  k.model = small_gpt();  // 6 units
  k.engine.pp = 3;
  k.engine.microbatches = 4;
  k.engine.stage_first_units = parse_stage_sizes("1,4,1", 6, 3);
  std::vector<int> first_units;
  expect_matches_unsplit(k, nullptr, &first_units);
  EXPECT_EQ(first_units, (std::vector<int>{0, 1, 5}));
}

TEST(PipelineEngine, PlanProfilesAndPartitionsWithoutOverride) {
  model::Transformer model(small_gpt());
  std::vector<float> params(model.num_parameters());
  model.initialize(params, 3);
  const Data data = random_step_data(model.config(), 8, 4);
  EngineConfig config;
  config.pp = 3;
  config.microbatches = 2;
  PipelineEngine engine(model, config);
  engine.plan(params, data.view());
  ASSERT_EQ(engine.unit_costs().size(), 6u);
  for (double c : engine.unit_costs()) EXPECT_GT(c, 0.0);
  EXPECT_EQ(engine.stage_first_units(), partition(engine.unit_costs(), 3));
}

TEST(PipelineEngine, OneFOneBHoldsAtMostStagesMinusRankMicroBatches) {
  StepStats gpipe, one_f_one_b;
  Case k;
  k.model = small_gpt();
  k.engine.pp = 4;
  k.engine.microbatches = 8;
  k.engine.stage_first_units = {0, 2, 3, 4};
  k.engine.schedule = Schedule::kGpipe;
  expect_matches_unsplit(k, &gpipe);
  k.engine.schedule = Schedule::kOneFOneB;
  expect_matches_unsplit(k, &one_f_one_b);
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(gpipe.stages[s].peak_in_flight, 8);
    EXPECT_EQ(one_f_one_b.stages[s].peak_in_flight, 4 - s);
    EXPECT_GT(one_f_one_b.stages[s].peak_activation_bytes, 0u);
    // Every micro-batch saves the same bytes on a stage: the peaks scale with the counts.
    EXPECT_EQ(one_f_one_b.stages[s].peak_activation_bytes * 8, gpipe.stages[s].peak_activation_bytes * (4 - s));
  }
  for (const StepStats* st : {&gpipe, &one_f_one_b}) {
    EXPECT_DOUBLE_EQ(st->theoretical_bubble, 3.0 / 11.0);
    EXPECT_GE(st->measured_bubble, 0.0);
    EXPECT_LT(st->measured_bubble, 1.0);
    EXPECT_GE(st->replayed_bubble, 0.0);
    EXPECT_LT(st->replayed_bubble, 1.0);
    for (const auto& stage : st->stages) {
      EXPECT_GT(stage.busy_s, 0.0);
      EXPECT_GT(stage.busy_cpu_s, 0.0);
      EXPECT_GE(stage.idle_s, 0.0);
    }
  }
}

// Several chunks per stage: interleaved (round robin), ZB-V and V-Half (the V, whose turn
// at the bottom hands a micro-batch from a stage to itself), against the unsplit model,
// gpt (untied and tied: on a V the head and the embedding share stage 0) and vit, with
// sequence ranks too.
TEST(PipelineEngine, ChunkedSchedulesMatchTheUnsplitModel) {
  std::uint64_t seed = 90;
  for (const auto& model : {small_gpt(), small_gpt(/*tied=*/true), small_vit()})
    for (Schedule schedule : {Schedule::kInterleaved, Schedule::kZbV, Schedule::kVHalf})
      for (int pp : {1, 2, 3})
        for (int sp : {1, 2}) {
          if (sp == 2 && pp != 2) continue;
          if (2 * pp > model.layers + 2) continue;  // more virtual stages than units
          Case k;
          k.model = model;
          k.engine.pp = pp;
          k.engine.sp = sp;
          k.engine.microbatches = 6;
          k.batch = 12;
          k.engine.schedule = schedule;
          k.seed = ++seed;
          std::vector<int> first_units;
          expect_matches_unsplit(k, nullptr, &first_units);
          EXPECT_EQ(static_cast<int>(first_units.size()), 2 * pp);
        }
}

TEST(PipelineEngine, ZeroBubbleSchedulesKeepTheirMemoryBudget) {
  Case k;
  k.model = small_gpt();
  k.engine.pp = 4;
  k.engine.microbatches = 8;
  k.engine.stage_first_units = {0, 2, 3, 4};
  for (auto [schedule, budget] : {std::pair{Schedule::kZbH1, 4}, std::pair{Schedule::kZbH2, 7}}) {
    k.engine.schedule = schedule;
    StepStats stats;
    expect_matches_unsplit(k, &stats);
    int peak = 0;
    for (const auto& stage : stats.stages) peak = std::max(peak, stage.peak_in_flight);
    EXPECT_LE(peak, budget) << to_string(schedule);
    EXPECT_GT(peak, 1) << to_string(schedule);
    EXPECT_DOUBLE_EQ(stats.theoretical_bubble,
                     theoretical_bubble(ScheduleShape{.schedule = schedule, .stages = 4, .microbatches = 8}));
  }
}

// Vocabulary parallelism: the embedding and the output layer split over the stages, under
// schedules with one chunk and two, fused and split backward, sequence ranks or not.
TEST(PipelineEngine, VocabularyParallelMatchesTheUnsplitModel) {
  std::uint64_t seed = 300;
  for (VocabParallel mode : {VocabParallel::kVocab1, VocabParallel::kVocab2})
    for (bool tied : {false, true})
      for (Schedule schedule : {Schedule::kGpipe, Schedule::kOneFOneB, Schedule::kInterleaved, Schedule::kZbH1,
                                Schedule::kZbH2, Schedule::kZbV, Schedule::kVHalf})
        for (int pp : {2, 3}) {
          const bool chunked = ScheduleShape{.schedule = schedule, .stages = pp}.chunks() > 1;
          if (chunked && pp == 3) continue;  // 6 virtual stages, 6 units: fine, but slow to add nothing
          Case k;
          k.model = small_gpt(tied);
          k.model.vocab = 96;  // 32 or 48 rows a stage; not a power of two
          k.engine.pp = pp;
          k.engine.sp = pp == 2 && schedule == Schedule::kOneFOneB ? 2 : 1;
          k.engine.microbatches = 4;
          k.batch = 8;
          k.engine.schedule = schedule;
          k.engine.vocab_parallel = mode;
          k.seed = ++seed;
          StepStats stats;
          expect_matches_unsplit(k, &stats);
          // Every parameter is held by exactly one stage: the shards partition wte and
          // lm_head, no stage keeps a whole copy (a tied head's included).
          std::size_t held = 0;
          for (const auto& stage : stats.stages) held += stage.parameter_bytes;
          EXPECT_EQ(held, sizeof(float) * model::Transformer(k.model).num_parameters());
        }
}

// The gradient of micro-batch i of M of `d` on the unsplit model (its share of the whole
// batch's mean loss).
std::vector<float> microbatch_gradient(const model::TransformerConfig& c, std::span<const float> params, const Data& d,
                                       int i, int microbatches) {
  model::Transformer model(c);
  const int per = d.batch / microbatches;
  const std::size_t span = static_cast<std::size_t>(per) * c.seq;
  std::vector<int> positions(c.tokens());
  std::iota(positions.begin(), positions.end(), 0);
  model::TokenBatch tb;
  tb.batch = per;
  tb.tokens = c.seq;
  tb.positions = positions;
  tb.bytes = std::span<const std::int32_t>(d.bytes).subspan(i * span, span);
  tb.targets = std::span<const std::int32_t>(d.targets).subspan(i * span, span);
  tb.loss_divisor = static_cast<double>(d.batch) * c.seq;
  std::vector<float> grads(model.num_parameters(), 0.0f);
  model.forward_backward(params, tb, grads);
  return grads;
}

// PipeDream: every backward runs on the weights its forward ran on (the stash's version,
// checked per micro-batch), and a step's gradient on stage s is its serial twin: the first
// M − w micro-batches at this step's weights plus the last step's last w = p − s − 1 at
// the last step's weights. The loss is this step's at this step's weights.
TEST(PipelineEngine, PipeDreamBackwardsRunOnTheirForwardsWeights) {
  const auto config = small_gpt();
  model::Transformer model(config);
  constexpr int P = 3, M = 4, kBatch = 8;
  EngineConfig ec;
  ec.pp = P;
  ec.microbatches = M;
  ec.schedule = Schedule::kPipeDream;
  ec.stage_first_units = {0, 2, 4};  // of 6 units
  PipelineEngine engine(model, ec);
  std::vector<float> params(model.num_parameters());
  model.initialize(params, 5);
  std::vector<std::vector<float>> versions;
  std::vector<Data> batches;
  for (int t = 0; t < 3; ++t) {
    SCOPED_TRACE(str("step ", t));
    batches.push_back(random_step_data(config, kBatch, 200 + t));
    versions.push_back(params);
    std::vector<float> grads(params.size(), 1e3f);
    const float loss = engine.step(params, batches[t].view(), grads);
    const Reference synchronous = unsplit(config, params, batches[t]);
    EXPECT_NEAR(loss, synchronous.loss, kTolerance * std::abs(synchronous.loss));

    std::vector<float> expected(params.size(), 0.0f);
    int carried = 0;
    for (const auto& pass : engine.last_stats().stashed) {
      EXPECT_EQ(pass.forward_version, pass.backward_version)
          << "stage " << pass.stage << " micro-batch " << pass.microbatch;
      EXPECT_EQ(pass.backward_version, pass.carried ? t - 1 : t);
      carried += pass.carried;
    }
    for (int s = 0; s < P; ++s) {
      const int w = P - s - 1;
      const int end_unit = s + 1 < P ? ec.stage_first_units[s + 1] : model.num_units();
      auto add = [&](const std::vector<float>& g) {
        for (int u = ec.stage_first_units[s]; u < end_unit; ++u) {
          const auto r = model.unit_parameters(u);
          for (std::size_t k = r.offset; k < r.offset + r.size; ++k) expected[k] += g[k];
        }
      };
      for (int i = 0; i < M - w; ++i) add(microbatch_gradient(config, versions[t], batches[t], i, M));
      if (t > 0)
        for (int j = M - w; j < M; ++j) add(microbatch_gradient(config, versions[t - 1], batches[t - 1], j, M));
    }
    EXPECT_EQ(static_cast<int>(engine.last_stats().stashed.size()), t == 0 ? P * M - (0 + 1 + 2) : P * M);
    EXPECT_EQ(carried, t == 0 ? 0 : 1 + 2);  // stage 0 carries 2, stage 1 one
    EXPECT_LE(normalized_error(grads, expected), kTolerance);
    // The one schedule that changes the numbers: not the synchronous gradient.
    EXPECT_GT(normalized_error(grads, synchronous.grads), 1e-3);
    // The next version of the weights: a step and a perturbation, so that the versions
    // differ well beyond the tolerance.
    Rng noise(300 + t);
    for (std::size_t k = 0; k < params.size(); ++k)
      params[k] -= 0.5f * grads[k] + 0.01f * static_cast<float>(noise.normal());
  }
}

TEST(PipelineEngine, BadConfigurationsNameTheirFlag) {
  model::Transformer model(small_gpt());
  auto expect_error = [&](EngineConfig config, const std::string& flag) {
    try {
      PipelineEngine engine(model, config);
      ADD_FAILURE() << flag << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  };
  EngineConfig several_chunks;  // 4 stages × 2 chunks = 8 virtual stages, 6 units
  several_chunks.pp = 4;
  several_chunks.microbatches = 4;
  several_chunks.schedule = Schedule::kZbV;
  expect_error(several_chunks, "--pp 4 with --schedule zb-v");
  EngineConfig interleaved;
  interleaved.pp = 2;
  interleaved.microbatches = 3;
  interleaved.schedule = Schedule::kInterleaved;
  expect_error(interleaved, "--microbatches 3 must be a multiple of --pp 2");
  interleaved.microbatches = 4;
  interleaved.chunks = 1;
  expect_error(interleaved, "--chunks 1");
  interleaved.chunks = 2;
  interleaved.stage_first_units = {0, 3};  // 2 entries for 4 virtual stages
  expect_error(interleaved, "--stages");
  EngineConfig c;
  c.pp = 7;  // 6 units
  expect_error(c, "--pp");
  c = {};
  c.pp = 2;
  c.stage_first_units = {0, 6};
  expect_error(c, "--stages");
  c.stage_first_units = {0, 2, 4};
  expect_error(c, "--stages");
  c = {};
  c.microbatches = 0;
  expect_error(c, "--microbatches");
  c = {};
  c.sp = 0;
  expect_error(c, "--sp");
  c.sp = 3;  // zigzag needs 2·SP to divide the 16 tokens
  expect_error(c, "--sp");
  c = {};
  c.pp = 4;
  c.microbatches = 2;
  c.schedule = Schedule::kPipeDream;
  expect_error(c, "--schedule pipedream: --microbatches 2 is too few for --pp 4");
  c.microbatches = 4;
  c.vocab_parallel = VocabParallel::kVocab1;
  expect_error(c, "--schedule pipedream with --vocab-parallel");
  c = {};
  c.vocab_parallel = VocabParallel::kVocab1;
  expect_error(c, "--vocab-parallel vocab-1 with --pp 1");
  c.pp = 3;  // 256 rows do not split 3 ways
  expect_error(c, "--vocab-size 256 does not split evenly over --pp 3");
  {
    model::Transformer vit(small_vit());
    c.pp = 2;
    try {
      PipelineEngine engine(vit, c);
      ADD_FAILURE() << "vocabulary parallelism accepted for vit";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--vocab-parallel vocab-1"), std::string::npos) << e.what();
    }
  }

  // A batch that the micro-batches do not divide.
  EngineConfig ok;
  ok.pp = 2;
  ok.microbatches = 3;
  PipelineEngine engine(model, ok);
  std::vector<float> params(model.num_parameters()), grads(params.size());
  model.initialize(params, 1);
  const Data data = random_step_data(model.config(), 8, 2);
  try {
    engine.step(params, data.view(), grads);
    ADD_FAILURE() << "a batch of 8 in 3 micro-batches was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--microbatches"), std::string::npos) << e.what();
  }
}

TEST(PipelineEngine, AFailingWorkerEndsTheStepAtOnceAndTheNextStepWorks) {
  const auto config = small_gpt();
  model::Transformer model(config);
  std::vector<float> params(model.num_parameters()), grads(params.size());
  model.initialize(params, 5);
  Data data = random_step_data(config, 8, 6);
  const Data good = data;
  // A byte outside the vocabulary in the last micro-batch: stage 0 fails on its last
  // forward while the later stages wait for it, and must be released by the abort, not by
  // their (long) timeout.
  data.bytes[7 * config.seq + 3] = 1000;
  for (Schedule schedule : kEngineSchedules)
    for (int sp : {1, 2}) {
      SCOPED_TRACE(str(to_string(schedule), " sp ", sp));
      EngineConfig engine_config;
      engine_config.pp = 4;
      engine_config.sp = sp;
      engine_config.microbatches = 4;
      engine_config.schedule = schedule;
      engine_config.timeout_s = 600;
      PipelineEngine engine(model, engine_config);
      const auto start = std::chrono::steady_clock::now();
      try {
        engine.step(params, data.view(), grads);
        ADD_FAILURE() << "the bad byte was accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
        EXPECT_NE(std::string(e.what()).find("pipeline stage 0"), std::string::npos) << e.what();
      }
      // Not a speed assertion: far below the 600 s timeout means the abort released them.
      EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 120.0);

      const Reference ref = unsplit(config, params, good);
      const float loss = engine.step(params, good.view(), grads);
      EXPECT_NEAR(loss, ref.loss, kTolerance * std::abs(ref.loss));
      EXPECT_LE(normalized_error(grads, ref.grads), kTolerance);
    }
}

TEST(PipelineEngine, StepsRepeatBitForBit) {
  // Buffers kept between steps (activation slots, outboxes, gradient ranges) must not leak
  // into the next, and the last bits must not depend on where the heap puts a step's
  // buffers (core/aligned.h): a fresh engine made after allocations that shift the heap
  // gives the same bits as well.
  for (const model::TransformerConfig& c : {small_vit(), small_gpt()}) {
    SCOPED_TRACE(c.kind == TransformerKind::kGpt ? "gpt" : "vit");
    model::Transformer model(c);
    std::vector<float> params(model.num_parameters());
    model.initialize(params, 8);
    const Data data = random_step_data(model.config(), 8, 9);
    EngineConfig config;
    config.pp = 2;
    config.sp = 2;
    config.microbatches = 4;
    std::vector<float> first(params.size()), second(params.size()), third(params.size());
    float loss1 = 0, loss2 = 0, loss3 = 0;
    {
      PipelineEngine engine(model, config);
      loss1 = engine.step(params, data.view(), first);
      loss2 = engine.step(params, data.view(), second);
    }
    std::vector<std::unique_ptr<char[]>> skew;
    for (int i = 0; i < 64; ++i) skew.push_back(std::make_unique<char[]>(8 + 24 * i));
    PipelineEngine engine(model, config);
    loss3 = engine.step(params, data.view(), third);
    EXPECT_EQ(loss1, loss2);
    EXPECT_EQ(loss1, loss3);
    EXPECT_TRUE(first == second);
    EXPECT_TRUE(first == third);
  }
}

}  // namespace
