// The training flags that `peertrain peer` and `peertrain launch` share, and their
// conversion to a TrainConfig; launch forwards the ones a user gave to every peer.
#pragma once

#include <cxxopts.hpp>
#include <string>
#include <vector>

#include "peertrain/train/trainer.h"

namespace peertrain::cli {

void add_training_options(cxxopts::Options& options);
// Throws UsageError (src/cli/options.h) naming the flag for a bad value.
train::TrainConfig training_config(const cxxopts::ParseResult& args);
// --hidden's "512,512" as layer widths (each 1 to 65,536); throws UsageError naming it.
std::vector<int> parse_widths(const std::string& text);
// The given training flags as "--name value" arguments, to pass on to a peer.
std::vector<std::string> forwarded_training_flags(const cxxopts::ParseResult& args);

}  // namespace peertrain::cli
