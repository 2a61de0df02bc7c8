"""HTTP/3 in bench/run.py: which server serves it with which options, a
throwaway certificate, and the compiled load client `bench/h3load` (h2load
here has no HTTP/3). run.py owns the servers and the measurements; this
module only knows how to talk HTTP/3 to them.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
H3LOAD = ROOT / "target" / "release" / "h3load"

# What each server needs to serve HTTP/3 on UDP at the port it serves TCP
# (HTTP/1.1 and HTTP/2 over TLS) on: appended to its command line, with
# {cert}, {key} and {port} filled in. A server missing here does not serve
# HTTP/3; its h3 cells say why (NO_H3) or that it is not configured.
H3 = {
    "skirr": " --ssl-certfile {cert} --ssl-keyfile {key} --http3",
    "skirr-gunicorn": " --certfile {cert} --keyfile {key}",  # + SKIRR_HTTP3=1 (H3_ENV)
    # `loop_mode single` (issue 22): quinn's endpoint and connections run in
    # the Tokio turns asyncio's selector makes, on the one thread.
    "skirr-single": " --ssl-certfile {cert} --ssl-keyfile {key} --http3",
    "skirr-gunicorn-single": " --certfile {cert} --keyfile {key}",  # + SKIRR_HTTP3=1 (H3_ENV)
    "peregrine": " --tls-cert {cert} --tls-key {key} --http3",
    "weft": " --tls-cert {cert} --tls-key {key} --http3",
    "hypercorn": " --certfile {cert} --keyfile {key} --quic-bind 127.0.0.1:{port}",  # aioquic
}
H3_ENV = {"skirr-gunicorn": {"SKIRR_HTTP3": "1"}, "skirr-gunicorn-single": {"SKIRR_HTTP3": "1"}}
NO_H3 = {
    "granian": "no HTTP/3 in granian (it waits on hyper)",
    "uvicorn": "no HTTP/3 in uvicorn 0.54",
    "uvicorn-worker": "no HTTP/3 in uvicorn-worker",
    "gunicorn-asgi": "no HTTP/3 in Gunicorn 27 (it refuses h3 in http_protocols)",
    "rustwasgi": "HTTP/1.1 only",
    "hyper": "no HTTP/3 in hyper",
}

_TLS: tuple[str, str] | None = None


def tls_files() -> tuple[str, str]:
    """A self-signed ECDSA P-256 certificate for localhost and 127.0.0.1 and
    its key (PEM files, made once per process with openssl)."""
    global _TLS
    if _TLS is None:
        d = Path(tempfile.mkdtemp(prefix="skirr-bench-tls-"))
        cert, key = d / "cert.pem", d / "key.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
            + ["-keyout", str(key), "-out", str(cert), "-days", "7", "-subj", "/CN=localhost"]
            + ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
            check=True,
            capture_output=True,
        )
        _TLS = (str(cert), str(key))
    return _TLS


def h3_extra(name: str, port: int) -> str:
    cert, key = tls_files()
    return H3[name].format(cert=cert, key=key, port=port)


def h3load_args(port: int, w, conns: int, streams: int = 1) -> list[str]:
    args = [str(H3LOAD), f"127.0.0.1:{port}", w.path, "-c", str(conns), "-m", str(streams)]
    if w.method == "POST":
        args += ["--post", str(w.body_size)]
    return args


def run_h3load(port: int, w, conns: int, streams: int, duration: float, client_cpu: str, rate: float = 0) -> dict:
    """One timed h3load run, in the shape of run.py's wrk and h2load results.
    ``rate`` > 0: that many requests per second in total (fixed offered load)."""
    args = ["taskset", "-c", client_cpu, *h3load_args(port, w, conns, streams), "-d", f"{duration:g}"]
    if rate:
        args += ["--rate", f"{rate:g}"]
    t0 = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, _, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    try:
        r = json.loads(out.splitlines()[0])
    except (ValueError, IndexError):
        r = {"requests": 0, "rps": 0.0, "errors": 0, "non2xx": 0, "first_error": out[-300:]}
    return {
        "rps": r["rps"],
        "requests": r["requests"],
        "p50_ms": r.get("p50_ms") if r["requests"] else None,
        "p99_ms": r.get("p99_ms") if r["requests"] else None,
        "socket_errors": r["errors"],
        "non2xx": r["non2xx"],
        "first_error": r.get("first_error"),
        "handshakes": r.get("connections"),
        "offered_rps": rate or None,
        "client_cpu_pct": 100.0 * (ru.ru_utime + ru.ru_stime) / wall,
        "raw": out,
    }


def verify_h3(port: int, w, timeout: float = 5.0) -> str | None:
    """One request over HTTP/3: a 2xx whose body has the expected length
    (h3load counts body bytes; it does not keep bodies)."""
    try:
        p = subprocess.run([*h3load_args(port, w, 1), "-n", "1"], capture_output=True, text=True, timeout=timeout)
        r = json.loads(p.stdout.splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        return f"h3 request failed: {e}"
    if r["requests"] != 1:
        return f"h3 request failed: {r.get('first_error') or 'non-2xx status'}"
    want = w.expect_len if w.expect_len is not None else len(w.expect_body or b"")
    if w.expect_body is not None or w.expect_len is not None:
        if r["bytes"] != want:
            return f"h3 body of {r['bytes']} bytes, expected {want}"
    return None


def hold_idle(port: int, n: int, hold: float) -> tuple[subprocess.Popen, dict]:
    """Opens ``n`` HTTP/3 connections that make one GET each and then stay
    open (PING every second) for ``hold`` seconds; returns the h3load
    process (its last line, ``{"held": N}``, says how many the server kept)
    and its first line (requests answered, connections made)."""
    w = type("W", (), {"path": "/", "method": "GET", "body_size": 0})
    args = [*h3load_args(port, w, n), "-n", str(n), "--hold", f"{hold:g}"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    try:
        return proc, json.loads(line)
    except ValueError:
        return proc, {"requests": 0, "connections": 0, "first_error": line[-300:]}
