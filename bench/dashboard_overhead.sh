#!/usr/bin/env bash
# The dashboard's cost to training: steps per second of the same run without --dashboard
# and with it, watched by 20 WebSocket clients that never read and one that reads
# everything, alternated REPS times (default 3). Prints each pair and the median ratio.
# Usage: bench/dashboard_overhead.sh [REPS]   (PEERTRAIN: default build/peertrain)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${PEERTRAIN:-$root/build/peertrain}
reps=${1:-3}
work=$(mktemp -d)
trap 'pkill -f -- "$work" 2>/dev/null; rm -rf "$work"' EXIT
topology=$work/ring8.yaml
{
  echo "name: ring8"
  echo "graph: {generator: ring, n: 8}"
  echo "peers:"
  for i in $(seq 0 7); do echo "  - {id: $i, host: 127.0.0.1, port: $((26500 + i))}"; done
} > "$topology"
flags=(--hidden 64 --batch 32 --max-steps 1500 --eval-every 25)
rate() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["items_per_s"])' "$1/summary.json"; }
ratios=()
for ((r = 1; r <= reps; r++)); do
  "$bin" launch --topology "$topology" "${flags[@]}" --out "$work/plain" > "$work/plain.log" 2>&1
  plain=$(rate "$work/plain")
  "$bin" launch --topology "$topology" "${flags[@]}" --dashboard 0 --out "$work/watched" > "$work/watched.log" 2>&1 &
  launcher=$!
  url=""
  for _ in $(seq 100); do
    url=$(grep -o 'dashboard: http://[^ ]*' "$work/watched.log" 2> /dev/null | cut -d' ' -f2 || true)
    [[ -n $url ]] && break
    sleep 0.1
  done
  /usr/bin/python3 "$root/bench/dashboard_clients.py" "$url" 20 "$work" > "$work/clients.log" 2>&1 &
  clients=$!
  wait $launcher
  kill $clients 2> /dev/null || true
  wait $clients 2> /dev/null || true
  watched=$(rate "$work/watched")
  ratio=$(/usr/bin/python3 -c "print(f'{$watched / $plain:.3f}')")
  ratios+=("$ratio")
  echo "run $r: without the dashboard $plain items/s, with it and 21 clients $watched items/s: ratio $ratio ($(cat "$work/clients.log"))"
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
echo "median ratio (with / without): $median over $reps pairs, 8 peers on a ring, MLP 784-64-10, batch 32"
