"""Browsers for bench/dashboard_overhead.sh: N WebSocket clients on a dashboard that never
read (slow or frozen tabs), and one that reads everything (an attentive one). Runs until
killed; prints how many messages the reader got.

  dashboard_clients.py URL N
"""
import base64
import os
import re
import signal
import socket
import sys

url, count = sys.argv[1], int(sys.argv[2])  # (a third argument, ignored, tags the process for cleanup)
m = re.match(r"http://([^:/]+):(\d+)/(?:\?token=(\w+))?", url)
host, port, token = m.group(1), int(m.group(2)), m.group(3) or ""


def connect():
    s = socket.create_connection((host, port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET /ws?token={token} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    return s


silent = [connect() for _ in range(count)]
reader = connect()
received = 0
signal.signal(signal.SIGTERM, lambda *_: (print(f"reader got {received} bytes"), sys.exit(0)))
while True:
    data = reader.recv(1 << 16)
    if not data:
        break
    received += len(data)
print(f"reader got {received} bytes")
