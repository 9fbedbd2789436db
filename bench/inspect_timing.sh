#!/usr/bin/env bash
# Times the whole `peertrain topology inspect` command (read, generate, validate, spectrum)
# on the issue's large graphs. Target, on 2 cores: under 3 s each for the 100,000-peer
# random 4-regular graph (scipy's eigsh is compared in docs/topology.md) and the
# 65,536-peer exponential graph. Usage: bench/inspect_timing.sh [build-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build}/peertrain
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin" topology generate random-regular --peers 100000 --degree 4 --seed 1 -o "$work/rr100k.yaml" 2>/dev/null
"$bin" topology generate exponential --peers 65536 -o "$work/exp64k.yaml" 2>/dev/null
"$bin" topology generate ring --peers 4096 -o "$work/ring4096.yaml" 2>/dev/null
"$bin" topology generate torus --rows 300 --cols 300 -o "$work/torus300.yaml" 2>/dev/null
"$bin" topology generate random-regular --peers 100000 --degree 4 --seed 1 --edges -o "$work/rr100k-edges.yaml" 2>/dev/null
printf "%-34s %8s %10s  %s\n" "topology" "wall s" "gap" "solver"
for f in rr100k exp64k ring4096 torus300 rr100k-edges; do
  start=$(date +%s.%N)
  out=$("$bin" topology inspect "$work/$f.yaml" --format json)
  end=$(date +%s.%N)
  gap=$(grep -o '"spectral_gap": [^,]*' <<<"$out" | head -1 | cut -d' ' -f2)
  solver=$(grep -o '"solver": "[^"]*"' <<<"$out" | head -1 | cut -d'"' -f4)
  printf "%-34s %8.3f %10.6g  %s\n" "$f" "$(echo "$end - $start" | bc)" "$gap" "$solver"
done
