#!/usr/bin/env bash
# The transformers as a user runs them, multi-process on loopback: the byte-level GPT on 4
# peers with --sp 2 --pp 2 follows the same losses as with --sp 1 --pp 1 (the engine's
# gradient equals the unsplit model's), the files carry bits per byte, the vit trains, and
# bad combinations of flags are named. Usage: transformer_cli_test.sh SOURCE_DIR [long]
#   long: train the GPT with --sp 2 --pp 2 until validation bits per byte fall below 2.5.
set -u
root=$1
mode=${2:-short}
source "$(dirname "$0")/common.sh"

base=$((21000 + ($$ * 16) % 9000))
write_topology "$work/ring4.yaml" ring4 ring 4 "$base"
tiny=(--model gpt --d-model 32 --layers 2 --heads 2 --seq 32 --batch 4 --eval-windows 4 --seed 3
      --connect-timeout 30 --peer-timeout 60)

if [[ $mode == long ]]; then
  # Done-when: 4 peers on a ring, --sp 2 --pp 2, validation bits per byte below 2.5.
  # The README's command, cut to keep CI short: the cosine decay over 2,000 steps instead
  # of 2,400, and 24 sequences per peer instead of 32. That ended at 2.469 in 660 s here,
  # against 2.41 in 860 s at 32. Cut further, it misses: 2.52 over 1,600 steps at 32,
  # 2.545 at 16, 2.524 with --seq 32, 2.501 at 1,200 steps with --lr 6e-3.
  "$bin" launch --topology "$work/ring4.yaml" --model gpt --sp 2 --pp 2 --microbatches 2 --seq 64 --batch 24 \
    --lr 3e-3 --weight-decay 0.1 --epochs 10 --max-steps 2000 --eval-every 400 --out "$work/long" >"$work/long.log" 2>&1
  code=$?
  bpb=$(grep -o '"val_bits_per_byte": [0-9.]*' "$work/long/summary.json" 2>/dev/null | cut -d' ' -f2)
  echo "long: gpt --sp 2 --pp 2 on ring4, validation bits per byte of x̄ after 2000 steps: ${bpb:-?} (exit $code)"
  [[ $code -eq 0 ]] && ok || { fail "long gpt run exited $code"; tail -20 "$work/long.log"; }
  awk -v b="${bpb:-9}" 'BEGIN { exit !(b < 2.5) }' && ok || fail "validation bits per byte ${bpb:-?} not below 2.5"
  echo "transformer cli tests (long): $pass passed, $failures failed"
  exit $((failures > 0))
fi

# 1. The same seed gives the same first 20 losses with --sp 2 --pp 2 as with --sp 1 --pp 1.
"$bin" launch --topology "$work/ring4.yaml" "${tiny[@]}" --max-steps 20 --eval-every 1 --out "$work/serial" \
  >"$work/serial.log" 2>&1 && ok || { fail "gpt --sp 1 --pp 1 launch failed"; tail -20 "$work/serial.log"; }
"$bin" launch --topology "$work/ring4.yaml" "${tiny[@]}" --sp 2 --pp 2 --microbatches 2 --max-steps 20 --eval-every 1 \
  --out "$work/split" >"$work/split.log" 2>&1 && ok || { fail "gpt --sp 2 --pp 2 launch failed"; tail -20 "$work/split.log"; }
rows=$(tail -n +2 "$work/split/metrics.csv" 2>/dev/null | wc -l)
[[ $rows -eq 80 ]] && ok || fail "metrics.csv has $rows rows, expected a train_loss row for every step and peer (80)"
head -1 "$work/split/metrics.csv" | grep -q "test_bits_per_byte" && ok || fail "metrics.csv lacks test_bits_per_byte"
grep -q '"val_bits_per_byte"' "$work/split/summary.json" 2>/dev/null && ok || fail "summary.json lacks val_bits_per_byte"
# step,peer → train_loss from both runs, compared to 1e-4 relative.
compare=$(compare_losses "$work/serial/metrics.csv" "$work/split/metrics.csv")
read -r matched worst <<<"$compare"
echo "gpt: $matched (step, peer) losses compared, worst relative difference sp2·pp2 vs sp1·pp1: $worst"
[[ $matched -eq 80 ]] && ok || fail "only $matched losses matched up"
awk -v w="$worst" 'BEGIN { exit !(w <= 1e-4) }' && ok || fail "losses differ by $worst relative (limit 1e-4)"

