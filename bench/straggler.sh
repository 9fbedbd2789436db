#!/usr/bin/env bash
# One slow peer: does it slow only its neighbourhood, or everyone? Eight peers on a ring
# train a small MLP: with no emulation, and with peer 4's two links delayed by 20 ms each
# way (a straggler by emulated delay), synchronously (--max-staleness 0) and with bounded
# staleness K for each K given. Prints, per peer, the time per step and the time spent
# waiting for neighbours, and each peer's graph distance to peer 4.
# Usage: bench/straggler.sh [build-dir] [delay_ms] [steps] [K ...]   (default K: 0 1 4 16)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build}/peertrain
delay=${2:-20}
steps=${3:-300}
shift $(( $# < 3 ? $# : 3 ))
ks=("$@")
[[ ${#ks[@]} -gt 0 ]] || ks=(0 1 4 16)
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
run() {  # OUT TOPOLOGY K
  "$bin" launch --topology "$work/$2.yaml" --hidden 64 --batch 32 --max-steps "$steps" --eval-every "$steps" \
    --max-staleness "$3" --out "$work/$1" >/dev/null 2>&1
}
run even even 0
for k in "${ks[@]}"; do run "k$k" straggler "$k"; done
echo "ring of 8, peer 4's links delayed by $delay ms; $steps steps; ms per step (ms of it waiting for neighbours)"
printf "%4s %4s %17s" peer hops "no straggler"
for k in "${ks[@]}"; do printf " %17s" "straggler K=$k"; done
echo
for p in 0 1 2 3 4 5 6 7; do
  d=$(( p > 4 ? p - 4 : 4 - p )); (( d > 4 )) && d=$((8 - d))
  row() { awk -F, -v p="$p" 'NR > 1 && $3 == p { printf "%7.2f (%7.2f)", 1000 * $10 / $1, 1000 * $12 / $1 }' "$1"; }
  printf "%4d %4d %17s" "$p" "$d" "$(row "$work/even/metrics.csv")"
  for k in "${ks[@]}"; do printf " %17s" "$(row "$work/k$k/metrics.csv")"; done
  echo
done
echo "K = 0 is synchronous D-PSGD: a peer runs at most its graph distance ahead of a slow one."
echo "With K > 0 a peer runs at most (K + 1) steps ahead of each neighbour, so d·(K + 1) ahead of"
echo "a peer d hops away: over a run much longer than that, everyone ends near the slowest pace."
