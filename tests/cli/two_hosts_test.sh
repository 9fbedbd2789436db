#!/usr/bin/env bash
# The README's run across machines, as a user would type it: two hosts of a netlab
# (scripts/netlab.sh: a network namespace each, with its own address) stand for two
# machines. One topology file puts peers 0-3 on the first host and 4-7 on the second, by
# address, and `peertrain launch` runs with the same flags on each host, each writing its own
# --out as on separate machines. Checks: both launches exit 0, each starts exactly its own
# four peers, the first host (peer 0, the coordinator) writes summary.json, and the file is
# refused on a machine that holds none of its hosts.
# Needs root (network namespaces); without it it says why and exits 77 (skipped).
# Usage: two_hosts_test.sh SOURCE_DIR   (PEERTRAIN: the binary). About 1 minute on 2 cores.
set -u
src=${1:?usage: two_hosts_test.sh SOURCE_DIR}
bin=$(realpath "${PEERTRAIN:?set PEERTRAIN to the peertrain binary}")
src=$(realpath "$src")
netlab="$src/scripts/netlab.sh"
if ! why=$("$netlab" check); then
  echo "skipped: $why"
  exit 77
fi
for old in $("$netlab" list); do
  [[ $old =~ ^th([0-9]+)$ ]] && ! kill -0 "${BASH_REMATCH[1]}" 2>/dev/null && "$netlab" down "$old"
done
lab="th$$"
work=$(mktemp -d)
cleanup() {
  "$netlab" down "$lab"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

"$netlab" up "$lab" 2 || { echo "FAIL could not make the lab"; exit 1; }
{
  echo "name: two-machines"
  echo "graph: {generator: ring, n: 8}"
  echo "peers:"
  for r in 0 1 2 3 4 5 6 7; do
    echo "  - {id: $r, host: 10.213.0.$((r / 4 + 1)), port: $((29500 + r % 4))}"
  done
} >"$work/two-machines.yaml"
flags=(--topology "$work/two-machines.yaml" --hidden 32 --batch 16 --max-steps 40 --eval-every 20
       --connect-timeout 30)

for h in 0 1; do
  (cd "$work" && "$netlab" exec "$lab" $h "$bin" launch "${flags[@]}" --out "$work/host$h" \
     >"$work/launch$h.out" 2>&1; echo $? >"$work/launch$h.rc") &
done
wait
for h in 0 1; do
  rc=$(cat "$work/launch$h.rc")
  [[ $rc == 0 ]] || { fail "launch on host $h exited $rc"; tail -20 "$work/launch$h.out"; }
  grep -q "launching 4 of 8 peers" "$work/launch$h.out" || fail "host $h did not start exactly its 4 peers"
done
for r in 0 1 2 3; do [[ -f $work/host0/peer-$r.log ]] || fail "host 0 has no log of peer $r"; done
for r in 4 5 6 7; do [[ -f $work/host1/peer-$r.log ]] || fail "host 1 has no log of peer $r"; done
[[ -f $work/host1/peer-0.log ]] && fail "host 1 started peer 0, which lives on host 0"
if [[ -f $work/host0/summary.json ]]; then
  grep -q '"peers": 8' "$work/host0/summary.json" || fail "summary.json does not count 8 peers"
  grep -q '"failed_peers": \[\]' "$work/host0/summary.json" || fail "summary.json names failed peers"
else
  fail "host 0 (the coordinator's) wrote no summary.json"
fi
grep -q "coordinator ran elsewhere" "$work/launch1.out" || fail "host 1 did not say where the summary is"

# On the machine itself (none of 10.213.0.x is its address) the same file is refused, naming the hosts.
if out=$("$bin" launch "${flags[@]}" --out "$work/here" 2>&1); then
  fail "launch accepted a file whose hosts are all elsewhere"
else
  grep -q "none of its 8 peers is on this machine (10.213.0.1, 10.213.0.2" <<<"$out" ||
    fail "the refusal does not name the hosts: $out"
fi
if ((failures == 0)); then
  echo "two hosts: both launches trained, 8 peers across 2 namespaces; host 0 printed:"
  grep -A2 "^two-machines ·" "$work/launch0.out"
fi
exit $((failures > 0))
