// Vocabulary parallelism for the output layer (Yeung, Qi, Lin, Wan, "Balancing Pipeline
// Parallelism with Vocabulary Parallelism", MLSys 2025): the LM head's V rows and its
// softmax cross-entropy split evenly over the p ranks of a group — in the pipeline, its
// stages — so that no stage carries the whole vocabulary. Each rank computes its V/p
// logits of every column; the softmax needs the maximum, the sum of exponentials and the
// target's logit over the whole vocabulary, which the ranks combine the online-softmax way
// (each sends its local maximum m, its sum S relative to m, its target logit or 0; the
// whole sum is Σ S_r·e^(m_r − M) with M the largest m).
//
//   vocab-2: two barriers. The statistics first (an all-gather of 3 floats per column),
//     then each rank's part of the input gradient Wᵣᵀ·(softmax − onehot) is summed (an
//     all-reduce of d floats per column).
//   vocab-1: one barrier. Before it each rank computes, with its local maximum, the
//     unnormalised input gradient Aᵣ = Wᵣᵀ·e^(Lᵣ − mᵣ) and Bᵣ = Wᵣᵀ·onehotᵣ — the forward and
//     the input gradient fused — and sends them with its statistics in one all-gather; every
//     rank then forms dy = Σ Aᵣ·e^(mᵣ − M)/S − Σ Bᵣ. The all-gather moves p·(2d + 3) floats
//     per column where vocab-2's all-reduce moves about 2d: fewer waits, more bytes.
// Either way every rank ends with the loss and the whole input gradient dy, and adds the
// gradient of its own rows of the weight.
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "peertrain/core/aligned.h"

#include "peertrain/comm/group.h"
#include "peertrain/model/transformer.h"

namespace peertrain::parallel {

enum class VocabParallel { kNone, kVocab1, kVocab2 };

// "none" | "vocab-1" | "vocab-2"; anything else throws Error(kInvalidArgument) naming `flag`.
VocabParallel parse_vocab_parallel(std::string_view text, std::string_view flag = "--vocab-parallel");
std::string_view to_string(VocabParallel mode);
// The schedule's ScheduleShape::output_barriers for the mode: 0, 1 or 2.
inline int output_barriers(VocabParallel mode) {
  return mode == VocabParallel::kVocab1 ? 1 : mode == VocabParallel::kVocab2 ? 2 : 0;
}

// Rank r's rows [first, first + count) of a V-row output layer split over `ranks`: V/p each.
// Throws Error(kInvalidArgument) naming --vocab-size and --pp when p does not divide V.
struct VocabShard {
  int first = 0;
  int count = 0;
};
VocabShard vocab_shard(int vocab, int ranks, int rank);

// Whether `mode` fits the model and the pipeline: none always; vocab-1 and vocab-2 need gpt,
// at least 2 stages and a vocabulary they divide. Throws Error(kInvalidArgument) naming
// --vocab-parallel (and --model, --pp or --vocab-size) otherwise.
void check_vocab_parallel(VocabParallel mode, const model::TransformerConfig& model, int stages);

// The input embedding split the same way: rank r holds wte's columns of its shard. out (d ×
// n) gets wte[:, ids[j]] in column j where the id is in the shard and 0 elsewhere, so the
// ranks' outputs summed are the whole lookup exactly (one non-zero term per column).
void vocab_embedding_forward(VocabShard shard, int d, std::span<const std::int32_t> ids, const float* wte, float* out);
// dwte[:, ids[j]] += dout[:, j] for the columns whose id is in the shard (dwte: the whole
// d × V layout, only the shard's columns written).
void vocab_embedding_backward(VocabShard shard, int d, std::span<const std::int32_t> ids, const float* dout,
                              float* dwte);

// The output layer in two passes, as the paper places them in the schedule:
//   S, vocab_output_forward: the logits of the shard, their statistics, the barrier (the
//     all-gather); returns the loss summed over the columns (the same on every rank) and,
//     for vocab-1, writes dy (d × n) already — the forward and the input gradient fused.
//   T, vocab_output_backward: the logits' gradient and the shard's weight gradient (ADDED
//     into dw); for vocab-2 also dy, with the second barrier (the all-reduce).
// Between them `state` holds what T needs: e^(L − m) of the shard's rows (rows × n), the
// input y, the local and global statistics. Vocab-1's T has no barrier and nothing
// downstream waits for it; vocab-2's T gives the head stage's backward its dy.
struct VocabOutputState {
  Eigen::MatrixXf e;
  AlignedVector<float> y;
  std::vector<float> local_max, M, S;
  int n = 0;
  std::size_t bytes() const;
};
double vocab_output_forward(comm::Group& group, VocabParallel mode, VocabShard shard, int vocab, int d, bool tied,
                            const float* w, const float* y, int n, std::span<const std::int32_t> targets,
                            float grad_scale, VocabOutputState& state, float* dy, long long* correct = nullptr,
                            double timeout_s = comm::kDefaultTimeoutS);
void vocab_output_backward(comm::Group& group, VocabParallel mode, VocabShard shard, int vocab, int d, bool tied,
                           const float* w, std::span<const std::int32_t> targets, float grad_scale,
                           VocabOutputState& state, float* dy, float* dw, double timeout_s = comm::kDefaultTimeoutS);

// S then T at once: the softmax cross-entropy of logits W·y over the group, rank
// `group.rank()` holding rows `shard` of W (V × d, column-major: the model's lm_head.weight; or wteᵀ for a tied head,
// which is d × V — pass tied = true). n columns of y (d × n); targets: n ids in [0, V).
// Returns the loss summed over the columns (the same on every rank); writes dy (d × n) =
// ∂(grad_scale · loss)/∂y, the same on every rank; ADDS grad_scale · ∂loss/∂W for the
// shard's rows into dw (the same layout as w). `correct` (may be null) gets the number of
// columns whose largest logit is the target.
double vocab_parallel_cross_entropy(comm::Group& group, VocabParallel mode, VocabShard shard, int vocab, int d,
                                    bool tied, const float* w, const float* y, int n,
                                    std::span<const std::int32_t> targets, float grad_scale, float* dy, float* dw,
                                    long long* correct = nullptr, double timeout_s = comm::kDefaultTimeoutS);

}  // namespace peertrain::parallel
