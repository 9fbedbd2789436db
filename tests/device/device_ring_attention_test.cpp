// Ring attention on the device against whole-sequence attention (model::LocalAttention):
// SP ranks as threads over a ThreadGroup on the emulator's memory (NcclGroup on GPUs takes
// the same calls), both splits, causal and not; every output and gradient compared.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "test_support/normalized_error.h"
#include "peertrain/device/device_ring_attention.h"
#include "peertrain/kernels/device.h"
#include "peertrain/comm/thread_group.h"
#include "peertrain/model/attention.h"
#include "peertrain/parallel/ring_attention.h"

namespace peertrain::device {
namespace {

std::vector<float> random_floats(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(count);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(DeviceRingAttention, EqualsWholeSequenceAttention) {
  // Only the emulator: a ThreadGroup moves host memory, which the emulator's device memory
  // is; on a GPU the ring needs NcclGroup, one rank per device.
  if (!kernels::emulated()) GTEST_SKIP() << "runs on the CPU emulator (a GPU needs one device per rank)";
  const int rows = 2, tokens = 48, head_dim = 16;
  const std::size_t size = std::size_t(rows) * tokens * head_dim;
  const auto q = random_floats(size, 1), k = random_floats(size, 2), v = random_floats(size, 3),
             dout = random_floats(size, 4);
  for (bool causal : {true, false}) {
    std::vector<int> all(tokens);
    for (int t = 0; t < tokens; ++t) all[t] = t;
    model::AttentionShape shape{.batch = rows, .heads = 1, .head_dim = head_dim, .tokens = tokens, .causal = causal};
    std::vector<float> out(size), lse(std::size_t(rows) * tokens), dq(size), dk(size), dv(size);
    model::LocalAttention local;
    local.forward(shape, all, q.data(), k.data(), v.data(), out.data(), lse.data());
    local.backward(shape, all, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                   dv.data());
    for (int ranks : {1, 2, 3, 4})
      for (parallel::SequenceSplit split : {parallel::SequenceSplit::kZigzag, parallel::SequenceSplit::kContiguous}) {
        SCOPED_TRACE(::testing::Message() << "SP " << ranks << " " << parallel::to_string(split) << " causal "
                                          << causal);
        comm::ThreadGroup group(ranks, "ring test group");
        std::vector<float> got_out(size), got_lse(lse.size()), got_dq(size), got_dk(size), got_dv(size);
        std::vector<std::thread> threads;
        for (int r = 0; r < ranks; ++r)
          threads.emplace_back([&, r] {
            const std::vector<int> mine = parallel::sequence_positions(tokens, ranks, r, split);
            const int held = static_cast<int>(mine.size());
            const std::size_t part = std::size_t(rows) * held * head_dim;
            // [rows][held][head_dim] slices of the whole-sequence tensors, and back.
            auto gather = [&](const std::vector<float>& x) {
              std::vector<float> y(part);
              for (int row = 0; row < rows; ++row)
                for (int t = 0; t < held; ++t)
                  for (int e = 0; e < head_dim; ++e)
                    y[(std::size_t(row) * held + t) * head_dim + e] =
                        x[(std::size_t(row) * tokens + mine[t]) * head_dim + e];
              return y;
            };
            auto scatter = [&](const std::vector<float>& y, std::vector<float>& x, int width) {
              for (int row = 0; row < rows; ++row)
                for (int t = 0; t < held; ++t)
                  for (int e = 0; e < width; ++e)
                    x[(std::size_t(row) * tokens + mine[t]) * width + e] = y[(std::size_t(row) * held + t) * width + e];
            };
            auto upload = [](const auto& host) {
              kernels::DeviceArray<typename std::decay_t<decltype(host)>::value_type> d(host.size());
              kernels::copy_to_device(d.data(), host.data(), sizeof(host[0]) * host.size(), {});
              return d;
            };
            auto download = [](const kernels::DeviceArray<float>& d, std::size_t count) {
              std::vector<float> h(count);
              kernels::copy_to_host(h.data(), d.data(), sizeof(float) * count, {});
              return h;
            };
            auto dq_ = upload(gather(q)), dk_ = upload(gather(k)), dv_ = upload(gather(v)),
                 ddout = upload(gather(dout));
            auto pos = upload(mine);
            kernels::DeviceArray<float> o(part), l(std::size_t(rows) * held), gq(part), gk(part), gv(part);
            DeviceRingAttention ring(group.member(r), {}, 30);
            const kernels::AttentionDims dims{.rows = rows, .tq = held, .tk = held, .head_dim = head_dim,
                                              .causal = causal};
            ring.forward(dims, pos.data(), dq_.data(), dk_.data(), dv_.data(), o.data(), l.data());
            ring.backward(dims, pos.data(), dq_.data(), dk_.data(), dv_.data(), o.data(), l.data(), ddout.data(),
                          gq.data(), gk.data(), gv.data());
            scatter(download(o, part), got_out, head_dim);
            scatter(download(l, std::size_t(rows) * held), got_lse, 1);
            scatter(download(gq, part), got_dq, head_dim);
            scatter(download(gk, part), got_dk, head_dim);
            scatter(download(gv, part), got_dv, head_dim);
          });
        for (std::thread& t : threads) t.join();
        EXPECT_LT(normalized_error(got_out, out), 1e-5);
        EXPECT_LT(normalized_error(got_lse, lse), 1e-5);
        EXPECT_LT(normalized_error(got_dq, dq), 1e-5);
        EXPECT_LT(normalized_error(got_dk, dk), 1e-5);
        EXPECT_LT(normalized_error(got_dv, dv), 1e-5);
      }
  }
}

}  // namespace
}  // namespace peertrain::device
