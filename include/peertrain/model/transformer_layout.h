// Where the transformer's tensors live in the flat parameter buffer, and where a block
// keeps what forward saves for backward: one description, read by the CPU model
// (model/transformer.h) and the device model (device/device_transformer.h) alike, so the
// two cannot drift apart.
//
// Parameter layout, in buffer order (every matrix column-major, a Linear's weight d_out ×
// d_in; d = d_model, F = mlp_ratio·d, P = patch²):
//   unit 0, embedding   gpt: wte (d × vocab), wpe (d × seq)
//                       vit: patch.weight (d × P), patch.bias (d), wpe (d × tokens)
//   unit 1 + l, block l h{l}.ln1.weight (d), h{l}.ln1.bias (d),
//                       h{l}.attn.qkv.weight (3d × d), h{l}.attn.qkv.bias (3d),
//                       h{l}.attn.proj.weight (d × d), h{l}.attn.proj.bias (d),
//                       h{l}.ln2.weight (d), h{l}.ln2.bias (d),
//                       h{l}.mlp.fc.weight (F × d), h{l}.mlp.fc.bias (F),
//                       h{l}.mlp.proj.weight (d × F), h{l}.mlp.proj.bias (d)
//   unit L + 1, head    ln_f.weight (d), ln_f.bias (d), then
//                       gpt untied: lm_head.weight (vocab × d), no bias; gpt tied: nothing
//                       (the logits are wteᵀ·x); vit: head.weight (classes × d), head.bias.
// The qkv rows are [q; k; v], head h at rows h·head_dim of each, as in GPT-2's c_attn. wte
// and wpe column-major are row-major vocab × d, PyTorch's nn.Embedding layout.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "peertrain/model/transformer.h"

namespace peertrain::model {

// How initialize() fills a tensor (GPT-2's scheme; see Transformer::initialize).
enum class TensorInit { kNormal, kResidual, kEmbedding, kOne, kZero };

struct TensorSpec {
  std::string name;  // "wte", "h0.attn.qkv.weight", …
  int rows = 0;
  int cols = 0;
  std::size_t offset = 0;  // in floats, from the start of the buffer
  TensorInit init = TensorInit::kZero;
};

// The offsets of one block's tensors.
struct BlockOffsets {
  std::size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc2_w, fc2_b;
};

struct TransformerLayout {
  std::vector<TensorSpec> tensors;    // buffer order
  std::vector<ParameterRange> units;  // embedding, blocks, head
  std::size_t wte = 0, wpe = 0, patch_w = 0, patch_b = 0;
  std::vector<BlockOffsets> blocks;
  std::size_t lnf_w = 0, lnf_b = 0, head_w = 0, head_b = 0;
  std::size_t total = 0;  // floats
};

// The layout of a (validated) configuration.
TransformerLayout transformer_layout(const TransformerConfig& config);

// What a block keeps from forward for its backward, as offsets (in floats) into one buffer
// for N = batch·tokens columns: x_in, ln1(x), its mean and 1/σ, the qkv projection's
// output and the attention output (token-major, one column per token), the log-sum-exp of
// each row, x_mid = x + attention, ln2(x_mid), its mean and 1/σ, the fc pre-activation h
// and the GELU output g. Under tensor parallelism a rank keeps q, k, v and the attention
// output of its heads only (attention = d_model / tp rows), and its share of h and g
// (hidden = the MLP's width / tp).
struct BlockSaved {
  std::size_t x_in, ln1, mean1, rstd1, qkv, att, lse, x_mid, ln2, mean2, rstd2, h, g, total;
};
BlockSaved block_saved(int d_model, int attention, int hidden, int heads, std::size_t columns);

}  // namespace peertrain::model
