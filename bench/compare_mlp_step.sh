#!/usr/bin/env bash
# One MLP training step (784-512-512-10 by default), peertrain against PyTorch on the CPU,
# run back to back on the same machine: ms per step, items/s, GFLOP/s, the speed-up, and
# Eigen's float GEMM rate at the same thread count as the ceiling.
#
#   bench/compare_mlp_step.sh [--batch 128] [--threads 1] [--hidden 512,512] [--steps 200]
#
# PEERTRAIN names the binary (default build/peertrain); PYTHON a Python with torch
# (default /usr/bin/python3). Numbers from a loaded machine are noise: run it alone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
peertrain=${PEERTRAIN:-$here/../build/peertrain}
python=${PYTHON:-/usr/bin/python3}
batch=128 threads=1 hidden=512,512 steps=200
while [[ $# -gt 0 ]]; do
  case $1 in
    --batch) batch=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --hidden) hidden=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $peertrain ]] || { echo "error: $peertrain is not built (cmake --build build --target peertrain)" >&2; exit 1; }

ours=$("$peertrain" bench step --model mlp --format json --batch "$batch" --threads "$threads" --hidden "$hidden" \
  --steps "$steps")
theirs=$(OMP_NUM_THREADS=$threads "$python" "$here/torch_mlp_step.py" --batch "$batch" --threads "$threads" \
  --hidden "$hidden" --steps "$steps")

"$python" - "$ours" "$theirs" <<'PY'
import json, sys
ours, theirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
flops = ours["flops_per_step"]
shape = ours["shape"]
print(f"MLP {shape} training step, batch {ours['batch']}, {ours['threads']} thread(s), median of {ours['steps']}")
print(f"{'':22}{'ms/step':>10}{'items/s':>12}{'GFLOP/s':>10}")
for name, r in (("peertrain", ours), (theirs["framework"] + " CPU", theirs)):
    print(f"{name:22}{r['ms_per_step']:10.3f}{r['items_per_s']:12.0f}{flops / r['ms_per_step'] / 1e6:10.1f}")
print(f"torch's BLAS: {theirs.get('blas', 'unknown')}")
print(f"speed-up              {theirs['ms_per_step'] / ours['ms_per_step']:.2f}x")
print(f"Eigen GEMM {ours['eigen_gemm_size']}^3        {ours['eigen_gemm_gflops']:.1f} GFLOP/s "
      f"(peertrain's step runs at {100 * ours['gflops'] / ours['eigen_gemm_gflops']:.0f}% of it)")
PY
