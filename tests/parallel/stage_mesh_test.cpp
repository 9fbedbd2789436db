// Tensor parallelism (--tp) and stage meshes of different layouts (--stage-mesh) in the
// pipeline engine, against the unsplit model: one step's loss and gradient within 1e-5 by
// normalized error, for T = 1, 2, 3, 4, combined with sequence and pipeline parallelism,
// and for neighbouring stages whose meshes differ under every resharding strategy (the
// boundary tensors resharded between them), with and without emulated links; then bad
// mesh specifications, each named by its stage and axis.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "peertrain/core/error.h"
#include "peertrain/parallel/pipeline.h"
#include "pipeline_twin.h"

namespace {

using namespace peertrain;
using namespace peertrain::parallel;
using namespace peertrain::pipeline_twin;

// 12 heads of 4 dimensions: T = 2, 3 and 4 all divide them (and the MLP's 192).
model::TransformerConfig twelve_head_gpt(bool tied = false) {
  model::TransformerConfig c = small_gpt(tied);
  c.d_model = 48;
  c.heads = 12;
  c.layers = 3;
  return c;
}

model::TransformerConfig four_head_vit() {
  model::TransformerConfig c = small_vit();
  c.heads = 4;
  return c;
}

constexpr ReshardStrategy kStrategies[] = {ReshardStrategy::kSendRecv, ReshardStrategy::kBroadcast,
                                           ReshardStrategy::kLocalAllGather};

TEST(TensorParallelEngine, TensorRanksMatchTheUnsplitModel) {
  std::uint64_t seed = 200;
  for (int tp : {1, 2, 3, 4}) {
    Case k;
    k.model = twelve_head_gpt();
    k.engine.tp = tp;
    k.engine.microbatches = 2;
    k.seed = ++seed;
    expect_matches_unsplit(k);
  }
}

TEST(TensorParallelEngine, CombinedWithSequenceAndPipelineParallelism) {
  std::uint64_t seed = 210;
  // Pipeline × sequence × tensor; the split backward (B then W) too, and the tied head.
  for (Schedule schedule : {Schedule::kOneFOneB, Schedule::kZbH1})
    for (auto [sp, tp] : {std::pair{2, 2}, std::pair{1, 4}, std::pair{2, 3}}) {
      Case k;
      k.model = twelve_head_gpt();
      k.engine.sp = sp;
      k.engine.tp = tp;
      k.engine.pp = 2;
      k.engine.microbatches = 4;
      k.engine.schedule = schedule;
      k.seed = ++seed;
      expect_matches_unsplit(k);
    }
  Case tied;
  tied.model = twelve_head_gpt(/*tied=*/true);
  tied.engine.tp = 2;
  tied.engine.pp = 2;
  tied.engine.microbatches = 2;
  tied.seed = 220;
  expect_matches_unsplit(tied);
  Case vit;
  vit.model = four_head_vit();
  vit.engine.sp = 2;
  vit.engine.tp = 2;
  vit.engine.pp = 2;
  vit.engine.microbatches = 2;
  vit.seed = 221;
  expect_matches_unsplit(vit);
}

TEST(StageMeshes, DifferentMeshesMatchTheUnsplitModelForEveryStrategy) {
  std::uint64_t seed = 230;
  for (ReshardStrategy strategy : kStrategies) {
    // The example: two sequence ranks, then four tensor ranks (each of which needs
    // the whole sequence: the destination replicates).
    Case k;
    k.model = twelve_head_gpt();
    k.engine.pp = 2;
    k.engine.stage_meshes = parse_stage_meshes("sp=2,tp=1;sp=1,tp=4");
    k.engine.microbatches = 4;
    k.engine.reshard = strategy;
    k.seed = ++seed;
    expect_matches_unsplit(k);
    // Three stages, every one different, under a split backward.
    k.engine.pp = 3;
    k.engine.stage_meshes = parse_stage_meshes("sp=1,tp=2;sp=4,tp=1;sp=2,tp=3");
    k.engine.schedule = Schedule::kZbH1;
    k.seed = ++seed;
    expect_matches_unsplit(k);
  }
}

TEST(StageMeshes, ContiguousSplitsTheVAndEmulatedLinksToo) {
  Case k;
  k.model = twelve_head_gpt();
  k.engine.pp = 2;
  k.engine.stage_meshes = parse_stage_meshes("sp=4,tp=1;sp=2,tp=2");
  k.engine.microbatches = 4;
  k.engine.split = SequenceSplit::kContiguous;
  k.engine.reshard = ReshardStrategy::kLocalAllGather;
  k.seed = 240;
  expect_matches_unsplit(k);
  // ZB-V: stage 0 holds the first and the last chunk, so activations cross both ways.
  k.engine.split = SequenceSplit::kZigzag;
  k.engine.schedule = Schedule::kZbV;
  k.engine.stage_meshes = parse_stage_meshes("sp=2,tp=2;sp=1,tp=3");
  k.engine.reshard = ReshardStrategy::kBroadcast;
  k.seed = 241;
  expect_matches_unsplit(k);
  // Slow emulated links change the time, not the numbers.
  k.engine.schedule = Schedule::kOneFOneB;
  k.engine.links = LinkModel{.between_bytes_per_s = 50e6, .within_bytes_per_s = 500e6, .latency_s = 1e-4};
  k.seed = 242;
  expect_matches_unsplit(k);
}

TEST(StageMeshes, EagerOneFOneBMatchesTheUnsplitModelAndHoldsMore) {
  // Alpa's overlap-friendly 1F1B: stage s runs 2(p − s) − 1 forwards before its first
  // backward, so it holds that many micro-batches instead of p − s.
  Case k;
  k.model = twelve_head_gpt();
  k.engine.pp = 3;
  k.engine.stage_meshes = parse_stage_meshes("sp=2;tp=2;sp=1");
  k.engine.microbatches = 6;
  k.engine.schedule = Schedule::kEager1F1B;
  k.engine.stage_first_units = {0, 2, 4};
  k.batch = 6;
  k.seed = 250;
  StepStats stats;
  expect_matches_unsplit(k, &stats);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(stats.stages[s].peak_in_flight, std::min(2 * (3 - s) - 1, 6)) << "stage " << s;
}

TEST(StageMeshes, PlanIsPrintedPerBoundary) {
  model::Transformer model(twelve_head_gpt());
  std::vector<float> params(model.num_parameters()), grads(params.size());
  model.initialize(params, 5);
  EngineConfig config;
  config.pp = 2;
  config.stage_meshes = parse_stage_meshes("sp=2,tp=1;sp=1,tp=4");
  config.microbatches = 2;
  config.reshard = ReshardStrategy::kBroadcast;
  PipelineEngine engine(model, config);
  engine.step(params, random_step_data(model.config(), 4, 6).view(), grads);
  const std::string plan = engine.describe_boundaries();
  EXPECT_NE(plan.find("stage 0 (sp=2,tp=1) -> stage 1 (sp=1,tp=4), broadcast, tensor [2, 16, 48]"), std::string::npos)
      << plan;
  EXPECT_NE(plan.find("stage 1 (sp=1,tp=4) -> stage 0 (sp=2,tp=1)"), std::string::npos) << plan;
  EXPECT_NE(plan.find("-> destination 0,1,2,3"), std::string::npos) << plan;  // one multicast to all four
}

TEST(StageMeshes, BadMeshesNameTheStageAndTheAxis) {
  model::Transformer model(twelve_head_gpt());  // 12 heads, 16 tokens
  auto expect_error = [&](EngineConfig config, const std::string& words) {
    try {
      PipelineEngine engine(model, config);
      ADD_FAILURE() << words << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  EngineConfig c;
  c.pp = 2;
  c.stage_meshes = parse_stage_meshes("sp=1,tp=2;sp=1,tp=5");
  expect_error(c, "--stage-mesh stage 1 axis tp=5 does not divide the 12 attention heads");
  c.stage_meshes = parse_stage_meshes("sp=3;tp=2");
  expect_error(c, "--stage-mesh stage 0 axis sp=3");
  c.stage_meshes = parse_stage_meshes("sp=2,tp=2;sp=1,tp=4");
  c.max_workers = 6;
  expect_error(c, "--stage-mesh stage 1 (sp=1 × tp=4 = 4 workers) brings the peer to 8 workers, more than the 6");
  c.max_workers = 0;
  c.stage_meshes = parse_stage_meshes("sp=2");
  expect_error(c, "gives 1 stages, --pp is 2");
  c.stage_meshes = parse_stage_meshes("sp=1;sp=1");
  c.tp = 2;
  expect_error(c, "leave --sp and --tp at 1");
  c = {};
  c.tp = 5;
  expect_error(c, "--tp tp=5 does not divide the 12 attention heads");
  c.tp = 2;
  c.pp = 2;
  c.vocab_parallel = VocabParallel::kVocab1;
  expect_error(c, "--vocab-parallel vocab-1 needs every stage on the same sequence ranks and no tensor parallelism");
  for (const char* bad : {"sp=2,xp=2", "sp=0", "tp=two", "sp=2;;tp=2", "sp"}) {
    try {
      parse_stage_meshes(bad);
      ADD_FAILURE() << bad << " parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--stage-mesh"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("stage "), std::string::npos) << e.what();
    }
  }
}

}  // namespace
