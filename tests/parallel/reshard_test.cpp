// The cross-mesh resharding planner against brute force: on random shapes, meshes and
// layouts every destination element is covered by exactly one slice, every holder of a
// slice holds it, and no source worker that holds it is left out; every strategy delivers
// each destination its whole tile.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>

#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/parallel/reshard.h"

namespace {

using namespace peertrain;
using namespace peertrain::parallel;

// Calls fn on every index of the box.
void for_each_index(const Box& box, const std::function<void(const std::vector<std::int64_t>&)>& fn) {
  if (box.empty()) return;
  std::vector<std::int64_t> at = box.lo;
  while (true) {
    fn(at);
    std::size_t d = at.size();
    while (d-- > 0) {
      if (++at[d] < box.hi[d]) break;
      at[d] = box.lo[d];
    }
    if (d == static_cast<std::size_t>(-1)) return;
  }
}

struct Case {
  Mesh source, destination;
  Layout source_layout, destination_layout;
  std::vector<std::int64_t> shape;
};

Mesh random_mesh(Rng& rng) {
  Mesh mesh;
  const int axes = 1 + static_cast<int>(rng.uniform_below(2));
  for (int a = 0; a < axes; ++a) mesh.axes.push_back(1 + static_cast<int>(rng.uniform_below(4)));
  return mesh;
}

Layout random_layout(Rng& rng, const Mesh& mesh, int rank) {
  Layout layout;
  std::vector<bool> used(mesh.axes.size(), false);
  for (int d = 0; d < rank; ++d) {
    const int a = static_cast<int>(rng.uniform_below(mesh.axes.size() + 1)) - 1;
    layout.split_axis.push_back(a >= 0 && !used[a] ? a : -1);
    if (a >= 0) used[a] = true;
  }
  return layout;
}

Case random_case(Rng& rng) {
  Case k;
  k.source = random_mesh(rng);
  k.destination = random_mesh(rng);
  const int rank = 1 + static_cast<int>(rng.uniform_below(3));
  k.source_layout = random_layout(rng, k.source, rank);
  k.destination_layout = random_layout(rng, k.destination, rank);
  // Each dimension a multiple of whatever splits it on either side, times a little more.
  for (int d = 0; d < rank; ++d) {
    std::int64_t n = 1;
    for (const auto& [mesh, layout] : {std::pair{&k.source, &k.source_layout}, {&k.destination, &k.destination_layout}})
      if (layout->split_axis[d] >= 0) n = std::lcm(n, static_cast<std::int64_t>(mesh->axes[layout->split_axis[d]]));
    k.shape.push_back(n * (1 + static_cast<std::int64_t>(rng.uniform_below(3))));
  }
  return k;
}

TEST(Reshard, EveryDestinationElementOnceFromASourceThatHoldsIt) {
  Rng rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const Case k = random_case(rng);
    SCOPED_TRACE(str("trial ", trial, ": ", to_string(k.source_layout), " -> ", to_string(k.destination_layout)));
    const auto tasks = plan_reshard(k.source, k.source_layout, k.destination, k.destination_layout, k.shape);
    for (int w = 0; w < k.destination.workers(); ++w) {
      const Box wanted = tile(k.destination, k.destination_layout, k.shape, w);
      for_each_index(wanted, [&](const std::vector<std::int64_t>& at) {
        int covered = 0;
        for (const auto& t : tasks)
          if (t.destination == w && t.slice.contains(at)) {
            ++covered;
            // The holders are exactly the source workers whose tile has this element.
            std::vector<int> holders;
            for (int s = 0; s < k.source.workers(); ++s)
              if (tile(k.source, k.source_layout, k.shape, s).contains(at)) holders.push_back(s);
            EXPECT_EQ(t.holders, holders);
          }
        EXPECT_EQ(covered, 1) << "destination " << w;
      });
    }
    // Nothing outside a destination's tile is sent to it.
    for (const auto& t : tasks) {
      const Box wanted = tile(k.destination, k.destination_layout, k.shape, t.destination);
      EXPECT_EQ(intersect(t.slice, wanted), t.slice);
    }
  }
}

