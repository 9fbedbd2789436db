#!/usr/bin/env bash
# Directed graphs from the command line, as a user runs them: topology generate and inspect
# (SLEM, the period's product, a redrawn graph's interval); SGP and Epidemic Learning
# train on real processes; SGP on a simulated cluster gives the real run's metrics bit for
# bit; a killed peer is left out of push-sum and the others finish; bad files and flags get
# one error line naming them.
# Usage: PEERTRAIN=build/peertrain directed_cli_test.sh SOURCE_DIR
set -u
source "$(dirname "$0")/common.sh"
base=$((29000 + RANDOM % 2000))
peers() { for ((i = 0; i < $1; i++)); do echo "  - {id: $i, host: 127.0.0.1, port: $((base + $2 + i))}"; done; }
{ echo "graph: {generator: one-peer-directed-exponential, n: 6}"; echo "peers:"; peers 6 0; } >"$work/dexp6.yaml"
{ echo "graph: {n: 4, directed: true, edges: [[0, 1], [1, 2], [2, 3], [3, 0], [0, 2]]}"; echo "peers:"; peers 4 10; } \
  >"$work/cycle4.yaml"
{ echo "graph: {generator: random-out, n: 6, fanout: 2, seed: 5}"; echo "peers:"; peers 6 20; } >"$work/rout6.yaml"
write_topology "$work/complete6.yaml" complete6 complete 6 $((base + 30))
small=(--batch 16 --connect-timeout 20 --peer-timeout 20 --max-steps 40 --eval-every 20)

# 1. generate and inspect: the one-peer graph's period is exact averaging on 8 peers; the
# directed ring's SLEM is cos(π/n); a redrawn graph reports an interval.
"$bin" topology generate one-peer-directed-exponential --peers 8 -o "$work/g8.yaml" 2>/dev/null &&
  "$bin" topology inspect "$work/g8.yaml" >"$work/g8.txt" && grep -q "exact averaging" "$work/g8.txt" && ok ||
  { fail "one-peer directed exponential on 8: no exact averaging"; cat "$work/g8.txt"; }
echo "graph: {n: 5, directed: true, edges: [[0, 1], [1, 2], [2, 3], [3, 4], [4, 0]]}" >"$work/ring5.yaml"
slem=$("$bin" topology inspect "$work/ring5.yaml" --format json | grep -o '"slem": [0-9.e-]*' | cut -d' ' -f2)
awk -v s="${slem:-0}" 'BEGIN { exit !(s > 0.809016 && s < 0.809018) }' && ok || fail "directed ring of 5: SLEM ${slem:-?}, expected cos(pi/5)"
"$bin" topology inspect "$work/rout6.yaml" --draws 8 >"$work/rout.txt" && grep -q "95% of 8 draws in" "$work/rout.txt" && ok ||
  { fail "random-out: no interval over 8 draws"; cat "$work/rout.txt"; }
"$bin" topology inspect "$work/cycle4.yaml" --mtx "$work/p.mtx" >/dev/null && grep -q "general" "$work/p.mtx" && ok ||
  fail "--mtx of a directed graph is not written as a general matrix"

# 2. Each algorithm trains end to end on real processes.
for run in "dexp6 sgp" "dexp6 sgp --update atc" "dexp6 sgp --max-staleness 2" "cycle4 sgp" "rout6 sgp" \
           "complete6 el" "complete6 el --fanout 3 --el-variant oracle"; do
  read -r topo flags <<<"$run"
  out="$work/run-${run//[ :.-]/_}"
  # shellcheck disable=SC2086
  if timeout 300 "$bin" launch --topology "$work/$topo.yaml" --algorithm $flags "${small[@]}" --out "$out" \
      >"$out.log" 2>&1 && [[ -s $out/summary.json ]]; then
    ok
  else
    fail "launch $topo --algorithm $flags"; tail -5 "$out.log"; continue
  fi
  acc=$(summary "$out" test_accuracy)
  awk -v a="${acc:-0}" 'BEGIN { exit !(a > 0.5) }' && ok || fail "$run: x̄ accuracy ${acc:-?} after 40 steps"
