#!/usr/bin/env bash
# The live dashboard and the report in a real browser (tests/cli/dashboard_check.py), plus
# the flag's bad input. Keeps the screenshots in build/tests/dashboard/ (the README's comes
# from there). Usage: PEERTRAIN=build/peertrain dashboard_test.sh
set -u
source "$(dirname "$0")/common.sh"
keep=$(dirname "$bin")/tests/dashboard
mkdir -p "$keep"

# Bad --dashboard values: an error naming the flag, nothing started.
write_topology "$work/ring4.yaml" ring4 ring 4 $((27000 + RANDOM % 1000))
for bad in "abc" "70000" "1.2.3.4.5:80" "host:"; do
  if "$bin" launch --topology "$work/ring4.yaml" --dashboard "$bad" --max-steps 2 >"$work/err.log" 2>&1; then
    fail "--dashboard $bad was accepted"
  elif grep -q "^error: --dashboard '$bad'" "$work/err.log"; then ok; else fail "--dashboard $bad: $(cat "$work/err.log")"; fi
done
# A port in use is named.
/usr/bin/python3 -c 'import socket,time; s=socket.socket(); s.bind(("127.0.0.1",0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(30)' >"$work/port" &
holder=$!
for _ in $(seq 50); do [[ -s $work/port ]] && break; sleep 0.1; done
used=$(cat "$work/port")
if "$bin" launch --topology "$work/ring4.yaml" --dashboard "$used" --max-steps 2 >"$work/err.log" 2>&1; then
  fail "--dashboard on a port in use was accepted"
elif grep -q "^error: --dashboard 127.0.0.1:$used: cannot listen" "$work/err.log"; then ok; else fail "port in use: $(cat "$work/err.log")"; fi
kill $holder 2>/dev/null

/usr/bin/python3 "$(dirname "$0")/dashboard_check.py" "$bin" "$work"
code=$?
cp "$work"/*.png "$keep/" 2>/dev/null
[[ $code -eq 77 ]] && { echo "dashboard: skipped (chromium unavailable)"; exit 77; }
[[ $code -eq 0 ]] && ok || fail "the browser checks (above)"
echo "dashboard CLI: $pass passed, $failures failed"
[[ $failures -eq 0 ]]
