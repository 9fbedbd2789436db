#!/usr/bin/env bash
# Training as a user runs it, multi-process on loopback: launch end to end with its output
# files, a peer with another topology refused, a killed peer named by the others within
# the timeout, and bad flags. Usage: train_cli_test.sh SOURCE_DIR [long]
#   long: also train 4 peers to >= 0.85 test accuracy with dpsgd and with allreduce.
set -u
root=$1
mode=${2:-short}
bin=${PEERTRAIN:?set PEERTRAIN to the peertrain binary}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$work"; }
trap cleanup EXIT
failures=0
pass=0
ok() { pass=$((pass + 1)); }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# A topology with ports of its own, so concurrent tests never share a port.
base=$((20000 + ($$ * 16) % 9000))
topology() {  # topology NAME GRAPH N
  local name=$1 graph=$2 n=$3
  {
    echo "name: $name"
    echo "graph: $graph"
    echo "peers:"
    for ((i = 0; i < n; i++)); do echo "  - {id: $i, host: 127.0.0.1, port: $((base + i))}"; done
  } >"$work/$name.yaml"
}
topology ring4 "{generator: ring, n: 4}" 4
topology complete4 "{generator: complete, n: 4}" 4
small=(--hidden 32 --batch 16 --connect-timeout 20 --peer-timeout 20)

if [[ $mode == long ]]; then
  # One of 8 peers killed mid-training, on a ring and on an exponential graph: the
  # others finish within 2 points of the run without failure.
  topology ring8 "{generator: ring, n: 8}" 8
  topology exponential8 "{generator: exponential, n: 8}" 8
  for name in ring8 exponential8; do
    "$bin" launch --topology "$work/$name.yaml" --epochs 2 --peer-timeout 20 --out "$work/$name-clean" >/dev/null 2>&1
    "$bin" launch --topology "$work/$name.yaml" --epochs 2 --peer-timeout 20 --out "$work/$name-kill" \
      >"$work/$name-kill.log" 2>&1 &
    launcher=$!
    for _ in $(seq 300); do grep -q '"step": *[0-9]*[0-9][0-9][0-9]' "$work/$name-kill.log" 2>/dev/null && break; \
      [[ $(cat "$work/$name-kill/metrics.csv" 2>/dev/null | wc -l) -gt 1 ]] && break; sleep 0.2; done
    pkill -9 -f -- "peer --rank 5 --topology $work/$name.yaml"
    wait $launcher
    code=$?
    clean=$(grep -o '"test_accuracy": [0-9.]*' "$work/$name-clean/summary.json" | cut -d' ' -f2)
    killed=$(grep -o '"test_accuracy": [0-9.]*' "$work/$name-kill/summary.json" | cut -d' ' -f2)
    echo "long: $name x̄ accuracy without failure ${clean:-?}, with peer 5 killed mid-run ${killed:-?} (launch exit $code)"
    [[ $code -eq 0 ]] && ok || fail "$name: launch exited $code after losing peer 5"
    grep -q '"failed_peers": \[5\]' "$work/$name-kill/summary.json" && ok || fail "$name: peer 5 not in failed_peers"
    awk -v a="${clean:-0}" -v b="${killed:-0}" 'BEGIN { exit !(b >= a - 0.02) }' && ok ||
      fail "$name: accuracy fell from ${clean:-?} to ${killed:-?}"
  done
# 7. Long: 4 peers reach >= 0.85 test accuracy of x̄ with dpsgd and with allreduce.
  for algorithm in dpsgd allreduce; do
    "$bin" launch --topology "$work/ring4.yaml" --algorithm "$algorithm" --epochs 3 --out "$work/long-$algorithm" \
      >"$work/long.log" 2>&1
    acc=$(grep -o '"test_accuracy": [0-9.]*' "$work/long-$algorithm/summary.json" | cut -d' ' -f2)
    echo "long: $algorithm test accuracy of x̄ = $acc"
    awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.85) }' && ok || fail "$algorithm reached only ${acc:-nothing}"
  done

