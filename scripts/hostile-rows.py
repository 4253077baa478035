#!/usr/bin/env python3
"""Five hostile inputs against the release binary (docs/RELIABILITY.md's first rows): rotating
new accounts, one new account's concurrent burst, a `Forwarded` spoofer behind a trusted proxy,
an unparsable forwarded hop, and a config file emptied during a run. Prints what happened.

Usage: cargo build --release -p sluice-cli && scripts/hostile-rows.py"""
import http.client, socket, subprocess, tempfile, threading, time, os
B = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "sluice")
TMP = tempfile.mkdtemp(prefix="sluice-rows-")

def req(port, headers):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.putrequest("GET", "/")
    for k, v in headers:
        c.putheader(k, v)
    c.endheaders()
    r = c.getresponse(); r.read(); c.close()
    return r.status

def raw(port, head: bytes):
    s = socket.create_connection(("127.0.0.1", port)); s.sendall(head)
    data = s.recv(4096); s.close()
    return int(data.split(b" ")[1])

def serve(args, port):
    p = subprocess.Popen([B, "serve", "--listen", f"127.0.0.1:{port}"] + args,
                         stdout=subprocess.DEVNULL, stderr=open(f"{TMP}/serve{port}.log", "w"))
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port)).close(); break
        except OSError:
            time.sleep(0.05)
    return p

p = serve([], 18181)
t0 = time.time()
ok = sum(req(18181, [("X-Account-ID", f"rot{i}")]) == 200 for i in range(100))
print(f"row 1: 100 rotating unknown keys in {time.time()-t0:.2f}s: {ok} admitted (pool 20/s)")
time.sleep(1.5)
res = []
ts = [threading.Thread(target=lambda: res.append(req(18181, [("X-Account-ID", "newbie")]))) for _ in range(20)]
[t.start() for t in ts]; [t.join() for t in ts]
print(f"row 2: 20 concurrent from one unknown account: {res.count(200)} admitted")
p.terminate(); p.wait()

cfg = f"{TMP}/proxy.yaml"
open(cfg, "w").write("key: {from: [ip]}\ntrusted_proxies: [127.0.0.1/32]\nunknown: 1/min\nfailsafe: 1/min\nfetch_latency: 0s\naccounts: {}\n")
p = serve(["--config", cfg], 18182)
ok = sum(req(18182, [("X-Forwarded-For", "203.0.113.7"), ("Forwarded", f"for=198.51.100.{i}")]) == 200 for i in range(20))
print(f"row 3: one client, same X-Forwarded-For, 20 Forwarded values: {ok} admitted")
s = raw(18182, b"GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: \xff, 203.0.113.8\r\n\r\n")
other = req(18182, [("X-Forwarded-For", "203.0.113.9")])
print(f"row 4: \\xff hop: {s}; next client (203.0.113.9): {other}")
p.terminate(); p.wait()

cfg = f"{TMP}/accounts.yaml"
body = "fetch_latency: 0s\naccounts: {hourly: 1/h}\n"
open(cfg, "w").write(body)
p = serve(["--config", cfg], 18183)
first = req(18183, [("X-Account-ID", "hourly")])
time.sleep(0.3)
second = req(18183, [("X-Account-ID", "hourly")])
open(cfg, "w").write("")
time.sleep(2.5)
during = req(18183, [("X-Account-ID", "hourly")])
open(cfg, "w").write(body)
time.sleep(2.5)
after = req(18183, [("X-Account-ID", "hourly")])
p.terminate(); p.wait()
log = open(f"{TMP}/serve18183.log").read()
refused = [l for l in log.splitlines() if "empty" in l]
print(f"row 5: 1/h account: {first}, {second}; file emptied: {during}; restored: {after}; log lines on the empty file: {len(refused)}")
for l in refused: print("   ", l[:200])
