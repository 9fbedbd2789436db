#!/usr/bin/env bash
# The GPU path as a user runs it: 4 peers of the default GPT on a ring with --device cuda
# follow the CPU run's first 20 losses (fp32 GEMMs to 1e-4 relative, tf32 to 2e-2, bf16
# GEMMs and tensor-core attention to 5e-2; the GPU pipeline, --pp 2 and 3, to 1e-4; with
# two or more GPUs also --sp 2 over NCCL),
# and peer 0's log names the device. Exits 77 (skipped) where there is no GPU or no CUDA
# build. Usage: gpu_cli_test.sh SOURCE_DIR
set -u
root=$1
source "$(dirname "$0")/common.sh"

base=$((24000 + ($$ * 16) % 8000))  # below 32768, where the ephemeral ports begin
write_topology "$work/ring4.yaml" ring4 ring 4 "$base"

probe=$("$bin" launch --topology "$work/ring4.yaml" --model gpt --d-model 32 --heads 2 --layers 1 --seq 16 \
  --device cuda --max-steps 1 --eval-windows 2 --out "$work/probe" 2>&1)
if grep -q "built without CUDA\|no CUDA device" <<<"$probe"; then
  echo "skipped: $(grep -o 'error:.*' <<<"$probe" | head -1)"
  exit 77
fi

run() {  # run NAME ARGS...: the done-when command, 20 steps, a loss row per step and peer
  local name=$1
  shift
  # --eval-windows 2: the evaluation after every step stays small (the train losses are compared).
  "$bin" launch --topology "$work/ring4.yaml" --model gpt --max-steps 20 --eval-every 1 --eval-windows 2 \
    --out "$work/$name" "$@" \
    >"$work/$name.log" 2>&1 && ok || { fail "$name: launch $* failed"; tail -20 "$work/$name.log"; }
}
run cpu --device cpu
run fp32 --device cuda --gemm-precision fp32
run tf32 --device cuda

compare() {  # compare A B LIMIT: train_loss per (step, peer)
  local result
  result=$(compare_losses "$work/$1/metrics.csv" "$work/$2/metrics.csv")
  read -r matched worst <<<"$result"
  echo "$2 vs $1: $matched (step, peer) losses, worst relative difference $worst (limit $3)"
  [[ $matched -eq 80 ]] && ok || fail "$2: only $matched losses matched up"
  awk -v w="$worst" -v l="$3" 'BEGIN { exit !(w <= l) }' && ok || fail "$2: losses differ by $worst relative (limit $3)"
}
run bf16 --device cuda --gemm-precision bf16  # GEMMs and attention's forward in BF16
compare cpu fp32 1e-4
compare cpu tf32 2e-2
compare cpu bf16 5e-2
# The GPU pipeline: stages of consecutive units, one thread each, on the GPUs round robin
# (all on one with one GPU); the default batch in micro-batches through 1f1b and gpipe.
run pp2 --device cuda --pp 2 --microbatches 4 --gemm-precision fp32
compare cpu pp2 1e-4
run pp3 --device cuda --pp 3 --microbatches 2 --schedule gpipe --gemm-precision fp32
compare cpu pp3 1e-4
grep -q "3 pipeline stages" "$work/pp3/peer-0.log" 2>/dev/null && ok ||
  fail "peer 0's log of --pp 3 does not name the stages: $(grep -m1 gpt "$work/pp3/peer-0.log")"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [[ $gpus -ge 2 ]]; then  # sequence ranks over NCCL, one GPU each
  run sp2 --device cuda --sp 2 --gemm-precision fp32
  compare cpu sp2 1e-4
else
  echo "--sp 2 on the device not run: $gpus GPU(s)"
fi
grep -q "on NVIDIA\|on .*device 0" "$work/tf32/peer-0.log" 2>/dev/null && ok ||
  fail "peer 0's log does not name the GPU: $(grep -m1 gpt "$work/tf32/peer-0.log")"

echo "gpu cli tests: $pass passed, $failures failed"
exit $((failures > 0))
