// The flags that lay out a peer's workers beyond --sp and --pp — tensor parallelism, a mesh
// per stage, how boundary tensors are resharded, the emulated links — shared by `peer`,
// `launch` and `bench pipeline`.
#pragma once

#include <cxxopts.hpp>
#include <string>
#include <vector>

#include "peertrain/parallel/pipeline.h"

namespace peertrain::cli {

void add_mesh_options(cxxopts::Options& options, const std::string& group);
// Throws UsageError naming the flag; the engine checks the meshes against the model.
void read_mesh_options(const cxxopts::ParseResult& args, parallel::EngineConfig& engine);

}  // namespace peertrain::cli
