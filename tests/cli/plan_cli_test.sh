#!/usr/bin/env bash
# peertrain plan as a user runs it: the search over a peer's workers prints the winner and
# why the others lose, reads its profiles back from the cache the second time, runs the best
# K on the engine with --measure, refuses
# what does not fit with the reason, predicts one --strategy, and names bad flags.
# Usage: plan_cli_test.sh SOURCE_DIR
set -u
source "$(dirname "$0")/common.sh"

tiny=(--d-model 32 --layers 2 --heads 2 --seq 32 --batch 4 --profile-cache "$work/profile.tsv")
out=$("$bin" plan "${tiny[@]}" --workers 2 --top 3 2>&1)
[[ $? -eq 0 ]] && grep -q "the winner" <<<"$out" && grep -q "%: " <<<"$out" && ok || fail "plan --workers 2: $out"
[[ -s $work/profile.tsv ]] && ok || fail "plan wrote no profile cache"
out=$("$bin" plan "${tiny[@]}" --workers 2 --top 3 2>&1)
grep -q "profiles: 0 measured now" <<<"$out" && ok || fail "second plan measured again: $out"
# --measure K: K of the best predicted (one of each kind of split first) run on the engine; the fastest measured wins.
out=$("$bin" plan "${tiny[@]}" --workers 2 --top 4 --measure 2 --measure-rounds 2 --measure-steps 1 2>&1)
[[ $? -eq 0 ]] && grep -q "the winner: fastest measured" <<<"$out" && grep -q "% measured (" <<<"$out" &&
  grep -q "not measured; predicted " <<<"$out" && grep -q "measuring 2 candidates on the engine: round 2 of 2" <<<"$out" &&
  ! grep -q "profiling 0 unit shapes" <<<"$out" &&
  ok || fail "plan --measure 2: $out"
out=$("$bin" plan "${tiny[@]}" --workers 2 --measure 2 --measure-rounds 2 --measure-steps 1 --format json 2>&1)
[[ $(grep -o '"measured_rounds_s":\[[0-9.e-]*, *[0-9.e-]*\]' <<<"$out" | wc -l) -eq 2 ]] && ok ||
  fail "plan --measure 2 --format json: two strategies with two rounds each expected: $out"
# --profile-rounds R: a fresh cache's unit shapes measured in R rounds.
out=$("$bin" plan "${tiny[@]/$work\/profile.tsv/none}" --strategy --pp 2 --microbatches 2 --profile-rounds 2 2>&1)
[[ $? -eq 0 ]] && grep -q "unit shapes in 2 rounds" <<<"$out" && ok || fail "plan --profile-rounds 2: $out"
out=$("$bin" plan "${tiny[@]}" --workers 2 --memory-per-worker 1KiB 2>&1)
grep -q "no strategy fits" <<<"$out" && grep -q "does not fit: stage 0's workers need" <<<"$out" && ok ||
  fail "plan under a 1 KiB cap: $out"
out=$("$bin" plan "${tiny[@]}" --strategy --pp 2 --microbatches 2 --schedule zb-h1 --format json 2>&1)
grep -q '"strategy":"sp1 tp1 pp2 m2 zb-h1", *"feasible":true, *"step_s":' <<<"$out" && ok || fail "plan --strategy: $out"
out=$("$bin" plan "${tiny[@]}" --strategy --pp 2 --microbatches 2 --vocab-parallel vocab-2 --format json 2>&1)
grep -q '"strategy":"sp1 tp1 pp2 m2 1f1b vocab-2", *"feasible":true, *"step_s":' <<<"$out" && ok ||
  fail "plan --strategy --vocab-parallel vocab-2: $out"
out=$("$bin" plan "${tiny[@]}" --strategy --tp 3 --format json 2>&1)
grep -q '"feasible":false, *"why_not":"--tp tp=3 does not divide the 2 attention heads' <<<"$out" && ok ||
  fail "plan --strategy --tp 3: $out"
# --run trains with the winner on a topology.
base=$((21000 + ($$ * 16 + 11) % 9000))
write_topology "$work/pair.yaml" pair complete 2 "$base"
out=$("$bin" plan "${tiny[@]}" --workers 2 --run --topology "$work/pair.yaml" --max-steps 5 --out "$work/run" 2>&1)
[[ $? -eq 0 ]] && grep -q "plan --run: peertrain launch" <<<"$out" && [[ -s $work/run/metrics.csv ]] && ok ||
  fail "plan --run: $out"
# Across peers: the algorithms ranked for a topology's links, each with its bottleneck.
printf 'links:\n  default: {latency_ms: 10, bandwidth_mbps: 100}\n' >>"$work/pair.yaml"
out=$("$bin" plan --topology "$work/pair.yaml" --compare --model mlp --hidden 32 --batch 8 2>&1)
[[ $? -eq 0 && $(grep -c "^dpsgd\|^allreduce\|^ps" <<<"$out") -ge 5 ]] && grep -q "link 0-1 (10 ms" <<<"$out" &&
  grep -q "^allreduce-tree" <<<"$out" && grep -q "^allreduce-rd" <<<"$out" && ok ||
  fail "plan --topology --compare (dpsgd, the ring, tree and rd all-reduces, ps): $out"
