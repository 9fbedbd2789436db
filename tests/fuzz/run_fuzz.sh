#!/usr/bin/env bash
# Builds the topology-parser, frame-decoder, handshake and membership-message fuzzers (libFuzzer + AddressSanitizer +
# UndefinedBehaviorSanitizer) in the sanitized build folder that sanitize.asan_ubsan uses,
# so the library is compiled once for both, and runs each for a bounded time, starting
# from the shipped topology files. Any crash, leak or sanitizer report fails.
# Usage: run_fuzz.sh SOURCE BUILD [SECONDS]
set -euo pipefail
root=$1
build=$2
seconds=${3:-10}
source "$root/tests/sanitize/configure_sanitized.sh"
configure_sanitized "$root" "$build"
cmake --build "$build" --target topology_fuzz frame_fuzz handshake_fuzz membership_fuzz -j2 >"$build.fuzz-build.log" 2>&1 ||
  { tail -40 "$build.fuzz-build.log"; exit 1; }
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
hellos=$(mktemp -d)
trap 'rm -rf "$corpus" "$frames" "$hellos"' EXIT
"$build/tests/fuzz/handshake_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=256 -print_final_stats=1 "$hellos" 2>&1 | tail -8
members=$(mktemp -d)
trap 'rm -rf "$corpus" "$frames" "$hellos" "$members"' EXIT
"$build/tests/fuzz/membership_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=1024 -print_final_stats=1 "$members" 2>&1 | tail -8
