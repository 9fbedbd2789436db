#include "peertrain/parallel/vocab_parallel.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "peertrain/core/aligned.h"
#include "peertrain/core/error.h"
#include "matrix_views.h"

namespace peertrain::parallel {
namespace {

using namespace views;

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

void vocab_embedding_forward(VocabShard shard, int d, std::span<const std::int32_t> ids, const float* wte, float* out) {
  for (std::size_t j = 0; j < ids.size(); ++j) {
    float* column = out + j * d;
    const int id = ids[j];
    if (id >= shard.first && id < shard.first + shard.count)
      std::copy_n(wte + static_cast<std::ptrdiff_t>(id) * d, d, column);
    else
      std::fill_n(column, d, 0.0f);
  }
}

void vocab_embedding_backward(VocabShard shard, int d, std::span<const std::int32_t> ids, const float* dout,
                              float* dwte) {
  for (std::size_t j = 0; j < ids.size(); ++j) {
    const int id = ids[j];
    if (id < shard.first || id >= shard.first + shard.count) continue;
    Eigen::Map<Eigen::ArrayXf>(dwte + static_cast<std::ptrdiff_t>(id) * d, d) +=
        Eigen::Map<const Eigen::ArrayXf>(dout + j * d, d);
  }
}

void check_vocab_parallel(VocabParallel mode, const model::TransformerConfig& model, int stages) {
  if (mode == VocabParallel::kNone) return;
  const auto name = to_string(mode);
  if (model.kind != model::TransformerKind::kGpt)
    throw Error(ErrorKind::kInvalidArgument,
                str("--vocab-parallel ", name, ": splits gpt's vocabulary; --model vit has none"));
  if (stages < 2)
    throw Error(ErrorKind::kInvalidArgument,
                str("--vocab-parallel ", name, " with --pp ", stages,
                    ": splits the vocabulary over the pipeline's stages, needs 2 or more"));
  vocab_shard(model.vocab, stages, 0);  // names --vocab-size and --pp when p does not divide V
}

namespace {

// This rank's rows of W as a rows × d matrix, copied (a strided view multiplies slowly):
// rows [first, first + rows) of lm_head (V × d, so a row stride of V), or columns of wte
// (d × V) transposed for a tied head.
void copy_rows(VocabShard shard, int vocab, int d, bool tied, const float* w, Eigen::MatrixXf& weights) {
  if (tied)
    weights =
        Strided(w + static_cast<std::ptrdiff_t>(shard.first) * d, d, shard.count, Eigen::OuterStride<>(d)).transpose();
  else
    weights = Strided(w + shard.first, shard.count, d, Eigen::OuterStride<>(vocab));
}

}  // namespace

std::size_t VocabOutputState::bytes() const {
  return sizeof(float) * (static_cast<std::size_t>(e.size()) + y.size() + local_max.size() + M.size() + S.size());
}

double vocab_output_forward(comm::Group& group, VocabParallel mode, VocabShard shard, int vocab, int d, bool tied,
                            const float* w, const float* y, int n, std::span<const std::int32_t> targets,
                            float grad_scale, VocabOutputState& state, float* dy, long long* correct,
                            double timeout_s) {
  PEERTRAIN_CHECK(mode != VocabParallel::kNone, "vocab_output_forward without a mode");
  PEERTRAIN_CHECK(static_cast<int>(targets.size()) == n, targets.size(), " targets for ", n, " columns");
  PEERTRAIN_CHECK(mode == VocabParallel::kVocab2 || dy != nullptr, "vocab-1 forms dy in its forward");
  const int p = group.size(), rows = shard.count;
  const std::size_t dn = static_cast<std::size_t>(d) * n;
  // Buffers kept per thread: at 32k/4 rows × 128 columns each call would otherwise take
  // ~16 MB of fresh pages, a page fault every 4 KB.
  thread_local Eigen::MatrixXf weights;
  thread_local AlignedVector<float> send, all;
  copy_rows(shard, vocab, d, tied, w, weights);
  state.n = n;
  state.y.assign(y, y + dn);  // for the weight gradient in T
  const ConstMatrix Y(state.y.data(), d, n);
  Eigen::MatrixXf& e = state.e;
  e.resize(rows, n);
  e.noalias() = weights * Y;  // the logits, then in place e^(L − m), then (in T) the logits' gradient
  // What this rank sends: kStats floats per column (see above), and for vocab-1 also
  // A = Wᵀ·e^(L − m) and B = Wᵀ·onehot, the forward and the input gradient fused before
  // the one barrier.
  const std::size_t part = static_cast<std::size_t>(kStats) * n + (mode == VocabParallel::kVocab1 ? 2 * dn : 0);
  send.resize(part);
  all.resize(part * static_cast<std::size_t>(p));
  state.local_max.resize(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) {
    Eigen::Index argmax = 0;
    const float m = e.col(j).maxCoeff(&argmax);
    const int t = targets[static_cast<std::size_t>(j)] - shard.first;
    const bool here = t >= 0 && t < rows;
    float* st = send.data() + static_cast<std::ptrdiff_t>(kStats) * j;
    st[0] = m;
    st[2] = here ? e(t, j) : 0.0f;
    st[3] = here ? 1.0f : 0.0f;
    st[4] = static_cast<float>(argmax + shard.first);
    e.col(j) = (e.col(j).array() - m).exp().matrix();
    st[1] = e.col(j).sum();
    state.local_max[static_cast<std::size_t>(j)] = m;
  }
  if (mode == VocabParallel::kVocab1) {
    float* a_part = send.data() + static_cast<std::ptrdiff_t>(kStats) * n;
    Matrix(a_part, d, n).noalias() = weights.transpose() * e;
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
  state.M.resize(static_cast<std::size_t>(n));
  state.S.resize(static_cast<std::size_t>(n));
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
    state.M[static_cast<std::size_t>(j)] = best;
    state.S[static_cast<std::size_t>(j)] = static_cast<float>(sum);
    loss += std::log(sum) + best - target_logit;
    right += static_cast<int>(best_id) == targets[static_cast<std::size_t>(j)];
  }
  if (correct != nullptr) *correct += right;
  if (mode == VocabParallel::kVocab1) {  // dy from the gathered parts: no second barrier
    Matrix DY(dy, d, n);
    DY.setZero();
    for (int r = 0; r < p; ++r) {
      const float* base = all.data() + static_cast<std::size_t>(r) * part;
      const ConstMatrix A(base + static_cast<std::ptrdiff_t>(kStats) * n, d, n);
      const ConstMatrix B(base + static_cast<std::ptrdiff_t>(kStats) * n + static_cast<std::ptrdiff_t>(dn), d, n);
      for (int j = 0; j < n; ++j) {
        const float scale =
            std::exp(base[static_cast<std::size_t>(kStats) * j] - state.M[static_cast<std::size_t>(j)]) /
            state.S[static_cast<std::size_t>(j)];
        DY.col(j) += grad_scale * (scale * A.col(j) - B.col(j));
      }
    }
  }
  return loss;
}

void vocab_output_backward(comm::Group& group, VocabParallel mode, VocabShard shard, int vocab, int d, bool tied,
                           const float* w, std::span<const std::int32_t> targets, float grad_scale,
                           VocabOutputState& state, float* dy, float* dw, double timeout_s) {
  PEERTRAIN_CHECK(mode == VocabParallel::kVocab1 || dy != nullptr, "vocab-2 forms dy in its backward");
  const int n = state.n, rows = shard.count;
  PEERTRAIN_CHECK(state.e.rows() == rows && state.e.cols() == n, "vocab_output_backward before its forward");
  Eigen::MatrixXf& e = state.e;
  // The gradient of the logits, (softmax − onehot)·grad_scale on this rank's rows:
  // e^(L − m) rescaled by e^(m − M)/S, no second exponential.
  for (int j = 0; j < n; ++j) {
    const auto c = static_cast<std::size_t>(j);
    e.col(j) *= grad_scale * std::exp(state.local_max[c] - state.M[c]) / state.S[c];
    const int t = targets[c] - shard.first;
    if (t >= 0 && t < rows) e(t, j) -= grad_scale;
  }
  // The weight gradient of this rank's rows, g·yᵀ, added in place.
  const ConstMatrix Y(state.y.data(), d, n);
  if (tied)
    Matrix(dw + static_cast<std::ptrdiff_t>(shard.first) * d, d, rows).noalias() += Y * e.transpose();
  else
    MutableStrided(dw + shard.first, rows, d, Eigen::OuterStride<>(vocab)).noalias() += e * Y.transpose();
  if (mode == VocabParallel::kVocab2) {
    thread_local Eigen::MatrixXf weights;
    copy_rows(shard, vocab, d, tied, w, weights);
    Matrix(dy, d, n).noalias() = weights.transpose() * e;
    group.all_reduce(std::span<float>(dy, static_cast<std::size_t>(d) * n), timeout_s);  // the second barrier
  }
}

double vocab_parallel_cross_entropy(comm::Group& group, VocabParallel mode, VocabShard shard, int vocab, int d,
                                    bool tied, const float* w, const float* y, int n,
                                    std::span<const std::int32_t> targets, float grad_scale, float* dy, float* dw,
                                    long long* correct, double timeout_s) {
  thread_local VocabOutputState state;
  const double loss = vocab_output_forward(group, mode, shard, vocab, d, tied, w, y, n, targets, grad_scale, state,
                                           mode == VocabParallel::kVocab1 ? dy : nullptr, correct, timeout_s);
  vocab_output_backward(group, mode, shard, vocab, d, tied, w, targets, grad_scale, state,
                        mode == VocabParallel::kVocab2 ? dy : nullptr, dw, timeout_s);
  return loss;
}

}  // namespace peertrain::parallel