else
# 1. launch end to end: progress, summary, files with the promised columns and keys.
for algorithm in dpsgd allreduce ps local; do
  out="$work/run-$algorithm"
  if timeout 300 "$bin" launch --topology "$work/ring4.yaml" --algorithm "$algorithm" --max-steps 40 \
      --eval-every 20 "${small[@]}" --out "$out" >"$work/launch.log" 2>&1; then
    ok
  else
    fail "launch $algorithm exited $?"; tail -5 "$work/launch.log"; continue
  fi
  head -1 "$out/metrics.csv" | grep -q "step,epoch,peer,train_loss,test_accuracy,.*consensus_distance,bytes_sent,bytes_received,wall_s,compute_s,comm_wait_s" \
    && ok || fail "$algorithm: metrics.csv header: $(head -1 "$out/metrics.csv")"
  rows=$(($(wc -l <"$out/metrics.csv") - 1))
  [[ $rows -eq 8 ]] && ok || fail "$algorithm: metrics.csv has $rows rows, expected 2 evaluations x 4 peers"
  for key in test_accuracy mean_local_accuracy consensus_distance wall_s bytes_sent_per_peer spectral_gap failed_peers; do
    grep -q "\"$key\":" "$out/summary.json" && ok || fail "$algorithm: summary.json lacks $key"
  done
  grep -q "test accuracy of x̄" "$work/launch.log" && ok || fail "$algorithm: no summary table"
done
# Centralized baselines keep every replica identical.
grep -q '"consensus_distance": 0\(\.0\)\?,' "$work/run-allreduce/summary.json" && ok || fail "allreduce replicas differ"
grep -q '"bytes_sent_per_peer": 0,' "$work/run-local/summary.json" || ok

# 2. --eval-every 1 gives a train_loss row for every step and every peer.
"$bin" launch --topology "$work/ring4.yaml" --max-steps 5 --eval-every 1 "${small[@]}" --out "$work/every" >/dev/null 2>&1
rows=$(($(wc -l <"$work/every/metrics.csv") - 1))
[[ $rows -eq 20 ]] && ok || fail "--eval-every 1: $rows rows, expected 20"

# 3. A peer started with a different topology file is refused, and says why.
for r in 0 2 3; do
  "$bin" peer --topology "$work/ring4.yaml" --rank $r --max-steps 5 "${small[@]}" --connect-timeout 8 \
    >/dev/null 2>"$work/refuse-$r.log" &
  pids+=($!)
done
"$bin" peer --topology "$work/complete4.yaml" --rank 1 --max-steps 5 "${small[@]}" --connect-timeout 8 \
  >/dev/null 2>"$work/refuse-1.log" &
pids+=($!)
for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
pids=()
grep -q "refused the connection: topology fingerprint" "$work/refuse-1.log" && ok ||
  fail "peer 1 was not told why it was refused: $(tail -2 "$work/refuse-1.log")"
cat "$work"/refuse-[023].log | grep -q "refused peer 1 .*fingerprint" && ok ||
  fail "no neighbour logged why it refused peer 1"
grep -q "^error: " "$work/refuse-0.log" && ok || fail "peer 0 did not stop with an error"

# 4. A killed peer under a centralized baseline: its ring neighbours stop with an error
#    naming it, within the timeout.
start=$(date +%s)
for r in 0 1 2 3; do
  "$bin" peer --topology "$work/ring4.yaml" --rank $r --algorithm allreduce --epochs 50 "${small[@]}" \
    --peer-timeout 15 >/dev/null 2>"$work/kill-$r.log" &
  pids+=($!)
done
for _ in $(seq 100); do grep -q "connected; training" "$work/kill-2.log" 2>/dev/null && break; sleep 0.2; done
sleep 1
kill -9 "${pids[2]}"
codes=()
for r in 0 1 3; do
  wait "${pids[$r]}"
  codes+=($?)
done
pids=()
elapsed=$(($(date +%s) - start))
[[ ${codes[1]} -ne 0 && ${codes[2]} -ne 0 ]] && ok || fail "neighbours of the killed peer exited ${codes[*]}"
grep -q "peer 2 (127.0.0.1:$((base + 2)))" "$work/kill-1.log" && ok || fail "peer 1 did not name peer 2: $(tail -2 "$work/kill-1.log")"
grep -q "peer 2 (127.0.0.1:$((base + 2)))" "$work/kill-3.log" && ok || fail "peer 3 did not name peer 2: $(tail -2 "$work/kill-3.log")"
[[ $elapsed -lt 60 ]] && ok || fail "the survivors took ${elapsed}s to stop"

