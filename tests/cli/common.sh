# What the CLI test scripts share; source it after `set -u` with PEERTRAIN set:
#   bin, work (a temporary folder, removed with its processes on exit), ok, fail and their
#   counts pass and failures; write_topology FILE NAME GENERATOR N BASE_PORT; summary and
#   expect_launch_error (below); and
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

compare_losses() {
  awk -F, 'FNR == 1 { file++; next } file == 1 { a[$1 "," $3] = $4; next }
    ($1 "," $3) in a { n++; d = $4 - a[$1 "," $3]; if (d < 0) d = -d; r = d / (a[$1 "," $3] < 0 ? -a[$1 "," $3] : a[$1 "," $3]);
    if (r > w) w = r } END { printf "%d %.3g", n, w }' "$1" "$2"
}
