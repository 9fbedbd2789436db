#!/usr/bin/env bash
# No single point of failure, run the way a user runs it (`peertrain launch`, 8 peers on a
# ring, D-PSGD): the coordinator, peer 0, is killed (SIGKILL) or stalled (SIGSTOP past
# --peer-timeout, then SIGCONT) mid-run, and a stranger floods one peer with idle
# connections and garbage. Each run is compared with an undisturbed run of the same flags:
#  - kill: launch exits 0, summary.json names peer 0 in failed_peers and peer 1 as the
#    peer that took over, and x̄'s accuracy is within 2 points of the undisturbed run;
#  - stall: the same, peer 0 stops by itself once it finds it was dropped, and the W that
#    the peers' mixing traces (--mixing-trace) assemble into is symmetric and doubly
#    stochastic at every step (every peer applied the weights the others did);
#  - strangers: 2,000 idle connections and a stream of garbage to peer 5's port change
#    nothing: the accuracy is bit for bit the undisturbed run's, and peer 5's log says, in
#    a rate-limited line, that it refused strangers.
# Usage: coordinator_test.sh SOURCE_DIR   (PEERTRAIN: the binary). About 60 s on 2 cores.
set -u
bin=${PEERTRAIN:?set PEERTRAIN to the peertrain binary}
work=$(mktemp -d)
helpers=()
cleanup() {
  for p in "${helpers[@]}"; do kill -9 "$p" 2>/dev/null; done
  pkill -CONT -f "peertrain peer .*$work" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
pass=0
ok() { pass=$((pass + 1)); }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# Below 32768, where Linux's ephemeral ports begin (ip_local_port_range): an outgoing
# connection of this or another test can hold a port there and a peer then cannot listen
# on it (a base reaching 32992 failed so).
base=$((25000 + ($$ * 16) % 7000))
{
  echo "name: ring8"
  echo "graph: {generator: ring, n: 8}"
  echo "peers:"
  for ((i = 0; i < 8; i++)); do echo "  - {id: $i, host: 127.0.0.1, port: $((base + i))}"; done
} >"$work/ring8.yaml"
flags=(--topology "$work/ring8.yaml" --hidden 32 --batch 16 --epochs 40 --eval-every 2000
       --connect-timeout 30 --peer-timeout 10 --mixing-trace)

field() { grep -o "\"$2\": [^,}]*" "$1/summary.json" | head -1 | sed 's/.*: //'; }
# Waits until the coordinator has written step $2's rows for all 8 peers in run $1.
wait_for_step() {
  for _ in $(seq 600); do
    [[ $(grep -c "^$2," "$work/$1/metrics.csv" 2>/dev/null) -ge 8 ]] && return 0
    sleep 0.1
  done
  return 1
}
launch() {  # launch NAME [STEPS]: runs in the background, exit code in $work/NAME.code
  (timeout 240 "$bin" launch "${flags[@]}" --max-steps "${2:-12000}" --out "$work/$1" >"$work/$1.log" 2>&1
   echo $? >"$work/$1.code") &
}
peer0() { pgrep -f "peertrain peer --rank 0 .*--out $work/$1( |$)"; }

# --- undisturbed ---------------------------------------------------------------------
launch calm
wait
[[ $(cat "$work/calm.code") == 0 ]] && ok || { fail "undisturbed run: launch exited $(cat "$work/calm.code")"; tail -5 "$work/calm.log"; }
calm_acc=$(field "$work/calm" test_accuracy)

# --- kill the coordinator ------------------------------------------------------------
launch kill
wait_for_step kill 4000 || fail "kill: the run never reached step 4000"
kill -9 $(peer0 kill)
wait
[[ $(cat "$work/kill.code") == 0 ]] && ok || { fail "kill: launch exited $(cat "$work/kill.code")"; tail -5 "$work/kill.log"; }
[[ $(field "$work/kill" failed_peers) == "[0]" ]] && ok || fail "kill: failed_peers is $(field "$work/kill" failed_peers), expected [0]"
grep -q '"takeovers": \[{"peer":1,"step":[0-9]*,"from":0}\]' "$work/kill/summary.json" && ok ||
  fail "kill: summary.json does not say peer 1 took over from peer 0: $(grep takeovers "$work/kill/summary.json")"
grep -q "peer 1 took over from peer 0" "$work/kill.log" && ok || fail "kill: launch's summary does not name the takeover"
awk -v a="$(field "$work/kill" test_accuracy)" -v b="$calm_acc" 'BEGIN { exit !(a > b - 0.02) }' && ok ||
  fail "kill: accuracy $(field "$work/kill" test_accuracy) against $calm_acc undisturbed"

# --- stall the coordinator past --peer-timeout, then let it go on ----------------------
# 20,000 steps: the survivors must still be training when peer 0 wakes, 13 s after step
# 4,000 and about 3 s after they dropped it, however fast this machine runs them.
launch stall 20000
wait_for_step stall 4000 || fail "stall: the run never reached step 4000"
victim=$(peer0 stall)
kill -STOP "$victim"
sleep 13  # past the 5 s its silent neighbours allow it and the 10 s --peer-timeout
kill -CONT "$victim"
wait
[[ $(cat "$work/stall.code") == 0 ]] && ok || { fail "stall: launch exited $(cat "$work/stall.code")"; tail -5 "$work/stall.log"; }
[[ $(field "$work/stall" failed_peers) == "[0]" ]] && ok || fail "stall: failed_peers is $(field "$work/stall" failed_peers)"
grep -q "counts every other peer lost\|counts this peer lost" "$work/stall/peer-0.log" && ok ||
  fail "stall: peer 0 did not stop on finding itself dropped: $(tail -2 "$work/stall/peer-0.log")"
awk -v a="$(field "$work/stall" test_accuracy)" -v b="$calm_acc" 'BEGIN { exit !(a > b - 0.02) }' && ok ||
  fail "stall: accuracy $(field "$work/stall" test_accuracy) against $calm_acc undisturbed"
# W at every step, from each peer's trace (a row holds until the peer's next line): every
# survivor's row sums to 1 over the peers still in the run at that step (a lost peer
# leaves at the step the survivors gave up on it, summary.json's failures) and the
# survivors' block is symmetric. The stalled peer's own last row is not checked: it may
# give up on a neighbour one step before that neighbour gives up on it (it wakes after
# its neighbour already mixed its x of that step), and it leaves the run either way.
python3 - "$work/stall" 8 <<'PY' && ok || fail "stall: the applied W is not symmetric and doubly stochastic at every step"
import json, sys
out, n = sys.argv[1], int(sys.argv[2])
gone = {f["peer"]: f["step"] for f in json.load(open(f"{out}/summary.json"))["failures"]}
changes = {}
for p in range(n):
    for line in open(f"{out}/mixing-peer-{p}.csv").read().split("\n")[1:]:
        if not line: continue
        step, self_w, rest = line.split(",")
        row = {p: float(self_w)}
        for term in rest.split():
            q, w = term.split(":"); row[int(q)] = float(w)
        changes.setdefault(int(step), []).append((p, row))
W = [[0.0] * n for _ in range(n)]
bad = 0
for step in sorted(set(changes) | set(gone.values())):  # W holds between these steps
    for p, row in changes.get(step, []): W[p] = [row.get(q, 0.0) for q in range(n)]
    alive = [a for a in range(n) if a not in gone or step < gone[a]]
    survivors = [a for a in alive if a not in gone]
    for a in survivors:
        if abs(sum(W[a][b] for b in alive) - 1) > 1e-5 or any(abs(W[a][b] - W[b][a]) > 1e-6 for b in survivors):
            if bad < 3: print(f"step {step}: row {a} = {W[a]}, column {[W[b][a] for b in range(n)]}")
            bad += 1
print(f"W checked at {len(changes)} steps where a row changed, with peers {sorted(gone)} lost")
sys.exit(1 if bad else 0)
PY

# --- strangers -------------------------------------------------------------------------
launch strangers
wait_for_step strangers 2000 || fail "strangers: the run never reached step 2000"
python3 - "$((base + 5))" <<'PY' &
import os, resource, socket, sys, time
port = int(sys.argv[1])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
idle = []
for _ in range(2000):  # idle: connect and say nothing
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2); idle.append(s)
    except OSError:
        pass
