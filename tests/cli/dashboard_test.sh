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

# Bound to every interface without a key, the dashboard still asks for a token, and it
# closes a 17th connection from one address other than loopback (this host's own
# non-loopback address stands in for a stranger's; the check is skipped without one).
"$bin" launch --topology "$work/ring4.yaml" --dashboard 0.0.0.0:0 --max-steps 1000000 --out "$work/open" \
  >"$work/open.log" 2>&1 &
run=$!
for _ in $(seq 200); do grep -q "^dashboard: " "$work/open.log" && break; sleep 0.1; done
url=$(sed -n 's/^dashboard: \([^ ]*\).*/\1/p' "$work/open.log" | head -1)
[[ $url == *"?token="* ]] && ok || fail "a dashboard on 0.0.0.0 without --secret-file gave no token: '$url'"
stranger=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -m1 -E '^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$' | grep -v '^127\.')
if [[ -n $stranger ]]; then
  /usr/bin/python3 - "$stranger" "${url##*:}" <<'EOF_PY' && ok || fail "the per-address cap (above)"
import socket, sys, urllib.request
host, rest = sys.argv[1], sys.argv[2]
port, token = int(rest.split("/")[0]), rest.split("token=")[1]
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an http_proxy
status = lambda path: direct.open(f"http://{host}:{port}{path}", timeout=10).status
try:
    status("/state")
    sys.exit("the state was served without the token")
except urllib.error.HTTPError as e:
    assert e.code == 401, e.code
assert status(f"/state?token={token}") == 200
idle = [socket.create_connection((host, port), timeout=10) for _ in range(16)]
extra = socket.create_connection((host, port), timeout=10)
extra.sendall(f"GET /state?token={token} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
try:
    got = extra.recv(100)
except ConnectionResetError:
    got = b""
assert got == b"", f"a 17th connection from {host} was served: {got!r}"
for s in idle:
    s.close()
import time
for _ in range(50):  # the server hears of the closes asynchronously
    try:
        if status(f"/state?token={token}") == 200:
            break
    except (ConnectionError, urllib.error.URLError):
        pass
    time.sleep(0.1)
else:
    sys.exit("not served again within 5 s of the other connections closing")
print(f"per-address cap: 16 idle connections from {host}, the 17th closed, served again after")
EOF_PY
else
  echo "per-address cap: skipped, this host has no non-loopback IPv4 address"
fi
kill "$run" 2>/dev/null
wait "$run" 2>/dev/null
# Its peers go with it (PR_SET_PDEATHSIG); the browser checks below start once they have.
for _ in $(seq 100); do pgrep -f -- "--topology $work/ring4.yaml" >/dev/null || break; sleep 0.1; done

/usr/bin/python3 "$(dirname "$0")/dashboard_check.py" "$bin" "$work"
code=$?
cp "$work"/*.png "$keep/" 2>/dev/null
[[ $code -eq 77 ]] && { echo "dashboard: skipped (chromium unavailable)"; exit 77; }
[[ $code -eq 0 ]] && ok || fail "the browser checks (above)"
echo "dashboard CLI: $pass passed, $failures failed"
[[ $failures -eq 0 ]]
