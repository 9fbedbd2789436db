#!/usr/bin/env bash
# Builds the test suite with AddressSanitizer and UndefinedBehaviorSanitizer in its own
# folder and runs its unit tests (which include the transport, gossip and collectives
# with peers as threads on loopback). The multi-process command-line tests are left out:
# they assert on timeouts that a sanitized build stretches. Any sanitizer report fails
# the run. Usage: run_sanitized.sh SOURCE BUILD
set -euo pipefail
root=$1
build=$2
# -O1: the build is most of this test's time on a 2-core machine, and -O1 compiles
# markedly faster than -O2 while keeping the sanitizers' reports precise.
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DPEERTRAIN_SANITIZE=address,undefined -DPEERTRAIN_CUDA=OFF -DPEERTRAIN_BENCHMARKS=OFF -DPEERTRAIN_NATIVE=OFF \
  >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" --target unit_tests -j"$(nproc)" >"$build.build.log" 2>&1 ||
  { tail -40 "$build.build.log"; exit 1; }
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
cd "$build"
ctest --output-on-failure -j"$(nproc)" -E "^(long|fuzz|sanitize|experiments|cli)\." --timeout 900
