#!/usr/bin/env bash
# DiLoCo from the command line, as a user runs it: over the all-reduce it sends the
# all-reduce run's bytes divided by H (measured); over each exchange it trains; Streaming
# DiLoCo with int8 pseudo-gradients gives the same metrics, bit for bit, on a simulated
# cluster as on real processes; a killed peer is left out over gossip and over the
# all-reduce (the survivors regroup), and the others finish;
# bad flags get one error line naming them.
# Usage: PEERTRAIN=build/peertrain diloco_cli_test.sh SOURCE_DIR
set -u
source "$(dirname "$0")/common.sh"
write_topology "$work/ring4.yaml" ring4 ring 4 $((25000 + RANDOM % 2000))
write_topology "$work/ring6.yaml" ring6 ring 6 $((27000 + RANDOM % 2000))
small=(--batch 16 --connect-timeout 20 --peer-timeout 20 --max-steps 40 --eval-every 20)


# 1. Each exchange trains end to end; the summary records the outer loop.
for flags in "allreduce" "diloco --inner-steps 10" "diloco --inner-steps 10 --outer-exchange ps" \
             "diloco --inner-steps 10 --outer-exchange gossip" \
             "diloco --inner-steps 10 --fragments 2 --overlap 2 --outer-compression fp8" \
             "diloco --inner-steps 10 --outer-compression sparse:0.02"; do
  out="$work/run-${flags//[ :.]/_}"
  # shellcheck disable=SC2086
  if timeout 300 "$bin" launch --topology "$work/ring4.yaml" --algorithm $flags "${small[@]}" --out "$out" \
      >"$out.log" 2>&1 && [[ -s $out/summary.json ]]; then
    ok
  else
    fail "launch --algorithm $flags"; tail -5 "$out.log"; continue
  fi
  acc=$(summary "$out" test_accuracy)
  awk -v a="${acc:-0}" 'BEGIN { exit !(a > 0.3) }' && ok || fail "$flags: x̄ accuracy ${acc:-?} after 40 steps"
done
grep -q '"exchange":"gossip"' "$work/run-diloco_--inner-steps_10_--outer-exchange_gossip/summary.json" &&
  ok || fail "summary.json does not record the outer exchange"

# 2. Bytes: DiLoCo's per peer are the all-reduce's over H = 10, within 2 %.
dense=$(summary "$work/run-allreduce" bytes_sent_per_peer)
outer=$(summary "$work/run-diloco_--inner-steps_10" bytes_sent_per_peer)
echo "bytes per peer: allreduce $dense, diloco H=10 $outer"
awk -v d="${dense:-0}" -v o="${outer:-1e99}" 'BEGIN { r = o * 10 / d; exit !(r > 0.98 && r < 1.02) }' && ok ||
  fail "DiLoCo sent ${outer:-?} bytes against the all-reduce's ${dense:-?} / 10"

# 3. Streaming DiLoCo, int8, over the ring: a simulated cluster gives the real run's metrics.
gpt=(--model gpt --d-model 32 --layers 2 --heads 2 --seq 32 --batch 4 --max-steps 24 --eval-every 12
     --eval-windows 16 --algorithm diloco --inner-steps 6 --fragments 3 --overlap 1 --outer-compression int8)
if timeout 300 "$bin" launch --topology "$work/ring4.yaml" "${gpt[@]}" --out "$work/real" >"$work/real.log" 2>&1 &&
   timeout 300 "$bin" launch --simulate --topology "$work/ring4.yaml" "${gpt[@]}" --out "$work/sim" \
     >"$work/sim.log" 2>&1; then
  if diff <(cut -d, -f1-7 "$work/real/metrics.csv") <(cut -d, -f1-7 "$work/sim/metrics.csv") >/dev/null; then
    ok
  else
    fail "simulated Streaming DiLoCo differs from the real run"; diff "$work/real/metrics.csv" "$work/sim/metrics.csv"
  fi
else
  fail "Streaming DiLoCo, real or simulated"; tail -5 "$work/real.log" "$work/sim.log"
