// Cutting the transformer's chain of units into pipeline stages, after PipeDream
// (Narayanan et al., SOSP 2019): profile what each unit costs (forward + backward on a
// sample micro-batch), then choose the split points by dynamic programming so that the
// slowest stage — the one that sets the pipeline's throughput — is as fast as it can be.
// Stages are runs of consecutive units, every stage holds at least one unit, and stage
// boundaries are given as the first unit of each stage ({0, 3} = units 0–2 and 3–).
//
// PipeDream's planner also weighs the activation traffic between stages and replicates
// stages; inside one peer the traffic is a d × N copy through shared memory and stages
// are not replicated, so only compute enters the cost here.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "peertrain/model/transformer.h"

namespace peertrain::parallel {

// The first unit of each of `stages` stages minimising the largest stage cost (the sum of
// its units' costs). Ties go to the split with the earliest boundaries. Throws
// Error(kInvalidArgument) when stages < 1 or stages > units (a stage would be empty), or
// when a cost is negative or not finite.
std::vector<int> partition(std::span<const double> unit_costs, int stages);

// The cost of the slowest stage of a split given by its first units.
double bottleneck_cost(std::span<const double> unit_costs, std::span<const int> first_units);

// Checks a split of `units` units into `stages` stages: first_units[0] == 0, strictly
// increasing, all below `units`. Throws Error(kInvalidArgument) naming `flag`.
void validate_first_units(std::span<const int> first_units, int units, int stages,
                          std::string_view flag = "--stages");

// Parses the --stages override, units per stage separated by commas ("3,3"), into first
// units. It must have `stages` positive entries that sum to `units`; otherwise throws
// Error(kInvalidArgument) naming the flag, what was given and what was expected.
std::vector<int> parse_stage_sizes(std::string_view text, int units, int stages,
                                   std::string_view flag = "--stages");

// "2,2,2": the sizes of a split, the inverse of parse_stage_sizes.
std::string format_stage_sizes(std::span<const int> first_units, int units);

// Seconds of forward + backward of each unit on `sample` (one micro-batch as one rank sees
// it, local attention), the median of `repetitions` timed runs after one warm-up run.
// Gradients go to a scratch buffer; params is only read.
std::vector<double> profile_units(model::Transformer& model, std::span<const float> params,
                                  const model::TokenBatch& sample, int repetitions = 3,
                                  const model::UnitContext& context = {});

}  // namespace peertrain::parallel
