#!/usr/bin/env bash
# Tensor parallelism and stage meshes as a user runs them, multi-process on loopback: a GPT
# whose two stages have different meshes (two sequence ranks, then four tensor ranks)
# follows the unsplit model's losses under every resharding strategy, --tp combines with
# --sp and --pp, emulated links change the time and not the numbers, and bad mesh
# specifications are named by stage and axis; --threads 2 (the batch split over threads)
# follows the unsplit losses too. Usage: mesh_cli_test.sh SOURCE_DIR
set -u
source "$(dirname "$0")/common.sh"

base=$((21000 + ($$ * 16 + 7) % 9000))
write_topology "$work/pair.yaml" pair complete 2 "$base"
tiny=(--model gpt --d-model 32 --layers 2 --heads 4 --seq 32 --batch 4 --eval-windows 4 --seed 5 --max-steps 10
      --eval-every 1 --connect-timeout 30 --peer-timeout 60)

run() {  # run NAME ARGS...: launch, report a failure with the log's tail
  local name=$1
  shift
  "$bin" launch --topology "$work/pair.yaml" "${tiny[@]}" "$@" --out "$work/$name" >"$work/$name.log" 2>&1 && ok ||
    { fail "launch $name [$*] failed"; tail -20 "$work/$name.log"; }
}
expect_same_losses() {  # expect_same_losses NAME LIMIT
  read -r n w <<<"$(compare_losses "$work/serial/metrics.csv" "$work/$1/metrics.csv")"
  echo "gpt $1: $n losses, worst relative difference from the unsplit model: $w"
  [[ $n -eq 20 ]] && awk -v w="$w" -v l="$2" 'BEGIN { exit !(w <= l) }' && ok || fail "$1: $n losses compared, worst $w"
}

run serial
for strategy in send-recv broadcast local-allgather; do
  run "mesh-$strategy" --pp 2 --microbatches 2 --stage-mesh "sp=2,tp=1;sp=1,tp=4" --reshard "$strategy"
  expect_same_losses "mesh-$strategy" 1e-5
done
grep -q "stage meshes sp=2,tp=1;sp=1,tp=4 (reshard local-allgather)" "$work/mesh-local-allgather/peer-0.log" && ok ||
  fail "peer log does not describe the stage meshes"
grep -q '"stage_mesh": "sp=2,tp=1;sp=1,tp=4"' "$work/mesh-broadcast/summary.json" && ok || fail "summary.json lacks stage_mesh"
run tp --tp 2 --sp 2 --pp 2 --microbatches 2
expect_same_losses tp 1e-5
run links --pp 2 --microbatches 2 --stage-mesh "sp=1,tp=2;sp=2,tp=1" --reshard broadcast --link-between-gbps 1
expect_same_losses links 1e-5
# --threads 2 without --sp/--pp: the batch's sequences split over two threads per peer.
run threads --threads 2
expect_same_losses threads 1e-5
grep -q "on the CPU, 2 threads over the batch" "$work/threads/peer-0.log" && ok ||
  fail "peer log does not say the batch is split over 2 threads"

expect_error() {  # expect_error PATTERN ARGS...
  local pattern=$1
  shift
  out=$("$bin" launch --topology "$work/pair.yaml" "$@" --out "$work/bad" 2>&1)
  code=$?
  if [[ $code -ne 0 ]] && grep -q -- "error:.*$pattern" <<<"$out"; then ok; else fail "[$*] gave exit $code: $out"; fi
}
expect_error "--stage-mesh stage 1 axis tp=3 does not divide the 4 attention heads" "${tiny[@]}" --pp 2 \
  --stage-mesh "sp=1;tp=3"
expect_error "--stage-mesh stage 1 (sp=1 × tp=4 = 4 workers) brings the peer to 6 workers, more than the 4" "${tiny[@]}" \
  --pp 2 --stage-mesh "sp=2;tp=4" --workers 4
expect_error "--stage-mesh stage 0 axis sp=3" "${tiny[@]}" --pp 2 --stage-mesh "sp=3;tp=1"
expect_error "--stage-mesh 'sp=2;xp=2': stage 1: 'xp=2' is not sp=N or tp=N" "${tiny[@]}" --pp 2 --stage-mesh "sp=2;xp=2"
expect_error "gives 3 stages, --pp is 2" "${tiny[@]}" --pp 2 --stage-mesh "sp=1;sp=1;sp=1"
expect_error "--tp tp=3 does not divide the 4 attention heads" "${tiny[@]}" --tp 3
expect_error "--reshard 'multicast'" "${tiny[@]}" --reshard multicast
expect_error "--link-between-gbps" "${tiny[@]}" --link-between-gbps 0

echo "mesh cli tests: $pass passed, $failures failed"
exit $((failures > 0))
