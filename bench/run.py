"""Skirr's benchmark matrix: every server, identical apps, same machine, same run.

    bench/run.sh                       # set up bench/.venv, then run the default matrix
    bench/.venv/bin/python bench/run.py --servers skirr,granian --workloads raw_get

Method (see bench/README.md): one worker per server, pinned to CPU 0; wrk
pinned to CPU 1; status and body verified before and after each cell; a
warm-up, then N runs; medians with min-max; p50/p99; socket errors and
non-2xx counted; PSS summed over the server's process tree; server and load
generator CPU % recorded, and a cell whose load generator saturated its core
is flagged. Writes ``bench/results/<stamp>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

try:
    from bench import quic  # imported as bench.run (bench/instructions.py)
except ImportError:
    import quic  # run as a script: bench/ is sys.path[0]

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
CLK = os.sysconf("SC_CLK_TCK")
SERVER_CPU = os.environ.get("BENCH_SERVER_CPU", "0")
CLIENT_CPU = os.environ.get("BENCH_CLIENT_CPU", "1")
# `--workers N` (N > 1): every server with N worker processes, servers and
# load generator sharing every CPU (unless BENCH_*_CPU say otherwise).
WORKERS = 1
# `--skirr-python`: the interpreter of the `skirr` server (another build of
# Skirr, e.g. a branch's test venv); None: the bench venv's.
SKIRR_PY: str | None = None


@dataclass(frozen=True)
class Workload:
    name: str
    app: str  # module:attr for ASGI servers
    path: str  # request path
    method: str = "GET"
    body_size: int = 0
    expect_body: bytes | None = None
    expect_len: int | None = None
    hyper_path: str | None = None  # route on the pure-hyper ceiling, None = not applicable
    proto: str = "h1"  # "h2": HTTP/2 over cleartext with prior knowledge, driven by h2load; "h3": by h3load


WORKLOADS = {
    w.name: w
    for w in [
        Workload("raw_get", "bench.apps:raw_get", "/", expect_body=b"Hello, world!", hyper_path="/"),
        Workload("get_64k", "bench.apps:get_64k", "/", expect_len=65536, hyper_path="/64k"),
        Workload("post_4k", "bench.apps:post_4k", "/", "POST", 4096, expect_body=b"4096", hyper_path="/"),
        Workload("fastapi_json", "bench.fastapi_app:app", "/", expect_body=b'{"message":"Hello, world!"}'),
        Workload("h2_raw_get", "bench.apps:raw_get", "/", expect_body=b"Hello, world!", hyper_path="/", proto="h2"),
        Workload(
            "h2_post_4k", "bench.apps:post_4k", "/", "POST", 4096, expect_body=b"4096", hyper_path="/", proto="h2"
        ),
        Workload("h3_raw_get", "bench.apps:raw_get", "/", expect_body=b"Hello, world!", proto="h3"),
        Workload("h3_post_4k", "bench.apps:post_4k", "/", "POST", 4096, expect_body=b"4096", proto="h3"),
    ]
}

# Fixed offered load (`--fixed`): total req/s per workload, below the
# saturation of every leader on this machine, so that CPU per request is
# compared at the same load. `--fixed-rate` overrides it for every workload.
FIXED_RATE = {"raw_get": 25600, "post_4k": 19200, "get_64k": 12800, "fastapi_json": 3200}

# {bin}: the bench venv's bin; {py}: its python; {app}; {port}; {root}: repo root.
SERVERS = {
    "skirr": "{py} -m skirr {app} --port {port} --no-access-log --lifespan off",
    "skirr-gunicorn": "{bin}/gunicorn -k skirr.RustWorker -w 1 -b 127.0.0.1:{port} --log-level warning {app}",
    # Gunicorn's reuse_port: SO_REUSEPORT on the master's one listening
    # socket (every worker still accepts from that same socket).
    "skirr-gunicorn-reuseport": "{bin}/gunicorn -k skirr.RustWorker -w 1 -b 127.0.0.1:{port} --reuse-port "
    "--log-level warning {app}",
    "peregrine": "{bin}/peregrine --port {port} --workers 1 {app}",
    "weft": "{bin}/weft --port {port} --workers 1 --lifespan off --log-level warning {app}",
    "granian": "{bin}/granian --interface asgi --workers 1 --port {port} --no-ws --loop uvloop "
    "--log-level warning {app}",
    "uvicorn": "{bin}/uvicorn {app} --port {port} --no-access-log --lifespan off --loop uvloop "
    "--http httptools --log-level warning",
    "uvicorn-worker": "{bin}/gunicorn -k uvicorn_worker.UvicornWorker -w 1 -b 127.0.0.1:{port} "
    "--log-level warning {app}",
    "gunicorn-asgi": "{bin}/gunicorn -k asgi -w 1 -b 127.0.0.1:{port} --log-level warning {app}",
    "hypercorn": "{bin}/hypercorn -w 1 -b 127.0.0.1:{port} --log-level warning {app}",
    "rustwasgi": "{bin}/gunicorn -k rustwasgi.gunicorn.RustWASGIWorker -w 1 -b 127.0.0.1:{port} "
    "--log-level warning {app}",
    "hyper": "{root}/target/release/hyper-hello {port}",
    # Issue 22's one-thread mode (not in DEFAULT_SERVERS): `loop_mode single`.
    "skirr-single": "{py} -m skirr {app} --port {port} --no-access-log --lifespan off --loop-mode single",
    "skirr-gunicorn-single": "{bin}/gunicorn -k skirr.RustWorker -w 1 -b 127.0.0.1:{port} --log-level warning {app}",
    # `loop_mode dual` on asyncio's own loop (what `single` runs on), for
    # the two modes compared on one loop.
    "skirr-asyncio": "{py} -m skirr {app} --port {port} --no-access-log --lifespan off --loop-mode dual --loop asyncio",
}

# Environment a server entry needs beyond its command line.
SERVER_ENV = {"skirr-gunicorn-single": {"SKIRR_LOOP_MODE": "single"}}

# What each server needs to serve HTTP/2 over cleartext with prior knowledge
# (h2c) on the port it also serves HTTP/1.1 on: appended to its command line
# ("" = it does so as configured above). A server missing here does not serve
# h2c; its HTTP/2 cells say why.
H2 = {
    "skirr": " --http2",
    "skirr-single": " --http2",
    "skirr-asyncio": " --http2",
    "skirr-gunicorn": " --http-protocols h2,h1 --http2-cleartext prior-knowledge",
    "gunicorn-asgi": " --http-protocols h2,h1 --http2-cleartext prior-knowledge",
    "granian": "",  # --http auto (the default): HTTP/2 preface or HTTP/1.1
    "hypercorn": "",  # h2c prior knowledge on plain TCP by default
    "peregrine": "",  # HTTP/2 on unless --no-http2; h2c prior knowledge on plain TCP
    "weft": "",  # likewise
    "uvicorn": " --http zttp --http2",  # HTTP/2 needs zttp's parser (the h1 cells use httptools)
    "hyper": " --h2",  # hyper-util's auto builder
}
NO_H2 = {
    "uvicorn-worker": "no HTTP/2 setting in uvicorn-worker 0.4 (it never passes uvicorn's http2)",
    "rustwasgi": "HTTP/1.1 only: rustwasgi 0.1.4 drops the HTTP/2 preface, answers Upgrade: h2c as HTTP/1.1",
}

DEFAULT_SERVERS = (
    "hyper,skirr,skirr-gunicorn,peregrine,weft,granian,uvicorn,uvicorn-worker,gunicorn-asgi,hypercorn,rustwasgi"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_pids(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return pids


def tree_cpu(pid: int) -> dict:
    """On-CPU time of every thread of the server's process tree: a snapshot
    of ``/proc/<pid>/task/<tid>/schedstat`` (field 1, ``sum_exec_runtime``,
    nanoseconds, exact rather than sampled per tick) per thread, and the tick
    count of ``/proc/<pid>/stat`` utime+stime summed over the processes
    (which also keeps threads that exited), as a cross-check."""
    tasks, ticks = {}, 0
    for p in tree_pids(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/schedstat") as f:
                    tasks[(p, int(tid))] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return {"tasks": tasks, "ticks": ticks, "t": time.monotonic()}


def cpu_delta(before: dict, after: dict, done: int) -> dict:
    """Server CPU between two `tree_cpu` snapshots: total µs, % of one core,
    and µs per completed request (or message). A thread that exited between
    the snapshots took its time with it; ``exited_threads`` counts them and
    ``cpu_us_ticks`` (utime+stime, 1/CLK_TCK resolution) is the check."""
    ns = sum(v - before["tasks"].get(k, 0) for k, v in after["tasks"].items())
    wall = after["t"] - before["t"]
    ticks_us = (after["ticks"] - before["ticks"]) * 1e6 / CLK
    return {
        "server_cpu_us": ns / 1000,
        "server_cpu_pct": 100.0 * ns / 1e9 / wall if wall > 0 else 0.0,
        "cpu_us_per_req": ns / 1000 / done if done else None,
        "cpu_us_ticks": ticks_us,
        "threads": len(after["tasks"]),
        "exited_threads": sum(1 for k in before["tasks"] if k not in after["tasks"]),
    }


def machine_busy() -> dict:
    """Busy ticks per CPU from /proc/stat (user+nice+system+irq+softirq+steal)."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu"):
                break
            name, *vals = line.split()
            v = [int(x) for x in vals[:8]]
            out[name] = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7], sum(v))
    return out


