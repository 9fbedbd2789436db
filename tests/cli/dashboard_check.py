"""The live dashboard as a person sees it, in a real browser (Debian's chromium, headless,
driven over the DevTools protocol with nothing but the standard library).

  dashboard_check.py PEERTRAIN WORKDIR

1. launch trains 6 peers on a ring with --dashboard and --secret-file; the page asks for
   the token without it, and never shows the key.
2. The page shows one node per peer and a line per link, and its curves gain points while
   the run goes on.
3. Twenty WebSocket clients that never read, one that sends malformed frames and one that
   vanishes mid-handshake: the run goes on and the page keeps updating.
4. A peer killed with SIGKILL turns to lost within the peer timeout; restarted with the
   command launch prints (--rejoin), it comes back, and the events say both.
5. A screenshot (WORKDIR/dashboard.png); then `peertrain report` of the finished run opens
   offline in the same browser with the same elements and events.
Exit 77 (skipped) when chromium is missing or cannot start.
"""
import base64
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request

PEERTRAIN, WORK = sys.argv[1], sys.argv[2]
PEERS, PEER_TIMEOUT = 6, 6
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)


# ---- a minimal WebSocket client (RFC 6455), enough for DevTools and the abuse tests ----
class WebSocket:
    def __init__(self, host, port, path, timeout=30, headers=""):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        host_header = f"{host}:{port}" if "Host:" not in headers else None
        self.sock.sendall((f"GET {path} HTTP/1.1\r\n" + (f"Host: {host_header}\r\n" if host_header else "") +
                           f"{headers}Upgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise ConnectionError("closed during the handshake")
            head += chunk
        self.status = int(head.split(b" ")[1])
        if self.status != 101:
            raise ConnectionError(f"handshake answered {self.status}")

    def send(self, payload, opcode=1):
        data = payload.encode() if isinstance(payload, str) else payload
        mask = os.urandom(4)
        header = bytes([0x80 | opcode])
        n = len(data)
        header += bytes([0x80 | n]) if n < 126 else (bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536
                                                      else bytes([0x80 | 127]) + struct.pack(">Q", n))
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    def recv(self):
        message = b""
        while True:
            b0, b1 = self._exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            message += self._exact(n)
            if b0 & 0x80:
                return message.decode()


class Browser:
    def __init__(self):
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if not exe:
            print("SKIP: chromium is not installed (scripts/setup.sh --test installs it)")
            sys.exit(77)
        self.profile = os.path.join(WORK, "chromium-profile")
        shutil.rmtree(self.profile, ignore_errors=True)
        self.proc = subprocess.Popen([exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                      "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
                                      "--window-size=1400,1100", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=open(os.path.join(WORK, "chromium.log"), "w"))
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        for _ in range(300):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        else:
            pass
        if not os.path.exists(port_file):
            print("SKIP: chromium did not start (see chromium.log)")
            self.proc.kill()
            sys.exit(77)
        port = int(open(port_file).read().split()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        page = next(t for t in targets if t["type"] == "page")
        url = page["webSocketDebuggerUrl"]
        m = re.match(r"ws://([^:/]+):(\d+)(/.*)", url)
        self.ws = WebSocket(m.group(1), int(m.group(2)), m.group(3), timeout=60)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def navigate(self, url):
        self.call("Page.enable")
        self.call("Page.navigate", url=url)
        time.sleep(1.0)

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def stats(self):
        value = self.evaluate("JSON.stringify(Object.assign({}, (document.getElementById('stats') || {}).dataset))")
        return json.loads(value) if value else {}

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def wait_for(predicate, seconds, browser):
    deadline = time.time() + seconds
    s = browser.stats()
    while time.time() < deadline:
        s = browser.stats()
        if predicate(s):
            return s, True
        time.sleep(0.25)
    return s, False


def http_get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def main():
    browser = Browser()
    port = 24000 + os.getpid() % 3000
    topology = os.path.join(WORK, "ring6.yaml")
    with open(topology, "w") as f:
        f.write(f"name: ring6\ngraph: {{generator: ring, n: {PEERS}}}\npeers:\n")
        for i in range(PEERS):
            f.write(f"  - {{id: {i}, host: 127.0.0.1, port: {port + i}}}\n")
    key = os.path.join(WORK, "key")
    if os.path.exists(key):
        os.remove(key)
    subprocess.run([PEERTRAIN, "keygen", key], check=True, stdout=subprocess.DEVNULL)
    out = os.path.join(WORK, "run")
    log = open(os.path.join(WORK, "launch.log"), "w")
    launch = subprocess.Popen([PEERTRAIN, "launch", "--topology", topology, "--secret-file", key, "--dashboard", "0",
                               "--hidden", "32", "--batch", "16", "--epochs", "40", "--max-steps", "9000", "--eval-every", "40",
                               "--peer-timeout", str(PEER_TIMEOUT), "--connect-timeout", "30", "--out", out],
                              stdout=log, stderr=subprocess.STDOUT)
    url = None
    for _ in range(300):
        text = open(os.path.join(WORK, "launch.log")).read()
        m = re.search(r"dashboard: (http://\S+)", text)
        if m:
            url = m.group(1)
            break
        if launch.poll() is not None:
            break
        time.sleep(0.1)
    check(url is not None and "token=" in url, f"launch printed the dashboard's address with a token ({url})")
    if url is None:
        print(open(os.path.join(WORK, "launch.log")).read())
        return
    m = re.match(r"http://([^:/]+):(\d+)/\?token=(\w+)", url)
    host, http_port, token = m.group(1), int(m.group(2)), m.group(3)
    base = f"http://{host}:{http_port}"

    # 1. The token: asked for, and the key never shown.
    status, body = http_get(base + "/")
    check(status == 401 and "token" in body, f"the page without the token asks for it (HTTP {status})")
    check(http_get(base + "/state")[0] == 401, "the state without the token is refused")
    status, state = http_get(base + "/state?token=" + token)
    secret = open(key).read().strip()
    check(status == 200 and secret not in state and secret not in http_get(url)[1],
          "with the token the state is served, and the key appears nowhere")
    try:
        WebSocket(host, http_port, "/ws?token=wrong")
        check(False, "a WebSocket with a wrong token was accepted")
    except ConnectionError:
        check(True, "a WebSocket with a wrong token is refused")
    try:
        WebSocket(host, http_port, "/ws?token=" + token, headers="Origin: http://evil.example\r\n")
        check(False, "a WebSocket from another site's page was accepted")
    except ConnectionError as e:
        check("403" in str(e), f"a WebSocket from another site's page is refused ({e})")
    rebind = socket.create_connection((host, http_port))
    rebind.sendall(f"GET /state?token={token} HTTP/1.1\r\nHost: evil.example:{http_port}\r\n\r\n".encode())
    answer = rebind.recv(200).decode(errors="replace")
    rebind.close()
    check(answer.startswith("HTTP/1.1 403"), f"a request addressed to another name (DNS rebinding) is refused "
                                              f"({answer.splitlines()[0] if answer else 'nothing'})")

    # 2. What a person sees, growing.
    browser.navigate(url)
    s, ok = wait_for(lambda s: int(s.get("points", 0)) >= 2, 120, browser)
    check(ok, f"the curves have points ({s.get('points')})")
    check(s.get("peers") == str(PEERS), f"one node per peer ({s.get('peers')} of {PEERS})")
    check(s.get("links") == str(PEERS), f"a line per link of the ring ({s.get('links')})")
    first = int(s.get("points", 0))
    s, ok = wait_for(lambda s: int(s.get("points", 0)) > first, 60, browser)
    check(ok, f"they grow while the run goes on ({first} -> {s.get('points')})")
    thick = browser.evaluate("Math.max(...[...document.querySelectorAll('#graph .link')].map(l => +l.dataset.throughput))")
    check(thick is not None and thick > 0, f"links are drawn with their throughput (busiest {thick} B/s)")

    # 3. Abuse: slow readers, malformed frames, a vanished client. The page keeps updating.
    silent = [WebSocket(host, http_port, "/ws?token=" + token) for _ in range(20)]
    bad = WebSocket(host, http_port, "/ws?token=" + token)
    bad.send("this is not json")
    bad.send(b"\xff\xfe\x00garbage", opcode=2)
    bad.send("x" * 100000)  # over the server's message limit: it closes this one client
    half = socket.create_connection((host, http_port))
    half.sendall(b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n")
    half.close()
    raw = socket.create_connection((host, http_port))
    raw.sendall(b"\x00\x01garbage that is not HTTP\r\n\r\n")
    raw.close()
    now = int(browser.stats().get("points", 0))
    s, ok = wait_for(lambda s: int(s.get("points", 0)) > now + 1, 90, browser)
    check(ok, f"with 20 silent clients and malformed input the page keeps updating ({now} -> {s.get('points')})")
    check(launch.poll() is None, "and the run is still going")

    # 4. A killed peer turns to lost within the peer timeout.
    subprocess.run(["pkill", "-9", "-f", f"peer --rank 4 --topology {topology}"])
    killed = time.time()
    s, ok = wait_for(lambda s: "4" in s.get("lost", "").split(","), PEER_TIMEOUT, browser)
    check(ok, f"peer 4 shows as lost {time.time() - killed:.1f} s after SIGKILL (peer timeout {PEER_TIMEOUT} s); "
              f"states {s.get('states')}")
    time.sleep(1.5)
    browser.screenshot(os.path.join(WORK, "dashboard.png"))
    check(os.path.getsize(os.path.join(WORK, "dashboard.png")) > 10000, "a screenshot was saved")
    for ws in silent:
        ws.sock.close()

    # The peer comes back with the command launch printed for it.
    again = None
    for _ in range(100):
        m = re.search(r"to bring it back: peertrain (peer --rank 4 --rejoin .*)", open(os.path.join(WORK, "launch.log")).read())
        if m:
            again = m.group(1).split()
            break
        time.sleep(0.1)
    check(again is not None, "launch printed the command that brings peer 4 back")
    if again:
        rejoined = subprocess.Popen([PEERTRAIN] + again, stdout=subprocess.DEVNULL,
                                    stderr=open(os.path.join(WORK, "rejoined.log"), "w"))
        s, ok = wait_for(lambda s: "4" not in s.get("lost", "").split(",") and s.get("status") == "running", 60, browser)
        events = browser.evaluate("document.getElementById('events').textContent") or ""
        check(ok and "peer 4 rejoined" in events, f"peer 4 is back after --rejoin (states {s.get('states')}; "
                                                  f"events: {events[-160:]!r})")

    # 5. The run ends (the survivors finish); its report opens offline with the same view.
    try:
        code = launch.wait(300)
    except subprocess.TimeoutExpired:
        launch.send_signal(signal.SIGINT)
        code = launch.wait(30)
    check(code == 0, f"launch finished (exit {code})")
    if again:
        try:
            check(rejoined.wait(60) == 0, "the rejoined peer finished the run")
        except subprocess.TimeoutExpired:
            rejoined.kill()
            check(False, "the rejoined peer did not finish within 60 s of the others")
    s, ok = wait_for(lambda s: s.get("status") in ("finished", "disconnected"), 10, browser)
    check(s.get("status") == "finished", f"the page says the run finished ({s.get('status')})")
    report = os.path.join(WORK, "report.html")
    r = subprocess.run([PEERTRAIN, "report", out, "-o", report], capture_output=True, text=True)
    check(r.returncode == 0 and os.path.exists(report), f"peertrain report wrote the file ({r.stdout.strip()})")
    html = open(report).read()
    check(not re.search(r"(src|href)=\"https?:", html), "the report loads nothing from the network")
    browser.call("Network.enable")
    browser.call("Network.emulateNetworkConditions", offline=True, latency=0, downloadThroughput=-1,
                 uploadThroughput=-1)
    browser.navigate("file://" + os.path.abspath(report))
    s, ok = wait_for(lambda s: int(s.get("points", 0)) >= 2, 20, browser)
    check(ok and s.get("peers") == str(PEERS) and s.get("links") == str(PEERS),
          f"the report shows the same elements offline (peers {s.get('peers')}, links {s.get('links')}, "
          f"points {s.get('points')})")
    events = browser.evaluate("document.getElementById('events').textContent") or ""
    check("peer 4 lost" in events and "peer 4 rejoined" in events,
          f"the report's events show peer 4 lost and rejoined ({events[-160:]!r})")
    browser.screenshot(os.path.join(WORK, "report.png"))
    browser.close()


try:
    main()
except SystemExit:
    raise
except Exception as e:  # a broken step is a failure with its reason, not a hang
    failures.append(repr(e))
    print("FAIL  " + repr(e))
subprocess.run(["pkill", "-f", f"--topology {os.path.join(WORK, 'ring6.yaml')}"], capture_output=True)
print(f"dashboard: {len(failures)} failed")
sys.exit(1 if failures else 0)
