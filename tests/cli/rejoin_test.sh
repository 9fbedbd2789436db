#!/usr/bin/env bash
# A killed peer restarted with --rejoin comes back into a running D-PSGD run: 8 peers on a
# ring, started as a user would start them on 8 machines (`peertrain peer`); peer 3 is
# killed (SIGKILL) mid-run and restarted 1 s later with --rejoin and the same flags. It
# must take a neighbour's parameters, train on to the end, and everyone must exit 0;
# summary.json records the rejoin; the rejoined peer's model is as good as the others'
# and the consensus distance stays as small as before the failure.
# With VICTIM 0 the coordinator itself is killed: peer 1 takes over, and peer 0 comes back
# as a peer like any other.
# With ALGORITHM diloco the run is DiLoCo over the all-reduce (H = 10): the restarted peer
# takes the survivors' outer state when they regroup with it.
# Usage: rejoin_test.sh SOURCE_DIR [K] [VICTIM] [ALGORITHM]   (PEERTRAIN: the binary; K:
# --max-staleness, default 0; VICTIM: the peer killed, default 3; ALGORITHM: dpsgd or
# diloco, default dpsgd). About 20 s on 2 cores.
set -u
staleness=${2:-0}
bin=${PEERTRAIN:?set PEERTRAIN to the peertrain binary}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$work"; }
trap cleanup EXIT
failures=0
pass=0
ok() { pass=$((pass + 1)); }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

base=$((21000 + ($$ * 16) % 9000))
{
  echo "name: ring8"
  echo "graph: {generator: ring, n: 8}"
  echo "peers:"
  for ((i = 0; i < 8; i++)); do echo "  - {id: $i, host: 127.0.0.1, port: $((base + i))}"; done
} >"$work/ring8.yaml"
# Long enough that the run is still well under way when the restarted peer is back: at
# 9,000 steps a fast machine finished within 2 s of the kill, before the restart.
steps=16000
flags=(--topology "$work/ring8.yaml" --hidden 32 --batch 16 --epochs 40 --max-steps $steps --eval-every 1000
       --connect-timeout 30 --peer-timeout 20 --max-staleness "$staleness" --out "$work/out")
victim=${3:-3}
algorithm=${4:-dpsgd}
[[ $algorithm == dpsgd ]] || flags+=(--algorithm diloco --inner-steps 10)

for r in 0 1 2 3 4 5 6 7; do
  "$bin" peer --rank $r "${flags[@]}" >/dev/null 2>"$work/peer-$r.log" &
  pids+=($!)
done
echo "${pids[@]}" >"$work/pids"
# Nothing hangs: every peer is killed after 150 s whatever happens.
(
  trap 'exit 0' TERM
  for _ in $(seq 1500); do sleep 0.1; done
  for p in $(cat "$work/pids"); do kill -9 "$p" 2>/dev/null; done
) >/dev/null 2>&1 &
watchdog=$!
# Kill peer 3 once the run is well under way (past the second evaluation).
for _ in $(seq 300); do
  [[ $(grep -c "^2000," "$work/out/metrics.csv" 2>/dev/null) -ge 8 ]] && break
  sleep 0.1
done
kill -9 "${pids[$victim]}"
wait "${pids[$victim]}" 2>/dev/null
sleep 1  # neighbours see a crash at once; a restart before they drop it is told "not yet" and retries
"$bin" peer --rank $victim --rejoin "${flags[@]}" >/dev/null 2>"$work/peer-$victim-rejoined.log" &
rejoined=$!
pids+=($rejoined)
echo "${pids[@]}" >"$work/pids"
codes=()
want=()
for r in 0 1 2 3 4 5 6 7; do
  [[ $r == "$victim" ]] && continue
  wait "${pids[$r]}"
  codes+=("$r:$?")
  want+=("$r:0")
done
wait $rejoined
rejoin_code=$?
kill "$watchdog" 2>/dev/null
pids=()