def other_load(before: dict, after: dict, server_pct: float, client_pct: float) -> dict:
    """What else ran on the machine during a run: busy % of each CPU, and
    the busy time (in % of one core) not spent by the server or the load
    generator — other users' processes, kernel threads, softirq work."""
    pct = {}
    for name in after:
        busy = after[name][0] - before.get(name, (0, 0))[0]
        total = after[name][1] - before.get(name, (0, 0))[1]
        pct[name] = 100.0 * busy / total if total else 0.0
    ncpu = max(1, len(after) - 1)
    return {
        "cpu_busy_pct": {k: round(v, 1) for k, v in pct.items() if k != "cpu"},
        "other_cpu_pct": round(pct.get("cpu", 0.0) * ncpu - server_pct - client_pct, 1),
    }


def tree_pss_kib(pid: int) -> int:
    total = 0
    for p in tree_pids(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def proc_mem_kib(pid: int) -> dict:
    """PSS, USS (private clean + dirty) and anonymous PSS of one process, KiB."""
    out = {"pid": pid, "pss": 0, "uss": 0, "pss_anon": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                k, v = line.split()[:2]
                if k == "Pss:":
                    out["pss"] = int(v)
                elif k in ("Private_Clean:", "Private_Dirty:"):
                    out["uss"] += int(v)
                elif k == "Pss_Anon:":
                    out["pss_anon"] = int(v)
        out["threads"] = len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        pass
    return out


def tree_mem_kib(pid: int) -> dict:
    """`proc_mem_kib` of each process of the tree (the first is the one
    started: Gunicorn's master) and their sums."""
    procs = [proc_mem_kib(p) for p in tree_pids(pid)]
    return {
        "pss": sum(p["pss"] for p in procs),
        "uss": sum(p["uss"] for p in procs),
        "procs": procs,
    }


def serve_some(port: int, conns: int = 20, per_conn: int = 100) -> int:
    """`conns` keep-alive connections, one after the other, each making
    `per_conn` sequential `GET /`; the responses answered."""
    req = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    done = 0
    for _ in range(conns):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            for _ in range(per_conn):
                s.sendall(req)
                buf = b""
                while b"Hello, world!" not in buf:
                    chunk = s.recv(4096)
                    if not chunk:
                        return done
                    buf += chunk
                done += 1
    return done


def one_request(port: int, w: Workload, timeout: float = 5.0) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        body = b"x" * w.body_size if w.method == "POST" else None
        path = w.path
        c.request(w.method, path, body=body)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def one_h2_request(port: int, w: Workload, timeout: float = 5.0) -> tuple[int, bytes]:
    """One request over HTTP/2 with prior knowledge (curl, built with nghttp2)."""
    args = ["curl", "-s", "--http2-prior-knowledge", "-m", str(timeout), "-o", "-"]
    args += ["-w", "\n%{http_code} %{http_version}"]
    if w.method == "POST":
        args += ["--data-binary", f"@{post_body_file()}", "-H", "content-type: application/octet-stream"]
    out = subprocess.run([*args, f"http://127.0.0.1:{port}{w.path}"], capture_output=True, timeout=timeout + 2)
    body, _, tail = out.stdout.rpartition(b"\n")
    code, _, version = tail.decode(errors="replace").partition(" ")
    if out.returncode != 0:
        raise OSError(f"curl exit {out.returncode}")
    if version != "2":
        raise OSError(f"served as HTTP/{version}, not HTTP/2")
    return int(code), body


def verify(port: int, w: Workload) -> str | None:
    if w.proto == "h3":
        return quic.verify_h3(port, w)
    try:
        status, body = (one_h2_request if w.proto == "h2" else one_request)(port, w)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return f"request failed: {e}"
    if status != 200:
        return f"status {status}"
    if w.expect_body is not None and body.replace(b" ", b"") != w.expect_body.replace(b" ", b""):
        return f"unexpected body {body[:60]!r}"
    if w.expect_len is not None and len(body) != w.expect_len:
        return f"body length {len(body)}"
    return None


WRK_RE = {
    "rps": re.compile(r"Requests/sec:\s+([\d.]+)"),
    "p50": re.compile(r"\s50%\s+([\d.]+)(us|ms|s)"),
    "p99": re.compile(r"\s99%\s+([\d.]+)(us|ms|s)"),
    "socket": re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)"),
    "non2xx": re.compile(r"Non-2xx or 3xx responses: (\d+)"),
    "requests": re.compile(r"(\d+) requests in"),
}


def _ms(m) -> float | None:
    if not m:
        return None
    v, unit = float(m.group(1)), m.group(2)
    return v / 1000 if unit == "us" else v * 1000 if unit == "s" else v


def run_wrk(url: str, w: Workload, conns: int, duration: float) -> dict:
    args = ["taskset", "-c", CLIENT_CPU, "wrk", "-t1", f"-c{conns}", f"-d{max(1, round(duration))}s", "--latency"]
    if w.method == "POST":
        args += ["-s", str(BENCH / "post4k.lua")]
    args.append(url)
    t0 = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    sock = WRK_RE["socket"].search(out)
    non2xx = WRK_RE["non2xx"].search(out)
    rps = WRK_RE["rps"].search(out)
    return {
        "rps": float(rps.group(1)) if rps else 0.0,
        "requests": int(WRK_RE["requests"].search(out).group(1)) if WRK_RE["requests"].search(out) else 0,
        "p50_ms": _ms(WRK_RE["p50"].search(out)),
        "p99_ms": _ms(WRK_RE["p99"].search(out)),
        "socket_errors": sum(int(x) for x in sock.groups()) if sock else 0,
        "non2xx": int(non2xx.group(1)) if non2xx else 0,
        "client_cpu_pct": 100.0 * (ru.ru_utime + ru.ru_stime) / wall,
        "raw": out,
    }


H2LOAD_RE = {
    "rps": re.compile(r"finished in [\d.]+\w*, ([\d.]+) req/s"),
    "requests": re.compile(
        r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, "
        r"(\d+) timeout"
    ),
    "status": re.compile(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx"),
    "proto": re.compile(r"Application protocol: (\S+)"),
}


def post_body_file() -> Path:
    path = Path(f"/tmp/skirr-bench-post4k-{os.getpid()}.bin")
    if not path.exists():
        path.write_bytes(b"x" * 4096)
    return path


def run_h2load(
    url: str, w: Workload, conns: int, duration: float, streams: int = 1, h1: bool = False, rps: float = 0
) -> dict:
    """One timed h2load run. HTTP/2 over cleartext with prior knowledge
    (h2load's default for http://), or HTTP/1.1 keep-alive with ``h1``.
    ``rps`` > 0 offers that many requests per second *per connection*
    (h2load's ``--rps``): a fixed offered load rather than a closed loop.
    p50/p99 come from h2load's per-request log (``--log-file``)."""
    log = Path(f"/tmp/skirr-bench-h2load-{os.getpid()}.log")
    log.unlink(missing_ok=True)
    args = ["taskset", "-c", CLIENT_CPU, "h2load", "-t1", f"-c{conns}", f"-m{streams}"]
    args += [f"-D{max(1, round(duration))}", f"--log-file={log}"]
    if h1:
        args.append("--h1")
    if rps:
        args.append(f"--rps={rps:g}")
    if w.method == "POST":
        args += ["-d", str(post_body_file())]
    args.append(url)
    t0 = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    req = H2LOAD_RE["requests"].search(out)
    st = H2LOAD_RE["status"].search(out)
    rate = H2LOAD_RE["rps"].search(out)
    proto = H2LOAD_RE["proto"].search(out)
    lat = []
    try:
        with open(log) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    lat.append(int(parts[2]) / 1000.0)
    except OSError:
        pass
    log.unlink(missing_ok=True)
    lat.sort()

    def pct(q: float) -> float | None:
        return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None

    # h2load: "failed" includes HTTP-level failures; "errored" is its subset
    # of network-level ones (connection errors, RST_STREAM). Responses
    # received = succeeded + failed - errored.
    succeeded, failed, errored, timeouts = (int(req.group(i)) for i in (4, 5, 6, 7)) if req else (0, 0, 0, 0)
    responses = succeeded + failed - errored
    statuses = [int(x) for x in st.groups()] if st else [0, 0, 0, 0]
    return {
        "rps": float(rate.group(1)) if rate else 0.0,
        "requests": responses,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "socket_errors": errored,
        "timeouts": timeouts,
        "non2xx": statuses[2] + statuses[3],
        # Responses whose status h2load did not record: its HTTP/1.1 parser
        # (nghttp2 1.52) reports none for a status line with an empty reason
        # phrase (hypercorn's "HTTP/1.1 200 "); run.py's own checks before and
        # after the cell read those as 200.
        "no_status": max(0, responses - sum(statuses)),
        "protocol": proto.group(1) if proto else None,
        "offered_rps": rps * conns if rps else None,
        "client_cpu_pct": 100.0 * (ru.ru_utime + ru.ru_stime) / wall,
        "raw": out,
    }


@dataclass
class Cell:
    server: str
    workload: str
    connections: int
    # "wrk" closed loop, "fixed" h2load --h1 --rps, "h2" h2load -m streams,
    # "h3" h3load -m streams, "h3fixed" h3load --rate
    load: str = "wrk"
    streams: int = 1
    offered_rps: float | None = None
    runs: list = field(default_factory=list)
    verify_before: str | None = None
    verify_after: str | None = None
    pss_idle_kib: int | None = None
    pss_load_kib: int | None = None
    error: str | None = None


def with_workers(name: str, tmpl: str, n: int) -> str | None:
    """The server's command line with ``n`` worker processes, or None when
    it has no such option (one process: `python -m skirr`, pure hyper)."""
    if n == 1:
        return tmpl
    if name in ("skirr", "hyper"):
        return None
    if name == "uvicorn":
        return tmpl + f" --workers {n}"
    for one in (" -w 1 ", " --workers 1 "):
        if one in tmpl:
            return tmpl.replace(one, one.replace("1", str(n)), 1)
    return None


def start_server(
    name: str, w: Workload, port: int, venv: Path, websockets: bool = False, extra: str = "", env: dict | None = None
) -> subprocess.Popen:
    tmpl = with_workers(name, SERVERS[name], WORKERS)
    if tmpl is None:
        raise ValueError(f"{name} has no worker-count option")
    if extra:
        tmpl = tmpl.replace(" {app}", extra + " {app}", 1) if "gunicorn" in tmpl else tmpl + extra
    if websockets:
        tmpl = tmpl.replace(" --no-ws", "")
    app = w.app
    py = SKIRR_PY if name in ("skirr", "skirr-single", "skirr-asyncio") and SKIRR_PY else venv / "bin" / "python"
    cmd = tmpl.format(py=py, bin=venv / "bin", app=app, port=port, root=ROOT)
    env = dict(os.environ, PYTHONPATH=str(ROOT), **SERVER_ENV.get(name, {}), **(env or {}))
    return subprocess.Popen(
        ["taskset", "-c", SERVER_CPU, *shlex.split(cmd)],
        cwd=str(ROOT),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def stop_server(proc: subprocess.Popen) -> None:
    """Stops the server and every process it started (some peers fork
    workers into their own sessions, out of reach of a group kill)."""
    pids = tree_pids(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in reversed(pids):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            proc.wait(10 if sig == signal.SIGTERM else None)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids[1:]):
            time.sleep(0.05)
        if not any(os.path.exists(f"/proc/{p}") for p in pids[1:]):
            return


def one_load(url: str, w: Workload, cell: Cell, duration: float) -> dict:
    if cell.load in ("h3", "h3fixed"):
        port = urlsplit(url).port or 0
        return quic.run_h3load(port, w, cell.connections, cell.streams, duration, CLIENT_CPU, cell.offered_rps or 0)
    if cell.load == "wrk":
        return run_wrk(url, w, cell.connections, duration)
    if cell.load == "fixed":
        per_conn = (cell.offered_rps or 0) / cell.connections
        return run_h2load(url, w, cell.connections, duration, h1=True, rps=per_conn)
    return run_h2load(url, w, cell.connections, duration, streams=cell.streams)


def plan_loads(w: Workload, conns: list[int], fixed: dict, args) -> list[Cell]:
    """The load runs of one (server, workload): they share one server start."""
    if w.proto == "h2":
        return [Cell("", w.name, args.h2_connections, load="h2", streams=args.h2_streams)]
    if w.proto == "h3":
        cells = [Cell("", w.name, args.h3_connections, load="h3", streams=args.h3_streams)]
        if args.h3_rate:
            cells.append(
                Cell("", w.name, args.h3_connections, "h3fixed", streams=args.h3_streams, offered_rps=args.h3_rate)
            )
        return cells
    cells = [Cell("", w.name, c) for c in conns]
    if w.name in fixed:
        cells.append(Cell("", w.name, args.fixed_connections, load="fixed", offered_rps=fixed[w.name]))
    return cells


@dataclass
class Running:
    """One server started for one workload, with the cells it is measured in."""

    name: str
    w: Workload
    cells: list
    port: int = 0
    proc: subprocess.Popen | None = None
    failed: bool = False

    def fail(self, msg: str) -> None:
        self.failed = True
        for cell in self.cells:
            if not cell.runs and not cell.error:
                cell.error = msg


def socket_owners(port: int, state: str) -> tuple[int, dict[int, int]]:
    """The TCP sockets on local ``port`` in ``state`` (``established`` or
    ``listening``): how many there are, and how many each process holds,
    from ``ss -p`` (root sees every process; a socket shared by several
    processes counts once in the total and for each of them)."""
    out = subprocess.run(["ss", "-Htnp", "state", state, f"( sport = :{port} )"], capture_output=True, text=True).stdout
    owners: dict[int, int] = {}
    for line in out.splitlines():
        for pid in set(int(x) for x in re.findall(r"pid=(\d+)", line)):
            owners[pid] = owners.get(pid, 0) + 1
    return len(out.splitlines()), owners


def spread(before: dict, after: dict, conns: dict[int, int], listening: int) -> dict:
    """How a multi-worker server shared one run: each process's share of
    the CPU time (%, largest first, processes under 1 % left out), the
    client connections each worker held mid-run, and how many listening
    sockets the port has (1: the workers share one socket, as Gunicorn's
    do; N: one per worker, SO_REUSEPORT, which the kernel balances by a
    hash of each connection's addresses)."""
    per: dict[int, int] = {}
    for (pid, tid), v in after["tasks"].items():
        per[pid] = per.get(pid, 0) + v - before["tasks"].get((pid, tid), 0)
    total = sum(per.values()) or 1
    shares = sorted((100.0 * v / total for v in per.values()), reverse=True)
    return {
        "cpu_share_pct": [round(x, 1) for x in shares if x >= 1.0],
        "conns_per_worker": sorted(conns.values(), reverse=True),
        "listening_sockets": listening,
    }


def one_run(r: Running, cell: Cell, args) -> None:
    url = f"http://127.0.0.1:{r.port}{r.w.path}"
    busy0, before = machine_busy(), tree_cpu(r.proc.pid)
    sampled: dict[str, dict] = {}
    timer = None
    if WORKERS > 1:
        # Mid-run: which worker holds which client connection.
        timer = threading.Timer(
            args.duration / 2, lambda: sampled.update(conns=socket_owners(r.port, "established")[1])
        )
        timer.start()
    res = one_load(url, r.w, cell, args.duration)
    after = tree_cpu(r.proc.pid)
    res.update(cpu_delta(before, after, res["requests"]))
    if timer is not None:
        timer.join()
        res["spread"] = spread(before, after, sampled.get("conns", {}), socket_owners(r.port, "listening")[0])
    res.update(other_load(busy0, machine_busy(), res["server_cpu_pct"], res["client_cpu_pct"]))
    res["client_saturated"] = res["client_cpu_pct"] >= 95.0
    if cell.load in ("fixed", "h3fixed"):
        res["server_saturated"] = res["rps"] < 0.97 * (cell.offered_rps or 0)
    if not args.keep_raw:
        res.pop("raw")
    cell.runs.append(res)


def check_cell(r: Running, cell: Cell) -> None:
    cell.pss_load_kib = tree_pss_kib(r.proc.pid)
    if cell.load == "h2" and any(x.get("protocol") != "h2c" for x in cell.runs):
        protos = sorted({str(x.get("protocol")) for x in cell.runs})
        cell.error = f"not served as h2c (h2load negotiated {', '.join(protos)})"
    if cell.runs and not any(x["requests"] for x in cell.runs):
        cell.error = "no request completed"
    elif any(x.get("no_status") for x in cell.runs):
        n = sum(x.get("no_status", 0) for x in cell.runs)
        cell.error = f"h2load read no status from {n:,} responses (empty reason phrase), counted as completed"
    cell.verify_after = verify(r.port, r.w)
    if cell.verify_after:
        cell.error = f"verification after load failed: {cell.verify_after}"
        r.fail("server failed in an earlier load of the same start")
    elif r.proc.poll() is not None:
        r.fail("server exited")


def measure_workload(w: Workload, servers: list[str], plan, args, venv: Path) -> list[Cell]:
    """Every server of one workload, interleaved: all are started (each pinned
    to the server CPU; idle ones cost next to nothing), then for each kind of
    load, run k of every server follows run k-1 of every server (the order
    rotating each round), so that a burst of other load on the machine hits
    one run of several servers rather than every run of one."""
    running: list[Running] = []
    out: list[Cell] = []
    for name in servers:
        cells = plan()
        for cell in cells:
            cell.server = name
        out += cells
        if w.proto == "h2" and name not in H2:
            for cell in cells:
                cell.error = NO_H2.get(name, f"{name} is not configured for h2c (see H2 in run.py)")
            continue
        if w.proto == "h3" and name not in quic.H3:
            for cell in cells:
                cell.error = quic.NO_H3.get(name, f"{name} is not configured for HTTP/3 (see H3 in bench/quic.py)")
            continue
        wn = w
        if name == "hyper":
            if w.hyper_path is None:
                for cell in cells:
                    cell.error = "not applicable"
                continue
            wn = Workload(w.name, "", w.hyper_path, w.method, w.body_size, w.expect_body, w.expect_len, proto=w.proto)
        running.append(Running(name, wn, cells))
    try:
        for r in running:
            r.port = free_port()
            extra = H2[r.name] if w.proto == "h2" else quic.h3_extra(r.name, r.port) if w.proto == "h3" else ""
            env = quic.H3_ENV.get(r.name) if w.proto == "h3" else None
            r.proc = start_server(r.name, r.w, r.port, venv, extra=extra, env=env)
        for r in running:
            if not wait_ready(r.port, r.proc):
                err = r.proc.stderr.read().decode(errors="replace")[-500:] if r.proc.poll() is not None else ""
                r.fail(f"did not start {err}".strip())
                continue
            # Let the server finish booting (lifespan, worker fork) before measuring.
            for _ in range(50):
                if verify(r.port, r.w) is None:
                    break
                time.sleep(0.1)
        nloads = max((len(r.cells) for r in running), default=0)
        for i in range(nloads):
            active = []
            for r in running:
                if r.failed:
                    continue
                cell = r.cells[i]
                cell.verify_before = verify(r.port, r.w)
                if cell.verify_before:
                    cell.error = f"verification failed: {cell.verify_before}"
                    continue
                cell.pss_idle_kib = tree_pss_kib(r.proc.pid)
                active.append(r)
            for k in range(args.runs):
                shift = k % len(active) if active else 0
                for r in active[shift:] + active[:shift]:
                    if r.failed:
                        continue
                    cell = r.cells[i]
                    if k == 0:
                        one_load(f"http://127.0.0.1:{r.port}{r.w.path}", r.w, cell, args.warmup)
                    one_run(r, cell, args)
                    if r.proc.poll() is not None:
                        r.fail("server exited")
            for r in active:
                if not r.failed:
                    check_cell(r, r.cells[i])
        return out
    finally:
        for r in running:
            if r.proc is not None:
                stop_server(r.proc)


def stream_first_byte(name: str, venv: Path, samples: int = 20) -> dict | None:
    """Streaming: app sends a first chunk, sleeps 50 ms, sends the last one."""
    if name == "hyper":
        return None
    w = Workload("stream", "bench.apps:stream", "/")
    port = free_port()
    proc = start_server(name, w, port, venv)
    try:
        if not wait_ready(port, proc):
            return {"error": "did not start"}
        for _ in range(50):
            try:
                if one_request(port, w)[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        first, total = [], []
        for _ in range(samples):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                t0 = time.perf_counter()
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                buf = b""
                while b"first" not in buf:
                    buf += s.recv(65536)
                t1 = time.perf_counter()
                while True:
                    d = s.recv(65536)
                    if not d:
                        break
                    buf += d
                t2 = time.perf_counter()
            if b"last" not in buf:
                return {"error": "incomplete stream"}
            first.append((t1 - t0) * 1000)
            total.append((t2 - t0) * 1000)
        return {"first_byte_ms": statistics.median(first), "total_ms": statistics.median(total)}
    finally:
        stop_server(proc)


def measure_ws(name: str, conns: int, args, venv: Path) -> dict:
    """ws_echo: messages per second through a WebSocket echo, driven by the
    compiled client (`bench/loadgen ws`) on the load-generator CPU."""
    if name == "hyper":
        return {"server": name, "connections": conns, "error": "not applicable"}
    w = Workload("ws_echo", "bench.apps:ws_echo", "/", expect_body=b"ws")
    port = free_port()
    proc = start_server(name, w, port, venv, websockets=True)
    out = {"server": name, "connections": conns, "runs": []}
    try:
        if not wait_ready(port, proc):
            out["error"] = "did not start"
            return out
        for _ in range(50):
            if verify(port, w) is None:
                break
            time.sleep(0.1)
        url = f"ws://127.0.0.1:{port}/"
        cmd = ["taskset", "-c", CLIENT_CPU, str(ROOT / "target/release/loadgen"), "ws", url, str(conns)]
        subprocess.run([*cmd, "1"], capture_output=True, text=True)
        for _ in range(args.runs):
            busy0, before = machine_busy(), tree_cpu(proc.pid)
            p = subprocess.run([*cmd, str(round(args.duration))], capture_output=True, text=True)
            after = tree_cpu(proc.pid)
            busy1 = machine_busy()
            try:
                r = json.loads(p.stdout)
            except ValueError:
                out["error"] = (p.stdout + p.stderr)[-300:]
                return out
            r.update(cpu_delta(before, after, r["messages"]))
            r.update(other_load(busy0, busy1, r["server_cpu_pct"], 0.0))
            out["runs"].append(r)
        out["pss_kib"] = tree_pss_kib(proc.pid)
        mps = [r["mps"] for r in out["runs"]]
        out["mps_median"], out["mps_min"], out["mps_max"] = statistics.median(mps), min(mps), max(mps)
        out["p99_ms"] = statistics.median(r["p99_ms"] for r in out["runs"])
        out["errors"] = sum(r["errors"] for r in out["runs"])
        out["cpu_us_per_msg"] = median_of(out["runs"], "cpu_us_per_req")
        if any(r["messages"] == 0 for r in out["runs"]):
            out["error"] = "no messages echoed"
        return out
    finally:
        stop_server(proc)


# What each server needs to hold idle keep-alive connections for the whole
# measurement (about 10 s from the first connection): a keep-alive timeout
# of 30 s, and Gunicorn's workers more than `worker_connections` (1,000)
# connections. Without it a server whose keep-alive is 5 s (Skirr's
# default, uvicorn's, hypercorn's) closes them while PSS is read, and the
# lowest PSS kept is that of fewer connections: the first "+22.6 MiB
# standalone vs +42.5 MiB under Gunicorn" (bench/NOTES.md, entry 41).
# Servers without such an option here: the table's `held` column says how
# many connections were still open when PSS was read.
IDLE_EXTRA = {
    "skirr": " --keepalive-timeout 30",
    "skirr-gunicorn": " --worker-connections 20000 --keep-alive 30",
    "skirr-gunicorn-reuseport": " --worker-connections 20000 --keep-alive 30",
    "skirr-single": " --keepalive-timeout 30",
    "skirr-asyncio": " --keepalive-timeout 30",
    "skirr-gunicorn-single": " --worker-connections 20000 --keep-alive 30",
    "uvicorn": " --timeout-keep-alive 30",
    "uvicorn-worker": " --worker-connections 20000 --keep-alive 30",
    "gunicorn-asgi": " --worker-connections 20000 --keep-alive 30",
    "rustwasgi": " --worker-connections 20000 --keep-alive 30",
    "hypercorn": " --keep-alive 30",
}


def still_open(socks: list) -> int:
    """How many of the client's sockets the server has not closed (no end
    of stream, no error, nothing unread beyond the one response)."""
    n = 0
    for s in socks:
        s.setblocking(False)
        try:
            if s.recv(1, socket.MSG_PEEK) == b"":
                continue
        except BlockingIOError:
            n += 1
            continue
        except OSError:
            continue
        n += 1
    return n


def measure_idle(name: str, n: int, venv: Path) -> dict:
    """PSS of the server's process tree with `n` idle keep-alive connections
    (each has made one request), minus PSS before they were opened."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 1000), hard))
    w = WORKLOADS["raw_get"]
    if name == "hyper":
        w = Workload(w.name, "", "/", expect_body=w.expect_body)
    port = free_port()
    proc = start_server(name, w, port, venv, extra=IDLE_EXTRA.get(name, ""))
    out = {"server": name, "connections": n}
    socks = []
    try:
        if not wait_ready(port, proc):
            out["error"] = "did not start"
            return out
        for _ in range(50):
            if verify(port, w) is None:
                break
            time.sleep(0.1)
        # Right after boot (one request: the readiness check) and after
        # 2,000 keep-alive requests on 20 connections, each closed; 1 s to
        # settle after each (allocators' decay, parked connections).
        time.sleep(1.0)
        out["boot"] = tree_mem_kib(proc.pid)
        out["served"] = serve_some(port)
        time.sleep(1.0)
        out["after_requests"] = tree_mem_kib(proc.pid)
        before = tree_pss_kib(proc.pid)
        req = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(req)
            socks.append(s)
        got = 0
        for s in socks:
            if b"Hello, world!" in s.recv(4096):
                got += 1
        # Servers free per-connection buffers at their own pace (Skirr parks
        # a connection after 250 ms idle): the lowest PSS over 5 s is kept.
        after = tree_pss_kib(proc.pid)
        for _ in range(10):
            time.sleep(0.5)
            after = min(after, tree_pss_kib(proc.pid))
        out["with_connections"] = tree_mem_kib(proc.pid)
        out.update(
            pss_before_kib=before,
            pss_after_kib=after,
            kib_per_connection=(after - before) / n,
            answered=got,
            held=still_open(socks),
            delta_mib=(after - before) / 1024.0,
            alive=proc.poll() is None,
        )
        return out
    except OSError as e:
        out["error"] = f"{type(e).__name__}: {e} after {len(socks)} connections"
        return out
    finally:
        for s in socks:
            s.close()
        stop_server(proc)


def measure_idle_h3(name: str, n: int, venv: Path) -> dict:
    """PSS of the server's process tree with `n` idle HTTP/3 connections
    (each has made one GET; the client PINGs every second so that QUIC's
    idle timeout does not close them), minus PSS before they were opened.
    Same keep-alive options as the TCP idle figure (IDLE_EXTRA)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 100:  # h3load: one UDP socket per connection
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 1000), hard))
    out = {"server": name, "connections": n}
    if name not in quic.H3:
        return {**out, "error": quic.NO_H3.get(name, "not configured for HTTP/3")}
    w = WORKLOADS["h3_raw_get"]
    port = free_port()
    extra = quic.h3_extra(name, port) + IDLE_EXTRA.get(name, "")
    proc = start_server(name, w, port, venv, extra=extra, env=quic.H3_ENV.get(name))
    client = None
    try:
        if not wait_ready(port, proc):
            return {**out, "error": "did not start"}
        for _ in range(50):
            if verify(port, w) is None:
                break
            time.sleep(0.1)
        before = tree_pss_kib(proc.pid)
        client, first = quic.hold_idle(port, n, hold=8.0)
        # As for TCP: the lowest PSS over 5 s once every connection answered.
        after = tree_pss_kib(proc.pid)
        for _ in range(10):
            time.sleep(0.5)
            after = min(after, tree_pss_kib(proc.pid))
        last = client.communicate(timeout=60)[0].strip().splitlines()
        held = json.loads(last[-1]).get("held") if last and last[-1].startswith('{"held"') else None
        out.update(
            pss_before_kib=before,
            pss_after_kib=after,
            answered=first.get("requests", 0),
            held=held,
            delta_mib=(after - before) / 1024.0,
            alive=proc.poll() is None,
        )
        if first.get("first_error"):
            out["first_error"] = first["first_error"]
        return out
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return {**out, "error": f"{type(e).__name__}: {e}"}
    finally:
        if client is not None and client.poll() is None:
            client.kill()
            client.wait()
        stop_server(proc)


def median_of(runs: list, key: str) -> float | None:
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def summarize(cell: Cell) -> dict:
    d = {k: v for k, v in cell.__dict__.items() if k != "runs"}
    d["runs"] = cell.runs
    if cell.runs:
        cpu = [r["cpu_us_per_req"] for r in cell.runs if r.get("cpu_us_per_req") is not None]
        d["cpu_us_per_req"] = statistics.median(cpu) if cpu else None
        d["cpu_us_per_req_min"] = min(cpu) if cpu else None
        d["cpu_us_per_req_max"] = max(cpu) if cpu else None
        d["server_saturated"] = any(r.get("server_saturated") for r in cell.runs)
        rps = [r["rps"] for r in cell.runs]
        d["rps_median"] = statistics.median(rps)
        d["rps_min"], d["rps_max"] = min(rps), max(rps)
        for key in ("p50_ms", "p99_ms"):
            vals = [r[key] for r in cell.runs if r[key] is not None]
            d[key] = statistics.median(vals) if vals else float("nan")
        d["errors"] = sum(r["socket_errors"] for r in cell.runs)
        d["non2xx"] = sum(r["non2xx"] for r in cell.runs)
        d["server_cpu_pct"] = statistics.median(r["server_cpu_pct"] for r in cell.runs)
        d["client_cpu_pct"] = statistics.median(r["client_cpu_pct"] for r in cell.runs)
        d["client_saturated"] = any(r["client_saturated"] for r in cell.runs)
        d["other_cpu_pct"] = median_of(cell.runs, "other_cpu_pct")
    return d


def versions(venv: Path) -> dict:
    code = (
        "import importlib.metadata as m, json\n"
        "out = {}\n"
        "for p in ['skirr','granian','uvicorn','uvicorn-worker','gunicorn','hypercorn','peregrine-server',"
        "'weft-server','rustwasgi','fastapi','uvloop','httptools','aioquic']:\n"
        "    try: out[p] = m.version(p)\n"
        "    except Exception: pass\n"
        "print(json.dumps(out))"
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True)
    try:
        return json.loads(out.stdout)
    except ValueError:
        return {}


def machine() -> dict:
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "git_sha": sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else ""),
    }


