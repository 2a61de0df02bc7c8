"""pathsend benchmark: FastAPI's ``FileResponse`` under Skirr with the
``http.response.pathsend`` extension (Skirr reads the file) and without it
(Starlette reads it in Python, 64 KiB chunks), for a 1 MiB and a 64 MiB file.

Server CPU time per request (every thread of the server process, from
/proc/<pid>/stat) is the figure; req/s and throughput beside it. The server
runs pinned to BENCH_SERVER_CPU (0), wrk to BENCH_CLIENT_CPU (1); medians of
BENCH_RUNS (3) runs of BENCH_SECONDS (5) each, interleaved. Writes a JSON
artifact to bench/results/pathsend-<date>.json and prints a table.

    .venv/bin/python bench/pathsend.py
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER_CPU = os.environ.get("BENCH_SERVER_CPU", "0")
CLIENT_CPU = os.environ.get("BENCH_CLIENT_CPU", "1")
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "5"))
CLK = os.sysconf("SC_CLK_TCK")
CELLS = [("1m", 16), ("64m", 4)]  # (file, connections)


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(pathsend: bool) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = dict(os.environ, BENCH_NO_PATHSEND="0" if pathsend else "1", PYTHONPATH=str(ROOT / "bench"))
    cmd = ["taskset", "-c", SERVER_CPU, sys.executable, "-m", "skirr", "pathsend_app:app"]
    cmd += ["--port", str(port), "--no-access-log"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60  # the app writes its files on first start
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /1m HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                got = 0
                while chunk := s.recv(1 << 20):
                    got += len(chunk)
                if got > 1 << 20:
                    return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


def wrk(port: int, name: str, conns: int) -> dict:
    out = subprocess.run(
        [
            "taskset",
            "-c",
            CLIENT_CPU,
            "wrk",
            "-t1",
            f"-c{conns}",
            f"-d{SECONDS}s",
            "--latency",
            f"http://127.0.0.1:{port}/{name}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=SECONDS + 30,
    ).stdout
    reqs = int(re.search(r"(\d+) requests in", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    return {
        "requests": reqs,
        "non_2xx": int(errors.group(1)) if errors else 0,
        "p99_ms": float(p99.group(1)) * scale[p99.group(2)] if p99 else None,
    }


def main() -> None:
    results: dict = {}
    for run in range(RUNS):
        for pathsend in (True, False):
            proc, port = start(pathsend)
            try:
                for name, conns in CELLS:
                    t0, w0 = cpu_ticks(proc.pid), time.monotonic()
                    r = wrk(port, name, conns)
                    wall = time.monotonic() - w0
                    cpu = (cpu_ticks(proc.pid) - t0) / CLK
                    r["cpu_us_per_request"] = 1e6 * cpu / max(1, r["requests"])
                    r["req_per_s"] = r["requests"] / wall
                    r["server_cpu_pct"] = 100 * cpu / wall
                    key = f"{name} {'pathsend' if pathsend else 'python read'}"
                    results.setdefault(key, []).append(r)
                    print(f"run {run + 1} {key}: {r}", file=sys.stderr)
            finally:
                proc.terminate()
                proc.wait(15)
    table = {}
    for key, runs in results.items():
        table[key] = {
            k: statistics.median(r[k] for r in runs) for k in ("cpu_us_per_request", "req_per_s", "server_cpu_pct")
        }
        table[key]["p99_ms"] = statistics.median(r["p99_ms"] for r in runs if r["p99_ms"] is not None)
        table[key]["non_2xx"] = sum(r["non_2xx"] for r in runs)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = ROOT / "bench" / "results" / f"pathsend-{stamp}.json"
    out.write_text(json.dumps({"runs": results, "medians": table, "seconds": SECONDS}, indent=1))
    print("| file, path | server CPU µs/request | req/s | MiB/s | p99 ms | server CPU % |")
    print("|---|---:|---:|---:|---:|---:|")
    for key, t in table.items():
        size = 1 if key.startswith("1m") else 64
        print(
            f"| {key} | {t['cpu_us_per_request']:.0f} | {t['req_per_s']:.0f} | {t['req_per_s'] * size:.0f} |"
            f" {t['p99_ms']:.1f} | {t['server_cpu_pct']:.0f} |"
        )
    print(f"artifact: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
