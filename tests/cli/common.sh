# What the CLI test scripts share; source it after `set -u` with PEERTRAIN set:
#   bin, work (a temporary folder, removed with its processes on exit), ok, fail and their
#   counts pass and failures; write_topology FILE NAME GENERATOR N BASE_PORT; summary,
#   expect_launch_error and launch_and_kill (below); and
#   compare_losses A B, "N WORST": the (step, peer) train losses of two metrics.csv files
#   matched up and their largest relative difference.
bin=${PEERTRAIN:?set PEERTRAIN to the peertrain binary}
work=$(mktemp -d)
trap 'pkill -9 -f -- "$work" 2>/dev/null; rm -rf "$work"' EXIT
failures=0
pass=0
ok() { pass=$((pass + 1)); }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

write_topology() {  # write_topology FILE NAME GENERATOR N BASE_PORT
  {
    echo "name: $2"
    echo "graph: {generator: $3, n: $4}"
    echo "peers:"
    for ((i = 0; i < $4; i++)); do echo "  - {id: $i, host: 127.0.0.1, port: $(($5 + i))}"; done
  } >"$1"
}

# summary DIR FIELD: a number of DIR/summary.json.
summary() { grep -o "\"$2\": [0-9.e+-]*" "$1/summary.json" | head -1 | cut -d' ' -f2; }

# expect_launch_error TOPOLOGY TEXT FLAGS...: launch refuses FLAGS with exactly one "error:"
# line, matching TEXT, and starts nothing.
expect_launch_error() {
  local topology=$1 text=$2
  shift 2
  if timeout 120 "$bin" launch --topology "$topology" "$@" --out "$work/refused" >"$work/err.log" 2>&1; then
    fail "launch $* was accepted"
  elif [[ $(grep -c "^error: " "$work/err.log") -eq 1 ]] && grep -q -- "^error: .*$text" "$work/err.log"; then
    ok
  else
    fail "launch $*: expected one error line with '$text'"; cat "$work/err.log"
  fi
}

# launch_and_kill OUT TOPOLOGY N VICTIM FLAGS...: launches FLAGS on TOPOLOGY's N peers
# into OUT, kills peer VICTIM a second after every peer trains (each peer's log says so;
# the launcher's own log has no per-step line to wait for), and returns launch's exit code.
launch_and_kill() {
  local out=$1 topology=$2 n=$3 victim=$4
  shift 4
  "$bin" launch --topology "$topology" "$@" --out "$out" >"$out.log" 2>&1 &
  local launcher=$!
  for _ in $(seq 300); do
    [[ $(grep -l "connected; training" "$out"/peer-*.log 2>/dev/null | wc -l) -eq $n ]] && break
    sleep 0.1
  done
  sleep 1
  pkill -9 -f -- "peer --rank $victim --topology $topology"
  wait $launcher
}

compare_losses() {
  awk -F, 'FNR == 1 { file++; next } file == 1 { a[$1 "," $3] = $4; next }
    ($1 "," $3) in a { n++; d = $4 - a[$1 "," $3]; if (d < 0) d = -d; r = d / (a[$1 "," $3] < 0 ? -a[$1 "," $3] : a[$1 "," $3]);
    if (r > w) w = r } END { printf "%d %.3g", n, w }' "$1" "$2"
}
