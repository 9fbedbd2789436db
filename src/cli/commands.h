// Each subcommand of the peertrain program is a function from its arguments to an exit
// code: 0 success, 1 a failure at run time, 2 a wrong command line.
#pragma once

#include <string>
#include <vector>

namespace peertrain::cli {

int run_topology(int argc, char** argv);
int run_peer(int argc, char** argv);
int run_launch(int argc, char** argv);
int run_bench(int argc, char** argv);
int bench_schedule(int argc, char** argv);  // peertrain bench schedule
int bench_pipeline(int argc, char** argv);  // peertrain bench pipeline
int bench_reshard(int argc, char** argv);   // peertrain bench reshard
int bench_memory(int argc, char** argv);    // peertrain bench memory
int run_plan(int argc, char** argv);        // peertrain plan
int run_keygen(int argc, char** argv);
int run_report(int argc, char** argv);  // peertrain report runs/DIR

// launch -- PROGRAM: PROGRAM once per local peer of the topology file (launch_program.cpp).
int launch_program(const std::string& topology_file, const std::string& secret_file,
                   const std::vector<std::string>& command);

}  // namespace peertrain::cli
