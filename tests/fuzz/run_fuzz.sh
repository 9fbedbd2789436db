#!/usr/bin/env bash
# Builds the topology-parser and frame-decoder fuzzers with clang (libFuzzer + AddressSanitizer +
# UndefinedBehaviorSanitizer) in its own build folder and runs it for a bounded time,
# starting from the shipped topology files. Any crash, leak or sanitizer report fails.
set -euo pipefail
root=$1
build=$2
seconds=${3:-10}
cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPEERTRAIN_FUZZ=ON -DPEERTRAIN_TESTS=OFF -DPEERTRAIN_BENCHMARKS=OFF -DPEERTRAIN_CUDA=OFF \
  -DPEERTRAIN_NATIVE=OFF -DPEERTRAIN_SANITIZE=address,undefined >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
cmake --build "$build" --target topology_fuzz frame_fuzz -j2 >"$build.build.log" 2>&1 || { tail -40 "$build.build.log"; exit 1; }
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
cp "$root"/topology/*.yaml "$root"/topology/*.txt "$corpus"/
printf '%%%%MatrixMarket matrix coordinate real symmetric\n3 3 2\n2 1 0.5\n3 2 0.5\n' >"$corpus/seed.mtx"
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
"$build/tests/fuzz/topology_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=4096 -print_final_stats=1 "$corpus" 2>&1 | tail -8
frames=$(mktemp -d)
trap 'rm -rf "$corpus" "$frames"' EXIT
"$build/tests/fuzz/frame_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=512 -print_final_stats=1 "$frames" 2>&1 | tail -8