# 1b. The zero-bubble schedule splits each backward into B and W and puts the W's where the
# pipeline would idle; the gradient is the same sum in the same order, so its losses are
# 1F1B's bit for bit.
"$bin" launch --topology "$work/ring4.yaml" "${tiny[@]}" --pp 2 --stages 2,2 --microbatches 2 --max-steps 10 \
  --eval-every 1 --out "$work/1f1b" >"$work/1f1b.log" 2>&1 && ok || { fail "gpt --pp 2 1f1b launch failed"; tail -20 "$work/1f1b.log"; }
"$bin" launch --topology "$work/ring4.yaml" "${tiny[@]}" --pp 2 --stages 2,2 --microbatches 2 --max-steps 10 \
  --eval-every 1 --schedule zb-h1 --out "$work/zbh1" >"$work/zbh1.log" 2>&1 && ok ||
  { fail "gpt --pp 2 --schedule zb-h1 launch failed"; tail -20 "$work/zbh1.log"; }
if cmp -s <(cut -d, -f1,3,4 "$work/1f1b/metrics.csv") <(cut -d, -f1,3,4 "$work/zbh1/metrics.csv"); then ok; else
  fail "zb-h1 losses differ from 1f1b's"; fi
grep -q "zb-h1" "$work/zbh1/peer-0.log" && ok || fail "peer log does not name the zb-h1 schedule"
# Two chunks per stage (round robin, and the V) keep the numbers too, to float rounding.
for schedule in interleaved zb-v; do
  "$bin" launch --topology "$work/ring4.yaml" "${tiny[@]}" --pp 2 --microbatches 2 --max-steps 10 --eval-every 1 \
    --schedule $schedule --out "$work/$schedule" >"$work/$schedule.log" 2>&1 && ok ||
    { fail "gpt --pp 2 --schedule $schedule launch failed"; tail -20 "$work/$schedule.log"; }
  worst=$(compare_losses "$work/1f1b/metrics.csv" "$work/$schedule/metrics.csv")
  read -r n w <<<"$worst"
  echo "gpt --pp 2 --schedule $schedule: $n losses, worst relative difference from 1f1b $w"
  [[ $n -eq 40 ]] && awk -v w="$w" 'BEGIN { exit !(w <= 1e-5) }' && ok || fail "$schedule losses: $n compared, worst $w"
done
# PipeDream's asynchronous 1F1B changes the numbers: its first loss is 1F1B's (the same
# weights), the later ones differ (stale gradients; 3.6e-6 relative in 10 steps at this
# size, against float rounding's 1e-7 between the synchronous schedules), and it trains.
"$bin" launch --topology "$work/ring4.yaml" "${tiny[@]}" --pp 2 --stages 2,2 --microbatches 2 --max-steps 10 --eval-every 1 \
  --schedule pipedream --out "$work/pipedream" >"$work/pipedream.log" 2>&1 && ok ||
  { fail "gpt --pp 2 --schedule pipedream launch failed"; tail -20 "$work/pipedream.log"; }
grep -q "(pipedream, 2 micro-batches" "$work/pipedream/peer-0.log" && ok || fail "peer log does not name pipedream"
read -r n w <<<"$(compare_losses "$work/1f1b/metrics.csv" <(awk -F, 'NR == 1 || $1 == 1' "$work/pipedream/metrics.csv"))"
[[ $n -eq 4 ]] && awk -v w="$w" 'BEGIN { exit !(w <= 1e-6) }' && ok || fail "pipedream step 1: $n compared, worst $w"
read -r n w <<<"$(compare_losses "$work/1f1b/metrics.csv" "$work/pipedream/metrics.csv")"
echo "gpt --pp 2 --schedule pipedream: worst relative difference from 1f1b over $n losses $w (stale gradients)"
awk -v w="$w" 'BEGIN { exit !(w > 1e-6) }' && ok || fail "pipedream losses equal 1f1b's ($w): no staleness?"
awk -F, '$1 == 1 { a += $4 } $1 == 10 { b += $4 } END { exit !(b < a) }' "$work/pipedream/metrics.csv" && ok ||
  fail "pipedream did not lower the loss in 10 steps"
# A subword vocabulary: sentencepiece BPE of 8000 pieces trained on the training text and
# kept in the run's folder; --pp 2 follows --pp 1's first 20 losses; bits per byte are
# reported as for bytes.
for pp in 1 2; do
  "$bin" launch --topology "$work/ring4.yaml" "${tiny[@]}" --tokenizer sentencepiece --vocab-size 8000 --pp $pp \
    --microbatches 2 --max-steps 20 --eval-every 1 --out "$work/spm$pp" >"$work/spm$pp.log" 2>&1 && ok ||
    { fail "gpt --tokenizer sentencepiece --pp $pp launch failed"; tail -20 "$work/spm$pp.log"; }
