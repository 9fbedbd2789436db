#!/usr/bin/env bash
# The Python module's overhead: one neighbor_allreduce of a 10 MB
# float32 tensor on a ring of 3 peers on loopback, from Python (3 processes under
# `peertrain launch -- python3`), against the C++ gossip exchange and mix of the same
# bytes (bench/gossip_bench's BM_GossipExchange: 3 peers on a ring, TCP on loopback), run
# back to back. Target: Python at most 1.1x the C++ time. Medians of the repeats.
# Usage: bench/python_overhead.sh [build-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
[[ -x $build/bench/gossip_bench ]] || { echo "error: $build/bench/gossip_bench is not built" >&2; exit 1; }
[[ -d $build/python/peertrain ]] || { echo "error: the Python module is not built (needs pybind11-dev)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
port=$((26000 + $$ % 1000))
{
  echo "graph: {generator: ring, n: 3}"
  echo "peers:"
  for i in 0 1 2; do echo "  - {id: $i, host: 127.0.0.1, port: $((port + i))}"; done
} >"$work/ring3.yaml"
cpp=$("$build/bench/gossip_bench" --benchmark_filter=BM_GossipExchange --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_format=json 2>/dev/null |
  grep -A12 '"name": "BM_GossipExchange[^"]*_median"' | grep -o '"real_time": [^,]*' | head -1 | cut -d' ' -f2)
line=$(PYTHONPATH=$build/python "$build/peertrain" launch --topology "$work/ring3.yaml" -- /usr/bin/python3 \
  "$root/bench/python_neighbor_allreduce.py" --mb 10 --repeats 30 2>/dev/null | grep -o "python_ms .*")
read -r _ py lo hi <<<"$line"
printf "C++ gossip exchange + mix, 10 MB, ring of 3   %8.2f ms (median of 5 runs)\n" "$cpp"
printf "Python neighbor_allreduce, 10 MB, ring of 3   %8.2f ms (median of 30; %.2f to %.2f)\n" "$py" "$lo" "$hi"
awk -v p="$py" -v c="$cpp" 'BEGIN { printf "ratio %.2fx (target <= 1.1x)\n", p / c }'
