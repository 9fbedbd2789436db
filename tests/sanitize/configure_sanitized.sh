#!/usr/bin/env bash
# Configures the one sanitized build that sanitize.asan_ubsan and fuzz.topology_parser
# share, so that the library is compiled once for both: clang with AddressSanitizer,
# UndefinedBehaviorSanitizer and libFuzzer's coverage hooks, at -O1 with line tables, CPU only.
# clang is used because it builds this tree in less than half GCC's time at -O1 (161 s
# against 394 s for the unit tests on 2 cores). Without clang it falls back to the default
# compiler, with no fuzzers. -march=native (the build runs where it is built) compiles the
# AVX-512 attention kernels in, so that their loads and stores are checked too.
# Usage (sourced): configure_sanitized SOURCE BUILD
configure_sanitized() {
  local root=$1 build=$2 compiler=() fuzz=OFF debug=-g1
  if command -v clang++ >/dev/null; then
    compiler=(-DCMAKE_CXX_COMPILER=clang++)
    fuzz=ON
    debug=-gline-tables-only  # file:line for the reports' stacks, at a fifth less compile time than -g
  fi
  cmake -S "$root" -B "$build" "${compiler[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 $debug -march=native" -DPEERTRAIN_SANITIZE=address,undefined -DPEERTRAIN_FUZZ=$fuzz \
    -DPEERTRAIN_CUDA=OFF -DPEERTRAIN_BENCHMARKS=OFF -DPEERTRAIN_NATIVE=OFF -DPEERTRAIN_PYTHON=OFF >"$build.configure.log" 2>&1 ||
    { cat "$build.configure.log"; return 1; }
}
