#!/usr/bin/env bash
# AD-PSGD against a straggler: four peers on a ring train the MLP for
# --epochs (batch 128), with no straggler and with peer 1 five times slower (the topology's
# stragglers: it sleeps 4x each gradient), under AD-PSGD and under D-PSGD, each --seeds
# times. Prints the other peers' throughput (their steps per second, summed) with the
# straggler against without it (target: at least 0.9 for AD-PSGD), x̄'s test accuracy
# (target: within 1 point), and the share of their time spent waiting.
#
#   bench/adpsgd_straggler.sh [--epochs 1] [--seeds 3] [--slowdown 5]
#
# PEERTRAIN names the binary (default build/peertrain). Numbers from a loaded machine are
# noise: run it alone. On a machine with fewer cores than peers, a straggler's sleep frees
# a core for the others, which then run faster than without it (see the note it prints).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${PEERTRAIN:-$here/../build/peertrain}
epochs=1 seeds=3 slowdown=5
while [[ $# -gt 0 ]]; do
  case $1 in
    --epochs) epochs=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --slowdown) slowdown=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $bin ]] || { echo "error: $bin is not built (cmake --build build --target peertrain)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
base=$((28000 + $$ % 1000))
topology() {  # NAME [STRAGGLERS]
  {
    echo "graph: {generator: ring, n: 4}"
    echo "peers:"
    for ((i = 0; i < 4; i++)); do echo "  - {id: $i, host: 127.0.0.1, port: $((base + i))}"; done
    [[ -z ${2:-} ]] || echo "stragglers: [$2]"
  } >"$work/$1.yaml"
}
topology even
topology slow "{peer: 1, slowdown: $slowdown}"

# others OUT: the non-straggler peers' steps per second, summed; their mean waiting share; x̄'s accuracy.
others() {
  awk -F, 'NR > 1 && $3 != 1 { rate += $1 / $10; wait += $12 / $10; n++ } END { printf "%.1f %.3f", rate, wait / n }' \
    "$1/metrics.csv"
  printf " %s\n" "$(grep -o '"test_accuracy": [0-9.]*' "$1/summary.json" | cut -d' ' -f2)"
}
printf "%-7s %5s %-9s %14s %12s %9s\n" algo seed network "others steps/s" "others wait" "x̄ acc"
for algo in adpsgd dpsgd; do
  for ((seed = 1; seed <= seeds; seed++)); do
    for net in even slow; do
      out="$work/$algo-$seed-$net"
      "$bin" launch --topology "$work/$net.yaml" --algorithm "$algo" --epochs "$epochs" --batch 128 --lr 0.1 \
        --seed "$seed" --out "$out" >"$out.log" 2>&1 || { echo "error: $algo $net seed $seed failed:"; tail -5 "$out.log"; exit 1; }
      read -r rate wait acc <<<"$(others "$out")"
      printf "%-7s %5d %-9s %14.1f %11.1f%% %9.4f\n" "$algo" "$seed" "$net" "$rate" "$(awk -v w="$wait" 'BEGIN { print 100 * w }')" "$acc"
      echo "$algo $seed $net $rate $wait $acc" >>"$work/all.txt"
    done
  done
done
echo
awk -v s="$slowdown" '
  { rate[$1, $3] += $4; acc[$1, $3] += $6; n[$1, $3]++ }
  END {
    for (a = 0; a < 2; a++) {
      algo = a == 0 ? "adpsgd" : "dpsgd"
      r = (rate[algo, "slow"] / n[algo, "slow"]) / (rate[algo, "even"] / n[algo, "even"])
      d = 100 * (acc[algo, "slow"] / n[algo, "slow"] - acc[algo, "even"] / n[algo, "even"])
      printf "%-7s others with a %gx straggler: %.2fx their throughput without it, x̄ accuracy %+.2f points (means over seeds)\n", algo, s, r, d
    }
  }' "$work/all.txt"
echo "Targets (AD-PSGD): throughput at least 0.9x, accuracy within 1 point."
echo "Note: with more peers than cores, the straggler's sleep frees CPU, so the others can run faster than without it."
