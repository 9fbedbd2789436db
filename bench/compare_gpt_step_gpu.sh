#!/usr/bin/env bash
# One byte-level GPT training step on the GPU, peertrain (--device cuda) against PyTorch
# (eager, and torch.compile where it works) on the same card, back to back: tokens/s, the
# speed-up, and peak device memory. Both sides take an AdamW step; peertrain's step
# includes what training pays for: the copy of the parameters in through pinned memory
# and, with the optimizer on the device (the default, as training runs it), of its update
# out, then x − u on the host; with --optimizer-on host the gradient comes out and AdamW
# runs on the CPU.
#
#   bench/compare_gpt_step_gpu.sh [--batch 32] [--seq 256] [--d-model 128] [--layers 4]
#                                 [--heads 4] [--gemm-precision tf32] [--steps 50]
#                                 [--optimizer-on device|host]
#
# PEERTRAIN names the binary (default build/peertrain, a CUDA build); PYTHON a Python with
# torch built for CUDA (default /usr/bin/python3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
peertrain=${PEERTRAIN:-$here/../build/peertrain}
python=${PYTHON:-/usr/bin/python3}
batch=32 seq=256 d=128 layers=4 heads=4 steps=50 gemm=tf32 optimizer_on=device
while [[ $# -gt 0 ]]; do
  case $1 in
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --d-model) d=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --heads) heads=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --gemm-precision) gemm=$2; shift 2 ;;
    --optimizer-on) optimizer_on=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $peertrain ]] || { echo "error: $peertrain is not built" >&2; exit 1; }
"$python" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null ||
  { echo "error: $python has no CUDA torch or no GPU is visible" >&2; exit 1; }

shape=(--batch "$batch" --seq "$seq" --d-model "$d" --layers "$layers" --heads "$heads" --steps "$steps")
ours=$("$peertrain" bench step --model gpt --device cuda --gemm-precision "$gemm" --optimizer-on "$optimizer_on" \
  --format json "${shape[@]}")
tf32=()
[[ $gemm == tf32 ]] && tf32=(--tf32)
theirs=$("$python" "$here/torch_gpt_step.py" --device cuda "${tf32[@]}" "${shape[@]}")
# torch.compile needs Triton and a working compiler toolchain; where it fails, say so and go on.
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
compiled=$("$python" "$here/torch_gpt_step.py" --device cuda --compile "${tf32[@]}" "${shape[@]}" 2>"$errors" |
  tail -1) || compiled=""
[[ -n $compiled ]] || echo "torch.compile did not run: $(tail -1 "$errors")" >&2

"$python" - "$ours" "$theirs" "$compiled" <<'PY'
import json, sys
ours, theirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
compiled = json.loads(sys.argv[3]) if sys.argv[3] else None
print(f"device      {ours['device']}")
print(f"model       gpt {ours['shape']}, batch {ours['batch']}")
print(f"peertrain   {ours['ms_per_step']:.3f} ms/step, {ours['tokens_per_s']:.0f} tokens/s, "
      f"peak {ours['peak_device_bytes'] / 2**20:.1f} MiB (AdamW on the {ours['optimizer_on']}; its host part {ours['host_optimizer_ms']:.3f} ms)")
print(f"{theirs['framework']:<11} {theirs['ms_per_step']:.3f} ms/step, {theirs['tokens_per_s']:.0f} tokens/s, "
      f"peak {theirs['peak_device_bytes'] / 2**20:.1f} MiB")
if compiled:
    print(f"{compiled['framework']:<11} {compiled['ms_per_step']:.3f} ms/step, {compiled['tokens_per_s']:.0f} tokens/s, "
          f"peak {compiled['peak_device_bytes'] / 2**20:.1f} MiB")
print(f"speed-up    {theirs['ms_per_step'] / ours['ms_per_step']:.2f}x over eager"
      + (f", {compiled['ms_per_step'] / ours['ms_per_step']:.2f}x over compiled" if compiled else ""))
PY