fi

# 4. A peer killed mid-run: over gossip it is left out of the next rounds; over the
# all-reduce the round it breaks is abandoned and the survivors regroup at the step the
# membership agrees on. Either way the others finish, and x̄ still learns.
for exchange in gossip allreduce; do
  out="$work/kill-$exchange"
  launch_and_kill "$out" "$work/ring6.yaml" 6 4 --algorithm diloco --inner-steps 5 --outer-exchange $exchange \
    --batch 16 --max-steps 400 --eval-every 200 --peer-timeout 10 --connect-timeout 20
  code=$?
  [[ $code -eq 0 ]] && ok || { fail "$exchange DiLoCo: launch exited $code after losing peer 4"; tail -5 "$out.log"; }
  grep -q '"failed_peers": \[4\]' "$out/summary.json" 2>/dev/null && ok || fail "$exchange DiLoCo: peer 4 not in failed_peers"
  acc=$(summary "$out" test_accuracy)
  awk -v a="${acc:-0}" 'BEGIN { exit !(a > 0.5) }' && ok || fail "$exchange DiLoCo after a loss: x̄ accuracy ${acc:-?}"
done
# The same on a simulated cluster, where the host fails at a simulated time.
if timeout 300 "$bin" launch --simulate --topology "$work/ring6.yaml" --algorithm diloco --inner-steps 5 --batch 16 \
    --max-steps 200 --eval-every 100 --peer-timeout 10 --fail 4@0.5 --out "$work/sim-fail" >"$work/sim-fail.log" 2>&1 &&
   grep -q '"failed_peers": \[4\]' "$work/sim-fail/summary.json" && grep -q "regrouped" "$work/sim-fail/simulation.log"; then
  ok
else
  fail "simulated DiLoCo with a failed host"; tail -5 "$work/sim-fail.log"
fi

# 5. Bad flags: one error line naming the flag, exit 2, nothing started.
expect_error() { expect_launch_error "$work/ring4.yaml" "$@"; }
expect_error "--inner-steps must be" --algorithm diloco --inner-steps 0
expect_error "--fragments 4: the model has 3 layers" --algorithm diloco --fragments 4 --inner-steps 8
expect_error "--fragments 3 exceeds --inner-steps 2" --algorithm diloco --fragments 3 --inner-steps 2
expect_error "--overlap 3: an exchange must land before the next begins, so τ < ⌊H/F⌋ = 3" --algorithm diloco \
  --inner-steps 10 --fragments 3 --overlap 3
expect_error "--outer-compression 'int2' is not one of none, int8, fp8, int4" --algorithm diloco --outer-compression int2
expect_error "--outer-exchange 'ring' is not one of allreduce, ps, gossip" --algorithm diloco --outer-exchange ring
expect_error "--outer-lr applies to --algorithm diloco" --algorithm dpsgd --outer-lr 0.5
expect_error "--mix-alpha applies with --overlap above 0" --algorithm diloco --mix-alpha 0.3
expect_error "--outer-momentum must be below 1" --algorithm diloco --outer-momentum 1
expect_error "--resume: --algorithm diloco" --algorithm diloco --resume
expect_error "--outer-compression sparse runs over --outer-exchange allreduce (an all-gather)" \
  --algorithm diloco --outer-exchange ps --outer-compression sparse:0.1
expect_error "--outer-compression: --outer-exchange gossip mixes the local models in fp32" --algorithm diloco \
  --outer-exchange gossip --outer-compression int8
expect_error "--outer-compression 'sparse:2': sparse:F keeps the fraction F of each chunk" --algorithm diloco \
  --outer-compression sparse:2
expect_error "--allreduce-algo applies to --algorithm allreduce, or diloco" --algorithm diloco --outer-exchange gossip \
  --allreduce-algo tree
expect_error "--allreduce-algo tree: --overlap and --outer-compression run over the ring" --algorithm diloco \
  --allreduce-algo tree --overlap 2
echo "diloco CLI: $pass passed, $failures failed"
[[ $failures -eq 0 ]]
