"""Soak: mixed load on one Gunicorn worker for a long time; RSS and open
descriptors sampled over time (flat is the bar) and server errors counted
(zero is the bar).

    bench/.venv/bin/python bench/soak.py                 # 10 minutes
    bench/.venv/bin/python bench/soak.py --duration 60   # a quick look

Load, all at once: keep-alive GETs (wrk, 32 connections), uploads of 1 KiB
to 2 MiB (some chunked), streamed responses, WebSocket echo
(``bench/loadgen ws``, 32 connections, reconnecting every 10 s), and abrupt
disconnects (mid-head, mid-body, mid-stream, mid-WebSocket). Writes
``bench/results/soak-<stamp>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.run import BENCH, RESULTS, ROOT, free_port, machine  # noqa: E402

LOADGEN = ROOT / "target" / "release" / "loadgen"


def worker_pid(master: int) -> int | None:
    out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok: dict[str, int] = {}
        self.bad: dict[str, int] = {}
        self.examples: list[str] = []

    def add(self, kind: str, ok: bool, why: str = "") -> None:
        with self.lock:
            d = self.ok if ok else self.bad
            d[kind] = d.get(kind, 0) + 1
            if not ok and len(self.examples) < 20:
                self.examples.append(f"{kind}: {why}")


def http_once(port: int, raw: bytes, expect: bytes) -> tuple[bool, str]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(raw)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        return False, head[:80].decode("latin-1")
    if expect not in body:
        return False, f"body {body[:60]!r}"
    return True, ""


def uploads(port: int, stop: threading.Event, c: Counters) -> None:
    rnd = random.Random(1)
    while not stop.is_set():
        n = rnd.choice([1024, 65536, 500_000, 2 << 20])
        body = os.urandom(64) * (n // 64)
        if rnd.random() < 0.5:
            raw = (
                f"POST / HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
        else:
            chunks = b"".join(
                b"%x\r\n%s\r\n" % (len(p), p) for p in (body[i : i + 50_000] for i in range(0, len(body), 50_000))
            )
            raw = (
                b"POST / HTTP/1.1\r\nHost: a\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
                + chunks
                + b"0\r\n\r\n"
            )
        try:
            ok, why = http_once(port, raw, str(len(body)).encode())
        except OSError as e:
            ok, why = False, repr(e)
        c.add("upload", ok, why)


def streams(port: int, stop: threading.Event, c: Counters) -> None:
    while not stop.is_set():
        try:
            ok, why = http_once(port, b"GET /stream HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", b"last")
        except OSError as e:
            ok, why = False, repr(e)
        c.add("stream", ok, why)


def disconnects(port: int, stop: threading.Event, c: Counters) -> None:
    rnd = random.Random(2)
    partial = [
        b"GET / HTTP/1.1\r\nHo",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n" + b"x" * 5000,
        b"GET /stream HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    ]
    while not stop.is_set():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(rnd.choice(partial))
            if rnd.random() < 0.5:
                s.settimeout(0.05)
                try:
                    s.recv(100)
                except OSError:
                    pass
            if rnd.random() < 0.5:  # RST instead of FIN
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()
            c.add("disconnect", True)
        except OSError as e:
            c.add("disconnect", False, repr(e))
        time.sleep(0.005)


def websockets(port: int, stop: threading.Event, c: Counters, results: list) -> None:
    while not stop.is_set():
        p = subprocess.run(
            [str(LOADGEN), "ws", f"ws://127.0.0.1:{port}/ws", "32", "10"], capture_output=True, text=True
        )
        try:
            r = json.loads(p.stdout)
            results.append(r)
            c.add("ws_session", r["errors"] == 0 and r["messages"] > 0, f"{r['errors']} errors")
        except ValueError:
            c.add("ws_session", False, (p.stdout + p.stderr)[-200:])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=600)
    p.add_argument("--interval", type=float, default=10)
    p.add_argument("--venv", default=str(BENCH / ".venv"))
    args = p.parse_args(argv)
    venv = Path(args.venv)
    port = free_port()
    log_path = Path(f"/tmp/skirr-soak-{os.getpid()}.log")
    cmd = f"{venv}/bin/gunicorn -k skirr.RustWorker -w 1 -b 127.0.0.1:{port} --log-level info bench.soak_app:app"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open(log_path, "wb") as log:
        master = subprocess.Popen(shlex.split(cmd), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                ok, _ = http_once(port, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", b"ok")
                if ok:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or master.poll() is not None:
                print(log_path.read_text())
                return 1
            time.sleep(0.2)
        pid = worker_pid(master.pid)
        assert pid
        c = Counters()
        stop = threading.Event()
        ws_results: list = []
        threads = [
            threading.Thread(target=uploads, args=(port, stop, c)),
            threading.Thread(target=streams, args=(port, stop, c)),
            threading.Thread(target=streams, args=(port, stop, c)),
            threading.Thread(target=disconnects, args=(port, stop, c)),
            threading.Thread(target=websockets, args=(port, stop, c, ws_results)),
        ]
        wrk = subprocess.Popen(
            ["wrk", "-t1", "-c32", f"-d{int(args.duration)}s", "--latency", f"http://127.0.0.1:{port}/"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for t in threads:
            t.start()
        samples = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.duration:
            time.sleep(min(args.interval, max(0.0, args.duration - (time.monotonic() - t0))))
            if worker_pid(master.pid) != pid:
                samples.append({"t": round(time.monotonic() - t0), "error": "worker replaced"})
                break
            samples.append({"t": round(time.monotonic() - t0), "rss_kib": rss_kib(pid), "fds": fds(pid)})
            print(
                f"{samples[-1]['t']:>5}s  RSS {samples[-1]['rss_kib'] / 1024:7.1f} MiB  fds {samples[-1]['fds']:>5}",
                flush=True,
            )
        stop.set()
        for t in threads:
            t.join(60)
        wrk_out = wrk.communicate(timeout=60)[0]
        m = re.search(r"(\d+) requests in", wrk_out)
        wrk_requests = int(m.group(1)) if m else 0
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", wrk_out)
        sock_err = re.search(r"Socket errors: (.*)", wrk_out)
        # After the load: idle figures.
        time.sleep(2)
        idle = {"rss_kib": rss_kib(pid), "fds": fds(pid)}
    finally:
        master.terminate()
        try:
            master.wait(30)
        except subprocess.TimeoutExpired:
            master.kill()
    logs = log_path.read_text(errors="replace")
    error_lines = [ln for ln in logs.splitlines() if "[ERROR]" in ln or "Traceback" in ln or "[CRITICAL]" in ln]
    good = [s for s in samples if "rss_kib" in s]
    warm = [s["rss_kib"] for s in good[len(good) // 5 :]] or [0]
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "duration_s": args.duration,
        "samples": samples,
        "idle_after": idle,
        "rss_mib": {
            "first": round(good[0]["rss_kib"] / 1024, 1) if good else None,
            "after_warmup_min": round(min(warm) / 1024, 1),
            "after_warmup_max": round(max(warm) / 1024, 1),
            "last": round(good[-1]["rss_kib"] / 1024, 1) if good else None,
            "idle_after": round(idle["rss_kib"] / 1024, 1),
        },
        "fds": {"min": min(s["fds"] for s in good), "max": max(s["fds"] for s in good), "idle_after": idle["fds"]}
        if good
        else {},
        "client": {
            "ok": c.ok,
            "failed": c.bad,
            "examples": c.examples,
            "wrk_requests": wrk_requests,
            "wrk_non2xx": int(non2xx.group(1)) if non2xx else 0,
            "wrk_socket_errors": sock_err.group(1) if sock_err else "none",
            "ws_messages": sum(r["messages"] for r in ws_results),
        },
        "server_error_lines": error_lines[:50],
        "server_errors": len(error_lines),
        "worker_replaced": any("error" in s for s in samples),
    }
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = RESULTS / f"soak-{stamp}"
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    md = [
        f"Soak, {report['date']}, {args.duration:.0f} s, one Gunicorn worker (`-k skirr.RustWorker -w 1`)",
        "",
        f"* RSS: first sample {report['rss_mib']['first']} MiB; after warm-up {report['rss_mib']['after_warmup_min']}"
        f"–{report['rss_mib']['after_warmup_max']} MiB; last {report['rss_mib']['last']} MiB; "
        f"idle after {report['rss_mib']['idle_after']} MiB",
        f"* open descriptors: {report['fds'].get('min')}–{report['fds'].get('max')} under load, "
        f"{idle['fds']} idle after",
        f"* served: {wrk_requests:,} keep-alive GETs (non-2xx {report['client']['wrk_non2xx']}, socket errors "
        f"{report['client']['wrk_socket_errors']}), {c.ok.get('upload', 0):,} uploads, {c.ok.get('stream', 0):,} "
        f"streams, {report['client']['ws_messages']:,} WebSocket messages in {c.ok.get('ws_session', 0)} sessions, "
        f"{c.ok.get('disconnect', 0):,} abrupt disconnects",
        f"* client-side failures: {c.bad or 'none'}",
        f"* server error lines: {len(error_lines)}; worker replaced: {report['worker_replaced']}",
        "",
        "| t (s) | RSS MiB | fds |",
        "|---:|---:|---:|",
        *[f"| {s['t']} | {s['rss_kib'] / 1024:.1f} | {s['fds']} |" for s in good],
    ]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md[:7]))
    print(f"artifacts: {out.with_suffix('.json')} {out.with_suffix('.md')}")
    stats_ok = not error_lines and not c.bad and not report["worker_replaced"]
    return 0 if stats_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
