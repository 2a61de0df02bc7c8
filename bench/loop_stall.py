"""A worker whose event loop is blocked, under a real Gunicorn master
(issue 17, item 1): how many requests on new connections to *another* path
get no answer, and how long the answered ones wait.

    python bench/loop_stall.py                       # -w 2, shared socket
    python bench/loop_stall.py --reuse-port          # each worker its own socket
    python bench/loop_stall.py --stall-timeout 0     # the watchdog off (as before)

``gunicorn -k skirr.RustWorker -w 2 --timeout 10``; one request to
``/block?secs=25`` blocks one worker's loop (``time.sleep`` in an async
view) until Gunicorn kills it; meanwhile 40 requests, each on a new
connection, go to ``/`` spread over 10 s. Each ends as ``200``, another
status (``503`` from the watchdog), ``empty`` (the connection closed or was
reset with no response) or ``timeout``. Prints JSON (and writes it with
``--json PATH``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str, timeout: float) -> tuple[str, float, str]:
    """``(outcome, seconds, worker pid or "")``: outcome is the status code,
    ``empty`` (closed or reset before a status line) or ``timeout``."""
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except TimeoutError:
        return "timeout", time.monotonic() - t0, ""
    except OSError:
        data = b""
    took = time.monotonic() - t0
    if not data.startswith(b"HTTP/1.1 "):
        return "empty", took, ""
    status = data[9:12].decode()
    body = data.partition(b"\r\n\r\n")[2].decode(errors="replace")
    return status, took, body if status == "200" else ""


def answers(port: int) -> bool:
    try:
        return get(port, "/", 2.0)[0] == "200"
    except OSError:
        return False


def wait_until(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def workers(master: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def run(args: argparse.Namespace) -> dict:
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    if args.stall_timeout is not None:
        env["SKIRR_LOOP_STALL_TIMEOUT"] = str(args.stall_timeout)
    cmd = [
        sys.executable, "-m", "gunicorn", "-k", "skirr.RustWorker", "-w", str(args.workers),
        "--timeout", str(args.timeout), "--graceful-timeout", "5", "-b", f"127.0.0.1:{port}",
    ]  # fmt: skip
    if args.reuse_port:
        cmd.append("--reuse-port")
    cmd.append("bench.loop_stall_app:app")
    log = tempfile.NamedTemporaryFile(prefix="loop-stall-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT), env=env)
    try:
        wait_until(lambda: answers(port), 30, "gunicorn to answer")
        wait_until(lambda: len(workers(proc.pid)) == args.workers, 30, "every worker")
        # Every worker answers before the test starts.
        seen: set[str] = set()
        wait_until(lambda: seen.add(get(port, "/", 2.0)[2]) or len(seen - {""}) >= args.workers, 30, "all workers")
        blocked: dict = {}

        def block():
            blocked["r"] = get(port, f"/block?secs={args.block}", args.block + args.timeout + 30)

        tb = threading.Thread(target=block)
        tb.start()
        time.sleep(0.2)  # let the blocking request reach a worker's app
        results: list[tuple[str, float, str]] = [("", 0.0, "")] * args.requests
        threads = []
        t0 = time.monotonic()
        for i in range(args.requests):
            at = t0 + args.over * i / args.requests
            time.sleep(max(0.0, at - time.monotonic()))

            def one(i=i):
                results[i] = get(port, "/", args.request_timeout)

            t = threading.Thread(target=one)
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        tb.join()
        outcomes: dict[str, int] = {}
        for o, _, _ in results:
            outcomes[o] = outcomes.get(o, 0) + 1
        answered = [took for o, took, _ in results if o not in ("empty", "timeout")]
        ok = sorted(took for o, took, _ in results if o == "200")
        return {
            "workers": args.workers,
            "reuse_port": args.reuse_port,
            "gunicorn_timeout": args.timeout,
            "block_secs": args.block,
            "requests": args.requests,
            "over_secs": args.over,
            "loop_stall_timeout": args.stall_timeout,
            "outcomes": outcomes,
            "empty_replies": outcomes.get("empty", 0) + outcomes.get("timeout", 0),
            "worst_wait_s": round(max(answered), 3) if answered else None,
            "worst_200_wait_s": round(ok[-1], 3) if ok else None,
            "median_200_wait_s": round(ok[len(ok) // 2], 3) if ok else None,
            "block_request": blocked.get("r", ("?",))[0],
            "worker_timeout_logged": "WORKER TIMEOUT" in Path(log.name).read_text(errors="replace"),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.unlink(log.name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=int, default=10, help="Gunicorn's --timeout (s)")
    p.add_argument("--block", type=float, default=25.0, help="how long /block blocks the loop (s)")
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--over", type=float, default=10.0, help="the requests are spread over this long (s)")
    p.add_argument("--request-timeout", type=float, default=40.0)
    p.add_argument("--reuse-port", action="store_true")
    p.add_argument("--stall-timeout", type=float, default=None, help="SKIRR_LOOP_STALL_TIMEOUT (default: unset)")
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args()
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