done

# 3. SGP on a simulated cluster gives the real run's metrics, bit for bit.
sim=(--algorithm sgp --batch 16 --max-steps 30 --eval-every 15)
if timeout 300 "$bin" launch --topology "$work/dexp6.yaml" "${sim[@]}" --out "$work/real" >"$work/real.log" 2>&1 &&
   timeout 300 "$bin" launch --simulate --topology "$work/dexp6.yaml" "${sim[@]}" --out "$work/sim" >"$work/sim.log" 2>&1; then
  diff <(cut -d, -f1-7 "$work/real/metrics.csv") <(cut -d, -f1-7 "$work/sim/metrics.csv") >/dev/null && ok ||
    { fail "simulated SGP differs from the real run"; diff "$work/real/metrics.csv" "$work/sim/metrics.csv" | head; }
else
  fail "SGP, real or simulated"; tail -5 "$work/real.log" "$work/sim.log"
fi

# 4. A peer killed mid-run: its senders keep their shares home, the others finish.
out="$work/kill"
launch_and_kill "$out" "$work/dexp6.yaml" 6 4 --algorithm sgp --batch 16 --max-steps 400 --eval-every 200 \
  --peer-timeout 10 --connect-timeout 20
code=$?
[[ $code -eq 0 ]] && ok || { fail "SGP: launch exited $code after losing peer 4"; tail -5 "$out.log"; }
grep -q '"failed_peers": \[4\]' "$out/summary.json" 2>/dev/null && ok || fail "SGP: peer 4 not in failed_peers"
acc=$(summary "$out" test_accuracy)
awk -v a="${acc:-0}" 'BEGIN { exit !(a > 0.5) }' && ok || fail "SGP after a loss: x̄ accuracy ${acc:-?}"

# 5. Bad files and flags: one error line each, naming the input.
echo "graph: {n: 3, directed: true, edges: [[0, 1], [1, 2]]}" >"$work/oneway.yaml"
"$bin" topology inspect "$work/oneway.yaml" 2>"$work/err.txt"
[[ $(grep -c "^error: " "$work/err.txt") -eq 1 ]] && grep -q "oneway.yaml.*not strongly connected" "$work/err.txt" && ok ||
  { fail "a one-way chain is not refused as not strongly connected"; cat "$work/err.txt"; }
expect_launch_error "$work/dexp6.yaml" "dexp6.yaml is a directed graph.*use --algorithm sgp" --algorithm dpsgd
expect_launch_error "$work/dexp6.yaml" "directed graph.*sgp" --algorithm diloco --outer-exchange gossip
expect_launch_error "$work/complete6.yaml" "--fanout applies to --algorithm el" --algorithm sgp --fanout 2
expect_launch_error "$work/complete6.yaml" "--fanout 6 needs at least 7 peers; .*complete6.yaml has 6" --algorithm el --fanout 6
expect_launch_error "$work/complete6.yaml" "--el-variant 'any'" --algorithm el --el-variant any
"$bin" peer --rank 1 --topology "$work/dexp6.yaml" --algorithm sgp --rejoin 2>"$work/err.txt"
[[ $(grep -c "^error: " "$work/err.txt") -eq 1 ]] && grep -q "^error: --rejoin: --algorithm sgp keeps state" "$work/err.txt" &&
  ok || { fail "peer --rejoin under sgp is not refused"; cat "$work/err.txt"; }
"$bin" topology generate random-out --peers 4 2>"$work/err.txt"
grep -q "^error: .*fanout must be 1..3" "$work/err.txt" && ok || { fail "random-out without --fanout"; cat "$work/err.txt"; }

echo "directed cli tests: $pass passed, $failures failed"
exit $((failures > 0))
