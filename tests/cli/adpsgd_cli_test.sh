#!/usr/bin/env bash
# AD-PSGD from the command line, as a user runs it: with one peer 5x slower (the topology's
# stragglers), the others do not wait for it: they take at least twice its steps and spend
# under 10 % of their time waiting, and x̄ reaches an accuracy within 2 points of the run
# without the straggler (the same samples, all peers together); --time-budget ends a run
# of many epochs; a killed peer is gone around and named in the summary; bad flags and
# files get an error naming them.
# (The throughput ratio itself is a timing, measured in bench/adpsgd_straggler.sh.)
# Usage: PEERTRAIN=build/peertrain adpsgd_cli_test.sh SOURCE_DIR
set -u
source "$(dirname "$0")/common.sh"
port=$((25000 + RANDOM % 2000))
write_topology "$work/ring4.yaml" ring4 ring 4 "$port"
{ cat "$work/ring4.yaml"; printf 'stragglers:\n  - {peer: 1, slowdown: 5}\n'; } >"$work/slow4.yaml"
write_topology "$work/ring6.yaml" ring6 ring 6 $((port + 10))
common=(--algorithm adpsgd --connect-timeout 20 --peer-timeout 20)

column() { awk -F, -v c="$2" -v p="$3" 'NR > 1 && $3 == p { v = $c } END { print v }' "$1/metrics.csv"; }

# 1. With and without the straggler: one epoch of batch 128 on 4 peers.
for topo in ring4 slow4; do
  out="$work/$topo"
  if timeout 300 "$bin" launch --topology "$work/$topo.yaml" "${common[@]}" --epochs 1 --batch 128 --lr 0.1 \
      --out "$out" >"$out.log" 2>&1 && [[ -s $out/summary.json ]]; then
    ok
  else
    fail "adpsgd on $topo"; tail -5 "$out.log"
  fi
done
base=$(summary "$work/ring4" test_accuracy)
slow=$(summary "$work/slow4" test_accuracy)
echo "x̄ accuracy: ${base:-?} without the straggler, ${slow:-?} with it"
# Within 2 points here: one asynchronous run's x̄ moves by about a point between runs (the
# order of the averagings follows the timing; 0.8524 vs 0.8405 seen under a loaded
# machine). The 1-point target is a benchmark over seeds: bench/adpsgd_straggler.sh.
awk -v a="${base:-0}" -v b="${slow:-0}" 'BEGIN { exit !(a > 0.8 && b > a - 0.02) }' && ok ||
  fail "x̄ accuracy ${slow:-?} with the straggler against ${base:-?} without"
straggler=$(column "$work/slow4" 1 1)
for p in 0 2 3; do
  steps=$(column "$work/slow4" 1 $p)
  awk -v s="${steps:-0}" -v t="${straggler:-1e9}" 'BEGIN { exit !(s >= 2 * t) }' && ok ||
    fail "peer $p took ${steps:-?} steps, the 5x straggler ${straggler:-?}: it waited for it"
  waited=$(column "$work/slow4" 12 $p)
  wall=$(column "$work/slow4" 10 $p)
  awk -v w="${waited:-1}" -v t="${wall:-1}" 'BEGIN { exit !(w < 0.1 * t) }' && ok ||
    fail "peer $p waited ${waited:-?} s of ${wall:-?} s"
done
grep -q "steps" "$work/slow4.log" && grep -q "adpsgd: .* averagings" "$work/slow4/peer-0.log" && ok ||
  fail "no per-peer steps or averaging counts"

# 2. --time-budget ends a run of 1000 epochs after about 3 s.
out="$work/budget"
start=$(date +%s)
timeout 120 "$bin" launch --topology "$work/ring4.yaml" "${common[@]}" --epochs 1000 --time-budget 3 --out "$out" \
  >"$out.log" 2>&1 && [[ -s $out/summary.json ]] && ok || { fail "--time-budget 3"; tail -5 "$out.log"; }
(($(date +%s) - start < 100)) && ok || fail "--time-budget 3 ran $(($(date +%s) - start)) s"

# 3. A peer killed mid-run: its neighbours go on with the others, and it is named lost.
out="$work/kill"
"$bin" launch --topology "$work/ring6.yaml" "${common[@]}" --epochs 1000 --time-budget 8 --peer-timeout 10 \
  --out "$out" >"$out.log" 2>&1 &
launcher=$!
# Once every peer trains (its log says so), a second later.
for _ in $(seq 300); do [[ $(grep -l "connected; training" "$out"/peer-*.log 2>/dev/null | wc -l) -eq 6 ]] && break; sleep 0.1; done
sleep 1
pkill -9 -f -- "peer --rank 4 --topology $work/ring6.yaml"
wait $launcher
code=$?
[[ $code -eq 0 ]] && ok || { fail "adpsgd: launch exited $code after losing peer 4"; tail -5 "$out.log"; }
grep -q '"failed_peers": \[4\]' "$out/summary.json" 2>/dev/null && ok || fail "adpsgd: peer 4 not in failed_peers"
grep -q "lost peer 4" "$out/peer-3.log" && grep -q "lost peer 4" "$out/peer-5.log" && ok ||
  fail "adpsgd: peers 3 and 5 do not say they lost peer 4"

# 4. Bad flags and files: an error naming them, nothing started.
expect_error() {  # expect_error TEXT TOPOLOGY FLAGS...
  local text=$1 topo=$2
  shift 2
  if "$bin" launch --topology "$topo" --max-steps 5 "$@" >"$work/err.log" 2>&1; then
    fail "launch $* was accepted"
  elif grep -q "error: .*$text" "$work/err.log"; then
    ok
  else
    fail "launch $*: expected '$text'"; cat "$work/err.log"
  fi
}
expect_error "--time-budget applies to --algorithm adpsgd" "$work/ring4.yaml" --time-budget 5
expect_error "--time-budget" "$work/ring4.yaml" --algorithm adpsgd --time-budget -1
expect_error "--checkpoint-every: --algorithm adpsgd has no global step" "$work/ring4.yaml" --algorithm adpsgd \
  --checkpoint-every 5
expect_error "--update applies to --algorithm dpsgd, choco, sgp or el" "$work/ring4.yaml" --algorithm adpsgd --update atc
{ cat "$work/ring4.yaml"; printf 'stragglers:\n  - {peer: 1, slowdown: 0.5}\n'; } >"$work/bad.yaml"
expect_error "bad.yaml:.*slowdown must be at least 1" "$work/bad.yaml" --algorithm adpsgd
{ cat "$work/ring4.yaml"; printf 'stragglers:\n  - {peer: 9, slowdown: 2}\n'; } >"$work/bad.yaml"
expect_error "bad.yaml:.*straggler peer = 9 is out of range" "$work/bad.yaml" --algorithm adpsgd

echo "adpsgd CLI: $pass passed, $failures failed"
[[ $failures -eq 0 ]]
