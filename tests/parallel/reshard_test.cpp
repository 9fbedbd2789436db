// The cross-mesh resharding planner against brute force: on random shapes, meshes and
// layouts every destination element is covered by exactly one slice, every holder of a
// slice holds it, and no source worker that holds it is left out; every strategy delivers
// each destination its whole tile.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <thread>

#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"
#include "peertrain/comm/thread_group.h"
#include "peertrain/parallel/reshard.h"
#include "peertrain/parallel/reshard_exchange.h"

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

struct ReshardCase {
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
    layout.zigzag.push_back(layout.split_axis.back() >= 0 && rng.uniform_below(3) == 0);  // sometimes Z<axis>
    if (a >= 0) used[a] = true;
  }
  return layout;
}

// The boxes' union holds `at`.
bool holds(const std::vector<Box>& boxes, std::span<const std::int64_t> at) {
  return std::any_of(boxes.begin(), boxes.end(), [&](const Box& b) { return b.contains(at); });
}
std::int64_t elements(const std::vector<Box>& boxes) {
  std::int64_t n = 0;
  for (const Box& b : boxes) n += b.elements();
  return n;
}

ReshardCase random_case(Rng& rng) {
  ReshardCase k;
  k.source = random_mesh(rng);
  k.destination = random_mesh(rng);
  const int rank = 1 + static_cast<int>(rng.uniform_below(3));
  k.source_layout = random_layout(rng, k.source, rank);
  k.destination_layout = random_layout(rng, k.destination, rank);
  // Each dimension a multiple of whatever splits it on either side, times a little more.
  for (int d = 0; d < rank; ++d) {
    std::int64_t n = 1;
    for (const auto& [mesh, layout] : {std::pair{&k.source, &k.source_layout}, {&k.destination, &k.destination_layout}})
      if (layout->split_axis[d] >= 0)
        n = std::lcm(n, static_cast<std::int64_t>(mesh->axes[layout->split_axis[d]]) * (layout->is_zigzag(d) ? 2 : 1));
    k.shape.push_back(n * (1 + static_cast<std::int64_t>(rng.uniform_below(3))));
  }
  return k;
}

TEST(Reshard, EveryDestinationElementOnceFromASourceThatHoldsIt) {
  Rng rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const ReshardCase k = random_case(rng);
    SCOPED_TRACE(str("trial ", trial, ": ", to_string(k.source_layout), " -> ", to_string(k.destination_layout)));
    const auto tasks = plan_reshard(k.source, k.source_layout, k.destination, k.destination_layout, k.shape);
    // Brute force over every element of the tensor: a destination that holds it receives it
    // in exactly one slice, whose holders are exactly the source workers that hold it.
    Box whole;
    for (auto n : k.shape) {
      whole.lo.push_back(0);
      whole.hi.push_back(n);
    }
    for_each_index(whole, [&](const std::vector<std::int64_t>& at) {
      std::vector<int> holders;
      for (int s = 0; s < k.source.workers(); ++s)
        if (holds(tiles(k.source, k.source_layout, k.shape, s), at)) holders.push_back(s);
      for (int w = 0; w < k.destination.workers(); ++w) {
        int covered = 0;
        for (const auto& t : tasks)
          if (t.destination == w && t.slice.contains(at)) {
            ++covered;
            EXPECT_EQ(t.holders, holders);
          }
        EXPECT_EQ(covered, holds(tiles(k.destination, k.destination_layout, k.shape, w), at) ? 1 : 0)
            << "destination " << w;
      }
    });
  }
}

TEST(Reshard, ZigzagTilesAreSequenceParallelismsPieces) {
  // 16 tokens over 4 ranks zigzag: rank 1 holds pieces 1 and 6 of 8 (tokens 2–3 and 12–13).
  const Mesh four{{4}};
  const Layout zigzag = parse_layout("R,Z0");
  const std::vector<std::int64_t> shape{2, 16};
  const auto boxes = tiles(four, zigzag, shape, 1);
  ASSERT_EQ(boxes.size(), 2u);
  EXPECT_EQ(boxes[0], (Box{{0, 2}, {2, 4}}));
  EXPECT_EQ(boxes[1], (Box{{0, 12}, {2, 14}}));
  EXPECT_EQ(to_string(zigzag), "R,Z0");
  // From 2 zigzag ranks to 4: rank 1 of 4 (tokens 2–3, 12–13) gets both from rank 0 of 2
  // (tokens 0–3 and 12–15), none from rank 1 (tokens 4–11).
  const auto tasks = plan_reshard(Mesh{{2}}, zigzag, four, zigzag, shape);
  for (const auto& t : tasks) {
    if (t.destination == 1) {
      EXPECT_EQ(t.holders, std::vector<int>{0});
    }
  }
  EXPECT_THROW(check_layout(four, zigzag, std::vector<std::int64_t>{2, 12}, "stage 1's mesh"), Error);
}

