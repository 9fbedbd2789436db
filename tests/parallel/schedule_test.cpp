// The pure parts of pipeline parallelism: the partitioner's dynamic program against brute
// force on random costs, the --stages override, and the schedules' invariants and replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/parallel/partitioner.h"
#include "peertrain/parallel/schedule.h"

namespace {

using namespace peertrain;
using namespace peertrain::parallel;

// Every split of `units` into `stages` non-empty runs; returns the smallest bottleneck.
double brute_force_bottleneck(const std::vector<double>& costs, int stages) {
  const int units = static_cast<int>(costs.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> first(stages, 0);
  std::function<void(int)> choose = [&](int k) {
    if (k == stages) {
      best = std::min(best, bottleneck_cost(costs, first));
      return;
    }
    for (int u = first[k - 1] + 1; u <= units - (stages - k); ++u) {
      first[k] = u;
      choose(k + 1);
    }
  };
  choose(1);
  return best;
}

TEST(Partition, MatchesBruteForceOnRandomCosts) {
  Rng rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int units = 1 + static_cast<int>(rng.uniform_below(11));
    const int stages = 1 + static_cast<int>(rng.uniform_below(static_cast<std::uint64_t>(units)));
    std::vector<double> costs(units);
    for (auto& c : costs) c = trial % 5 == 0 ? static_cast<double>(rng.uniform_below(3)) : rng.uniform() * 10;
    const auto first = partition(costs, stages);
    ASSERT_EQ(static_cast<int>(first.size()), stages);
    EXPECT_NO_THROW(validate_first_units(first, units, stages));
    EXPECT_DOUBLE_EQ(bottleneck_cost(costs, first), brute_force_bottleneck(costs, stages))
        << "trial " << trial << ": " << units << " units, " << stages << " stages";
  }
}

TEST(Partition, BalancesEqualUnitsAndIsolatesAHeavyOne) {
  const std::vector<double> equal(8, 1.0);
  EXPECT_EQ(partition(equal, 4), (std::vector<int>{0, 2, 4, 6}));
  const std::vector<double> heavy{1, 1, 1, 9, 1, 1};
  EXPECT_DOUBLE_EQ(bottleneck_cost(heavy, partition(heavy, 3)), 9.0);
  EXPECT_EQ(partition(heavy, 1), (std::vector<int>{0}));
  EXPECT_EQ(partition(heavy, 6), (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

TEST(Partition, RejectsMoreStagesThanUnitsAndBadCosts) {
  const std::vector<double> costs{1, 2, 3};
  EXPECT_THROW(partition(costs, 4), Error);
  EXPECT_THROW(partition(costs, 0), Error);
  const std::vector<double> negative{1, -1};
  EXPECT_THROW(partition(negative, 1), Error);
  const std::vector<double> nan{1, std::nan("")};
  EXPECT_THROW(partition(nan, 2), Error);
}

TEST(StageSizes, ParsesUnitCountsIntoFirstUnits) {
  EXPECT_EQ(parse_stage_sizes("3,3", 6, 2), (std::vector<int>{0, 3}));
  EXPECT_EQ(parse_stage_sizes("1,2,2,1", 6, 4), (std::vector<int>{0, 1, 3, 5}));
  EXPECT_EQ(parse_stage_sizes("6", 6, 1), (std::vector<int>{0}));
  EXPECT_EQ(format_stage_sizes(std::vector<int>{0, 1, 3, 5}, 6), "1,2,2,1");
}

TEST(StageSizes, ErrorsNameTheFlagAndWhatWasExpected) {
  for (const char* bad : {"3,2", "3,4", "3,3,0", "2,2,2", "3;3", "", "3,", "a,3", "-1,7", "6,0"}) {
    try {
      parse_stage_sizes(bad, 6, 2);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      const std::string message = e.what();
      EXPECT_NE(message.find("--stages"), std::string::npos) << message;
      EXPECT_NE(message.find("sum to 6"), std::string::npos) << message;
    }
  }
  EXPECT_THROW(validate_first_units(std::vector<int>{1, 3}, 6, 2), Error);
  EXPECT_THROW(validate_first_units(std::vector<int>{0, 0}, 6, 2), Error);
  EXPECT_THROW(validate_first_units(std::vector<int>{0, 6}, 6, 2), Error);
  EXPECT_THROW(validate_first_units(std::vector<int>{0, 3, 4}, 6, 2), Error);
  EXPECT_NO_THROW(validate_first_units(std::vector<int>{0, 5}, 6, 2));
}

TEST(Schedule, ParsesItsNames) {
  EXPECT_EQ(parse_schedule("gpipe"), Schedule::kGpipe);
  EXPECT_EQ(parse_schedule("1f1b"), Schedule::kOneFOneB);
  EXPECT_EQ(to_string(Schedule::kOneFOneB), "1f1b");
  try {
    parse_schedule("zero-bubble");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--schedule"), std::string::npos);
  }
}

TEST(Schedule, EveryMicroBatchOnceForwardThenBackwardWithBoundedMemory) {
  for (Schedule schedule : {Schedule::kGpipe, Schedule::kOneFOneB, Schedule::kEager1F1B})
    for (int p : {1, 2, 3, 4, 7})
      for (int m : {1, 2, 3, 4, 8, 13})
        for (int s = 0; s < p; ++s) {
          SCOPED_TRACE(testing::Message() << to_string(schedule) << " p " << p << " m " << m << " stage " << s);
          const auto ops = stage_schedule(schedule, p, s, m);
          ASSERT_EQ(ops.size(), 2u * m);
          std::vector<int> forward_at(m, -1), backward_at(m, -1);
          for (int k = 0; k < static_cast<int>(ops.size()); ++k) {
            auto& at = ops[k].kind == PassKind::kForward ? forward_at : backward_at;
            ASSERT_EQ(at[ops[k].microbatch], -1) << "pass run twice";
            at[ops[k].microbatch] = k;
          }
          for (int i = 0; i < m; ++i) {
            ASSERT_GE(forward_at[i], 0);
            ASSERT_GT(backward_at[i], forward_at[i]);
          }
          const double peak = peak_in_flight(ops);
          if (schedule == Schedule::kGpipe) {
            EXPECT_EQ(peak, m);
          } else if (schedule == Schedule::kEager1F1B) {  // 2(p − s) − 1 forwards before the first backward
            EXPECT_EQ(peak, std::min(2 * (p - s) - 1, m));
            int before = 0;
            while (ops[before].kind == PassKind::kForward) ++before;
            EXPECT_EQ(before, std::min(2 * (p - s) - 1, m));
          } else {
            EXPECT_LE(peak, p - s);
            EXPECT_EQ(peak, std::min(p - s, m));
          }
        }
}

TEST(Schedule, OneFOneBMatchesPipeDreamFlushOrder) {
  // Stage 0 of 4 with 6 micro-batches: 3 warm-up forwards, steady 1F1B, 3 drain backwards.
  const auto ops = stage_schedule(Schedule::kOneFOneB, 4, 0, 6);
  const std::vector<PipelineOp> expected{
      {PassKind::kForward, 0},  {PassKind::kForward, 1},  {PassKind::kForward, 2},  {PassKind::kForward, 3},
      {PassKind::kBackward, 0}, {PassKind::kForward, 4},  {PassKind::kBackward, 1}, {PassKind::kForward, 5},
      {PassKind::kBackward, 2}, {PassKind::kBackward, 3}, {PassKind::kBackward, 4}, {PassKind::kBackward, 5}};
  EXPECT_EQ(ops, expected);
}

TEST(Schedule, ReplayOfUniformStagesHasTheTheoreticalBubble) {
  for (Schedule schedule : {Schedule::kGpipe, Schedule::kOneFOneB, Schedule::kEager1F1B})
    for (int p : {1, 2, 4, 5})
      for (int m : {1, 3, 4, 8}) {
        // Backward twice the forward, as in a transformer; the bubble does not depend on it.
        const auto replay = replay_schedule(schedule, p, m, [](int, const PipelineOp& op) {
          return op.kind == PassKind::kForward ? 1.0 : 2.0;
        });
        EXPECT_NEAR(replay.bubble, theoretical_bubble(p, m), 1e-12)
            << to_string(schedule) << " p " << p << " m " << m;
        EXPECT_DOUBLE_EQ(replay.makespan_s, 3.0 * (m + p - 1));
      }
}

TEST(Schedule, ReplayOfASlowStageIsBoundByIt) {
  // One stage twice as slow: the step takes at least m of its passes.
  const int p = 4, m = 8;
  const auto replay = replay_schedule(Schedule::kOneFOneB, p, m, [](int stage, const PipelineOp&) {
    return stage == 2 ? 2.0 : 1.0;
  });
  EXPECT_GE(replay.makespan_s, 2.0 * 2 * m);
  EXPECT_GT(replay.bubble, theoretical_bubble(p, m));
}

// Every schedule of every shape: each (micro-batch, chunk) runs forward once, backward
// once and, when split, W once after its B; the lists replay without stalling.
TEST(Schedule, EverySchedulePassesEachMicroBatchChunkOnceAndReplays) {
  for (Schedule schedule : all_schedules())
    for (int p : {1, 2, 3, 4, 5})
      for (int m : {1, 2, 4, 5, 8, 12}) {
        ScheduleShape shape{.schedule = schedule, .stages = p, .microbatches = m, .interleave = 2};
        if ((schedule == Schedule::kInterleaved && m % p != 0) || (schedule == Schedule::kPipeDream && m < p - 1)) {
          EXPECT_THROW(build_schedule(shape), Error);
          continue;
        }
        SCOPED_TRACE(testing::Message() << to_string(schedule) << " p " << p << " m " << m);
        const auto ops = build_schedule(shape);
        const int v = shape.chunks();
        ASSERT_EQ(static_cast<int>(ops.size()), p);
        for (int s = 0; s < p; ++s) {
          // seen[kind][chunk][micro-batch]: the position in the stage's list.
          std::vector<std::vector<std::vector<int>>> seen(3, std::vector<std::vector<int>>(v, std::vector<int>(m, -1)));
          for (int k = 0; k < static_cast<int>(ops[s].size()); ++k) {
            const PipelineOp& op = ops[s][k];
            ASSERT_TRUE(op.chunk >= 0 && op.chunk < v && op.microbatch >= 0 && op.microbatch < m);
            int& at = seen[static_cast<int>(op.kind)][op.chunk][op.microbatch];
            ASSERT_EQ(at, -1) << "pass run twice";
            at = k;
            // PipeDream carries exactly the last p − s − 1 micro-batches' backwards into
            // the next step; nothing else carries.
            const bool carry =
                schedule == Schedule::kPipeDream && op.kind == PassKind::kBackward && op.microbatch >= m - (p - s - 1);
            EXPECT_EQ(op.carried, carry) << "pass " << k;
          }
          for (int c = 0; c < v; ++c)
            for (int i = 0; i < m; ++i) {
              EXPECT_GE(seen[0][c][i], 0);
              if (!ops[s][static_cast<std::size_t>(seen[1][c][i])].carried) {
                EXPECT_GT(seen[1][c][i], seen[0][c][i]);
              }
              if (shape.split_backward())
                EXPECT_GT(seen[2][c][i], seen[1][c][i]);
              else
                EXPECT_EQ(seen[2][c][i], -1);
            }
        }
        EXPECT_NO_THROW(replay_schedule(shape, ops, [](int, const PipelineOp&) { return 1.0; }));
      }
}

TEST(Schedule, VirtualStagesRoundTrip) {
  for (Schedule schedule : {Schedule::kInterleaved, Schedule::kZbV, Schedule::kOneFOneB}) {
    const ScheduleShape shape{.schedule = schedule, .stages = 4, .microbatches = 8, .interleave = 3};
    for (int k = 0; k < shape.virtual_stages(); ++k)
      EXPECT_EQ(shape.virtual_stage(shape.stage_of(k), shape.chunk_of(k)), k) << to_string(schedule);
  }
  // The V: stage 0 holds the first and the last virtual stage.
  const ScheduleShape v{.schedule = Schedule::kZbV, .stages = 4, .microbatches = 8};
  EXPECT_EQ(v.virtual_stage(0, 1), 7);
  EXPECT_EQ(v.virtual_stage(3, 0), 3);
  EXPECT_EQ(v.virtual_stage(3, 1), 4);
}

// With equal pass times the replay meets the papers' closed forms where the schedule is
// fixed (GPipe, 1F1B, interleaved), and ZB-H2 has no bubble in the papers' measure.
TEST(Schedule, ReplayedBubblesAgainstThePapers) {
  for (int p : {2, 4, 8})
    for (int m : {8, 16}) {
      SCOPED_TRACE(testing::Message() << "p " << p << " m " << m);
      auto replay = [&](Schedule schedule, int v = 2) {
        const ScheduleShape shape{.schedule = schedule, .stages = p, .microbatches = m, .interleave = v};
        return replay_schedule(shape, [&](int, const PipelineOp& op) {
          const double whole = op.kind == PassKind::kBackward && !shape.split_backward() ? 2.0 : 1.0;
          return whole / shape.chunks();
        });
      };
      auto theory = [&](Schedule schedule, int v = 2) {
        return theoretical_bubble(ScheduleShape{.schedule = schedule, .stages = p, .microbatches = m, .interleave = v});
      };
      const double one_f_one_b = replay(Schedule::kOneFOneB).span_bubble;
      EXPECT_NEAR(one_f_one_b, theory(Schedule::kOneFOneB), 1e-12);
      EXPECT_NEAR(replay(Schedule::kGpipe).bubble, theory(Schedule::kGpipe), 1e-12);
      for (int v : {2, 4})
        EXPECT_NEAR(replay(Schedule::kInterleaved, v).span_bubble, theory(Schedule::kInterleaved, v), 1e-12);
      // H2's warm-up needs 2p − 1 micro-batches to fill stage 0 until the first B.
      if (m >= 2 * p - 1) {
        EXPECT_NEAR(replay(Schedule::kZbH2).span_bubble, 0.0, 1e-12);
      }
      EXPECT_NEAR(replay(Schedule::kZbH1).span_bubble, theory(Schedule::kZbH1), 1e-12);
      // The greedy ZB-V beats 1F1B but does not reach its closed form (docs/parallel.md).
      EXPECT_LT(replay(Schedule::kZbV).span_bubble, one_f_one_b);
      EXPECT_GE(replay(Schedule::kZbV).span_bubble, theory(Schedule::kZbV) - 1e-12);
    }
}

// Peak activations per stage, in micro-batches, within each schedule's budget.
TEST(Schedule, PeakMemoryWithinEachSchedulesBudget) {
  for (int p : {2, 3, 4, 6})
    for (int m : {6, 12, 24}) {
      SCOPED_TRACE(testing::Message() << "p " << p << " m " << m);
      auto peaks = [&](Schedule schedule) {
        const ScheduleShape shape{.schedule = schedule, .stages = p, .microbatches = m};
        std::vector<double> out;
        for (const auto& st : replay_schedule(shape, [](int, const PipelineOp&) { return 1.0; }).stages)
          out.push_back(st.peak_microbatches);
        return out;
      };
      const double pd = p;
      for (int s = 0; s < p; ++s) EXPECT_EQ(peaks(Schedule::kOneFOneB)[s], static_cast<double>(std::min(p - s, m)));
      for (double x : peaks(Schedule::kZbH1)) EXPECT_LE(x, pd);
      for (double x : peaks(Schedule::kZbH2)) EXPECT_LE(x, 2 * pd - 1);
      for (double x : peaks(Schedule::kZbV)) EXPECT_LE(x, pd);
      for (double x : peaks(Schedule::kVHalf)) EXPECT_LE(x, (pd + 1) / 2);
      // PipeDream holds 1F1B's p − s: its carried micro-batches and one more.
      for (int s = 0; s < p; ++s) EXPECT_EQ(peaks(Schedule::kPipeDream)[s], static_cast<double>(p - s));
    }
}

// Vocabulary parallelism's S and T passes: each micro-batch's once on every stage, in the
// same order everywhere (S is a collective, and vocab-2's T), S after the last virtual
// stage's forward and before its backward on the head stage, T after S, and before that
// backward under vocab-2 (it gives its dy) but after it under vocab-1 (off the critical
// path); the base passes keep their order; the replay runs every collective at one time on
// every stage and does not stall.
TEST(Schedule, OutputPassesJoinEveryListInOneOrder) {
  for (int barriers : {1, 2})
    for (Schedule schedule : all_schedules())
      for (int p : {2, 3, 4}) {
        ScheduleShape shape{.schedule = schedule, .stages = p, .microbatches = 2 * p};
        SCOPED_TRACE(str(to_string(schedule), " p ", p, " barriers ", barriers));
        if (schedule == Schedule::kPipeDream) {  // carries passes into the next step: refused
          shape.output_barriers = barriers;
          EXPECT_THROW(build_schedule(shape), Error);
          continue;
        }
        const auto base = build_schedule(shape);
        shape.output_barriers = barriers;
        const auto lists = build_schedule(shape);
        const int last = shape.virtual_stages() - 1, head = shape.stage_of(last);
        std::vector<PipelineOp> order0;
        for (int st = 0; st < p; ++st) {
          std::vector<PipelineOp> order, rest;
          for (const auto& op : lists[st])
            (op.kind == PassKind::kOutputS || op.kind == PassKind::kOutputT ? order : rest).push_back(op);
          EXPECT_EQ(rest, base[st]);
          EXPECT_EQ(static_cast<int>(order.size()), 2 * shape.microbatches);
          if (st == 0) order0 = order;
          EXPECT_EQ(order, order0) << "stage " << st;
        }
        for (int st = 0; st < p; ++st) {
          auto position = [&](PassKind kind, int i, int chunk) {
            const auto& ops = lists[st];
            return std::find(ops.begin(), ops.end(), PipelineOp{kind, i, chunk}) - ops.begin();
          };
          for (int i = 0; i < shape.microbatches; ++i) {
            EXPECT_LT(position(PassKind::kOutputS, i, 0), position(PassKind::kOutputT, i, 0));
            if (st != head) continue;
            const int chunk = shape.chunk_of(last);
            EXPECT_LT(position(PassKind::kForward, i, chunk), position(PassKind::kOutputS, i, 0));
            EXPECT_LT(position(PassKind::kOutputS, i, 0), position(PassKind::kBackward, i, chunk));
            if (barriers == 2)
              EXPECT_LT(position(PassKind::kOutputT, i, 0), position(PassKind::kBackward, i, chunk));
            else
              EXPECT_GT(position(PassKind::kOutputT, i, 0), position(PassKind::kBackward, i, chunk));
          }
        }
        const Replay replay = replay_schedule(shape, lists, [](int stage, const PipelineOp& op) {
          return op.kind == PassKind::kOutputS || op.kind == PassKind::kOutputT ? 0.5 + 0.1 * stage : 1.0;
        });
        // Every collective pass of a micro-batch starts at the same time on every stage.
        for (PassKind kind : {PassKind::kOutputS, PassKind::kOutputT}) {
          if (kind == PassKind::kOutputT && barriers == 1) continue;
          for (int i = 0; i < shape.microbatches; ++i) {
            std::vector<double> starts;
            for (int st = 0; st < p; ++st) {
              const auto& ops = lists[st];
              const auto k = std::find(ops.begin(), ops.end(), PipelineOp{kind, i, 0}) - ops.begin();
              starts.push_back(replay.stages[st].pass_start_s[static_cast<std::size_t>(k)]);
            }
            EXPECT_EQ(*std::min_element(starts.begin(), starts.end()), *std::max_element(starts.begin(), starts.end()));
          }
        }
      }
}

TEST(Schedule, BadShapesNameTheirFlag) {
  auto message = [](const ScheduleShape& shape) {
    try {
      build_schedule(shape);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({.schedule = Schedule::kInterleaved, .stages = 4, .microbatches = 6}).find("--microbatches 6"),
            std::string::npos);
  EXPECT_NE(
      message({.schedule = Schedule::kInterleaved, .stages = 2, .microbatches = 4, .interleave = 1}).find("--chunks"),
      std::string::npos);
  EXPECT_NE(message({.schedule = Schedule::kZbV, .stages = 2, .microbatches = 4, .interleave = 3}).find("exactly 2"),
            std::string::npos);
  EXPECT_NE(message({.schedule = Schedule::kOneFOneB, .stages = 0, .microbatches = 4}).find("--pp"), std::string::npos);
  EXPECT_NE(message({.schedule = Schedule::kZbH1, .stages = 2, .microbatches = 0}).find("--microbatches"),
            std::string::npos);
}

}  // namespace