# 5. launch: with allreduce it stops everything and names the peer that died; with
#    D-PSGD the survivors drop it, recompute W, finish, and report it.
kill_rank_after_start() {  # OUT RANK [DELAY]
  for _ in $(seq 150); do grep -q "connected; training" "$1/peer-$2.log" 2>/dev/null && break; sleep 0.2; done
  sleep "${3:-1}"
  pkill -9 -f -- "peer --rank $2 --topology $work/ring4.yaml"
}
"$bin" launch --topology "$work/ring4.yaml" --algorithm allreduce --epochs 50 "${small[@]}" --peer-timeout 15 \
  --out "$work/dies" >"$work/dies.log" 2>&1 &
launcher=$!
kill_rank_after_start "$work/dies" 1
wait $launcher
code=$?
[[ $code -ne 0 ]] && ok || fail "launch exited 0 after a peer died under allreduce"
grep -q "^error: peer [0-9]" "$work/dies.log" && ok || fail "launch did not name a failed peer: $(tail -3 "$work/dies.log")"
grep -q '"failed_peers": \[' "$work/dies/summary.json" && ok || fail "no failed_peers in summary.json"

# Peer 0 is not peer 2's neighbour: it hears of the loss from 1 and 3 and announces new
# weights at its next step. The run is long enough (~8 s unloaded) that the kill lands
# well before the end even on a loaded machine; a kill in the last steps would be noticed
# only by the final evaluation, which rightly recomputes nothing.
"$bin" launch --topology "$work/ring4.yaml" --max-steps 20000 --eval-every 5000 "${small[@]}" --peer-timeout 15 \
  --out "$work/survive" >"$work/survive.log" 2>&1 &
launcher=$!
kill_rank_after_start "$work/survive" 2 0.3
wait $launcher
code=$?
[[ $code -eq 0 ]] && ok || fail "D-PSGD launch exited $code after losing a peer: $(tail -3 "$work/survive.log")"
grep -q "peer 2 was killed by signal 9.*the others go on" "$work/survive.log" && ok || fail "launch did not report the lost peer"
grep -q '"failed_peers": \[2\]' "$work/survive/summary.json" && ok || fail "summary.json: $(grep failed "$work/survive/summary.json")"
grep -q '"survivors": 3' "$work/survive/summary.json" && ok || fail "summary.json does not count 3 survivors"
grep -q "switch to recomputed weights" "$work/survive/peer-0.log" && ok || fail "peer 0 did not announce recomputed weights: $(grep -m1 "is lost" "$work/survive/peer-0.log")"

# 5b. A stalled peer (SIGSTOP) is detected by the adaptive deadline, well inside a long
#     --peer-timeout, without its waiting neighbours being dropped too; launch stops it
#     once peer 0 has finished.
start=$(date +%s)
"$bin" launch --topology "$work/ring4.yaml" --epochs 100 --max-steps 20000 --eval-every 10000 "${small[@]}" \
  --peer-timeout 120 --out "$work/stalled" >"$work/stalled.log" 2>&1 &
launcher=$!
for _ in $(seq 150); do grep -q "connected; training" "$work/stalled/peer-2.log" 2>/dev/null && break; sleep 0.2; done
sleep 1
pkill -STOP -f -- "peer --rank 2 --topology $work/ring4.yaml"
wait $launcher
code=$?
elapsed=$(($(date +%s) - start))
[[ $code -eq 0 ]] && ok || fail "launch exited $code with a stalled peer: $(tail -3 "$work/stalled.log")"
grep -q '"failed_peers": \[2\]' "$work/stalled/summary.json" && ok ||
  fail "stalled: $(grep failed_peers "$work/stalled/summary.json")"
grep -q "adaptive deadline" "$work/stalled/peer-0.log" && ok || fail "the stall was not caught by the adaptive deadline"
[[ $elapsed -lt 110 ]] && ok || fail "a stalled peer took ${elapsed}s to handle with --peer-timeout 120"

# 6. Authentication: peers sharing --secret-file train; one without the key is refused.
"$bin" keygen "$work/run.key" >/dev/null && ok || fail "keygen"
[[ $(stat -c %a "$work/run.key") == 600 ]] && ok || fail "keygen wrote mode $(stat -c %a "$work/run.key")"
"$bin" keygen "$work/run.key" 2>"$work/keygen.err"; [[ $? -eq 1 ]] && grep -q "never overwrites" "$work/keygen.err" && ok ||
  fail "keygen overwrote a key: $(cat "$work/keygen.err")"
