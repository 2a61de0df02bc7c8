"""HUPs under a heavy mixed niquests HTTP/3 load (issue 21's trial,
re-created): ``gunicorn -k skirr.RustWorker -w 2`` with HTTP/3, client
threads each on its own niquests Session and threads sharing one Session
(niquests hands a shared HTTP/3 connection to several threads at once),
GET /pid, POST /echo (8-64 KiB) and slow streamed GETs, a HUP every
``--hup-every`` seconds. Prints every failure with its time after the
last HUP and the exception, then the counts.

    .venv-test/3.11/bin/python bench/h3hup.py --duration 20 --hups 4 --own 2 --shared 24 --idle 4

(the form that failed 3 of 3 runs before the drain's two-step GOAWAY;
README "HTTP/3").
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import niquests
import trustme

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=16)
    ap.add_argument("--hups", type=int, default=3)
    ap.add_argument("--own", type=int, default=6, help="threads with a Session each")
    ap.add_argument("--shared", type=int, default=6, help="threads sharing one Session")
    ap.add_argument("--idle", type=int, default=4, help="threads pausing 0.8-1.2 s between requests")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()

    d = Path(tempfile.mkdtemp(prefix="h3hup"))
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    (d / "g.conf.py").write_text("skirr_http3 = True\n")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"))
    log = open(d / "gunicorn.log", "w")
    cmd = [
        sys.executable,
        "-m",
        "gunicorn",
        "-k",
        "skirr.RustWorker",
        "-b",
        f"127.0.0.1:{port}",
        "-c",
        str(d / "g.conf.py"),
        "-w",
        str(a.workers),
        "--certfile",
        str(d / "cert.pem"),
        "--keyfile",
        str(d / "key.pem"),
        "--graceful-timeout",
        "10",
        "apps.probe:app",
    ]
    g = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    verify = str(d / "ca.pem")

    def session():
        sess = niquests.Session(disable_http1=True, disable_http2=True, timeout=10, pool_maxsize=8)
        sess.quic_cache_layer.add_domain("127.0.0.1", port)
        return sess

    t_end = time.monotonic() + 60
    while time.monotonic() < t_end:
        try:
            with session() as sess:
                if sess.get(url + "/pid", verify=verify).status_code == 200:
                    break
        except Exception:
            time.sleep(0.2)
    time.sleep(1)

    stop = threading.Event()
    hups: list[float] = []
    ok = [0]
    fails: list[tuple[float, str, str]] = []
    lock = threading.Lock()

    def one(sess, i: int) -> None:
        kind = ("get", "post", "stream", "post")[i % 4]
        try:
            if kind == "get":
                r = sess.get(url + "/pid", verify=verify)
                good = r.status_code == 200
            elif kind == "post":
                body = os.urandom(8192 * (1 + i % 8))
                r = sess.post(url + "/echo", data=body, verify=verify)
                good = r.status_code == 200 and r.content == body
            else:
                r = sess.get(url + "/stream?n=3&delay=0.05", verify=verify)
                good = r.status_code == 200 and r.content.count(b"chunk") == 3
            why = "" if good else f"status {r.status_code}"
        except Exception as e:  # noqa: BLE001 - every failure is counted
            good, why = False, f"{type(e).__name__}: {e}"
        with lock:
            if good:
                ok[0] += 1
            else:
                since = time.monotonic() - hups[-1] if hups else -1
                fails.append((round(since, 2), kind, why[:200]))

    def own() -> None:
        i = 0
        while not stop.is_set():
            with session() as sess:
                for _ in range(50):
                    if stop.is_set():
                        break
                    one(sess, i)
                    i += 1

    def idle() -> None:
        import random

        i = 0
        with session() as sess:
            while not stop.is_set():
                one(sess, i)
                i += 1
                time.sleep(random.uniform(0.8, 1.2))

    shared_sess = session()

    def shared(k: int) -> None:
        i = k
        while not stop.is_set():
            one(shared_sess, i)
            i += 1

    threads = [threading.Thread(target=own) for _ in range(a.own)]
    threads += [threading.Thread(target=shared, args=(k,)) for k in range(a.shared)]
    threads += [threading.Thread(target=idle) for _ in range(a.idle)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    every = a.duration / (a.hups + 1)
    for h in range(a.hups):
        time.sleep(max(0.0, t0 + every * (h + 1) - time.monotonic()))
        hups.append(time.monotonic())
        g.send_signal(signal.SIGHUP)
    time.sleep(max(0.0, t0 + a.duration - time.monotonic()))
    stop.set()
    for t in threads:
        t.join(30)
    shared_sess.close()
    g.send_signal(signal.SIGTERM)
    g.wait(30)
    for f in fails:
        print("FAIL", f)
    print(f"{len(hups)} HUPs, {ok[0]} ok, {len(fails)} failed (log {d / 'gunicorn.log'})")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