done
ls "$work/spm1/tokenizer/"sentencepiece-*-8000.model >/dev/null 2>&1 && ok || fail "no sentencepiece model in the run's folder"
grep -q "8000 pieces" "$work/spm2/peer-0.log" && ok || fail "peer log does not describe the vocabulary"
worst=$(compare_losses "$work/spm1/metrics.csv" "$work/spm2/metrics.csv")
read -r n w <<<"$worst"
echo "gpt --tokenizer sentencepiece --vocab-size 8000: $n losses, worst relative difference pp 2 vs pp 1: $w"
[[ $n -eq 80 ]] && awk -v w="$w" 'BEGIN { exit !(w <= 1e-5) }' && ok || fail "sentencepiece pp 2: $n compared, worst $w"
grep -q '"val_bits_per_byte"' "$work/spm2/summary.json" 2>/dev/null && ok || fail "sentencepiece run lacks val_bits_per_byte"
# Vocabulary parallelism: the embedding and the output layer split over the 2 stages,
# vocab-1 under 1F1B and vocab-2 under V-Half, follow --pp 1 as well.
for vp in "vocab-1 1f1b" "vocab-2 v-half"; do
  read -r mode schedule <<<"$vp"
  "$bin" launch --topology "$work/ring4.yaml" "${tiny[@]}" --tokenizer sentencepiece --vocab-size 8000 --pp 2 \
    --microbatches 2 --schedule "$schedule" --vocab-parallel "$mode" --max-steps 20 --eval-every 1 \
    --out "$work/spm-$mode" >"$work/spm-$mode.log" 2>&1 && ok ||
    { fail "gpt --pp 2 --vocab-parallel $mode launch failed"; tail -20 "$work/spm-$mode.log"; }
  grep -q "vocabulary split $mode" "$work/spm-$mode/peer-0.log" && ok || fail "peer log does not name --vocab-parallel $mode"
  worst=$(compare_losses "$work/spm1/metrics.csv" "$work/spm-$mode/metrics.csv")
  read -r n w <<<"$worst"
  echo "gpt sentencepiece 8000 --pp 2 --vocab-parallel $mode --schedule $schedule: $n losses, worst relative difference from pp 1: $w"
  [[ $n -eq 80 ]] && awk -v w="$w" 'BEGIN { exit !(w <= 1e-5) }' && ok || fail "--vocab-parallel $mode: $n compared, worst $w"
done
# bench schedule replays every schedule; ZB-H2 has no bubble in the papers' measure.
out=$("$bin" bench schedule --pp 4 --microbatches 8 --format json 2>&1)
/usr/bin/python3 -c 'import json, sys
row = [r for r in json.load(sys.stdin) if r["schedule"] == "zb-h2"][0]
sys.exit(0 if (row["stages"], row["microbatches"], row["chunks"], row["bubble"]) == (4, 8, 1, 0) else 1)' <<<"$out" && ok ||
  fail "bench schedule: no zero ZB-H2 bubble in: $out"
[[ $(grep -c '"schedule"' <<<"$out") -eq 9 ]] && ok || fail "bench schedule printed $(grep -c '"schedule"' <<<"$out") schedules, expected 9"
# bench pipeline runs the engine and reports every stage; the LM head of a large
# vocabulary makes its stage the heaviest.
out=$("$bin" bench pipeline --vocab-size 4096 --d-model 32 --layers 2 --heads 2 --seq 16 --batch 4 --pp 2 \
  --microbatches 4 --schedule zb-h1 --steps 1 --format json 2>&1)
/usr/bin/python3 -c 'import json, sys
run = json.load(sys.stdin)
sys.exit(0 if run["stages"][0]["stage"] == 0 and run["schedule"] == "zb-h1" else 1)' <<<"$out" && ok ||
  fail "bench pipeline json: $out"
