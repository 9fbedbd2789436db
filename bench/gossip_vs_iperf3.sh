#!/usr/bin/env bash
# Gossip exchange of a 10 MB parameter vector with two neighbours (3 peers on a ring, on
# loopback) against iperf3 on loopback, in one run. Target: >= 80% of iperf3's rate, over
# loopback TCP alone (what iperf3 measures). The same traffic with the payloads through
# shared memory (the default between peers on one host, docs/net.md) is printed after it.
# Usage: bench/gossip_vs_iperf3.sh [build-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
command -v iperf3 >/dev/null || { echo "error: iperf3 is not installed (apt-get install iperf3)" >&2; exit 1; }
port=$((25000 + $$ % 1000))
iperf3 -s -p "$port" -1 >/dev/null 2>&1 &
server=$!
sleep 0.5
iperf=$(iperf3 -c 127.0.0.1 -p "$port" -t 5 -J | grep -A8 '"sum_received"' | grep -o '"bits_per_second":[^,]*' | head -1 | cut -d: -f2 | tr -d '[:space:]')
wait $server 2>/dev/null || true
json=$("$build/bench/gossip_bench" --benchmark_format=json 2>/dev/null)
rate() { grep -A40 "\"name\": \"$1" <<<"$json" | grep -o '"loopback_total_Gbitps": [^,]*' | head -1 | cut -d' ' -f2; }
ms() { grep -A40 "\"name\": \"$1" <<<"$json" | grep -o '"real_time": [^,]*' | head -1 | cut -d' ' -f2; }
calc() { awk "BEGIN { printf \"%.6f\", $1 }"; }
iperf_g=$(calc "$iperf / 1e9")
transfer=$(rate BM_TransferOnly/10485760/0)
exchange=$(rate BM_GossipExchange/10485760/0)
shared_transfer=$(rate BM_TransferOnly/10485760/1)
shared_exchange=$(rate BM_GossipExchange/10485760/1)
printf "iperf3 loopback, 1 stream                %6.2f Gbit/s\n" "$iperf_g"
printf "transport alone (3 peers x 2 links)      %6.2f Gbit/s  %5.1f%% of iperf3  (%.1f ms per 10 MB exchange)\n" \
  "$transfer" "$(calc "100 * $transfer / $iperf_g")" "$(ms BM_TransferOnly/10485760/0)"
printf "gossip exchange + mix (D-PSGD step)      %6.2f Gbit/s  %5.1f%% of iperf3  (%.1f ms per 10 MB exchange)\n" \
  "$exchange" "$(calc "100 * $exchange / $iperf_g")" "$(ms BM_GossipExchange/10485760/0)"
printf "shared memory: transport alone           %6.2f Gbit/s  %5.1f%% of iperf3  (%.1f ms per 10 MB exchange)\n" \
  "$shared_transfer" "$(calc "100 * $shared_transfer / $iperf_g")" "$(ms BM_TransferOnly/10485760/1)"
printf "shared memory: gossip exchange + mix     %6.2f Gbit/s  %5.1f%% of iperf3  (%.1f ms per 10 MB exchange)\n" \
  "$shared_exchange" "$(calc "100 * $shared_exchange / $iperf_g")" "$(ms BM_GossipExchange/10485760/1)"
