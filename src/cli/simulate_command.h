// launch --simulate: every peer of the topology file in this process, on a simulated
// cluster (sim/cluster.h), with the same files and the same progress line as a real run.
#pragma once

#include <cxxopts.hpp>
#include <filesystem>

#include "dashboard_server.h"
#include "peertrain/topology/topology.h"
#include "peertrain/train/trainer.h"

namespace peertrain::cli {

void add_simulation_options(cxxopts::Options& options);
// Whether --simulate was given; refuses (UsageError) the simulation's flags without it.
bool simulation_requested(const cxxopts::ParseResult& args);
// Runs the simulated cluster and prints the summary; returns launch's exit code.
int run_simulated_launch(const cxxopts::ParseResult& args, const train::TrainConfig& config,
                         const topology::Topology& topology, const std::filesystem::path& out,
                         DashboardServer* dashboard);

}  // namespace peertrain::cli