ratio=$(grep -o '"parameter_bytes_max_over_mean": [0-9.]*' <<<"$out" | cut -d' ' -f2)
awk -v r="${ratio:-0}" 'BEGIN { exit !(r > 1.0) }' && ok || fail "bench pipeline: parameter max/mean ${ratio:-?}"
out=$("$bin" bench pipeline --pp 9 --layers 2 --d-model 32 --heads 2 --seq 16 2>&1)
[[ $? -eq 2 ]] && grep -q "error: --pp 9" <<<"$out" && ok || fail "bench pipeline --pp 9: $out"
# bench reshard plans the paper's cases; on the modelled links (the time is not asserted:
# that is the benchmark's), local all-gather is within 1.3x of the bound and 3x faster
# than send-recv where the destination replicates (1 -> 4). Carried out over emulated
# links on a small tensor, every destination tile checks out (the bench fails otherwise).
out=$("$bin" bench reshard --model-only 2>&1)
[[ $(grep -c "send-recv\|broadcast\|local-allgather" <<<"$out") -eq 24 ]] && ok || fail "bench reshard: $out"
read -r naive best ratio <<<"$(awk '/^1 -> 4, replicate/ && / send-recv / { n = $(NF-4) }
  /^1 -> 4, replicate/ && / local-allgather / { b = $(NF-4); r = $NF } END { print n, b, r }' <<<"$out")"
awk -v n="${naive:-0}" -v b="${best:-1}" -v r="${ratio:-9}" 'BEGIN { exit !(r <= 1.3 && n >= 3 * b) }' && ok ||
  fail "bench reshard 1 -> 4: send-recv ${naive:-?} ms, local-allgather ${best:-?} ms, ratio ${ratio:-?}: $out"
out=$("$bin" bench reshard --shape 64x64 --between-gbps 10 --within-gbps 100 2>&1)
[[ $? -eq 0 && $(grep -c "emulated" <<<"$out") -eq 1 && $(grep -c "local-allgather" <<<"$out") -eq 8 ]] && ok ||
  fail "bench reshard, carried out: $out"
out=$("$bin" bench reshard --source 2 --destination 3 --source-layout S0,R --destination-layout S0,R --shape 4x4 2>&1)
[[ $? -eq 2 ]] && grep -q "error: the destination mesh: dimension 0 (4) does not split evenly over axis 0" <<<"$out" &&
  ok || fail "bench reshard bad layout: $out"
out=$("$bin" bench schedule --schedule interleaved --pp 4 --microbatches 6 2>&1)
[[ $? -eq 2 ]] && grep -q "error: --schedule interleaved: --microbatches 6" <<<"$out" && ok || fail "bench schedule interleaved m 6: $out"

# 2. The vit trains on Fashion-MNIST patches with --sp 2 and a GPipe pipeline.
"$bin" launch --topology "$work/ring4.yaml" --model vit --d-model 32 --layers 2 --heads 2 --batch 8 --max-steps 30 \
  --sp 2 --pp 2 --microbatches 2 --schedule gpipe --out "$work/vit" >"$work/vit.log" 2>&1 && ok ||
  { fail "vit launch failed"; tail -20 "$work/vit.log"; }
grep -q '"model": "vit"' "$work/vit/summary.json" 2>/dev/null && ok || fail "vit summary.json missing"

# 3. Bad combinations are named before any peer starts.
expect_error() {  # expect_error PATTERN ARGS...
  local pattern=$1
  shift
  out=$("$bin" launch --topology "$work/ring4.yaml" "$@" --out "$work/bad" 2>&1)
  code=$?
  if [[ $code -ne 0 ]] && grep -q "error:.*$pattern" <<<"$out"; then ok; else fail "[$*] gave exit $code: $out"; fi
}
expect_error "--microbatches 3" "${tiny[@]}" --pp 2 --microbatches 3
expect_error "--sp\|zigzag\|divide" "${tiny[@]}" --sp 3
expect_error "--stages" "${tiny[@]}" --pp 2 --stages 1,1
expect_error "--heads 5" "${tiny[@]}" --heads 5
expect_error "--model 'bert'" --model bert
expect_error "--schedule" "${tiny[@]}" --schedule zigzag
expect_error "--pp 4 with --schedule zb-v (2 chunks per stage)" "${tiny[@]}" --pp 4 --microbatches 2 --schedule zb-v
expect_error "--chunks 1" "${tiny[@]}" --pp 2 --microbatches 2 --schedule interleaved --chunks 1
expect_error "--vocab-size 100" "${tiny[@]}" --tokenizer sentencepiece --vocab-size 100
expect_error "--tokenizer bytes has 256" "${tiny[@]}" --vocab-size 8000
expect_error "--tokenizer 'wordpiece'" "${tiny[@]}" --tokenizer wordpiece
expect_error "--tokenizer sentencepiece needs --model gpt" --model vit --tokenizer sentencepiece
expect_error "--vocab-parallel vocab-1 with --pp 1" "${tiny[@]}" --vocab-parallel vocab-1
expect_error "--schedule pipedream: --microbatches 2 is too few for --pp 4" "${tiny[@]}" --pp 4 --microbatches 2 \
  --schedule pipedream
