#!/usr/bin/env bash
# 32 peers on one machine, D-PSGD on an exponential graph, 200 steps: every peer must
# finish, and peer 0 must report all 32.
set -u
bin=${PEERTRAIN:?set PEERTRAIN to the peertrain binary}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
base=$((30000 + ($$ * 64) % 2000))
{
  echo "name: scale32"
  echo "graph: {generator: exponential, n: 32}"
  echo "peers:"
  for ((i = 0; i < 32; i++)); do echo "  - {id: $i, host: 127.0.0.1, port: $((base + i))}"; done
} >"$work/scale32.yaml"
if ! timeout 500 "$bin" launch --topology "$work/scale32.yaml" --max-steps 200 --eval-every 100 --hidden 32 \
    --batch 16 --connect-timeout 120 --peer-timeout 120 --out "$work/out" >"$work/launch.log" 2>&1; then
  echo "FAIL: launch of 32 peers failed"; tail -5 "$work/launch.log"; exit 1
fi
rows=$(($(wc -l <"$work/out/metrics.csv") - 1))
grep -q '"failed_peers": \[\]' "$work/out/summary.json" || { echo "FAIL: $(grep failed "$work/out/summary.json")"; exit 1; }
[[ $rows -eq 64 ]] || { echo "FAIL: metrics.csv has $rows rows, expected 2 x 32"; exit 1; }
echo "scale: 1 passed, 0 failed (32 peers, 200 steps, $(grep -o '"wall_s": [0-9.]*' "$work/out/summary.json"))"