# ... then DiLoCo's and Streaming DiLoCo's utilisation and the bandwidth each needs.
grep -q "^DiLoCo H=50 .*%" <<<"$out" && grep -q "^Streaming DiLoCo int8 H=50 F=4 tau=1 .*%" <<<"$out" && ok ||
  fail "plan --compare lacks the low-communication methods: $out"
out=$("$bin" plan --topology "$work/pair.yaml" --compare --model mlp --hidden 32 --inner-steps 8 --fragments 4 \
  --overlap 2 2>&1)
[[ $? -eq 2 ]] && grep -q "error: --overlap 2: an exchange must land before the next begins" <<<"$out" && ok ||
  fail "plan --overlap 2 with H 8, F 4: $out"
out=$("$bin" plan --topology "$work/pair.yaml" --algorithm allreduce --allreduce-algo star --model mlp 2>&1)
[[ $? -ne 0 ]] && grep -q "error: --allreduce-algo 'star'" <<<"$out" && ok || fail "plan --allreduce-algo star: $out"
out=$("$bin" plan --topology "$work/pair.yaml" --algorithm gossip --model mlp 2>&1)
[[ $? -ne 0 ]] && grep -q "error: --algorithm 'gossip'" <<<"$out" && ok || fail "plan --algorithm gossip: $out"
expect_error() {  # expect_error PATTERN ARGS...
  local pattern=$1
  shift
  out=$("$bin" plan "$@" 2>&1)
  if [[ $? -eq 2 ]] && grep -q -- "error:.*$pattern" <<<"$out"; then ok; else fail "plan [$*]: $out"; fi
}
expect_error "--memory-per-worker 'lots'" "${tiny[@]}" --workers 2 --memory-per-worker lots
expect_error "plan: --workers W" "${tiny[@]}"
expect_error "plan: --workers must be at least 1, got 0" "${tiny[@]}" --workers 0
expect_error "--top must be at least 1, got 0" "${tiny[@]}" --workers 2 --top 0
# A flag of the other mode is refused, not silently left unread.
expect_error "--pp sets one strategy: add --strategy to predict it, or leave it out to search" "${tiny[@]}" --workers 2 --pp 2
expect_error "--link-between-gbps sets one strategy" "${tiny[@]}" --workers 2 --link-between-gbps 1
expect_error "--hidden is for plan --topology FILE" "${tiny[@]}" --workers 2 --hidden 64
expect_error "--link-within-gbps needs --link-between-gbps" "${tiny[@]}" --strategy --pp 2 --link-within-gbps 1
expect_error "plan --run needs --topology" "${tiny[@]}" --workers 2 --run
expect_error "--format 'yaml'" "${tiny[@]}" --workers 2 --format yaml
expect_error "--vocab-parallel 'vocab-3'" "${tiny[@]}" --strategy --pp 2 --vocab-parallel vocab-3
# Evaluation rounds: counted on shared cores (the others' test passes), refused where not modelled.
out=$("$bin" plan --topology "$work/pair.yaml" --model mlp --hidden 32 --batch 8 --cores 1 --eval-every 1 2>&1)
[[ $? -eq 0 ]] && grep -q "a test pass of .* ms every 1 steps" <<<"$out" && ok || fail "plan --eval-every 1: $out"
expect_error "--eval-every must be 0" --topology "$work/pair.yaml" --model mlp --eval-every -1
expect_error "--sp sets one strategy: add --strategy to predict it (" --topology "$work/pair.yaml" --model mlp --sp 2
expect_error "--eval-every: the evaluation rounds are modelled for --model mlp only" --topology "$work/pair.yaml" \
  --model gpt --eval-every 5
expect_error "--cores must be at least 1" --topology "$work/pair.yaml" --model mlp --cores 0
expect_error "--contention and --no-contention: choose one" "${tiny[@]}" --workers 2 --contention --no-contention
expect_error "--contention and --no-contention: choose one" --topology "$work/pair.yaml" --model mlp --contention --no-contention
expect_error "--measure must be 0" "${tiny[@]}" --workers 2 --measure -1
expect_error "--measure-steps must be at least 1, got 0" "${tiny[@]}" --workers 2 --measure 2 --measure-steps 0
expect_error "--measure is for one peer's strategies" --topology "$work/pair.yaml" --model mlp --measure 2
expect_error "--profile-rounds must be at least 1" "${tiny[@]}" --workers 2 --profile-rounds 0
expect_error "--profile-rounds is for one peer's strategies" --topology "$work/pair.yaml" --model mlp --profile-rounds 3
expect_error "--eval-every is for plan --topology" "${tiny[@]}" --workers 2 --eval-every 5
expect_error "--top is for one peer's strategies" --topology "$work/pair.yaml" --model mlp --top 3
expect_error "--max-steps is for plan --run" "${tiny[@]}" --workers 2 --max-steps 10

echo "plan cli tests: $pass passed, $failures failed"
exit $((failures > 0))