expect_error "--schedule pipedream with --vocab-parallel" "${tiny[@]}" --pp 2 --microbatches 2 --schedule pipedream \
  --vocab-parallel vocab-1
expect_error "--vocab-size 8001 does not split evenly over --pp 2" "${tiny[@]}" --tokenizer sentencepiece \
  --vocab-size 8001 --pp 2 --microbatches 2 --vocab-parallel vocab-2
expect_error "--vocab-parallel 'vocab-3'" "${tiny[@]}" --pp 2 --vocab-parallel vocab-3
expect_error "--vocab-parallel vocab-1: splits gpt's vocabulary" --model vit --d-model 32 --layers 2 --heads 2 \
  --pp 2 --vocab-parallel vocab-1
expect_error "gpt or vit" --sp 2
# A flag the chosen model reads nowhere is refused, not left unread.
expect_error "--seq is for --model gpt" --seq 64
expect_error "--hidden is for --model mlp" "${tiny[@]}" --hidden 64
expect_error "--eval-windows is for --model gpt (a ViT" --model vit --eval-windows 4
expect_error "--momentum is for --optimizer sgd" "${tiny[@]}" --momentum 0.5
expect_error "--alpha is for --partition dirichlet" --alpha 0.1
expect_error "--warmup-steps is for --lr-schedule cosine" --warmup-steps 5
expect_error "--device 'gpu'" "${tiny[@]}" --device gpu
expect_error "--device cuda runs --model gpt" --device cuda
expect_error "--device cuda runs --sp S (one GPU each) or --pp P with --sp 1" "${tiny[@]}" --device cuda --pp 2 \
  --schedule zb-h1
expect_error "not --tp or --stage-mesh (got --sp 1 --tp 2" "${tiny[@]}" --device cuda --tp 2
expect_error "--sp 2 --tp 1 --pp 2" "${tiny[@]}" --device cuda --pp 2 --sp 2
expect_error "--gemm-precision 'fp16'" "${tiny[@]}" --gemm-precision fp16
out=$("$bin" bench step --model mlp --device cuda 2>&1)
[[ $? -eq 2 ]] && grep -q "error: --device cuda times --model gpt" <<<"$out" && ok || fail "bench step mlp --device cuda: $out"
# The step's report: its rate beside Eigen's GEMM, and (in a build with FMA vectors, one
# thread) beside one core's FMA peak, in the text and in the JSON alike.
text=$("$bin" bench step --model mlp --steps 2 2>&1) && json=$("$bin" bench step --model mlp --steps 2 --format json 2>&1)
if [[ $? -eq 0 ]] && grep -q "of Eigen's GEMM" <<<"$text"; then
  if grep -q '"fma_peak_gflops"' <<<"$json"; then
    grep -q "one core's FMA peak (24 chains): the step runs at [0-9]*% of it" <<<"$text" && ok || fail "bench step peak line: $text"
  else
    ! grep -q "FMA peak" <<<"$text" && ok || fail "bench step: a peak line without fma_peak_gflops in the JSON: $text"
  fi
else
  fail "bench step --model mlp --steps 2: $text $json"
fi
# A flag for another model is refused, not left unread.
for bad in "--model mlp --layers 2:--layers is for --model gpt or vit" "--model gpt --hidden 64:--hidden is for --model mlp" \
  "--model vit --seq 64:--seq is for --model gpt (a ViT" "--model gpt --patch 4:--patch is for --model vit" \
  "--model gpt --gemm-precision bf16:--gemm-precision is for --device cuda"; do
  read -r -a flags <<<"${bad%%:*}"
  out=$("$bin" bench step "${flags[@]}" --steps 1 2>&1)
  [[ $? -eq 2 ]] && grep -q -- "error: ${bad#*:}" <<<"$out" && ok || fail "bench step ${bad%%:*}: $out"
done
if ! nvidia-smi -L >/dev/null 2>&1; then  # no GPU here: --device cuda must say why
  expect_error "built without CUDA\|no CUDA device" "${tiny[@]}" --device cuda
  expect_error "built without CUDA\|no CUDA device" "${tiny[@]}" --device cuda --pp 2 --microbatches 2
fi
expect_error "fortunes\|no such directory" "${tiny[@]}" --text-dir "$work/none" --max-steps 1

echo "transformer cli tests: $pass passed, $failures failed"
exit $((failures > 0))
