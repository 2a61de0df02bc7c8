"""Availability through recycling (issue 23): a real Gunicorn master with
``-k skirr.RustWorker``, ``--max-requests`` recycles, slowloris connections
and clients that stop reading; counts failed POSTs, failed new-connection
probes, and the seconds during which no worker accepted; then SIGTERM and
the time the master takes to drain and exit.

    python bench/recycle_gap.py                      # -w 2, 60 s
    python bench/recycle_gap.py -w 1 --duration 30
    python bench/recycle_gap.py --python .venv-base/bin/python   # another build

Clients (threads): 4 keep-alive POSTers of 1 KiB bodies checked by echo,
never retried; 10 slowloris connections (a head trickled one byte a
second, reopened when closed); 4 clients that ask for 8 MiB and read none
of it (reopened when closed); a probe opening a new connection every
0.1 s (GET /healthz, 5 s timeout). "No worker accepted" adds up the probes'
waits beyond 0.25 s (probes run one at a time, so their waits do not
overlap). Prints one JSON line.

``--mixed`` adds the issue's other clients (app: bench/recycle_gap_app.py):
2 streamed responses at a time (20 chunks, 50 ms apart, checked for order
and completeness), 2 WebSocket clients echoing 1 KiB binary messages
checked by SHA-256 (a close 1001/1012 from a recycle is counted, not
failed; then they reconnect), 2 HTTP/2 clients (h2load, h2c prior
knowledge, rounds of 200 GETs 4 at a time on one connection), and a HUP every
``--hup-every`` seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BODY = os.urandom(1024)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.posts_ok = 0
        self.posts_failed: list[str] = []
        self.probes_ok = 0
        self.probes_failed = 0
        self.no_accept_s = 0.0
        self.max_probe_s = 0.0


def posters(port: int, stop: threading.Event, st: Stats) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    while not stop.is_set():
        try:
            conn.request("POST", "/echo", body=BODY)
            r = conn.getresponse()
            good = r.status == 200 and r.read() == BODY
            with st.lock:
                if good:
                    st.posts_ok += 1
                else:
                    st.posts_failed.append(str(r.status))
            if r.will_close:
                conn.close()
        except (OSError, http.client.HTTPException) as e:
            with st.lock:
                st.posts_failed.append(repr(e)[:80])
            conn.close()
    conn.close()


def slowloris(port: int, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: ")
            while not stop.wait(1.0):
                s.sendall(b"a")
        except OSError:
            time.sleep(0.2)


def non_reader(port: int, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(5)
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /bigbody?n=8388608 HTTP/1.1\r\nHost: a\r\n\r\n")
            # Reads nothing until the server gives up on it (a probe read
            # every 2 s notices the close without draining the socket).
            while not stop.wait(2.0):
                s.setblocking(False)
                try:
                    if s.recv(1, socket.MSG_PEEK) == b"":
                        break
                except BlockingIOError:
                    pass
                except OSError:
                    break
            s.close()
        except OSError:
            time.sleep(0.2)


def probe(port: int, stop: threading.Event, st: Stats) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/healthz", headers={"Connection": "close"})
            ok = c.getresponse().status == 200
            c.close()
        except (OSError, http.client.HTTPException):
            ok = False
        took = time.monotonic() - t0
        with st.lock:
            st.max_probe_s = max(st.max_probe_s, took)
            if took > 0.25:
                st.no_accept_s += took
            if ok:
                st.probes_ok += 1
            else:
                st.probes_failed += 1
        stop.wait(0.1)


class Mixed:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok = {"stream": 0, "ws_message": 0, "h2": 0}
        self.failed: dict[str, list[str]] = {"stream": [], "ws_message": [], "h2": []}
        self.ws_closed_by_recycle = 0

    def add(self, kind: str, why: str | None) -> None:
        with self.lock:
            if why is None:
                self.ok[kind] += 1
            else:
                self.failed[kind].append(why[:100])


def streamer(port: int, stop: threading.Event, mx: Mixed) -> None:
    expected = b"".join(f"chunk{i}\n".encode() for i in range(20))
    while not stop.is_set():
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/stream?n=20&delay=0.05", headers={"Connection": "close"})
            r = c.getresponse()
            body = r.read()
            c.close()
            mx.add("stream", None if r.status == 200 and body == expected else f"{r.status} {body[:40]!r}")
        except (OSError, http.client.HTTPException) as e:
            mx.add("stream", repr(e))


def ws_echoer(port: int, stop: threading.Event, mx: Mixed) -> None:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    while not stop.is_set():
        try:
            with connect(f"ws://127.0.0.1:{port}/ws", open_timeout=10, close_timeout=5) as ws:
                while not stop.is_set():
                    msg = os.urandom(1024)
                    ws.send(msg)
                    got = ws.recv(timeout=10)
                    ok = hashlib.sha256(got).digest() == hashlib.sha256(msg).digest()
                    mx.add("ws_message", None if ok else "echo differs")
                    stop.wait(0.02)
        except ConnectionClosed as e:
            if e.rcvd is not None and e.rcvd.code in (1001, 1012):
                with mx.lock:
                    mx.ws_closed_by_recycle += 1
            else:
                mx.add("ws_message", f"closed: {e!r}")
        except (OSError, TimeoutError) as e:
            mx.add("ws_message", repr(e))


def h2_client(port: int, stop: threading.Event, mx: Mixed) -> None:
    """h2load (nghttp2) in rounds of 200 GETs on one h2c connection, 4
    streams at a time: a request it started and did not complete is a
    failure; one it never sent (after a GOAWAY told it to open no more
    streams on that connection) is not. (httpx over h2 was tried first: the
    `h2` package closes the whole connection on GOAWAY and drops the
    responses still due, python-hyper/h2#1181.)"""
    import re
    import shutil

    exe = shutil.which("h2load")
    if exe is None:
        mx.add("h2", "h2load not found (Debian: nghttp2-client)")
        return
    while not stop.is_set():
        out = subprocess.run(
            [exe, "-n", "200", "-c", "1", "-m", "4", f"http://127.0.0.1:{port}/healthz"],
            capture_output=True, text=True, timeout=60,
        ).stdout  # fmt: skip
        m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded", out)
        if not m:
            mx.add("h2", "h2load: " + out[-80:])
            continue
        started, succeeded = int(m.group(2)), int(m.group(4))
        with mx.lock:
            mx.ok["h2"] += succeeded
            mx.failed["h2"] += [f"h2load: {started - succeeded} of {started} started not completed"] * (
                started - succeeded
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-w", "--workers", type=int, default=2)
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--max-requests", type=int, default=1500)
    ap.add_argument("--jitter", type=int, default=150)
    ap.add_argument("--graceful-timeout", type=int, default=30)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server")
    ap.add_argument("--mixed", action="store_true", help="add streams, WebSockets, HTTP/2 and HUPs")
    ap.add_argument("--hup-every", type=float, default=30)
    a = ap.parse_args()

    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="recycle-gap-", suffix=".log", delete=False)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}")
    env.update(kv.split("=", 1) for kv in a.env)
    cmd = [
        a.python, "-m", "gunicorn", "-k", "skirr.RustWorker", "-b", f"127.0.0.1:{port}",
        "-w", str(a.workers), "--max-requests", str(a.max_requests),
        "--max-requests-jitter", str(a.jitter), "--graceful-timeout", str(a.graceful_timeout),
        *(["--http-protocols", "h1,h2", "--http2-cleartext", "prior-knowledge"] if a.mixed else []),
        "bench.recycle_gap_app:app" if a.mixed else "apps.probe:app",
    ]  # fmt: skip
    master = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("server did not start") from None
            time.sleep(0.1)
    st = Stats()
    stop, stop_slow = threading.Event(), threading.Event()
    load = [threading.Thread(target=posters, args=(port, stop, st)) for _ in range(4)]
    load += [threading.Thread(target=probe, args=(port, stop, st))]
    slow = [threading.Thread(target=slowloris, args=(port, stop_slow)) for _ in range(10)]
    slow += [threading.Thread(target=non_reader, args=(port, stop_slow)) for _ in range(4)]
    mx = Mixed()
    if a.mixed:
        load += [threading.Thread(target=f, args=(port, stop, mx)) for f in (streamer, ws_echoer, h2_client) * 2]
    for t in load + slow:
        t.daemon = True
        t.start()
    hups = 0
    end = time.monotonic() + a.duration
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, a.hup_every))
        if a.mixed and end - time.monotonic() > 1:
            master.send_signal(signal.SIGHUP)
            hups += 1
    stop.set()
    for t in load:
        t.join(10)
    # Shutdown with the slow clients still attached: how long the drain takes.
    t0 = time.monotonic()
    master.send_signal(signal.SIGTERM)
    try:
        master.wait(a.graceful_timeout + 15)
    except subprocess.TimeoutExpired:
        master.kill()
    shutdown_s = time.monotonic() - t0
    stop_slow.set()
    logs = Path(log.name).read_text(errors="replace")
    out = {
        "workers": a.workers,
        "duration_s": a.duration,
        "recycles": logs.count("Autorestarting worker"),
        "deferred": logs.count("serving on until it accepts"),
        "posts_ok": st.posts_ok,
        "posts_failed": len(st.posts_failed),
        "post_failures": st.posts_failed[:3],
        "probes_ok": st.probes_ok,
        "probes_failed": st.probes_failed,
        "no_worker_accepted_s": round(st.no_accept_s, 1),
        "max_probe_s": round(st.max_probe_s, 2),
        "shutdown_drain_s": round(shutdown_s, 1),
        **(
            {
                "hups": hups,
                "ok": mx.ok,
                "failed": {k: len(v) for k, v in mx.failed.items()},
                "failures": {k: v[:3] for k, v in mx.failed.items() if v},
                "ws_closed_by_recycle": mx.ws_closed_by_recycle,
            }
            if a.mixed
            else {}
        ),
        "log": log.name,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
