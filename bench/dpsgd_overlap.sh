#!/usr/bin/env bash
# Does the exchange of x_k hide behind the gradient at x_k? Two peers on an emulated
# 2 Gbit/s link train the 784-512-512-10 MLP (2.7 MB of parameters) three ways:
#   compute alone:  --algorithm local, batch 128
#   exchange alone: --algorithm dpsgd, batch 1 (the gradient costs almost nothing)
#   D-PSGD:         --algorithm dpsgd, batch 128
# Targets: D-PSGD step time <= 1.1 x max(compute, exchange) up to 2 Gbit/s, <= 1.3 x
# at 8 Gbit/s and above (there both cores are busy with the gradients and the
# exchange's copies, docs/algo.md).
# The peers move their payloads through shared memory, as any two peers on one host do by
# default (docs/net.md); `off` as the third argument keeps every byte on loopback TCP.
# Usage: bench/dpsgd_overlap.sh [build-dir] [bandwidth_mbps] [auto|off]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build}/peertrain
mbps=${2:-2000}
shared=${3:-auto}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
base=$((26000 + $$ % 1000))
cat >"$work/pair.yaml" <<YAML
name: pair
graph: {generator: ring, n: 2}
peers: [{id: 0, host: 127.0.0.1, port: $base}, {id: 1, host: 127.0.0.1, port: $((base + 1))}]
links: {default: {latency_ms: 0, bandwidth_mbps: $mbps}}
YAML
ms_per_step() {  # ALGORITHM BATCH LR
  "$bin" launch --topology "$work/pair.yaml" --algorithm "$1" --batch "$2" --lr "$3" --max-steps 400 \
    --eval-every 400 --shared-memory "$shared" --out "$work/$1-$2" >/dev/null 2>&1
  awk -F': ' '/"wall_s"/ {w=$2} /"steps"/ {s=$2} END {gsub(",", "", w); gsub(",", "", s); printf "%.3f", 1000 * w / s}' \
    "$work/$1-$2/summary.json"
}
compute=$(ms_per_step local 128 0.05)
exchange=$(ms_per_step dpsgd 1 0.001)
dpsgd=$(ms_per_step dpsgd 128 0.05)
awk -v c="$compute" -v e="$exchange" -v d="$dpsgd" -v m="$mbps" -v s="$shared" 'BEGIN {
  bound = (c > e ? c : e)
  printf "link %d Mbit/s, 2 peers, 784-512-512-10 MLP, batch 128 per peer, --shared-memory %s\n", m, s
  printf "compute alone     %7.2f ms/step\n", c
  printf "exchange alone    %7.2f ms/step\n", e
  printf "D-PSGD            %7.2f ms/step  = %.2f x max(compute, exchange)  (target <= %.2f; no overlap would be %.2f)\n",
         d, d / bound, (m >= 8000 ? 1.3 : 1.1), (c + e) / bound
}'
