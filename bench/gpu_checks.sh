#!/usr/bin/env bash
# Runs every GPU test and measurement on a machine with an NVIDIA GPU, in order of
# importance, each step under its own time limit so that one hang cannot take the rest.
# It builds nothing: it runs the programs bench/gpu_bundle.sh put in .gpu/ (unpacking
# .gpupack/gpu.tar.xz first where only the archive was copied over).
# Steps (default: every one but profile and profattn):
#   kernels   kernels_cuda_test
#   device    device_cuda_test (the GPT step, DeviceRingAttention, the GPU pipeline)
#   nccl      nccl_group_test
#   cli       cli.gpu: the ring4 losses, --device cuda against --device cpu
#   sanitize  compute-sanitizer: memcheck over the kernel tests and the pipeline tests,
#             racecheck over the tensor-core attention tests
#   pipeline  the GPT step with --pp 1, 2 and 4 (stages share the GPUs round robin)
#   bench     kernels_bench: every kernel against the card's bandwidth, attention against
#             the cuBLAS BF16 GEMM rate
#   step      the GPT step against PyTorch eager and compiled, with the optimizer on the
#             host, and with BF16 GEMMs
#   profile   Nsight Compute: the device time per kernel over one GPT step (only when named)
#   profattn  Nsight Compute: each tensor-core attention tiling (only when named)
# Writes into $OUT (default /tmp/gpu-out): checks.log holds everything, summary.txt one line
# per step (exit code, milliseconds), ncu.csv the profile; the figures and failures are
# printed last.
#   bench/gpu_checks.sh [STEP...]
set -u
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
root=$(cd "$(dirname "$0")/.." && pwd)
gpu=$root/.gpu
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
log=$out/checks.log summary=$out/summary.txt
: >"$log"
: >"$summary"
steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(kernels device nccl cli sanitize pipeline bench step)
for s in "${steps[@]}"; do
  [[ " kernels device nccl cli sanitize pipeline bench step profile profattn " == *" $s "* ]] ||
    { echo "error: unknown step '$s' (kernels device nccl cli sanitize pipeline bench step profile profattn)" >&2
      exit 2; }
done
[[ -x $gpu/peertrain || ! -f $root/.gpupack/gpu.tar.xz ]] || tar -C "$root" -xJf "$root/.gpupack/gpu.tar.xz"
[[ -x $gpu/peertrain ]] || { echo "error: $gpu/peertrain is missing: run bench/gpu_bundle.sh first" >&2; exit 1; }

# This machine's own CUDA libraries (cuBLAS, NCCL, the runtime), wherever its system keeps them.
cuda_dirs=$(for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  find /usr/local /opt /usr/lib -name "$lib" 2>/dev/null | head -1
done | xargs -r -n1 dirname | sort -u | paste -sd:)
export LD_LIBRARY_PATH=$gpu/lib:$cuda_dirs:${LD_LIBRARY_PATH:-}
echo "libraries: $LD_LIBRARY_PATH" | tee -a "$log"
nvidia-smi -L 2>&1 | tee -a "$log"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee -a "$log"
for p in peertrain kernels_cuda_test device_cuda_test nccl_group_test kernels_bench; do
  ldd "$gpu/$p" | grep 'not found' | sed "s|^|$p: |" | tee -a "$log"
done
# Where this machine's C library is older than the build's, run through the copy in .gpu/glibc.
bin=$gpu
if ! "$gpu/peertrain" --version >/dev/null 2>>"$log"; then
  bin=/tmp/gpu-wrap
  mkdir -p "$bin"
  for p in peertrain kernels_cuda_test device_cuda_test nccl_group_test kernels_bench; do
    printf '#!/bin/sh\nexec %s --library-path %s %s "$@"\n' "$gpu/glibc/ld-linux-x86-64.so.2" \
      "$gpu/glibc:$LD_LIBRARY_PATH" "$gpu/$p" >"$bin/$p"
    chmod +x "$bin/$p"
  done
  echo "running through the C library in .gpu/glibc" | tee -a "$log"
fi
"$bin/peertrain" --version 2>&1 | tee -a "$log"
# The GPT trains on Debian's fortunes by default; where this machine has none, install the
# copy bench/gpu_bundle.sh packed.
[[ -d /usr/share/games/fortunes ]] || { mkdir -p /usr/share/games && cp -r "$gpu/fortunes" /usr/share/games/fortunes; }

