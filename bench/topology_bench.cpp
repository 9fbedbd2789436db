// Spectral-gap and topology-file benchmarks (targets in docs/performance.md):
//   100,000-peer random 4-regular and 65,536-peer exponential graphs: < 3 s each for the
//   whole inspect command (scipy eigsh: ~10 s for the first); dense n = 2,000 for
//   comparison; a 4,096-peer ring (time and method); parsing and validating a
//   100,000-peer explicit edge list: < 2 s.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "peertrain/topology/formats.h"
#include "peertrain/topology/spectrum.h"
#include "peertrain/topology/topology.h"

namespace {

using namespace peertrain::topology;

void run_spectrum(benchmark::State& state, const Graph& graph, SpectrumSolver solver) {
  const SparseMatrix w = build_mixing_matrix(graph, WeightScheme::kMetropolis);
  SpectrumOptions options;
  options.solver = solver;
  Spectrum s;
  for (auto _ : state) {
    s = analyze_spectrum(w, graph, options);
    benchmark::DoNotOptimize(&s);
  }
  state.counters["peers"] = graph.num_peers();
  state.counters["gap"] = s.spectral_gap;
  state.counters["matvecs"] = static_cast<double>(s.matvecs);
  state.SetLabel(s.solver);
}

void BM_Gap_RandomRegular4_100k(benchmark::State& state) {
  GeneratorParams p;
  p.n = 100'000;
  p.degree = 4;
  p.seed = 1;
  run_spectrum(state, generate("random-regular", p), SpectrumSolver::kAuto);
}
void BM_Gap_Exponential_65536(benchmark::State& state) {
  GeneratorParams p;
  p.n = 65'536;
  run_spectrum(state, generate("exponential", p), SpectrumSolver::kAuto);
}
void BM_Gap_Dense_RandomRegular4_2000(benchmark::State& state) {
  GeneratorParams p;
  p.n = 2'000;
  p.degree = 4;
  p.seed = 1;
  run_spectrum(state, generate("random-regular", p), SpectrumSolver::kDense);
}
void BM_Gap_Lanczos_RandomRegular4_2000(benchmark::State& state) {
  GeneratorParams p;
  p.n = 2'000;
  p.degree = 4;
  p.seed = 1;
  run_spectrum(state, generate("random-regular", p), SpectrumSolver::kLanczos);
}
void BM_Gap_Spectra_RandomRegular4_100k(benchmark::State& state) {
  GeneratorParams p;
  p.n = 100'000;
  p.degree = 4;
  p.seed = 1;
  run_spectrum(state, generate("random-regular", p), SpectrumSolver::kSpectra);
}
void BM_Gap_Ring_4096(benchmark::State& state) {
  GeneratorParams p;
  p.n = 4'096;
  run_spectrum(state, generate("ring", p), SpectrumSolver::kAuto);
}
void BM_Gap_Torus_300x300(benchmark::State& state) {
  GeneratorParams p;
  p.rows = 300;
  p.cols = 300;
  run_spectrum(state, generate("torus", p), SpectrumSolver::kAuto);
}
void BM_Generate_RandomRegular4_100k(benchmark::State& state) {
  GeneratorParams p;
  p.n = 100'000;
  p.degree = 4;
  for (auto _ : state) {
    p.seed++;
    benchmark::DoNotOptimize(generate("random-regular", p).num_edges());
  }
}

// Parse + validate a topology file whose graph is a 100,000-peer explicit edge list.
void BM_Load_EdgeList_100k(benchmark::State& state) {
  const auto dir = std::filesystem::temp_directory_path() / "peertrain_bench_edges";
  std::filesystem::create_directories(dir);
  GeneratorParams p;
  p.n = 100'000;
  p.degree = 4;
  p.seed = 3;
  const Graph g = generate("random-regular", p);
  {
    std::ofstream edges(dir / "peers.txt");
    edges << "# 100,000-peer random 4-regular graph\n";
    for (const Edge& e : g.edges()) edges << e.u << " " << e.v << "\n";
    std::ofstream yaml(dir / "big.yaml");
    yaml << "name: big\ngraph: {file: peers.txt}\nweights: metropolis\n";
  }
  for (auto _ : state) {
    Topology t = load_topology_file((dir / "big.yaml").string());
    benchmark::DoNotOptimize(t.fingerprint());
  }
  state.counters["edges"] = static_cast<double>(g.num_edges());
  std::filesystem::remove_all(dir);
}

}  // namespace

BENCHMARK(BM_Gap_RandomRegular4_100k)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_Gap_Spectra_RandomRegular4_100k)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_Gap_Exponential_65536)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_Gap_Dense_RandomRegular4_2000)->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK(BM_Gap_Lanczos_RandomRegular4_2000)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_Gap_Ring_4096)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_Gap_Torus_300x300)->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK(BM_Generate_RandomRegular4_100k)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_Load_EdgeList_100k)->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK_MAIN();
