#!/usr/bin/env bash
# One byte-level GPT training step (d_model 128, 4 layers, 4 heads, T 256, batch 8 by
# default), peertrain against PyTorch on the CPU, run back to back on the same machine:
# ms per step, tokens/s, GFLOP/s, the speed-up, and Eigen's float GEMM rate at the same
# thread count as the ceiling. Both sides take an AdamW step.
#
#   bench/compare_gpt_step.sh [--batch 8] [--seq 256] [--d-model 128] [--layers 4] [--heads 4]
#                             [--threads 1] [--steps 20]
#
# PEERTRAIN names the binary (default build/peertrain); PYTHON a Python with torch
# (default /usr/bin/python3). Numbers from a loaded machine are noise: run it alone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
peertrain=${PEERTRAIN:-$here/../build/peertrain}
python=${PYTHON:-/usr/bin/python3}
batch=8 seq=256 d=128 layers=4 heads=4 threads=1 steps=20
while [[ $# -gt 0 ]]; do
  case $1 in
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --d-model) d=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --heads) heads=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $peertrain ]] || { echo "error: $peertrain is not built (cmake --build build --target peertrain)" >&2; exit 1; }
"$python" -c 'import torch' 2>/dev/null || { echo "error: $python has no torch (apt-get install python3-torch)" >&2; exit 1; }

shape=(--batch "$batch" --seq "$seq" --d-model "$d" --layers "$layers" --heads "$heads" --threads "$threads" --steps "$steps")
ours=$("$peertrain" bench step --model gpt --format json "${shape[@]}")
theirs=$(OMP_NUM_THREADS=$threads "$python" "$here/torch_gpt_step.py" "${shape[@]}")

"$python" - "$ours" "$theirs" <<'PY'
import json, sys
ours, theirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
flops = ours["flops_per_step"]
print(f"GPT {ours['shape']} training step, batch {ours['batch']}, {ours['threads']} thread(s), median of {ours['steps']}")
print(f"{'':22}{'ms/step':>10}{'tokens/s':>12}{'GFLOP/s':>10}")
for name, r in (("peertrain", ours), (theirs["framework"] + " CPU", theirs)):
    print(f"{name:22}{r['ms_per_step']:10.2f}{r['tokens_per_s']:12.0f}{flops / r['ms_per_step'] / 1e6:10.1f}")
print(f"torch's BLAS: {theirs.get('blas', 'unknown')}")
print(f"speed-up              {theirs['ms_per_step'] / ours['ms_per_step']:.2f}x (target: at least 2.5x in every run)")
print(f"Eigen GEMM {ours['eigen_gemm_size']}^3        {ours['eigen_gemm_gflops']:.1f} GFLOP/s "
      f"(peertrain's step runs at {100 * ours['gflops'] / ours['eigen_gemm_gflops']:.0f}% of it)")
PY
