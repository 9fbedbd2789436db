// The transformer's shape from the flags that `bench step`, `bench pipeline` and `plan`
// name alike: --d-model, --layers, --heads, --seq, and --vocab-size where the command has it.
#pragma once

#include <cxxopts.hpp>

#include "options.h"
#include "peertrain/model/transformer.h"

namespace peertrain::cli {

inline model::TransformerConfig transformer_shape(const cxxopts::ParseResult& args, model::TransformerKind kind,
                                                  bool has_vocab) {
  if (kind == model::TransformerKind::kVit) {
    refuse_flags(args, {"seq"}, "--model gpt (a ViT's tokens are its image's patches)");
    if (has_vocab) refuse_flags(args, {"vocab-size"}, "--model gpt");
  }
  model::TransformerConfig config;
  config.kind = kind;
  config.d_model = number_flag<int>(args, "d-model");
  config.layers = number_flag<int>(args, "layers");
  config.heads = number_flag<int>(args, "heads");
  config.seq = number_flag<int>(args, "seq");
  if (has_vocab) config.vocab = number_flag<int>(args, "vocab-size");
  return config;
}

}  // namespace peertrain::cli