TEST(Reshard, EveryStrategyDeliversEachTileAndBroadcastSendsLess) {
  Rng rng(12);
  for (int trial = 0; trial < 200; ++trial) {
    const ReshardCase k = random_case(rng);
    SCOPED_TRACE(str("trial ", trial));
    const auto tasks = plan_reshard(k.source, k.source_layout, k.destination, k.destination_layout, k.shape);
    std::int64_t sent[3] = {};
    for (ReshardStrategy strategy :
         {ReshardStrategy::kSendRecv, ReshardStrategy::kBroadcast, ReshardStrategy::kLocalAllGather}) {
      const auto plan = schedule_reshard(tasks, strategy, k.source.workers(), k.destination.workers());
      for (int w = 0; w < k.destination.workers(); ++w) {
        const auto whole = elements(tiles(k.destination, k.destination_layout, k.shape, w));
        const auto i = static_cast<std::size_t>(w);
        EXPECT_EQ(plan.destination_received[i] + plan.destination_gathered[i], whole)
            << to_string(strategy) << " destination " << w;
      }
      // Each transfer's sender holds the slice.
      for (const auto& t : plan.transfers) {  // the whole slice: it lies in one of its boxes
        bool inside = false;
        for (const Box& b : tiles(k.source, k.source_layout, k.shape, t.sender))
          inside |= intersect(b, t.slice) == t.slice;
        EXPECT_TRUE(inside);
      }
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

// The packed tile of `boxes` filled from the global tensor (value = its row-major index).
std::vector<float> packed_from_global(const std::vector<Box>& boxes, std::span<const std::int64_t> shape) {
  const PackedTile tile(boxes, shape);
  std::vector<float> local(static_cast<std::size_t>(tile.elements()));
  for (const Box& b : boxes) {
    std::vector<float> values;
    for_each_index(b, [&](const std::vector<std::int64_t>& at) {
      std::int64_t flat = 0;
      for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + at[d];
      values.push_back(static_cast<float>(flat));
    });
    tile.unpack(b, values, local);
  }
  return local;
}

TEST(Reshard, ExchangeOverThreadsDeliversEveryTileForEveryStrategy) {
  Rng rng(13);
  for (int trial = 0; trial < 60; ++trial) {
    const ReshardCase k = random_case(rng);
    const int S = k.source.workers(), D = k.destination.workers();
    for (ReshardStrategy strategy :
         {ReshardStrategy::kSendRecv, ReshardStrategy::kBroadcast, ReshardStrategy::kLocalAllGather}) {
      SCOPED_TRACE(str("trial ", trial, " ", to_string(strategy), ": ", to_string(k.source_layout), " -> ",
                       to_string(k.destination_layout)));
      std::vector<int> source_ranks(S), destination_ranks(D);
      std::iota(source_ranks.begin(), source_ranks.end(), 0);
      std::iota(destination_ranks.begin(), destination_ranks.end(), S);
      const auto x = plan_exchange(k.source, k.source_layout, source_ranks, k.destination, k.destination_layout,
                                   destination_ranks, k.shape, strategy);
      comm::ThreadGroup group(S + D, "reshard group");
      std::vector<std::vector<float>> got(static_cast<std::size_t>(D));
      std::vector<std::thread> threads;
      for (int r = 0; r < S + D; ++r)
        threads.emplace_back([&, r] {
          GroupLink link(group.member(r), 7, 10.0);
          if (r < S) {
            exchange_send(x, r, packed_from_global(tiles(k.source, k.source_layout, k.shape, r), k.shape), link);
          } else {
            auto& mine = got[static_cast<std::size_t>(r - S)];
            mine.assign(static_cast<std::size_t>(x.destination_tiles[static_cast<std::size_t>(r - S)].elements()),
                        -1.0f);
            exchange_receive(x, r - S, mine, link);
          }
          link.finish();
        });
      for (auto& t : threads) t.join();
      for (int w = 0; w < D; ++w)
        EXPECT_EQ(got[static_cast<std::size_t>(w)],
                  packed_from_global(tiles(k.destination, k.destination_layout, k.shape, w), k.shape))
            << "destination " << w;
    }
  }
}

}  // namespace
