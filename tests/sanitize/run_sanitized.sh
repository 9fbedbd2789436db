#!/usr/bin/env bash
# Builds the unit tests with AddressSanitizer and UndefinedBehaviorSanitizer in their own
# folder and runs them (they include the transport, gossip and collectives with peers as
# threads on loopback, and the emulated CUDA kernels). The multi-process command-line
# tests and the chaos soak are left out: they run the program, which this build does not
# make, and assert on timeouts that a sanitized build stretches; so are the
# install test, the format check (this build makes no program to install) and the Python
# module's tests (a sanitized extension cannot load into an unsanitized interpreter). Any
# sanitizer report fails the run. Usage: run_sanitized.sh SOURCE BUILD
set -euo pipefail
root=$1
build=$2
source "$root/tests/sanitize/configure_sanitized.sh"
configure_sanitized "$root" "$build"
cmake --build "$build" --target unit_tests -j"$(nproc)" >"$build.build.log" 2>&1 ||
  { tail -40 "$build.build.log"; exit 1; }
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
cd "$build"
# Left out here, run unsanitized in the main suite: the dense-eigensolver spectrum check,
# 54 s under ASan. This keeps the whole suite within its 40-minute budget.
ctest --output-on-failure -j"$(nproc)" --timeout 900 \
  -E "^(long|fuzz|sanitize|experiments|cli|python|install|format|chaos)\.|^Spectrum\.LanczosSpectraAndDenseAgreeOnRandomRegularGraphs$"