def _mib(kib: int | None) -> str:
    return f"{kib / 1024:.1f}" if kib else "?"


def _us(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def _col(c: dict) -> str:
    if c.get("load") == "fixed":
        return f"{c['workload']} @{c['offered_rps'] / 1000:g}k"
    if c.get("load") in ("h2", "h3"):
        return f"{c['workload']} c{c['connections']}×{c['streams']}"
    if c.get("load") == "h3fixed":
        return f"{c['workload']} @{c['offered_rps'] / 1000:g}k"
    return f"{c['workload']} c{c['connections']}"


def _flags(c: dict) -> str:
    return (" !" if c.get("client_saturated") else "") + (" *" if c.get("server_saturated") else "")


def _cell_table(cells: list[dict], fixed: bool = False) -> list[str]:
    head = "| server | workload | CPU µs/req (min–max) |"
    head += " offered req/s | achieved req/s |" if fixed else " req/s (min–max) |"
    head += " p50 ms | p99 ms | errors | non-2xx | server CPU % | client CPU % | other CPU % | PSS idle/load MiB |"
    lines = [head, "|---|---|" + "---:|" * (head.count("|") - 3)]
    ncols = head.count("|") - 1
    for c in cells:
        if c.get("error") and not c.get("runs"):
            lines.append(f"| {c['server']} | {c['workload']} | {c['error']} |" + " |" * (ncols - 3))
            continue
        cpu = f"**{_us(c['cpu_us_per_req'])}** ({_us(c['cpu_us_per_req_min'])}–{_us(c['cpu_us_per_req_max'])})"
        rate = f"{c['rps_median']:,.0f}{_flags(c)} ({c['rps_min']:,.0f}–{c['rps_max']:,.0f})"
        if fixed:
            rate = f"{c['offered_rps'] or 0:,.0f} | {rate}"
        pss = f"{(c['pss_idle_kib'] or 0) / 1024:.1f} / {(c['pss_load_kib'] or 0) / 1024:.1f}"
        err = f" ({c['error']})" if c.get("error") else ""
        lines.append(
            f"| {c['server']} | {c['workload']}{err} | {cpu} | {rate} | {c['p50_ms']:.2f} | {c['p99_ms']:.2f} | "
            f"{c['errors']} | {c['non2xx']} | {c['server_cpu_pct']:.0f} | {c['client_cpu_pct']:.0f} | "
            f"{c.get('other_cpu_pct') or 0:.0f} | {pss} |"
        )
    return lines


def markdown(report: dict) -> str:
    a = report["args"]
    lines = [
        f"Skirr benchmark, {report['date']} — {report['machine']['cpu']} ({report['machine']['cores']} cores), "
        f"kernel {report['machine']['kernel']}, CPython {report['python']}, git {report['machine']['git_sha']}",
        "",
        f"{a.get('workers', 1)} worker(s) on CPU {SERVER_CPU}; the load generator (`wrk -t1`, `h2load -t1` or "
        f"`h3load`) on CPU {CLIENT_CPU}; {a['runs']} × {a['duration']} s after a {a['warmup']} s warm-up; "
        "medians (min–max). "
        "**CPU µs/req**: on-CPU time of every thread of the server's process tree (sum of "
        "`/proc/<pid>/task/*/schedstat`, ns) over each run, divided by the requests (or messages) completed "
        "in it; lower is better. PSS summed over the server's process tree. `!` marks a cell whose load "
        "generator saturated its core (the server may be faster than shown); `*` a fixed-load cell that "
        "achieved < 97 % of the offered rate. **other CPU %**: machine busy time during the runs (/proc/stat, "
        "in % of one core) not spent by the server or the load generator — other users' processes, kernel "
        "threads.",
        "",
    ]
    if report.get("note"):
        lines += [f"Note: {report['note']}", ""]
    cells = report["cells"]
    ok = [c for c in cells if c.get("runs")]
    if ok:
        cols = list(dict.fromkeys(_col(c) for c in ok))
        servers = list(dict.fromkeys(c["server"] for c in cells))
        by = {(c["server"], _col(c)): c for c in ok}
        lines.append("### Server CPU per request (µs, median of the runs; lower is better)")
        lines.append("")
        lines.append("| server | " + " | ".join(cols) + " |")
        lines.append("|---|" + "---:|" * len(cols))
        for srv in servers:
            row = []
            for col in cols:
                c = by.get((srv, col))
                row.append(f"{_us(c['cpu_us_per_req'])}{_flags(c)}" if c else "–")
            lines.append(f"| {srv} | " + " | ".join(row) + " |")
        lines.append("")
    for conns in a["connections"]:
        sel = [c for c in cells if c.get("load", "wrk") == "wrk" and c["connections"] == conns]
        if sel:
            lines += [f"### HTTP/1.1, closed loop: `wrk -t1 -c{conns}`", "", *_cell_table(sel), ""]
    sel = [c for c in cells if c.get("load") == "fixed"]
    if sel:
        lines += [
            f"### HTTP/1.1, fixed offered load: `h2load --h1 -t1 -c{a['fixed_connections']} --rps=<rate / "
            f"{a['fixed_connections']}>`",
            "",
            *_cell_table(sel, fixed=True),
            "",
        ]
    sel = [c for c in cells if c.get("load") == "h2"]
    if sel:
        lines += [
            f"### HTTP/2 over cleartext (prior knowledge): `h2load -t1 -c{a['h2_connections']} -m{a['h2_streams']}`",
            "",
            *_cell_table(sel),
            "",
        ]
    a3 = f"-c{a.get('h3_connections')} -m{a.get('h3_streams')}"
    sel = [c for c in cells if c.get("load") == "h3"]
    if sel:
        lines += [f"### HTTP/3 (TLS 1.3, self-signed certificate): `h3load {a3}`", "", *_cell_table(sel), ""]
    sel = [c for c in cells if c.get("load") == "h3fixed"]
    if sel:
        lines += [f"### HTTP/3, fixed offered load: `h3load {a3} --rate <rate>`", "", *_cell_table(sel, True), ""]
    spread_rows = [c for c in ok if any("spread" in r for r in c["runs"])]
    if spread_rows:
        lines += [
            f"### How {a['workers']} workers shared the load (each run: CPU share of each process, %; client "
            "connections each worker held mid-run; listening sockets on the port)",
            "",
            "| server | cell | CPU share % per run | connections per worker per run | listening sockets |",
            "|---|---|---|---|---|",
        ]
        for c in spread_rows:
            sp = [r["spread"] for r in c["runs"] if "spread" in r]
            cpu = "; ".join("/".join(f"{x:.0f}" for x in s["cpu_share_pct"]) for s in sp)
            conn = "; ".join("/".join(str(x) for x in s["conns_per_worker"]) or "–" for s in sp)
            lines.append(f"| {c['server']} | {_col(c)} | {cpu} | {conn} | {sp[-1]['listening_sockets']} |")
        lines.append("")
    if report.get("ws_echo"):
        lines.append("### ws_echo (16-byte text messages, compiled client `bench/loadgen ws`)")
        lines.append("")
        lines.append(
            "| server | connections | CPU µs/msg | msgs/s (min–max) | p99 ms | errors | server CPU % | PSS MiB |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for c in report["ws_echo"]:
            if c.get("error"):
                lines.append(f"| {c['server']} | {c['connections']} | {c['error']} | | | | | |")
                continue
            cpu = statistics.median(r["server_cpu_pct"] for r in c["runs"])
            lines.append(
                f"| {c['server']} | {c['connections']} | **{_us(c.get('cpu_us_per_msg'))}** | {c['mps_median']:,.0f} "
                f"({c['mps_min']:,.0f}–{c['mps_max']:,.0f}) | {c['p99_ms']:.2f} | {c['errors']} | {cpu:.0f} | "
                f"{c['pss_kib'] / 1024:.1f} |"
            )
        lines.append("")
    if report.get("idle"):
        lines.append(f"### {report['args']['idle']:,} idle keep-alive connections")
        lines.append("")
        lines.append(
            "| server | PSS boot MiB | USS boot | PSS after 2,000 req | USS after | worker PSS / USS after | "
            "answered | held | PSS with connections MiB | cost MiB | KiB per connection |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for c in report["idle"]:
            if c.get("error"):
                lines.append(f"| {c['server']} | {c['error']} | | | | | | | | | |")
                continue
            held = f"{c['held']:,}" if c.get("held") is not None else "?"
            b, a = c.get("boot") or {}, c.get("after_requests") or {}
            procs = a.get("procs") or [{}]
            # The worker: the process started (one-process servers) or its
            # largest child (a master's worker).
            wk = max(procs[1:], key=lambda p: p.get("pss", 0)) if len(procs) > 1 else procs[0]
            lines.append(
                f"| {c['server']} | {_mib(b.get('pss'))} | {_mib(b.get('uss'))} | {_mib(a.get('pss'))} | "
                f"{_mib(a.get('uss'))} | {_mib(wk.get('pss'))} / {_mib(wk.get('uss'))} | {c['answered']:,} | {held} | "
                f"{c['pss_after_kib'] / 1024:.1f} | {c['delta_mib']:.1f} | {c.get('kib_per_connection', 0):.2f} |"
            )
        lines.append("")
        lines.append(
            "PSS and USS of the whole process tree (Gunicorn: master + worker); worker: the process started, "
            "or its largest child when it has any. Boot: 1 s after the first answered request; after: 2,000 "
            "keep-alive requests on 20 connections (closed), 1 s later. Cost: lowest PSS over 5 s with the "
            "connections held minus PSS before them."
        )
        lines.append("")
    if report.get("idle_h3"):
        lines.append(f"### {report['args']['idle_h3']:,} idle HTTP/3 connections (one GET each, client PING every 1 s)")
        lines.append("")
        lines.append("| server | answered | held | PSS before MiB | PSS with connections MiB | cost MiB | KiB/conn |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        for c in report["idle_h3"]:
            if c.get("error"):
                lines.append(f"| {c['server']} | {c['error']} | | | | | |")
                continue
            held = f"{c['held']:,}" if c.get("held") is not None else "?"
            per = c["delta_mib"] * 1024 / c["connections"]
            lines.append(
                f"| {c['server']} | {c['answered']:,} | {held} | {c['pss_before_kib'] / 1024:.1f} | "
                f"{c['pss_after_kib'] / 1024:.1f} | {c['delta_mib']:.1f} | {per:.1f} |"
            )
        lines.append("")
    if report.get("stream"):
        lines.append("### Streaming (first chunk, 50 ms sleep, last chunk; median of 20)")
        lines.append("")
        lines.append("| server | first byte ms | total ms |")
        lines.append("|---|---:|---:|")
        for name, s in report["stream"].items():
            if s and "error" not in s:
                lines.append(f"| {name} | {s['first_byte_ms']:.3f} | {s['total_ms']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default=DEFAULT_SERVERS)
    p.add_argument(
        "--workloads",
        default="raw_get,get_64k,post_4k,fastapi_json,h2_raw_get,h2_post_4k",
        help="h1 workloads run under wrk at every --connections; h2_* ones under h2load (h2c prior knowledge); "
        "h3_* ones (h3_raw_get, h3_post_4k; not in the default) under bench/h3load over TLS",
    )
    p.add_argument("--connections", default="64,256", help="wrk connection counts for the HTTP/1.1 workloads")
    p.add_argument(
        "--fixed",
        default=None,
        help="HTTP/1.1 workloads to also run at a fixed offered load (h2load --h1 --rps); default: raw_get,post_4k "
        "if in --workloads; '' for none; a workload named here but not in --workloads runs at the fixed load only. "
        f"Rates: {', '.join(f'{k} {v:,}' for k, v in FIXED_RATE.items())} req/s in total",
    )
    p.add_argument("--fixed-rate", type=int, default=0, help="total offered req/s for every --fixed workload")
    p.add_argument("--fixed-connections", type=int, default=64)
    p.add_argument("--h2-connections", type=int, default=64)
    p.add_argument("--h2-streams", type=int, default=10, help="concurrent streams per HTTP/2 connection (h2load -m)")
    p.add_argument("--h3-connections", type=int, default=64, help="QUIC connections of the h3_* workloads")
    p.add_argument("--h3-streams", type=int, default=10, help="concurrent streams per HTTP/3 connection (h3load -m)")
    p.add_argument(
        "--h3-rate", type=float, default=0, help="also run the h3_* workloads at this fixed offered load (req/s)"
    )
    p.add_argument("--idle-h3", type=int, default=0, help="idle HTTP/3 connections to hold (0: skip)")
    p.add_argument("--note", default="", help="free text recorded in the artifacts (e.g. other load on the machine)")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--stream", action="store_true", help="also measure streaming first byte")
    p.add_argument("--ws", default="", help="ws_echo connection counts, e.g. 16,256 (empty: skip)")
    p.add_argument("--idle", type=int, default=0, help="idle keep-alive connections to hold (0: skip)")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes per server (N > 1: servers and load generator share every CPU, and each run "
        "records how the workers shared CPU and connections; servers without a worker option are skipped)",
    )
    p.add_argument("--venv", default=str(BENCH / ".venv"))
    p.add_argument("--skirr-python", default=None, help="python of the `skirr` server (default: the venv's)")
    p.add_argument("--keep-raw", action="store_true", help="keep wrk's raw output in the JSON")
    p.add_argument("--out", default=None, help="artifact path prefix (default bench/results/<stamp>)")
    args = p.parse_args(argv)
    venv = Path(args.venv)
    servers = [s for s in args.servers.split(",") if s]
    for s in servers:
        if s not in SERVERS:
            p.error(f"unknown server {s!r}; known: {', '.join(SERVERS)}")
    global WORKERS, SERVER_CPU, CLIENT_CPU, SKIRR_PY
    WORKERS = args.workers
    SKIRR_PY = args.skirr_python
    if WORKERS > 1:
        every = f"0-{(os.cpu_count() or 1) - 1}"
        SERVER_CPU = os.environ.get("BENCH_SERVER_CPU", every)
        CLIENT_CPU = os.environ.get("BENCH_CLIENT_CPU", every)
        skipped = [s for s in servers if with_workers(s, SERVERS[s], WORKERS) is None]
        if skipped:
            print(f"--workers {WORKERS}: skipping {', '.join(skipped)} (no worker-count option)", flush=True)
        servers = [s for s in servers if s not in skipped]
    names = [w for w in args.workloads.split(",") if w]
    if args.fixed is None:
        args.fixed = ",".join(w for w in ("raw_get", "post_4k") if w in names)
    for w in [*names, *args.fixed.split(",")]:
        if w and w not in WORKLOADS:
            p.error(f"unknown workload {w!r}; known: {', '.join(WORKLOADS)}")
    fixed = {w: args.fixed_rate or FIXED_RATE.get(w, 25600) for w in args.fixed.split(",") if w}
    for w in fixed:
        if WORKLOADS[w].proto != "h1":
            p.error(f"--fixed takes HTTP/1.1 workloads, not {w}")
    # A --fixed workload not in --workloads runs at the fixed load only.
    workloads = [WORKLOADS[w] for w in dict.fromkeys([*names, *fixed])]
    conns = [int(c) for c in args.connections.split(",")]
    py = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "python": py,
        "machine": machine(),
        "versions": versions(venv),
        "args": {
            "servers": servers,
            "workloads": [w.name for w in workloads],
            "connections": conns,
            "duration": args.duration,
            "warmup": args.warmup,
            "runs": args.runs,
            "server_cpu": SERVER_CPU,
            "workers": WORKERS,
            "client_cpu": CLIENT_CPU,
            "idle": args.idle,
            "fixed": fixed,
            "fixed_connections": args.fixed_connections,
            "h2_connections": args.h2_connections,
            "h2_streams": args.h2_streams,
            "h3_connections": args.h3_connections,
            "h3_streams": args.h3_streams,
            "h3_rate": args.h3_rate,
            "idle_h3": args.idle_h3,
            "skirr_python": args.skirr_python,
        },
        "note": args.note,
        "load_before": open("/proc/loadavg").read().split()[:3],
        "cells": [],
    }
    t_start = time.monotonic()
    for w in workloads:
        plan = lambda w=w: plan_loads(w, conns if w.name in names else [], fixed, args)  # noqa: E731
        cells = measure_workload(w, servers, plan, args, venv)
        for cell in sorted(cells, key=lambda c: (c.load != "wrk", c.connections)):
            d = summarize(cell)
            report["cells"].append(d)
            at = f"@{(cell.offered_rps or 0) / 1000:g}k"
            tag = {"wrk": f"c{cell.connections}", "fixed": at, "h3fixed": at}.get(
                cell.load, f"c{cell.connections}x{cell.streams}"
            )
            if d.get("runs"):
                print(
                    f"{tag:>7} {w.name:<13} {cell.server:<15} {_us(d['cpu_us_per_req']):>6} µs/req"
                    f" {d['rps_median']:>10,.0f} req/s  p50 {d['p50_ms']:.2f} p99 {d['p99_ms']:.2f} ms"
                    f"  cpu {d['server_cpu_pct']:.0f}%  client {d['client_cpu_pct']:.0f}%"
                    f"{'  CLIENT-SATURATED' if d['client_saturated'] else ''}"
                    f"{'  SERVER-SATURATED' if d.get('server_saturated') else ''}"
                    f"{'  ' + cell.error if cell.error else ''}",
                    flush=True,
                )
            else:
                print(f"{tag:>7} {w.name:<13} {cell.server:<15} {cell.error}", flush=True)
    if args.stream:
        report["stream"] = {s: stream_first_byte(s, venv) for s in servers if s != "hyper"}
    if args.ws:
        report["ws_echo"] = []
        for c in (int(x) for x in args.ws.split(",")):
            for s in servers:
                r = measure_ws(s, c, args, venv)
                report["ws_echo"].append(r)
                print(f"ws {c:>4} {s:<15} {r.get('mps_median', 0):>10,.0f} msg/s {r.get('error', '')}", flush=True)
    if args.idle:
        report["idle"] = []
        for s in servers:
            r = measure_idle(s, args.idle, venv)
            report["idle"].append(r)
            print(f"idle {args.idle} {s:<15} {r.get('delta_mib', 0):.1f} MiB {r.get('error', '')}", flush=True)
    if args.idle_h3:
        report["idle_h3"] = []
        for s in servers:
            r = measure_idle_h3(s, args.idle_h3, venv)
            report["idle_h3"].append(r)
            print(f"idle h3 {args.idle_h3} {s:<15} {r.get('delta_mib', 0):.1f} MiB {r.get('error', '')}", flush=True)
    report["seconds"] = round(time.monotonic() - t_start)
    report["load_after"] = open("/proc/loadavg").read().split()[:3]
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else RESULTS / stamp
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    md = markdown(report)
    out.with_suffix(".md").write_text(md + "\n")
    print()
    print(md)
    print(f"\nartifacts: {out.with_suffix('.json')} {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