step() {  # step NAME LIMIT_S COMMAND...: run it, log it, one summary line
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s%N)
  echo "=== $name: $*" >>"$log"
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  printf '%-10s rc=%-3s %6d ms\n' "$name" "$rc" $((($(date +%s%N) - start) / 1000000)) | tee -a "$summary" "$log"
}
want() { [[ " ${steps[*]} " == *" $1 "* ]]; }
want kernels && step kernels 60 "$bin/kernels_cuda_test" --gtest_brief=1
want device && step device 90 "$bin/device_cuda_test" --gtest_brief=1
want nccl && step nccl 90 "$bin/nccl_group_test" --gtest_brief=1
want cli && step cli 240 env PEERTRAIN="$bin/peertrain" bash "$root/tests/cli/gpu_cli_test.sh" "$root"
want sanitize && command -v compute-sanitizer >/dev/null &&
  step sanitize 60 compute-sanitizer --tool memcheck --error-exitcode 9 "$gpu/kernels_cuda_test" --gtest_brief=1 &&
  step pipecheck 90 compute-sanitizer --tool memcheck --error-exitcode 9 "$gpu/device_cuda_test" --gtest_brief=1 \
    --gtest_filter='*Pipeline*' &&
  # Shared-memory hazards of the tensor-core attention (cp.async buffers, barriers), every tiling.
  step racecheck 90 compute-sanitizer --tool racecheck --error-exitcode 9 "$gpu/kernels_cuda_test" --gtest_brief=1 \
    --gtest_filter='*TensorCore*:*Tiling*'
# The GPU pipeline's step against --pp 1 on the same card: stages as threads, each with its
# stream, sharing one GPU (or spread over several).
for pp in 1 2 4; do
  want pipeline && step "pp$pp" 60 "$bin/peertrain" bench step --model gpt --device cuda --pp "$pp" --microbatches 4 \
    --batch 32 --layers 6 --steps 30 --optimizer-on host
done
want bench && step bench 60 "$bin/kernels_bench"
want step && step step 120 env PEERTRAIN="$bin/peertrain" PYTHON=python3 bash "$root/bench/compare_gpt_step_gpu.sh"
# The same step with the optimizer on the host (the gradient comes out, AdamW on the CPU).
want step && step hoststep 60 "$bin/peertrain" bench step --model gpt --device cuda --optimizer-on host --batch 32 --steps 50
# BF16 GEMMs, and the forward attention on the tensor cores (the backward stays FP32).
want step && step bf16step 60 "$bin/peertrain" bench step --model gpt --device cuda --gemm-precision bf16 --batch 32 \
  --steps 50
# Where one GPT step's device time goes, kernel by kernel (Nsight Compute, one step after a
# warm-up; each kernel timed alone, so the sum is the device's busy time, not the step's).
if want profile && command -v ncu >/dev/null; then
  step profile 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$out/ncu.csv" \
    "$gpu/peertrain" bench step --model gpt --device cuda --batch 32 --steps 1 --warmup 1
  python3 - "$out/ncu.csv" <<'PY' | tee -a "$log"
import collections, csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]
name, value = head.index("Kernel Name"), head.index("Metric Value")
total, count = collections.Counter(), collections.Counter()
for r in rows[1:]:
    key = r[name].split("(")[0].split("<")[0][-60:]
    total[key] += float(r[value].replace(",", "")) / 1e3  # ns -> us
    count[key] += 1
print(f"device time by kernel over the profiled steps: {sum(total.values()):.0f} us in {sum(count.values())} launches")
for key, us in total.most_common(18):
    print(f"  {us:9.1f} us  {count[key]:4d}x  {key}")
PY
fi
# Why the tensor-core attention runs at the rate it does (Nsight Compute, each tiling once
# at T 4096, D 64; only when named): throughput, occupancy, scheduler and warp stalls.
if want profattn && command -v ncu >/dev/null; then
  step profattn 120 ncu --clock-control none --kernel-name regex:'attention_forward_(mma|wgmma)' \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
    --section SchedulerStats --section WarpStateStats "$gpu/kernels_bench" --profile-tilings
  stalls=$(printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' barrier long_scoreboard \
    short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle dispatch_stall not_selected selected membar \
    no_instruction branch_resolving misc sleeping drain imc_miss tex_throttle)
  step stalls 120 ncu --clock-control none --kernel-name regex:'attention_forward_(mma|wgmma)' \
    --metrics "${stalls%,}" "$gpu/kernels_bench" --profile-tilings
fi
# The figures and failures, last, where the end of the output shows them.
grep -E '^\[  FAILED|FAIL |vs cpu:|TFLOP/s|GB/s|ms/step|speed-up|peak|ERROR SUMMARY|error:|^rows|^step |^of which' "$log" | head -80
cat "$summary"
