"""``skirr.RustWorker``: the Gunicorn worker class.

    gunicorn -k skirr.RustWorker -w 4 app:app

Gunicorn's master binds, forks and supervises as usual. In each worker,
:meth:`RustWorker.run` builds the asyncio loop thread and hands Gunicorn's
inherited listeners to the Rust core, which serves until the master asks it
to stop:

* SIGTERM: stop accepting, finish in-flight requests (``--graceful-timeout``),
  run lifespan shutdown, exit 0. SIGINT/SIGQUIT: close everything, exit 0.
  SIGUSR1: reopen log files. These are handled in Rust (the main thread is
  inside the Rust runtime, where Python signal handlers would never run).
* The heartbeat (``self.notify()``) runs on the asyncio loop, so a long
  request or stream never looks dead, but a loop blocked past ``--timeout``
  gets the worker replaced, as with Gunicorn's other workers.
* ``--max-requests`` (+ jitter), ``--keep-alive``, ``--worker-connections``
  and ``--graceful-timeout`` are honoured; a worker whose master died exits.
"""

from __future__ import annotations

import datetime
import signal
import socket
import sys
from typing import Any

from gunicorn.workers.base import Worker

from skirr import config
from skirr._skirr import StartupFailed
from skirr.asgi import as_asgi3
from skirr.serve import serve

#: Gunicorn's exit status for "worker failed to boot": the master halts.
WORKER_BOOT_ERROR = 3


class _AccessResponse:
    __slots__ = ("status", "headers", "sent")

    def __init__(self, status: int, headers: list[tuple[str, str]], sent: int) -> None:
        self.status = status
        self.headers = headers
        self.sent = sent


class _AccessRequest:
    __slots__ = ("headers",)

    def __init__(self, headers: list[tuple[str, str]]) -> None:
        self.headers = headers


def _environ(scope: dict[str, Any], req_headers: list[tuple[str, str]]) -> dict[str, str]:
    qs = (scope.get("query_string") or b"").decode("latin-1")
    raw = scope.get("raw_path") or scope["path"].encode()
    raw_uri = raw.decode("latin-1") + ("?" + qs if qs else "")
    env = {
        "REQUEST_METHOD": scope["method"],
        "RAW_URI": raw_uri,
        "PATH_INFO": scope["path"],
        "QUERY_STRING": qs,
        "SERVER_PROTOCOL": "HTTP/" + scope["http_version"],
        "REMOTE_ADDR": scope["client"][0] if scope.get("client") else "-",
    }
    for k, v in req_headers:
        key = "HTTP_" + k.upper().replace("-", "_")
        env[key] = f"{env[key]},{v}" if key in env else v
    return env


class RustWorker(Worker):
    """A Gunicorn worker serving ASGI applications with Skirr's Rust core."""

    def init_signals(self) -> None:
        # Python-level handlers cannot run while the main thread is inside the
        # Rust runtime; Rust registers TERM, INT, QUIT and USR1 itself.
        for s in self.SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGWINCH, signal.SIG_IGN)

    def _options(self) -> dict[str, Any]:
        cfg = self.cfg
        max_requests = self.max_requests if self.max_requests < sys.maxsize else 0
        fallback = {
            "keepalive_timeout": cfg.keepalive,
            "graceful_timeout": cfg.graceful_timeout,
            "max_requests": max_requests,
            "max_connections": cfg.worker_connections,
        }
        return config.resolve(fallback=fallback)

    def _access(self):
        log = self.log
        if not getattr(log, "access_log_enabled", True):
            return None

        def access(scope: dict, status: int, headers: Any, size: int, seconds: float) -> None:
            req_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
            resp_headers = [(bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in headers or ()]
            log.access(
                _AccessResponse(status, resp_headers, size),
                _AccessRequest(req_headers),
                _environ(scope, req_headers),
                datetime.timedelta(seconds=seconds),
            )

        return access

    def run(self) -> None:
        try:
            values = self._options()
        except config.ConfigError as e:
            self.log.error("skirr: %s", e)
            sys.exit(WORKER_BOOT_ERROR)
        app = as_asgi3(self.wsgi)
        listeners = [(s.sock.fileno(), "unix" if s.sock.family == socket.AF_UNIX else "tcp") for s in self.sockets]
        rust = config.rust_config(values, parent_pid=self.ppid, sigint_graceful=False, access_log=True)
        interval = max(0.5, min(self.timeout / 2.0, 2.0))
        try:
            serve(
                app,
                config=rust,
                listeners=listeners,
                error_logger=self.log.error_log,
                loop_kind=values["loop"],
                access_logger=self._access(),
                reopen_logs=self.log.reopen_files,
                heartbeat=(self.notify, interval),
            )
        except StartupFailed as e:
            self.log.error("Application startup failed: %s", e)
            sys.exit(WORKER_BOOT_ERROR)
