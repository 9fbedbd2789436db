#include "peertrain/parallel/vocab_parallel.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "peertrain/core/aligned.h"
#include "peertrain/core/error.h"

namespace peertrain::parallel {
namespace {

using Strided = Eigen::Map<const Eigen::MatrixXf, 0, Eigen::OuterStride<>>;
using MutableStrided = Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>>;
using Matrix = Eigen::Map<Eigen::MatrixXf>;
using ConstMatrix = Eigen::Map<const Eigen::MatrixXf>;

// The statistics of one column on one rank, relative to its local maximum: the maximum
// m, Σ e^(logit − m), the target's logit (0 elsewhere), 1 where the target is here, and the
// argmax's vocabulary id.
constexpr int kStats = 5;

}  // namespace

VocabParallel parse_vocab_parallel(std::string_view text, std::string_view flag) {
  if (text == "none") return VocabParallel::kNone;
  if (text == "vocab-1") return VocabParallel::kVocab1;
  if (text == "vocab-2") return VocabParallel::kVocab2;
  throw Error(ErrorKind::kInvalidArgument, str(flag, " '", text, "': expected none, vocab-1 or vocab-2"));
}

std::string_view to_string(VocabParallel mode) {
  return mode == VocabParallel::kNone ? "none" : mode == VocabParallel::kVocab1 ? "vocab-1" : "vocab-2";
}

VocabShard vocab_shard(int vocab, int ranks, int rank) {
  if (ranks < 1 || vocab % ranks != 0)
    throw Error(ErrorKind::kInvalidArgument, str("--vocab-size ", vocab, " does not split evenly over --pp ", ranks,
                                                 " stages (vocabulary parallelism gives each V/p rows)"));
  PEERTRAIN_CHECK(rank >= 0 && rank < ranks, "rank ", rank, " of ", ranks);
  return {rank * (vocab / ranks), vocab / ranks};
}

double vocab_parallel_cross_entropy(comm::Group& group, VocabParallel mode, VocabShard shard, int vocab, int d,
                                    bool tied, const float* w, const float* y, int n,
                                    std::span<const std::int32_t> targets, float grad_scale, float* dy, float* dw,
                                    long long* correct, double timeout_s) {
  PEERTRAIN_CHECK(mode != VocabParallel::kNone, "vocab_parallel_cross_entropy without a mode");
  PEERTRAIN_CHECK(static_cast<int>(targets.size()) == n, targets.size(), " targets for ", n, " columns");
  const int p = group.size(), rows = shard.count;
  // This rank's rows of W as a rows × d matrix, copied once (a strided view multiplies
  // slowly): rows [first, first + rows) of lm_head (V × d, so a row stride of V), or
  // columns of wte (d × V) transposed for a tied head.
  const Eigen::MatrixXf weights =
      tied
          ? Eigen::MatrixXf(
                Strided(w + static_cast<std::ptrdiff_t>(shard.first) * d, d, rows, Eigen::OuterStride<>(d)).transpose())
          : Eigen::MatrixXf(Strided(w + shard.first, rows, d, Eigen::OuterStride<>(vocab)));
  const ConstMatrix Y(y, d, n);
  Eigen::MatrixXf logits = weights * Y;  // rows × n
  const std::size_t dn = static_cast<std::size_t>(d) * n;
  // What this rank sends: kStats floats per column (see above), and for vocab-1 also
  // A = Wᵀ·e^(L − m) and B = Wᵀ·onehot, the forward and the input gradient fused before
  // the one barrier.
  const std::size_t part = static_cast<std::size_t>(kStats) * n + (mode == VocabParallel::kVocab1 ? 2 * dn : 0);
  AlignedVector<float> send(part), all(part * static_cast<std::size_t>(p));
  Eigen::MatrixXf shifted(rows, n);  // e^(L − m), the local maximum m of each column
  for (int j = 0; j < n; ++j) {
    Eigen::Index argmax = 0;
    const float m = logits.col(j).maxCoeff(&argmax);
    shifted.col(j) = (logits.col(j).array() - m).exp().matrix();
    const int t = targets[static_cast<std::size_t>(j)] - shard.first;
    const bool here = t >= 0 && t < rows;
    float* st = send.data() + static_cast<std::ptrdiff_t>(kStats) * j;
    st[0] = m;
    st[1] = shifted.col(j).sum();
    st[2] = here ? logits(t, j) : 0.0f;
    st[3] = here ? 1.0f : 0.0f;
    st[4] = static_cast<float>(argmax + shard.first);
  }
  if (mode == VocabParallel::kVocab1) {
    float* a_part = send.data() + static_cast<std::ptrdiff_t>(kStats) * n;
    Matrix(a_part, d, n).noalias() = weights.transpose() * shifted;
    // Wᵀ·onehot is the target's row of W where this rank holds the target, else zero.
    Matrix b_part(a_part + dn, d, n);
    for (int j = 0; j < n; ++j) {
      const int t = targets[static_cast<std::size_t>(j)] - shard.first;
      if (t >= 0 && t < rows)
        b_part.col(j) = weights.row(t).transpose();
      else
        b_part.col(j).setZero();
    }
  }
  group.all_gather(send, all, timeout_s);  // the barrier (vocab-2's first)
  // The whole vocabulary's statistics, combined the online-softmax way.
  std::vector<float> M(static_cast<std::size_t>(n)), S(static_cast<std::size_t>(n));
  double loss = 0;
  long long right = 0;
  for (int j = 0; j < n; ++j) {
    float best = -std::numeric_limits<float>::infinity(), target_logit = 0, best_id = 0;
    for (int r = 0; r < p; ++r) {
      const float* st = all.data() + static_cast<std::size_t>(r) * part + static_cast<std::size_t>(kStats) * j;
      if (st[0] > best) {
        best = st[0];
        best_id = st[4];
      }
      target_logit += st[2];
    }
    double sum = 0;
    for (int r = 0; r < p; ++r) {
      const float* st = all.data() + static_cast<std::size_t>(r) * part + static_cast<std::size_t>(kStats) * j;
      sum += static_cast<double>(st[1]) * std::exp(static_cast<double>(st[0]) - best);
    }
    M[static_cast<std::size_t>(j)] = best;
    S[static_cast<std::size_t>(j)] = static_cast<float>(sum);
    loss += std::log(sum) + best - target_logit;
    right += static_cast<int>(best_id) == targets[static_cast<std::size_t>(j)];
  }
  if (correct != nullptr) *correct += right;
  // The gradient of the logits: (softmax − onehot)·grad_scale on this rank's rows.
  Eigen::MatrixXf g(rows, n);
  for (int j = 0; j < n; ++j) {
    g.col(j) =
        ((logits.col(j).array() - M[static_cast<std::size_t>(j)]).exp() * (grad_scale / S[static_cast<std::size_t>(j)]))
            .matrix();
    const int t = targets[static_cast<std::size_t>(j)] - shard.first;
    if (t >= 0 && t < rows) g(t, j) -= grad_scale;
  }
  // The weight gradient of this rank's rows: g·yᵀ (rows × d).
  const Eigen::MatrixXf dw_rows = g * Y.transpose();
  if (tied) {
    MutableStrided(dw + static_cast<std::ptrdiff_t>(shard.first) * d, d, rows, Eigen::OuterStride<>(d)) +=
        dw_rows.transpose();
  } else {
    MutableStrided(dw + shard.first, rows, d, Eigen::OuterStride<>(vocab)) += dw_rows;
  }
  Matrix DY(dy, d, n);
  if (mode == VocabParallel::kVocab2) {
    DY.noalias() = weights.transpose() * g;
    group.all_reduce(std::span<float>(dy, dn), timeout_s);  // the second barrier
  } else {
    DY.setZero();
    for (int r = 0; r < p; ++r) {
      const float* base = all.data() + static_cast<std::size_t>(r) * part;
      const ConstMatrix A(base + static_cast<std::ptrdiff_t>(kStats) * n, d, n);
      const ConstMatrix B(base + static_cast<std::ptrdiff_t>(kStats) * n + static_cast<std::ptrdiff_t>(dn), d, n);
      for (int j = 0; j < n; ++j) {
        const float scale = std::exp(base[static_cast<std::size_t>(kStats) * j] - M[static_cast<std::size_t>(j)]) /
                            S[static_cast<std::size_t>(j)];
        DY.col(j) += grad_scale * (scale * A.col(j) - B.col(j));
      }
    }
  }
  return loss;
}

}  // namespace peertrain::parallel
