// Tensor parallelism's two Linear layers (Shoeybi et al. 2019, Megatron-LM), over the T
// ranks of a group: the building blocks of `--tp` (issue 16). Every matrix is column-major
// with one column per token, as in model/layers.h; weights are read in place from the flat
// parameter buffer, d_out × d_in, each rank using only its part.
//
//   column-parallel  Y_r = W_r·X + b_r: rank r holds some rows of W and b (for attention,
//                    the q, k and v rows of its heads: several blocks), X whole. Forward
//                    needs nothing from the others; backward all-reduces dX = Σ W_rᵀ·dY_r
//                    (Megatron's f: identity forward, all-reduce backward).
//   row-parallel     Y = Σ_r W_r·X_r + b: rank r holds some columns of W and the matching
//                    rows of X (a column-parallel layer's output, unreduced). Forward
//                    all-reduces the partial products (Megatron's g), then adds b; backward
//                    needs nothing: dX_r = W_rᵀ·dY, dW_r = dY·X_rᵀ.
// The MLP is column then row (one all-reduce each way); attention splits its heads: qkv
// column-parallel, the output projection row-parallel.
//
// Gradients are ADDED into the full layout: a rank writes its rows (or columns) of dW and
// db; the row-parallel bias, the same on every rank, is added by rank 0 only, so that the
// ranks' gradient buffers sum to the unsplit layer's.
#pragma once

#include <span>

#include "peertrain/comm/group.h"

namespace peertrain::parallel {

// Rows [first, first + count) of a weight (column-parallel) or columns (row-parallel).
struct Block {
  int first = 0;
  int count = 0;
};

// The even split of `size` rows or columns over `ranks` (for a head-split layer, of whole
// heads: pass heads and multiply). Throws Error(kInvalidArgument) naming --tp and `what`
// when ranks does not divide size.
Block tensor_shard(int size, int ranks, int rank, const char* what);

// Y (Σ counts × n) = W[rows, :]·X + b[rows]; b may be null.
void column_parallel_forward(int in, int out, std::span<const Block> rows, int n, const float* w, const float* b,
                             const float* x, float* y);
// dW[rows, :] += dY·Xᵀ, db[rows] += Σ dY (when db is not null), dX = Σ_ranks W[rows, :]ᵀ·dY
// (all-reduced over the group; every rank ends with the whole dX).
void column_parallel_backward(comm::Group& group, int in, int out, std::span<const Block> rows, int n, const float* w,
                              const float* x, const float* dy, float* dw, float* db, float* dx,
                              double timeout_s = comm::kDefaultTimeoutS);

// Y (out × n) = Σ_ranks W[:, columns]·X_r + b (all-reduced; b may be null). X_r: count × n.
void row_parallel_forward(comm::Group& group, int in, int out, Block columns, int n, const float* w, const float* b,
                          const float* x_part, float* y, double timeout_s = comm::kDefaultTimeoutS);
// dW[:, columns] += dY·X_rᵀ, db += Σ dY on rank 0 only, dX_r = W[:, columns]ᵀ·dY.
void row_parallel_backward(comm::Group& group, int in, int out, Block columns, int n, const float* w,
                           const float* x_part, const float* dy, float* dw, float* db, float* dx_part);

}  // namespace peertrain::parallel
