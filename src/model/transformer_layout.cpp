#include "peertrain/model/transformer_layout.h"

#include "peertrain/core/error.h"

namespace peertrain::model {

TransformerLayout transformer_layout(const TransformerConfig& config) {
  validate(config);
  TransformerLayout m;
  const int d = config.d_model, f = config.mlp_ratio * d;
  auto add = [&](std::string name, int rows, int cols, TensorInit init) {
    m.tensors.push_back({std::move(name), rows, cols, m.total, init});
    m.total += static_cast<std::size_t>(rows) * cols;
    return m.tensors.back().offset;
  };
  std::size_t start = 0;
  auto close_unit = [&] {
    m.units.push_back({start, m.total - start});
    start = m.total;
  };
  if (config.kind == TransformerKind::kGpt) {
    m.wte = add("wte", d, config.vocab, TensorInit::kEmbedding);
  } else {
    m.patch_w = add("patch.weight", d, config.patch * config.patch, TensorInit::kNormal);
    m.patch_b = add("patch.bias", d, 1, TensorInit::kZero);
  }
  m.wpe = add("wpe", d, config.tokens(), TensorInit::kEmbedding);
  close_unit();
  for (int l = 0; l < config.layers; ++l) {
    const std::string p = str("h", l, ".");
    BlockOffsets b{};
    b.ln1_w = add(p + "ln1.weight", d, 1, TensorInit::kOne);
    b.ln1_b = add(p + "ln1.bias", d, 1, TensorInit::kZero);
    b.qkv_w = add(p + "attn.qkv.weight", 3 * d, d, TensorInit::kNormal);
    b.qkv_b = add(p + "attn.qkv.bias", 3 * d, 1, TensorInit::kZero);
    b.proj_w = add(p + "attn.proj.weight", d, d, TensorInit::kResidual);
    b.proj_b = add(p + "attn.proj.bias", d, 1, TensorInit::kZero);
    b.ln2_w = add(p + "ln2.weight", d, 1, TensorInit::kOne);
    b.ln2_b = add(p + "ln2.bias", d, 1, TensorInit::kZero);
    b.fc_w = add(p + "mlp.fc.weight", f, d, TensorInit::kNormal);
    b.fc_b = add(p + "mlp.fc.bias", f, 1, TensorInit::kZero);
    b.fc2_w = add(p + "mlp.proj.weight", d, f, TensorInit::kResidual);
    b.fc2_b = add(p + "mlp.proj.bias", d, 1, TensorInit::kZero);
    m.blocks.push_back(b);
    close_unit();
  }
  m.lnf_w = add("ln_f.weight", d, 1, TensorInit::kOne);
  m.lnf_b = add("ln_f.bias", d, 1, TensorInit::kZero);
  if (config.kind == TransformerKind::kVit) {
    m.head_w = add("head.weight", config.classes, d, TensorInit::kNormal);
    m.head_b = add("head.bias", config.classes, 1, TensorInit::kZero);
  } else if (!config.tied_head) {
    m.head_w = add("lm_head.weight", config.vocab, d, TensorInit::kNormal);
  }
  close_unit();
  return m;
}

BlockSaved block_saved(int d_model, int attention, int hidden, int heads, std::size_t columns) {
  const std::size_t d = static_cast<std::size_t>(d_model), f = static_cast<std::size_t>(hidden), n = columns;
  const std::size_t a = static_cast<std::size_t>(attention);
  BlockSaved s{};
  std::size_t at = 0;
  auto take = [&](std::size_t size) {
    const std::size_t here = at;
    at += size;
    return here;
  };
  s.x_in = take(d * n);
  s.ln1 = take(d * n);
  s.mean1 = take(n);
  s.rstd1 = take(n);
  s.qkv = take(3 * a * n);  // the qkv projection's output, token-major
  s.att = take(a * n);      // the attention's output, token-major (proj's input)
  s.lse = take(static_cast<std::size_t>(heads) * n);
  s.x_mid = take(d * n);
  s.ln2 = take(d * n);
  s.mean2 = take(n);
  s.rstd2 = take(n);
  s.h = take(f * n);
  s.g = take(f * n);
  s.total = at;
  return s;
}

}  // namespace peertrain::model