"$bin" launch --topology "$work/ring4.yaml" --max-steps 20 --eval-every 20 "${small[@]}" --secret-file "$work/run.key" \
  --out "$work/auth" >"$work/auth.log" 2>&1 && ok || fail "launch with --secret-file: $(tail -2 "$work/auth.log")"
for r in 0 2 3; do
  "$bin" peer --topology "$work/ring4.yaml" --rank $r --max-steps 5 "${small[@]}" --secret-file "$work/run.key" \
    --connect-timeout 6 >/dev/null 2>"$work/noauth-$r.log" &
  pids+=($!)
done
"$bin" peer --topology "$work/ring4.yaml" --rank 1 --max-steps 5 "${small[@]}" --connect-timeout 6 \
  >/dev/null 2>"$work/noauth-1.log" &
pids+=($!)
for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
pids=()
grep -q "refused the connection: we require --secret-file" "$work/noauth-1.log" && ok ||
  fail "a peer without the key was not refused: $(tail -2 "$work/noauth-1.log")"
cat "$work"/noauth-[023].log | grep -q "refused peer 1 .*we require --secret-file" && ok ||
  fail "no peer logged why it refused the keyless peer"
: >"$work/empty.key"
check_error_early() { local out; out=$("$@" 2>&1); [[ $? -eq 1 ]] && grep -q "$work/empty.key" <<<"$out" && ok || fail "bad key file: $out"; }
check_error_early "$bin" peer --topology "$work/ring4.yaml" --rank 0 --secret-file "$work/empty.key"
echo "correct horse battery staple" >"$work/empty.key"  # a passphrase is refused too, naming the file
check_error_early "$bin" peer --topology "$work/ring4.yaml" --rank 0 --secret-file "$work/empty.key"

# 7. Checkpoints: a run stopped at step 40 and resumed follows the uninterrupted run's
#    trajectory (every train_loss to 1e-6); a corrupt newest checkpoint falls back to the
#    previous complete set.
S=(--hidden 32 --batch 16 --eval-every 10 --connect-timeout 20 --peer-timeout 20)
"$bin" launch --topology "$work/ring4.yaml" --max-steps 60 "${S[@]}" --out "$work/straight" >/dev/null 2>&1
"$bin" launch --topology "$work/ring4.yaml" --max-steps 40 "${S[@]}" --checkpoint-every 20 --out "$work/resumed" \
  >/dev/null 2>&1
"$bin" launch --topology "$work/ring4.yaml" --max-steps 60 "${S[@]}" --checkpoint-every 20 --resume \
  --out "$work/resumed" >"$work/resume.log" 2>&1 && ok || fail "--resume failed: $(tail -3 "$work/resume.log")"
grep -q "resumed from step 40" "$work/resumed/peer-2.log" && ok || fail "peer 2 did not resume from step 40"
compare_losses() {  # A B: same rows, train_loss within 1e-6 relative
  awk -F, 'NR == FNR { if (FNR > 1) loss[$1 "," $3] = $4; next }
           FNR > 1 { key = $1 "," $3; seen++; if (!(key in loss)) { bad++; next }
                     d = loss[key] - $4; if (d < 0) d = -d; if (d > 1e-6 * (loss[key] < 0 ? -loss[key] : loss[key])) bad++ }
           END { exit !(seen == 24 && bad == 0) }' "$1" "$2"
}
compare_losses "$work/straight/metrics.csv" "$work/resumed/metrics.csv" && ok ||
  fail "the resumed trajectory differs: $(diff <(cut -d, -f1,3,4 "$work/straight/metrics.csv") <(cut -d, -f1,3,4 "$work/resumed/metrics.csv") | head -4)"
printf 'garbage' | dd of="$work/resumed/checkpoints/peer-1-step-60.ckpt" bs=1 seek=200 conv=notrunc 2>/dev/null
"$bin" launch --topology "$work/ring4.yaml" --max-steps 60 "${S[@]}" --resume --out "$work/resumed" \
  >"$work/resume2.log" 2>&1 && ok || fail "--resume after corruption failed: $(tail -3 "$work/resume2.log")"
