"""Compression benchmark: a FastAPI ~10 KiB JSON response with
``Accept-Encoding: gzip``, compressed by Skirr (``--compression gzip``) or
by Starlette's ``GZipMiddleware`` (under Skirr and under uvicorn), and
uncompressed for reference. Server CPU time per request (all threads, from
/proc) next to req/s and the bytes of one response body on the wire.
Pinned like bench/pathsend.py (server CPU 0, wrk CPU 1); medians of
BENCH_RUNS (3) × BENCH_SECONDS (5); JSON artifact in bench/results/.

    .venv/bin/python bench/compression.py
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

from pathsend import CLIENT_CPU, CLK, ROOT, RUNS, SECONDS, SERVER_CPU, cpu_ticks, free_port

SERVERS = {
    "skirr --compression gzip": (["-m", "skirr", "compression_app:app", "--compression", "gzip"], "0"),
    "skirr + GZipMiddleware": (["-m", "skirr", "compression_app:app"], "1"),
    "uvicorn + GZipMiddleware": (["-m", "uvicorn", "compression_app:app", "--no-access-log"], "1"),
    "skirr, uncompressed": (["-m", "skirr", "compression_app:app"], "0"),
}


def body_bytes(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        out, rest = b"", body
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            n = int(size_line, 16)
            if n == 0:
                return len(out)
            out, rest = out + rest[:n], rest[n + 2 :]
    return len(body)


def start(args: list[str], middleware: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = dict(os.environ, BENCH_GZIP_MIDDLEWARE=middleware, PYTHONPATH=str(ROOT / "bench"))
    cmd = ["taskset", "-c", SERVER_CPU, sys.executable, *args, "--port", str(port)]
    if "skirr" in args:
        cmd.append("--no-access-log")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            body_bytes(port)
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{args} did not start")


def main() -> None:
    runs: dict = {}
    for _ in range(RUNS):
        for name, (args, mw) in SERVERS.items():
            proc, port = start(args, mw)
            try:
                size = body_bytes(port)
                t0, w0 = cpu_ticks(proc.pid), time.monotonic()
                out = subprocess.run(
                    [
                        "taskset",
                        "-c",
                        CLIENT_CPU,
                        "wrk",
                        "-t1",
                        "-c64",
                        f"-d{SECONDS}s",
                        "--latency",
                        "-H",
                        "Accept-Encoding: gzip",
                        f"http://127.0.0.1:{port}/",
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=SECONDS + 30,
                ).stdout
                wall = time.monotonic() - w0
                cpu = (cpu_ticks(proc.pid) - t0) / CLK
                reqs = int(re.search(r"(\d+) requests in", out).group(1))
                r = {
                    "requests": reqs,
                    "req_per_s": reqs / wall,
                    "cpu_us_per_request": 1e6 * cpu / reqs,
                    "body_bytes": size,
                }
                runs.setdefault(name, []).append(r)
                print(name, r, file=sys.stderr)
            finally:
                proc.terminate()
                proc.wait(15)
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    out = ROOT / "bench" / "results" / f"compression-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"runs": runs, "medians": med, "seconds": SECONDS}, indent=1))
    print("| server | server CPU µs/request | req/s | body bytes |")
    print("|---|---:|---:|---:|")
    for n, m in med.items():
        print(f"| {n} | {m['cpu_us_per_request']:.0f} | {m['req_per_s']:.0f} | {m['body_bytes']:.0f} |")
    print(f"artifact: {out.relative_to(Path(ROOT))}")


if __name__ == "__main__":
    main()