for _ in range(200):   # garbage: random bytes where a hello belongs
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2); s.sendall(os.urandom(300)); s.close()
    except OSError:
        pass
time.sleep(30)
PY
helpers+=($!)
wait_for_step strangers 12000 || true
wait "${helpers[-1]}" 2>/dev/null &
kill -9 "${helpers[-1]}" 2>/dev/null
wait
[[ $(cat "$work/strangers.code") == 0 ]] && ok || { fail "strangers: launch exited $(cat "$work/strangers.code")"; tail -5 "$work/strangers.log"; }
[[ $(field "$work/strangers" test_accuracy) == "$calm_acc" ]] && ok ||
  fail "strangers: accuracy $(field "$work/strangers" test_accuracy), undisturbed $calm_acc (expected bit for bit)"
[[ $(field "$work/strangers" failed_peers) == "[]" ]] && ok || fail "strangers: failed_peers $(field "$work/strangers" failed_peers)"
lines=$(grep -c "refused strangers\|refused a connection" "$work/strangers/peer-5.log")
[[ $lines -ge 1 && $lines -le 40 ]] && ok ||
  fail "strangers: peer 5 logged $lines refusal lines for 2,200 connections (expected a few rate-limited ones)"

echo "coordinator: $pass passed, $failures failed"
[[ $failures == 0 ]]