[[ "${codes[*]}" == "${want[*]}" ]] && ok || fail "peer exit codes: ${codes[*]}"
[[ $rejoin_code -eq 0 ]] && ok || fail "the rejoined peer exited $rejoin_code: $(tail -3 "$work/peer-$victim-rejoined.log")"
step=$(grep -o "rejoined at step [0-9]*" "$work/peer-$victim-rejoined.log" | grep -o "[0-9]*$")
[[ -n $step ]] && ok || fail "the rejoined peer did not say at which step it came back: $(tail -3 "$work/peer-$victim-rejoined.log")"
grep -q "finished $steps steps" "$work/peer-$victim-rejoined.log" && ok || fail "the rejoined peer did not finish the run"
summary="$work/out/summary.json"
grep -q "\"rejoined_peers\": \[{\"peer\": *$victim, *\"step\": *${step:-x}," "$summary" && ok ||
  fail "summary.json does not record the rejoin at step ${step:-?}: $(grep rejoined "$summary")"
grep -q '"failed_peers": \[\]' "$summary" && ok || fail "failed_peers: $(grep failed_peers "$summary")"
grep -q "\"failures\": \[{\"peer\": *$victim," "$summary" && ok || fail "the loss is not in failures: $(grep failures "$summary")"
grep -q '"survivors": 8' "$summary" && ok || fail "not all 8 peers reported at the end: $(grep survivors "$summary")"
if [[ $victim == 0 ]]; then
  grep -q '"takeovers": \[{"peer":1,"step":[0-9]*,"from":0}\]' "$summary" && ok ||
    fail "summary.json does not say peer 1 took over from peer 0: $(grep takeovers "$summary")"
fi
# Trained on after coming back: its final model is as good as its neighbours', and the
# replicas agree as closely as they did before the failure.
awk -F, -v v=$victim -v end=$steps 'NR > 1 && $1 == end { if ($3 == v) mine = $5; else if (min == "" || $5 < min) min = $5 }
  END { printf "rejoined peer %d: test accuracy %s, lowest of the others %s\n", v, mine, min; exit !(mine != "" && mine >= min - 0.03) }' \
  "$work/out/metrics.csv" && ok || fail "the rejoined peer's accuracy is off"
awk -F, -v end=$steps 'NR > 1 && $1 == 2000 { before = $7 } NR > 1 && $1 == end { after = $7 }
  END { printf "consensus distance: %s at step 2000 (before the failure), %s at the end\n", before, after; exit !(after != "" && after <= 2 * before) }' \
  "$work/out/metrics.csv" && ok || fail "the replicas drifted apart after the rejoin"

# Bad input: an error naming the flag, at once (nothing waits for peers that never come).
check_error() {  # WANT_EXIT PATTERN -- command...
  local want=$1 pattern=$2; shift 3
  local out; out=$(timeout 60 "$@" 2>&1); local code=$?
  [[ $code -eq $want ]] && grep -qE -- "$pattern" <<<"$out" && ok || fail "'$*' → exit $code: $(head -2 <<<"$out")"
}
if [[ $staleness -eq 0 && $victim != 0 && $algorithm == dpsgd ]]; then
  check_error 2 "^error: --rejoin: --rejoin and --resume" -- "$bin" peer --rank 2 --rejoin --resume --checkpoint-dir "$work/ck" "${flags[@]}"
  check_error 2 "^error: --rejoin: --rejoin needs --algorithm dpsgd or diloco" -- "$bin" peer --rank 2 --rejoin --algorithm allreduce "${flags[@]}"
  check_error 2 "^error: --max-staleness must be 0 or more" -- "$bin" peer --rank 2 "${flags[@]}" --max-staleness -1
  check_error 2 "^error: --max-staleness 'soon' is not an integer" -- "$bin" peer --rank 2 "${flags[@]}" --max-staleness soon
  check_error 2 "^error: --max-staleness applies to --algorithm dpsgd" -- "$bin" peer --rank 2 "${flags[@]}" --max-staleness 2 --algorithm ps
  sed 's/generator: ring, n: 8/generator: one-peer-exponential, n: 8/' "$work/ring8.yaml" >"$work/onepeer8.yaml"
  check_error 1 "^error: --max-staleness 2: .*onepeer8.yaml changes every peer's neighbours" -- \
    "$bin" peer --rank 1 --topology "$work/onepeer8.yaml" --max-staleness 2 --hidden 32
fi

echo "rejoin cli ($algorithm, --max-staleness $staleness, peer $victim): $pass passed, $failures failed"
[[ $failures -eq 0 ]]
