"""Admission under overload (issue 23): one Gunicorn worker with
``--worker-connections 100`` and many busy keep-alive clients (wrk); a
canary opens a new connection every 0.5 s (GET /healthz, 10 s timeout).
Prints one JSON line: canaries answered and failed, their wait (p50, max),
and wrk's requests per second.

    python bench/admission.py                         # 1,000 wrk connections, 30 s
    python bench/admission.py -c 2000 --python .venv-base/bin/python
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-c", "--connections", type=int, default=1000)
    ap.add_argument("--slots", type=int, default=100)
    ap.add_argument("--duration", type=int, default=30)
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tempfile.NamedTemporaryFile(prefix="admission-", suffix=".log", delete=False)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}")
    cmd = [
        a.python, "-m", "gunicorn", "-k", "skirr.RustWorker", "-b", f"127.0.0.1:{port}", "-w", "1",
        "--worker-connections", str(a.slots), "--backlog", "4096", "apps.probe:app",
    ]  # fmt: skip
    master = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    deadline = time.monotonic() + 30
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/healthz")
            c.getresponse().read()
            c.close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("server did not start") from None
            time.sleep(0.1)
    wrk = subprocess.Popen(
        ["wrk", "-t2", f"-c{a.connections}", f"-d{a.duration}s", "--timeout", "20s", f"http://127.0.0.1:{port}/"],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(2)  # wrk's connections take every slot first
    waits: list[float] = []
    failed = 0
    stop = threading.Event()
    end = time.monotonic() + a.duration - 4
    while time.monotonic() < end and not stop.is_set():
        t0 = time.monotonic()
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/healthz", headers={"Connection": "close"})
            ok = c.getresponse().status == 200
            c.close()
        except (OSError, http.client.HTTPException):
            ok = False
        if ok:
            waits.append(time.monotonic() - t0)
        else:
            failed += 1
        time.sleep(0.5)
    out_wrk = wrk.communicate()[0]
    master.send_signal(signal.SIGTERM)
    master.wait(60)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out_wrk)
    errors = re.search(r"Socket errors:.*", out_wrk)
    print(
        json.dumps(
            {
                "connections": a.connections,
                "slots": a.slots,
                "canaries_ok": len(waits),
                "canaries_failed": failed,
                "canary_p50_s": round(statistics.median(waits), 3) if waits else None,
                "canary_max_s": round(max(waits), 3) if waits else None,
                "wrk_rps": float(rps.group(1)) if rps else None,
                "wrk_errors": errors.group(0) if errors else "",
            }
        )
    )


if __name__ == "__main__":
    main()
