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
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
CLK = os.sysconf("SC_CLK_TCK")
SERVER_CPU = os.environ.get("BENCH_SERVER_CPU", "0")
CLIENT_CPU = os.environ.get("BENCH_CLIENT_CPU", "1")


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


WORKLOADS = {
    w.name: w
    for w in [
        Workload("raw_get", "bench.apps:raw_get", "/", expect_body=b"Hello, world!", hyper_path="/"),
        Workload("get_64k", "bench.apps:get_64k", "/", expect_len=65536, hyper_path="/64k"),
        Workload("post_4k", "bench.apps:post_4k", "/", "POST", 4096, expect_body=b"4096", hyper_path="/"),
        Workload("fastapi_json", "bench.fastapi_app:app", "/", expect_body=b'{"message":"Hello, world!"}'),
    ]
}

# {bin}: the bench venv's bin; {py}: its python; {app}; {port}; {root}: repo root.
SERVERS = {
    "skirr": "{py} -m skirr {app} --port {port} --no-access-log --lifespan off",
    "skirr-gunicorn": "{bin}/gunicorn -k skirr.RustWorker -w 1 -b 127.0.0.1:{port} --log-level warning {app}",
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


def tree_cpu_ticks(pid: int) -> int:
    total = 0
    for p in tree_pids(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total


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


def verify(port: int, w: Workload) -> str | None:
    try:
        status, body = one_request(port, w)
    except OSError as e:
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


@dataclass
class Cell:
    server: str
    workload: str
    connections: int
    runs: list = field(default_factory=list)
    verify_before: str | None = None
    verify_after: str | None = None
    pss_idle_kib: int | None = None
    pss_load_kib: int | None = None
    error: str | None = None


def start_server(
    name: str, w: Workload, port: int, venv: Path, websockets: bool = False, extra: str = ""
) -> subprocess.Popen:
    tmpl = SERVERS[name]
    if extra:
        tmpl = tmpl.replace(" {app}", extra + " {app}", 1) if "gunicorn" in tmpl else tmpl + extra
    if websockets:
        tmpl = tmpl.replace(" --no-ws", "")
    app = w.app
    cmd = tmpl.format(py=venv / "bin" / "python", bin=venv / "bin", app=app, port=port, root=ROOT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
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


def measure(name: str, w: Workload, conns: int, args, venv: Path) -> Cell:
    cell = Cell(name, w.name, conns)
    if name == "hyper":
        if w.hyper_path is None:
            cell.error = "not applicable"
            return cell
        w = Workload(w.name, "", w.hyper_path, w.method, w.body_size, w.expect_body, w.expect_len)
    port = free_port()
    proc = start_server(name, w, port, venv)
    try:
        if not wait_ready(port, proc):
            err = proc.stderr.read().decode(errors="replace")[-500:] if proc.poll() is not None else ""
            cell.error = f"did not start {err}".strip()
            return cell
        # Let the server finish booting (lifespan, worker fork) before measuring.
        for _ in range(50):
            if verify(port, w) is None:
                break
            time.sleep(0.1)
        cell.verify_before = verify(port, w)
        if cell.verify_before:
            cell.error = f"verification failed: {cell.verify_before}"
            return cell
        cell.pss_idle_kib = tree_pss_kib(proc.pid)
        url = f"http://127.0.0.1:{port}{w.path}"
        run_wrk(url, w, conns, args.warmup)
        for _ in range(args.runs):
            t0 = tree_cpu_ticks(proc.pid)
            wall0 = time.monotonic()
            r = run_wrk(url, w, conns, args.duration)
            r["server_cpu_pct"] = 100.0 * (tree_cpu_ticks(proc.pid) - t0) / CLK / (time.monotonic() - wall0)
            r["client_saturated"] = r["client_cpu_pct"] >= 95.0
            if not args.keep_raw:
                r.pop("raw")
            cell.runs.append(r)
        cell.pss_load_kib = tree_pss_kib(proc.pid)
        cell.verify_after = verify(port, w)
        if cell.verify_after:
            cell.error = f"verification after load failed: {cell.verify_after}"
        return cell
    finally:
        stop_server(proc)


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
            t0 = tree_cpu_ticks(proc.pid)
            wall0 = time.monotonic()
            p = subprocess.run([*cmd, str(args.duration)], capture_output=True, text=True)
            try:
                r = json.loads(p.stdout)
            except ValueError:
                out["error"] = (p.stdout + p.stderr)[-300:]
                return out
            r["server_cpu_pct"] = 100.0 * (tree_cpu_ticks(proc.pid) - t0) / CLK / (time.monotonic() - wall0)
            out["runs"].append(r)
        out["pss_kib"] = tree_pss_kib(proc.pid)
        mps = [r["mps"] for r in out["runs"]]
        out["mps_median"], out["mps_min"], out["mps_max"] = statistics.median(mps), min(mps), max(mps)
        out["p99_ms"] = statistics.median(r["p99_ms"] for r in out["runs"])
        out["errors"] = sum(r["errors"] for r in out["runs"])
        if any(r["messages"] == 0 for r in out["runs"]):
            out["error"] = "no messages echoed"
        return out
    finally:
        stop_server(proc)


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
    # Gunicorn-based servers would otherwise hold only `worker_connections`
    # (1,000) connections and drop idle ones after `keepalive` (2 s).
    extra = " --worker-connections 20000 --keep-alive 30" if "gunicorn" in SERVERS[name] else ""
    proc = start_server(name, w, port, venv, extra=extra)
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
        out.update(
            pss_before_kib=before,
            pss_after_kib=after,
            answered=got,
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


def summarize(cell: Cell) -> dict:
    d = {k: v for k, v in cell.__dict__.items() if k != "runs"}
    d["runs"] = cell.runs
    if cell.runs:
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
    return d


def versions(venv: Path) -> dict:
    code = (
        "import importlib.metadata as m, json\n"
        "out = {}\n"
        "for p in ['skirr','granian','uvicorn','uvicorn-worker','gunicorn','hypercorn','peregrine-server',"
        "'weft-server','rustwasgi','fastapi','uvloop','httptools']:\n"
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


def markdown(report: dict) -> str:
    lines = [
        f"Skirr benchmark, {report['date']} — {report['machine']['cpu']} ({report['machine']['cores']} cores), "
        f"kernel {report['machine']['kernel']}, CPython {report['python']}, git {report['machine']['git_sha']}",
        "",
        f"One worker pinned to CPU {SERVER_CPU}; `wrk -t1` pinned to CPU {CLIENT_CPU}; "
        f"{report['args']['runs']} × {report['args']['duration']} s after a {report['args']['warmup']} s warm-up; "
        "medians (min–max). PSS summed over the server's process tree. `!` marks a cell whose load "
        "generator saturated its core (the server may be faster than shown).",
        "",
    ]
    cells = report["cells"]
    for conns in report["args"]["connections"]:
        lines.append(f"### {conns} connections")
        lines.append("")
        lines.append(
            "| server | workload | req/s (min–max) | p50 ms | p99 ms | errors | non-2xx | server CPU % "
            "| wrk CPU % | PSS idle/load MiB |"
        )
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for c in cells:
            if c["connections"] != conns:
                continue
            if c.get("error") and not c.get("runs"):
                lines.append(f"| {c['server']} | {c['workload']} | {c['error']} | | | | | | | |")
                continue
            flag = " !" if c.get("client_saturated") else ""
            pss = f"{(c['pss_idle_kib'] or 0) / 1024:.1f} / {(c['pss_load_kib'] or 0) / 1024:.1f}"
            lines.append(
                f"| {c['server']} | {c['workload']} | {c['rps_median']:,.0f}{flag} "
                f"({c['rps_min']:,.0f}–{c['rps_max']:,.0f}) | {c['p50_ms']:.2f} | {c['p99_ms']:.2f} | "
                f"{c['errors']} | {c['non2xx']} | {c['server_cpu_pct']:.0f} | {c['client_cpu_pct']:.0f} | {pss} |"
            )
        lines.append("")
    if report.get("ws_echo"):
        lines.append("### ws_echo (16-byte text messages, compiled client `bench/loadgen ws`)")
        lines.append("")
        lines.append("| server | connections | msgs/s (min–max) | p99 ms | errors | server CPU % | PSS MiB |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        for c in report["ws_echo"]:
            if c.get("error"):
                lines.append(f"| {c['server']} | {c['connections']} | {c['error']} | | | | |")
                continue
            cpu = statistics.median(r["server_cpu_pct"] for r in c["runs"])
            lines.append(
                f"| {c['server']} | {c['connections']} | {c['mps_median']:,.0f} "
                f"({c['mps_min']:,.0f}–{c['mps_max']:,.0f}) | {c['p99_ms']:.2f} | {c['errors']} | {cpu:.0f} | "
                f"{c['pss_kib'] / 1024:.1f} |"
            )
        lines.append("")
    if report.get("idle"):
        lines.append(f"### {report['args']['idle']:,} idle keep-alive connections")
        lines.append("")
        lines.append("| server | answered | PSS before MiB | PSS with connections MiB | cost MiB |")
        lines.append("|---|---:|---:|---:|---:|")
        for c in report["idle"]:
            if c.get("error"):
                lines.append(f"| {c['server']} | {c['error']} | | | |")
                continue
            lines.append(
                f"| {c['server']} | {c['answered']:,} | {c['pss_before_kib'] / 1024:.1f} | "
                f"{c['pss_after_kib'] / 1024:.1f} | {c['delta_mib']:.1f} |"
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
    p.add_argument("--workloads", default="raw_get,get_64k,post_4k,fastapi_json")
    p.add_argument("--connections", default="64,256")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--stream", action="store_true", help="also measure streaming first byte")
    p.add_argument("--ws", default="", help="ws_echo connection counts, e.g. 16,256 (empty: skip)")
    p.add_argument("--idle", type=int, default=0, help="idle keep-alive connections to hold (0: skip)")
    p.add_argument("--venv", default=str(BENCH / ".venv"))
    p.add_argument("--keep-raw", action="store_true", help="keep wrk's raw output in the JSON")
    p.add_argument("--out", default=None, help="artifact path prefix (default bench/results/<stamp>)")
    args = p.parse_args(argv)
    venv = Path(args.venv)
    servers = [s for s in args.servers.split(",") if s]
    for s in servers:
        if s not in SERVERS:
            p.error(f"unknown server {s!r}; known: {', '.join(SERVERS)}")
    workloads = [WORKLOADS[w] for w in args.workloads.split(",") if w]
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
            "client_cpu": CLIENT_CPU,
            "idle": args.idle,
        },
        "cells": [],
    }
    for c in conns:
        for w in workloads:
            for s in servers:
                cell = measure(s, w, c, args, venv)
                d = summarize(cell)
                report["cells"].append(d)
                if d.get("runs"):
                    print(
                        f"{c:>4} {w.name:<13} {s:<15} {d['rps_median']:>10,.0f} req/s  p99 {d['p99_ms']:.2f} ms"
                        f"  cpu {d['server_cpu_pct']:.0f}%  wrk {d['client_cpu_pct']:.0f}%"
                        f"{'  SATURATED' if d['client_saturated'] else ''}",
                        flush=True,
                    )
                else:
                    print(f"{c:>4} {w.name:<13} {s:<15} {cell.error}", flush=True)
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
