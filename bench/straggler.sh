#!/usr/bin/env bash
# One slow peer: does it slow only its neighbourhood, or everyone? Eight peers on a ring
# train a small MLP twice: with no emulation, and with peer 4's two links delayed by
# 20 ms each way (a straggler by emulated delay). Prints, per peer, the time per step and
# the time spent waiting for neighbours, and each peer's graph distance to peer 4.
# Usage: bench/straggler.sh [build-dir] [delay_ms]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build}/peertrain
delay=${2:-20}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
base=$((27000 + $$ % 1000))
topology() {  # NAME OVERRIDES
  {
    echo "name: $1"
    echo "graph: {generator: ring, n: 8}"
    echo "peers:"
    for ((i = 0; i < 8; i++)); do echo "  - {id: $i, host: 127.0.0.1, port: $((base + i))}"; done
    echo "links: {overrides: [$2]}"
  } >"$work/$1.yaml"
}
topology even ""
topology straggler "{between: [3, 4], latency_ms: $delay}, {between: [4, 5], latency_ms: $delay}"
for name in even straggler; do
  "$bin" launch --topology "$work/$name.yaml" --hidden 64 --batch 32 --max-steps 300 --eval-every 300 \
    --out "$work/$name" >/dev/null 2>&1
done
echo "ring of 8, peer 4's links delayed by $delay ms; 300 steps; ms per step (waiting for neighbours)"
printf "%5s %9s %22s %22s\n" peer distance "no straggler" "straggler at peer 4"
for p in 0 1 2 3 4 5 6 7; do
  d=$(( p > 4 ? p - 4 : 4 - p )); (( d > 4 )) && d=$((8 - d))
  row() { awk -F, -v p="$p" 'NR > 1 && $3 == p { printf "%8.2f (%7.2f)", 1000 * $10 / $1, 1000 * $12 / $1 }' "$1"; }
  printf "%5d %9d %22s %22s\n" "$p" "$d" "$(row "$work/even/metrics.csv")" "$(row "$work/straggler/metrics.csv")"
done
echo "Synchronous D-PSGD: a peer runs at most its graph distance ahead of a slow one, so over"
echo "300 steps every peer's step time rises to the straggler's pace."
