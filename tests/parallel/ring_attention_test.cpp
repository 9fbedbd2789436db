// RingAttention against its serial twin, LocalAttention over the whole sequence: SP ranks
// as threads of one ThreadGroup, each holding the tokens its split gives it; output, lse,
// dQ, dK and dV gathered back by position and compared by normalized error ‖a − b‖/‖b‖
// ≤ 1e-5, on fresh random inputs. Sweeps SP = 1, 2, 3, 4, 8 × causal or not × zigzag or
// contiguous × online softmax or RSA, with batch and heads > 1, and small blocks so that
// every rank has several query tiles and travelling units (a partial last one included).
#include "test_support/normalized_error.h"
#include "test_support/cluster.h"
#include "peertrain/parallel/ring_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "peertrain/comm/thread_group.h"
#include "peertrain/core/error.h"
#include "peertrain/core/rng.h"

namespace peertrain::parallel {
namespace {

using model::AttentionShape;

// Each rank on a thread of its own; the first failure is rethrown (test_support/cluster.h).
void run_ranks(int n, const std::function<void(int)>& body) { peertrain::testing::run_peers(n, body); }

std::vector<float> random_vector(std::size_t n, Rng& rng) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

// Rows of `full` ([bh][T][width]) at the given positions, and back.
std::vector<float> gather(const std::vector<float>& full, int heads, int T, int width, const std::vector<int>& pos) {
  const int tl = static_cast<int>(pos.size());
  std::vector<float> local(static_cast<std::size_t>(heads) * tl * width);
  for (int h = 0; h < heads; ++h)
    for (int t = 0; t < tl; ++t)
      std::copy_n(full.begin() + (static_cast<std::ptrdiff_t>(h) * T + pos[t]) * width, width,
                  local.begin() + (static_cast<std::ptrdiff_t>(h) * tl + t) * width);
  return local;
}

void scatter(const std::vector<float>& local, int heads, int T, int width, const std::vector<int>& pos,
             std::vector<float>& full) {
  const int tl = static_cast<int>(pos.size());
  for (int h = 0; h < heads; ++h)
    for (int t = 0; t < tl; ++t)
      std::copy_n(local.begin() + (static_cast<std::ptrdiff_t>(h) * tl + t) * width, width,
                  full.begin() + (static_cast<std::ptrdiff_t>(h) * T + pos[t]) * width);
}

struct Case {
  int sp = 1;
  bool causal = true;
  SequenceSplit split = SequenceSplit::kZigzag;
  RingMode mode = RingMode::kOnlineSoftmax;
  int batch = 2, heads = 3, head_dim = 8, tokens = 48;
  int block = 4;
};

struct Errors {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;
  std::vector<long long> work;
  std::vector<std::size_t> peak, planned;
};

Errors compare_with_local(const Case& c, std::uint64_t seed) {
  const int T = c.tokens, d = c.head_dim, heads = c.batch * c.heads;
  AttentionShape full{c.batch, c.heads, d, T, c.causal};
  Rng rng(seed);
  const std::size_t n = static_cast<std::size_t>(full.elements());
  const auto q = random_vector(n, rng), k = random_vector(n, rng), v = random_vector(n, rng),
             dout = random_vector(n, rng);
  std::vector<int> all(T);
  for (int t = 0; t < T; ++t) all[t] = t;
  std::vector<float> out_ref(n), lse_ref(static_cast<std::size_t>(full.rows())), dq_ref(n), dk_ref(n), dv_ref(n);
  model::LocalAttention local;
  local.forward(full, all, q.data(), k.data(), v.data(), out_ref.data(), lse_ref.data());
  local.backward(full, all, q.data(), k.data(), v.data(), out_ref.data(), lse_ref.data(), dout.data(), dq_ref.data(),
                 dk_ref.data(), dv_ref.data());

  std::vector<float> out(n), lse(lse_ref.size()), dq(n), dk(n), dv(n);
  Errors e;
  e.work.assign(c.sp, 0);
  e.peak.assign(2 * c.sp, 0);
  e.planned.assign(2 * c.sp, 0);
  comm::ThreadGroup group(c.sp, "test sequence group");
  std::mutex mutex;
  run_ranks(c.sp, [&](int rank) {
    const auto pos = sequence_positions(T, c.sp, rank, c.split);
    const int tl = static_cast<int>(pos.size());
    const AttentionShape shape{c.batch, c.heads, d, tl, c.causal};
    const auto lq = gather(q, heads, T, d, pos), lk = gather(k, heads, T, d, pos), lv = gather(v, heads, T, d, pos),
               ldout = gather(dout, heads, T, d, pos);
    std::vector<float> lout(lq.size()), llse(static_cast<std::size_t>(shape.rows())), ldq(lq.size()), ldk(lq.size()),
        ldv(lq.size());
    RingAttention ring(group.member(rank), c.mode, 30.0, c.block);
    ring.forward(shape, pos, lq.data(), lk.data(), lv.data(), lout.data(), llse.data());
    const long long forward_work = ring.work();
    const std::size_t forward_peak = ring.peak_bytes();
    ring.backward(shape, pos, lq.data(), lk.data(), lv.data(), lout.data(), llse.data(), ldout.data(), ldq.data(),
                  ldk.data(), ldv.data());
    std::lock_guard lock(mutex);
    scatter(lout, heads, T, d, pos, out);
    scatter(llse, heads, T, 1, pos, lse);
    scatter(ldq, heads, T, d, pos, dq);
    scatter(ldk, heads, T, d, pos, dk);
    scatter(ldv, heads, T, d, pos, dv);
    e.work[rank] = forward_work;
    e.peak[2 * rank] = forward_peak;
    e.peak[2 * rank + 1] = ring.peak_bytes();
    e.planned[2 * rank] = RingAttention::planned_peak_bytes(shape, c.sp, c.mode, false, c.block);
    e.planned[2 * rank + 1] = RingAttention::planned_peak_bytes(shape, c.sp, c.mode, true, c.block);
  });
  e.out = normalized_error(out, out_ref);
  e.lse = normalized_error(lse, lse_ref);
  e.dq = normalized_error(dq, dq_ref);
  e.dk = normalized_error(dk, dk_ref);
  e.dv = normalized_error(dv, dv_ref);
  return e;
}

constexpr double kTolerance = 1e-5;

TEST(RingAttention, MatchesLocalAttentionOverTheWholeSequence) {
  std::uint64_t seed = 1;
  double worst = 0;
  for (int sp : {1, 2, 3, 4, 8})
    for (bool causal : {true, false})
      for (SequenceSplit split : {SequenceSplit::kZigzag, SequenceSplit::kContiguous})
        for (RingMode mode : {RingMode::kOnlineSoftmax, RingMode::kRsa}) {
          Case c;
          c.sp = sp;
          c.causal = causal;
          c.split = split;
          c.mode = mode;
          SCOPED_TRACE(::testing::Message() << "SP=" << sp << " causal=" << causal << " " << to_string(split) << " "
                                            << to_string(mode));
          const Errors e = compare_with_local(c, seed++);
          EXPECT_LE(e.out, kTolerance);
          EXPECT_LE(e.lse, kTolerance);
          EXPECT_LE(e.dq, kTolerance);
          EXPECT_LE(e.dk, kTolerance);
          EXPECT_LE(e.dv, kTolerance);
          EXPECT_EQ(e.peak, e.planned) << "the accounting formula and the run disagree";
          worst = std::max({worst, e.out, e.lse, e.dq, e.dk, e.dv});
        }
  std::cout << "largest normalized error over 40 configurations: " << worst << "\n";
}

// A case against local attention on fresh random data, every error within the tolerance,
// and the meter equal to the accounting formula.
void expect_matches_and_planned(const Case& c, std::uint64_t seed) {
  const Errors e = compare_with_local(c, seed);
  EXPECT_LE(std::max({e.out, e.lse, e.dq, e.dk, e.dv}), kTolerance)
      << "out " << e.out << " lse " << e.lse << " dq " << e.dq << " dk " << e.dk << " dv " << e.dv;
  EXPECT_EQ(e.peak, e.planned);
}

TEST(RingAttention, MatchesWithOneBlockPerRankAndLongerSequences) {
  // The default block (256 tokens): a rank's keys of a (sequence, head) in one block (at
  // SP 4 both heads travel as one unit); and T where a rank's tokens are not a multiple of
  // the block.
  std::uint64_t seed = 100;
  for (int sp : {2, 4})
    for (RingMode mode : {RingMode::kOnlineSoftmax, RingMode::kRsa})
      for (int block : {256, 48}) {
        Case c;
        c.sp = sp;
        c.mode = mode;
        c.tokens = 320;
        c.batch = 1;
        c.heads = 2;
        c.head_dim = 16;
        c.block = block;
        SCOPED_TRACE(::testing::Message() << "SP=" << sp << " " << to_string(mode) << " block=" << block);
        expect_matches_and_planned(c, seed++);
      }
}

// Where a (sequence, head)'s keys on a rank fit one block, whole heads travel together, up
// to a block of keys a unit; the last unit of a pass may hold fewer. Against local
// attention, with the meter equal to the formula, for groups of 2 (9 pairs: 5 units, the
// last of one head) and of 4 (3 units: 4, 4, 1).
TEST(RingAttention, MatchesWhenWholeHeadsTravelTogether) {
  EXPECT_EQ(RingAttention::ring_units({.batch = 12, .heads = 4, .tokens = 32}), 6);  // 8 heads a unit
  EXPECT_EQ(RingAttention::ring_units({.batch = 3, .heads = 3, .tokens = 32}, 64), 5);
  EXPECT_EQ(RingAttention::ring_units({.batch = 3, .heads = 3, .tokens = 16}, 64), 3);
  EXPECT_EQ(RingAttention::ring_units({.batch = 1, .heads = 5, .tokens = 256}), 5);  // a head fills a block
  EXPECT_EQ(RingAttention::ring_units({.batch = 1, .heads = 3, .tokens = 300}), 6);  // 2 blocks a head
  std::uint64_t seed = 300;
  for (int sp : {2, 4})
    for (bool causal : {true, false}) {
      Case c;
      c.sp = sp;
      c.causal = causal;
      c.batch = 3;
      c.heads = 3;
      c.head_dim = 8;
      c.tokens = 64;
      c.block = 64;
      SCOPED_TRACE(::testing::Message() << "SP=" << sp << (causal ? " causal" : " full"));
      expect_matches_and_planned(c, seed++);
    }
}

TEST(RingAttention, ZigzagBalancesTheCausalWorkAndContiguousDoesNot) {
  auto imbalance = [](const std::vector<long long>& work) {
    double total = 0;
    for (long long w : work) total += static_cast<double>(w);
    return static_cast<double>(*std::max_element(work.begin(), work.end())) / (total / work.size());
  };
  // Blocks of one zigzag chunk: exact balance. Blocks wider than a rank's tokens: query
  // tiles stop where positions jump, but the middle rank's two chunks are adjacent and make
  // one tile, computed as wide as its later half needs (8% more at these sizes).
  for (int block : {8, 256}) {
    Case c;
    c.sp = 4;
    c.tokens = 64;
    c.block = block;
    c.split = SequenceSplit::kZigzag;
    const double zigzag = imbalance(compare_with_local(c, 7).work);
    c.split = SequenceSplit::kContiguous;
    const double contiguous = imbalance(compare_with_local(c, 8).work);
    EXPECT_LT(zigzag, block == 8 ? 1.0 + 1e-9 : 1.1) << "block " << block;
    EXPECT_GT(contiguous, 1.5) << "block " << block;
  }
}

TEST(SequencePositions, ContiguousAndZigzagChunks) {
  EXPECT_EQ(sequence_positions(8, 2, 1, SequenceSplit::kContiguous), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(sequence_positions(16, 4, 1, SequenceSplit::kZigzag), (std::vector<int>{2, 3, 12, 13}));
  EXPECT_EQ(sequence_positions(16, 4, 3, SequenceSplit::kZigzag), (std::vector<int>{6, 7, 8, 9}));
  EXPECT_EQ(sequence_positions(6, 1, 0, SequenceSplit::kZigzag), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  // Every position exactly once over the ranks.
  for (int sp : {1, 2, 3, 8}) {
    std::vector<int> seen(48, 0);
    for (int r = 0; r < sp; ++r)
      for (int p : sequence_positions(48, sp, r, SequenceSplit::kZigzag)) ++seen[p];
    EXPECT_EQ(seen, std::vector<int>(48, 1)) << "SP=" << sp;
  }
}

TEST(SequencePositions, RejectsASequenceTheSplitDoesNotDivide) {
  for (auto [tokens, sp, split] : {std::tuple{50, 4, SequenceSplit::kZigzag}, std::tuple{12, 8, SequenceSplit::kContiguous},
                                   std::tuple{12, 4, SequenceSplit::kZigzag}}) {
    try {
      (void)sequence_positions(tokens, sp, 0, split);
      ADD_FAILURE() << "T=" << tokens << " SP=" << sp << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      const std::string message = e.what();
      EXPECT_NE(message.find(str("T=", tokens)), std::string::npos) << message;
      EXPECT_NE(message.find(str("SP=", sp)), std::string::npos) << message;
      EXPECT_NE(message.find("not padded"), std::string::npos) << message;
    }
  }
  EXPECT_THROW((void)sequence_positions(16, 4, 4, SequenceSplit::kZigzag), Error);
  EXPECT_THROW((void)sequence_positions(16, 0, 0, SequenceSplit::kZigzag), Error);
}

TEST(RingAttention, ParsesItsFlags) {
  EXPECT_EQ(parse_sequence_split("zigzag"), SequenceSplit::kZigzag);
  EXPECT_EQ(parse_sequence_split("contiguous"), SequenceSplit::kContiguous);
  EXPECT_EQ(parse_ring_mode("ring"), RingMode::kOnlineSoftmax);
  EXPECT_EQ(parse_ring_mode("online"), RingMode::kOnlineSoftmax);
  EXPECT_EQ(parse_ring_mode("rsa"), RingMode::kRsa);
  try {
    (void)parse_ring_mode("flash", "--ring-mode");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--ring-mode 'flash'"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)parse_sequence_split("striped"), Error);
}

TEST(RingAttention, RanksThatDisagreeOnTheShapeAllFail) {
  comm::ThreadGroup group(3, "test sequence group");
  std::vector<std::optional<ErrorKind>> kinds(3);
  run_ranks(3, [&](int rank) {
    const int tl = rank == 2 ? 5 : 4;
    const AttentionShape shape{1, 1, 4, tl, true};
    std::vector<int> pos(tl);
    for (int t = 0; t < tl; ++t) pos[t] = rank * 8 + t;
    std::vector<float> x(static_cast<std::size_t>(shape.elements()), 1.0f), out(x.size()), lse(tl);
    RingAttention ring(group.member(rank), RingMode::kOnlineSoftmax, 10.0);
    try {
      ring.forward(shape, pos, x.data(), x.data(), x.data(), out.data(), lse.data());
    } catch (const Error& e) {
      kinds[rank] = e.kind();
    }
  });
  for (const auto& kind : kinds) EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
}

TEST(RingAttention, ARankThatNeverComesIsATimeoutNotAHang) {
  comm::ThreadGroup group(2, "test sequence group");
  const AttentionShape shape{1, 1, 4, 4, true};
  const std::vector<int> pos = {0, 1, 2, 3};
  std::vector<float> x(16, 1.0f), out(16), lse(4);
  RingAttention ring(group.member(0), RingMode::kOnlineSoftmax, 0.2);
  try {
    ring.forward(shape, pos, x.data(), x.data(), x.data(), out.data(), lse.data());
    ADD_FAILURE() << "forward returned without its partner";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("test sequence group"), std::string::npos) << e.what();
  }
}

TEST(RingAttention, AFailedRankEndsTheOthersAtOnce) {
  comm::ThreadGroup group(3, "test sequence group");
  std::vector<std::optional<ErrorKind>> kinds(3);
  const auto start = std::chrono::steady_clock::now();
  run_ranks(3, [&](int rank) {
    if (rank == 2) {  // a worker that failed before its attention call
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      group.member(2).abort("worker 2 failed");
      return;
    }
    const AttentionShape shape{1, 2, 4, 8, true};
    const auto pos = sequence_positions(24, 3, rank, SequenceSplit::kContiguous);
    std::vector<float> x(static_cast<std::size_t>(shape.elements()), 1.0f), out(x.size()), lse(16);
    RingAttention ring(group.member(rank), RingMode::kOnlineSoftmax, 30.0);
    try {
      ring.forward(shape, pos, x.data(), x.data(), x.data(), out.data(), lse.data());
    } catch (const Error& e) {
      kinds[rank] = e.kind();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(kinds[0], ErrorKind::kPeerLost);
  EXPECT_EQ(kinds[1], ErrorKind::kPeerLost);
}

}  // namespace
}  // namespace peertrain::parallel