grep -q "resumed from step 40" "$work/resumed/peer-0.log" && ok || fail "did not fall back to step 40"
grep -q "peer-1-step-60.ckpt" "$work/resumed/peer-0.log" "$work/resumed/peer-1.log" && ok || fail "the corrupt file was not named"
compare_losses "$work/straight/metrics.csv" "$work/resumed/metrics.csv" && ok || fail "the second resume differs"
check_error_early2() { local out; out=$("$@" 2>&1); [[ $? -ne 0 ]] && grep -q "no complete set of checkpoints" <<<"$out" && ok || fail "resume without checkpoints: $out"; }
check_error_early2 "$bin" peer --topology "$work/ring4.yaml" --rank 0 --resume --checkpoint-dir "$work/nothing-here" "${S[@]}"

# 8. Bad flags and files.
check_error() {  # check_error WANT_EXIT PATTERN -- command...
  local want=$1 pattern=$2; shift 3
  local out; out=$(timeout 60 "$@" 2>&1); local code=$?
  [[ $code -eq $want ]] && grep -qE -- "$pattern" <<<"$out" && ok || { fail "'$*' → exit $code: $(head -2 <<<"$out")"; }
}
check_error 2 "^error: --algorithm 'gossip'" -- "$bin" launch --topology "$work/ring4.yaml" --algorithm gossip
check_error 2 "^error: --batch must be positive" -- "$bin" launch --topology "$work/ring4.yaml" --batch 0
check_error 2 "^error: --lr 'fast' is not a number" -- "$bin" launch --topology "$work/ring4.yaml" --lr fast
check_error 2 "^error: --topology FILE is required" -- "$bin" launch
check_error 2 "^error: no --rank" -- env -u SLURM_PROCID -u OMPI_COMM_WORLD_RANK -u PMI_RANK "$bin" peer --topology "$work/ring4.yaml"
check_error 1 "^error: .*none of its 8 peers is on this machine" -- "$bin" launch --topology "$root/topology/two-hosts.yaml"
check_error 1 "^error: .*no-such-dir.*" -- "$bin" peer --topology "$work/ring4.yaml" --rank 0 --data-dir "$work/no-such-dir"
check_error 0 "peer-timeout" -- "$bin" launch --help
check_error 0 "keygen FILE" -- "$bin" --help

# 9. launch killed with SIGKILL takes its peers with it: none is left holding a port, and
#    the next run on the same file starts.
"$bin" launch --topology "$work/ring4.yaml" --max-steps 100000 "${small[@]}" --out "$work/orphans" >"$work/orphans.log" 2>&1 &
launcher=$!
kids=()
for _ in $(seq 1 100); do  # until the four peers are up (at most 20 s)
  mapfile -t kids < <(pgrep -P "$launcher")
  [[ ${#kids[@]} -eq 4 ]] && break
  sleep 0.2
done
sleep 1
kill -KILL "$launcher"; wait "$launcher" 2>/dev/null
# A peer counts as alive until it is gone or a zombie: the orphans are reparented, and a
# busy machine's reaper may leave a dead one a zombie for a while (kill -0 still succeeds
# on it, which made this check flaky). Wait up to 10 s for the kernel's SIGTERM to land.
alive() {
  local n=0 state
  for k in "${kids[@]}"; do
    state=$(ps -o stat= -p "$k" 2>/dev/null)
    [[ -n $state && $state != Z* ]] && n=$((n + 1))
  done
  echo $n
}
for _ in $(seq 1 50); do left=$(alive); [[ $left -eq 0 ]] && break; sleep 0.2; done
[[ ${#kids[@]} -eq 4 && $left -eq 0 ]] && ok || { fail "after launch was killed, $left of ${#kids[@]} peers live on: $(tail -3 "$work/orphans.log")"; kill -KILL "${kids[@]}" 2>/dev/null; }
"$bin" launch --topology "$work/ring4.yaml" --max-steps 5 "${small[@]}" --out "$work/after-orphans" >/dev/null 2>&1 && ok ||
  fail "the run after a killed launch did not start: $(tail -2 "$work/after-orphans/peer-0.log")"

fi

echo "train cli: $pass passed, $failures failed"
[[ $failures -eq 0 ]]