TEST(Reshard, EveryStrategyDeliversEachTileAndBroadcastSendsLess) {
  Rng rng(12);
  for (int trial = 0; trial < 200; ++trial) {
    const Case k = random_case(rng);
    SCOPED_TRACE(str("trial ", trial));
    const auto tasks = plan_reshard(k.source, k.source_layout, k.destination, k.destination_layout, k.shape);
    std::int64_t sent[3] = {};
    for (ReshardStrategy strategy :
         {ReshardStrategy::kSendRecv, ReshardStrategy::kBroadcast, ReshardStrategy::kLocalAllGather}) {
      const auto plan = schedule_reshard(tasks, strategy, k.source.workers(), k.destination.workers());
      for (int w = 0; w < k.destination.workers(); ++w) {
        const auto whole = tile(k.destination, k.destination_layout, k.shape, w).elements();
        const auto i = static_cast<std::size_t>(w);
        EXPECT_EQ(plan.destination_received[i] + plan.destination_gathered[i], whole)
            << to_string(strategy) << " destination " << w;
      }
      // Each transfer's sender holds the slice.
      for (const auto& t : plan.transfers)
        EXPECT_EQ(intersect(tile(k.source, k.source_layout, k.shape, t.sender), t.slice), t.slice);
      for (auto n : plan.source_sent) sent[static_cast<int>(strategy)] += n;
    }
    EXPECT_LE(sent[1], sent[0]);  // a multicast leaves its sender once
  }
}

// 1 → 4 workers, the destination replicating the tensor: send-recv sends it 4 times from the
// one source, broadcast once; local all-gather sends a quarter to each and gathers.
TEST(Reshard, OneToManyReplicated) {
  const Mesh one{{1}}, four{{4}};
  const std::vector<std::int64_t> shape{8, 16};
  const auto tasks = plan_reshard(one, parse_layout("R,R"), four, parse_layout("R,R"), shape);
  ASSERT_EQ(tasks.size(), 4u);
  const auto naive = schedule_reshard(tasks, ReshardStrategy::kSendRecv, 1, 4);
  const auto multicast = schedule_reshard(tasks, ReshardStrategy::kBroadcast, 1, 4);
  const auto gather = schedule_reshard(tasks, ReshardStrategy::kLocalAllGather, 1, 4);
  EXPECT_EQ(naive.source_sent[0], 4 * 128);
  EXPECT_EQ(multicast.source_sent[0], 128);
  EXPECT_EQ(gather.source_sent[0], 128);
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(gather.destination_received[w], 32);
    EXPECT_EQ(gather.destination_gathered[w], 96);
  }
  EXPECT_NE(describe(gather).find("all-gathered by 0,1,2,3"), std::string::npos) << describe(gather);
}

// Senders are balanced: a tensor replicated on 2 source workers goes to 2 destinations
// from both, not twice from the first.
TEST(Reshard, SendersBalancedByBytes) {
  const Mesh two{{2}};
  const std::vector<std::int64_t> shape{4, 6};
  const auto tasks = plan_reshard(two, parse_layout("R,R"), two, parse_layout("S0,R"), shape);
  const auto plan = schedule_reshard(tasks, ReshardStrategy::kSendRecv, 2, 2);
  EXPECT_EQ(plan.source_sent[0], 12);
  EXPECT_EQ(plan.source_sent[1], 12);
}

TEST(Reshard, BadLayoutsNameTheMeshDimensionAndAxis) {
  const Mesh mesh{{2, 3}};
  const std::vector<std::int64_t> shape{4, 5};
  auto expect_error = [&](const Layout& layout, const std::string& words) {
    try {
      check_layout(mesh, layout, shape, "stage 1's mesh");
      ADD_FAILURE() << words << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("stage 1's mesh"), std::string::npos) << e.what();
    }
  };
  expect_error(parse_layout("S0,S1"), "dimension 1 (5) does not split evenly over axis 1 (3 workers)");
  expect_error(parse_layout("S0,S0"), "axis 0 splits two dimensions");
  expect_error(parse_layout("S2,R"), "dimension 0 is split over axis 2, but the mesh has 2 axes");
  expect_error(parse_layout("R"), "has 1 dimensions, the tensor 2");
  EXPECT_THROW(parse_layout("S0,X"), Error);
  EXPECT_THROW(parse_reshard_strategy("multicast"), Error);
}

}  // namespace
