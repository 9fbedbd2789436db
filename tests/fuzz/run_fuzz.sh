#!/usr/bin/env bash
# Builds the fuzzers (libFuzzer + AddressSanitizer + UndefinedBehaviorSanitizer) of the
# topology parser, the frame decoder, the handshake, the membership messages, the other
# payloads a peer sends (payload_fuzz.cpp) and the checkpoint and IDX readers (file_fuzz.cpp) in the sanitized build folder that sanitize.asan_ubsan uses,
# so the library is compiled once for both, and runs each for a bounded time, starting
# from the shipped topology files, two at a time (one core each). Any crash, leak or
# sanitizer report fails, with that fuzzer's report.
# Usage: run_fuzz.sh SOURCE BUILD [SECONDS]
set -euo pipefail
root=$1
build=$2
seconds=${3:-10}
source "$root/tests/sanitize/configure_sanitized.sh"
configure_sanitized "$root" "$build"
cmake --build "$build" --target topology_fuzz frame_fuzz handshake_fuzz membership_fuzz payload_fuzz file_fuzz -j2 >"$build.fuzz-build.log" 2>&1 ||
  { tail -40 "$build.fuzz-build.log"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus=$work/topology frames=$work/frames hellos=$work/hellos members=$work/members
payloads=$work/payloads files=$work/files
mkdir "$corpus" "$frames" "$hellos" "$members" "$payloads" "$files"
# A valid IDX pair for the file fuzzer: selector 1, the split at 24 bytes, two 2×2 images, two labels.
printf '\x01\x00\x18\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x02\x00\x00\x00\x02\x01\x02\x03\x04\x05\x06\x07\x08\x00\x00\x08\x01\x00\x00\x00\x02\x03\x07' >"$files/idx"
cp "$root"/topology/*.yaml "$root"/topology/*.txt "$corpus"/
printf '%%%%MatrixMarket matrix coordinate real symmetric\n3 3 2\n2 1 0.5\n3 2 0.5\n' >"$corpus/seed.mtx"
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# fuzz NAME MAX_LEN CORPUS: one fuzzer in the background, its output to $work/NAME.log.
# Each fuzzer is one process on one core: two at a time fill this machine's two cores,
# and each still fuzzes for the whole $seconds.
fuzz() {
  "$build/tests/fuzz/$1" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len="$2" -print_final_stats=1 "$3" >"$work/$1.log" 2>&1 &
  pids+=($!)
  names+=("$1")
}
# finish: waits for the running fuzzers; shows the end of each one's output, and all of
# a failed one's report.
failed=0
finish() {
  for i in "${!pids[@]}"; do
    if wait "${pids[$i]}"; then
      tail -8 "$work/${names[$i]}.log"
    else
      echo "FAIL ${names[$i]}:"
      tail -60 "$work/${names[$i]}.log"
      failed=1
    fi
  done
  pids=()
  names=()
}
pids=()
names=()
fuzz topology_fuzz 4096 "$corpus"
fuzz frame_fuzz 512 "$frames"
finish
fuzz handshake_fuzz 256 "$hellos"
fuzz membership_fuzz 1024 "$members"
finish
fuzz payload_fuzz 4096 "$payloads"
fuzz file_fuzz 4096 "$files"
finish
exit $failed
