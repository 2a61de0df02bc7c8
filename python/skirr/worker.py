"""``skirr.RustWorker``: the Gunicorn worker class.

    gunicorn -k skirr.RustWorker -w 4 app:app

Gunicorn's master binds, forks and supervises as usual. In each worker,
:meth:`RustWorker.run` builds the asyncio loop thread and hands Gunicorn's
inherited listeners to the Rust core, which serves until the master asks it
to stop:

* SIGTERM: stop accepting, finish in-flight requests (``--graceful-timeout``),
  run lifespan shutdown, exit 0. SIGINT/SIGQUIT: ``worker_int``, then close
  everything, exit 0. SIGABRT (the master's timeout): ``worker_abort``, exit
  1. SIGUSR1: reopen log files. These are handled in Rust (the main thread
  is inside the Rust runtime, where Python signal handlers would never run).
  The app's ``loop.add_signal_handler()`` gets other signals (USR2 …)
  forwarded; HUP, TTIN, TTOU, WINCH and CHLD stay Gunicorn's (see
  :data:`skirr.serve.GUNICORN_SIGNALS`).
* The heartbeat (``self.notify()``) runs on the asyncio loop, so a long
  request or stream never looks dead, but a loop blocked past ``--timeout``
  gets the worker replaced, as with Gunicorn's other workers.
* Settings: see :mod:`skirr.gunicorn_settings` (which apply, which are
  warned about, which stop the boot).
* HTTP/3 (``skirr_http3``): the master binds the UDP sockets whose
  packets a BPF program steers to the worker owning each connection, when
  it constructs its first worker (see :mod:`skirr.h3steer`).
* ``metrics_bind``: the master binds the metrics listener and creates the
  shared table when it constructs its first worker, before the fork (see
  :mod:`skirr.metrics`); every worker serves the whole table.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import sys
import tempfile
from typing import Any

import gunicorn
from gunicorn.workers.base import Worker

from skirr import config, gunicorn_settings, h3steer, metrics
from skirr._skirr import StartupFailed
from skirr.asgi import AppLoadError, app_traceback, as_asgi3
from skirr.serve import GUNICORN_SIGNALS, serve

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


def environ(scope: dict[str, Any], req_headers: list[tuple[str, str]]) -> dict[str, Any]:
    """A WSGI-style environ for Gunicorn's access log atoms and
    ``post_request`` hooks (``%(h)s``, ``%(r)s``, ``%({name}e)s``...)."""
    qs = (scope.get("query_string") or b"").decode("latin-1")
    raw = scope.get("raw_path") or scope["path"].encode()
    raw_uri = raw.decode("latin-1") + ("?" + qs if qs else "")
    client = scope.get("client")
    server = scope.get("server") or ("", None)
    env: dict[str, Any] = {
        "REQUEST_METHOD": scope.get("method", "GET"),
        "RAW_URI": raw_uri,
        "PATH_INFO": scope["path"],
        "SCRIPT_NAME": scope.get("root_path", ""),
        "QUERY_STRING": qs,
        # HTTP/2's version is "2" in the scope, "HTTP/2.0" in logs (as Gunicorn).
        "SERVER_PROTOCOL": "HTTP/" + _wire_version(scope.get("http_version", "1.1")),
        "REMOTE_ADDR": client[0] if client else "-",
        "REMOTE_PORT": str(client[1]) if client else "",
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": "" if server[1] is None else str(server[1]),
        "wsgi.url_scheme": scope.get("scheme", "http"),
    }
    for k, v in req_headers:
        key = "HTTP_" + k.upper().replace("-", "_")
        env[key] = f"{env[key]},{v}" if key in env else v
    if "HTTP_CONTENT_TYPE" in env:
        env["CONTENT_TYPE"] = env["HTTP_CONTENT_TYPE"]
    if "HTTP_CONTENT_LENGTH" in env:
        env["CONTENT_LENGTH"] = env["HTTP_CONTENT_LENGTH"]
    return env


def _wire_version(v: str) -> str:
    return v + ".0" if v in ("2", "3") else v


class HookRequest:
    """What ``pre_request(worker, req)`` and ``post_request(worker, req,
    environ, resp)`` receive as ``req``: ``method``, ``uri`` (path and
    query as sent), ``path``, ``query``, ``version`` (``(1, 1)``),
    ``scheme``, ``headers`` (``[(NAME, value)]`` upper-cased str pairs, as
    Gunicorn's request has), ``remote_addr`` and ``peer_addr``."""

    __slots__ = ("method", "uri", "path", "query", "version", "scheme", "headers", "remote_addr", "peer_addr")

    def __init__(self, scope: dict[str, Any]) -> None:
        qs = (scope.get("query_string") or b"").decode("latin-1")
        self.method = scope.get("method", "GET")
        self.path = scope["path"]
        self.query = qs
        self.uri = (scope.get("raw_path") or b"").decode("latin-1") + ("?" + qs if qs else "")
        major, _, minor = scope.get("http_version", "1.1").partition(".")
        self.version = (int(major), int(minor or 0))
        self.scheme = scope.get("scheme", "http")
        self.headers = [(k.decode("latin-1").upper(), v.decode("latin-1")) for k, v in scope.get("headers", ())]
        client = scope.get("client")
        self.remote_addr = client[0] if client else None
        self.peer_addr = tuple(client) if client else None


#: The body of the 500 Skirr sends when an app fails before responding.
INTERNAL_ERROR_BODY = b"Internal Server Error"


class HookResponse:
    """``post_request``'s ``resp``: ``status`` (``"200 OK"``-style str, as
    Gunicorn's), ``status_code`` (int; 500 when the app failed before responding,
    as the client was answered),
    ``headers`` (``[(name, value)]`` str pairs) and ``sent`` (body bytes)."""

    __slots__ = ("status_code", "headers", "sent")

    def __init__(self) -> None:
        self.status_code = 0
        self.headers: list[tuple[str, str]] = []
        self.sent = 0

    @property
    def status(self) -> str:
        from http import HTTPStatus

        try:
            return f"{self.status_code} {HTTPStatus(self.status_code).phrase}"
        except ValueError:
            return str(self.status_code)


def with_request_hooks(app: Any, worker: Worker) -> Any:
    """Wraps ``app`` to call Gunicorn's ``pre_request`` and ``post_request``
    hooks around each HTTP request (only installed when either is set: it
    costs a Python call per request)."""
    cfg, log = worker.cfg, worker.log

    async def hooked(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        req = HookRequest(scope)
        try:
            cfg.pre_request(worker, req)
        except Exception:  # noqa: BLE001 - a hook must not break the request
            log.exception("pre_request hook failed")
        resp = HookResponse()

        async def send_and_note(message: dict) -> None:
            t = message.get("type")
            if t == "http.response.start":
                resp.status_code = message.get("status", 0)
                resp.headers = [
                    (bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in message.get("headers", ())
                ]
            elif t == "http.response.body":
                resp.sent += len(message.get("body", b""))
            await send(message)

        try:
            await app(scope, receive, send_and_note)
        finally:
            if resp.status_code == 0:
                # The app raised or returned before starting a response:
                # Skirr answers 500 with this body (rust/src/asgi/http/protocol.rs).
                resp.status_code = 500
                resp.headers = [("content-type", "text/plain; charset=utf-8")]
                resp.sent = len(INTERNAL_ERROR_BODY)
            try:
                cfg.post_request(worker, req, environ(scope, req.headers), resp)
            except Exception:  # noqa: BLE001
                log.exception("post_request hook failed")

    return hooked


def load_error_app(report: str) -> Any:
    """The ASGI app served under ``--reload`` while the code does not
    import: every request gets a 500 carrying ``report`` (the traceback),
    as Gunicorn's own workers answer; lifespan completes, so the worker
    stays up until the reloader sees the fix."""
    body = report.encode("utf-8", "replace")

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8")],
                }
            )
            await send({"type": "http.response.body", "body": body})
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1011})
        elif scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    return app


def _own_listeners(cfg) -> bool:
    """Whether Gunicorn bound this worker's sockets in the worker itself
    (``reuse_port``: ``spawn_worker``), so that they are its alone. Skirr
    then shuts them down when the worker stops accepting, and the kernel
    sends new connections to the other workers' sockets. Sockets given as
    ``fd://N`` are shared even then (each worker wraps the same one)."""
    return (
        bool(cfg.reuse_port)
        and hasattr(socket, "SO_REUSEPORT")
        and not any(isinstance(a, int) for a in cfg.address)
    )


#: The master's recycle lock file, per master pid (see ``_recycle_lock_fd``).
_RECYCLE_LOCKS: dict[int, int] = {}


def _recycle_lock_fd(tmp_dir: str | None) -> int:
    """The descriptor of a file shared by every worker of this master (one
    per master process, created on first use, unlinked at once): workers
    take POSIX record locks on it so that their ``max_requests`` recycles
    never overlap (rust/src/server/recycle.rs). Called in the master, when
    Gunicorn creates a worker object, before the fork."""
    pid = os.getpid()
    fd = _RECYCLE_LOCKS.get(pid)
    if fd is None:
        fd, path = tempfile.mkstemp(prefix="skirr-recycle-", dir=tmp_dir)
        os.unlink(path)
        _RECYCLE_LOCKS[pid] = fd
    return fd


def _preload_uvloop() -> None:
    """Imports uvloop in the master, before the fork, when the workers
    will run it: its code and module objects are then shared by every
    worker (copy-on-write) instead of loaded by each after the fork
    (~1.5 MiB a worker; bench/NOTES.md, entry 63). Missing: the worker
    falls back (``auto``) or fails (``uvloop``) as before."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        pass


class RustWorker(Worker):
    """A Gunicorn worker serving ASGI applications with Skirr's Rust core."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # In the master, before the fork (see `_recycle_lock_fd`); one
        # worker has no one to coordinate with.
        self._recycle_fd = None
        if self.cfg.workers >= 2:
            try:
                self._recycle_fd = _recycle_lock_fd(self.cfg.worker_tmp_dir)
            except OSError as e:
                self.log.warning("skirr: no recycle coordination between workers: %s", e)
        # Gunicorn's master constructs each worker object before forking
        # it: the metrics listener and shared table are made here, once per
        # master (skirr.metrics), and inherited by every worker. A bind
        # failure is reported by the worker as a boot error (exit 3), which
        # stops the master with the message, as other option errors do.
        self._metrics: metrics.Exposition | None = None
        self._metrics_error: str | None = None
        # HTTP/3 under a master: its UDP sockets and lock file, made here
        # once per master and inherited (skirr.h3steer).
        self._h3_steer: tuple | None = None
        try:
            fallback = gunicorn_settings.fallback(self.cfg, self.max_requests)
            early = config.resolve(
                fallback=fallback, only=("metrics_bind", "http3", "http3_port", "loop", "loop_mode")
            )
            if early["loop_mode"] != "single" and early["loop"] != "asyncio":
                _preload_uvloop()
            if early["metrics_bind"]:
                self._metrics = metrics.exposition(early["metrics_bind"], "metrics_bind", self.log)
            if early["http3"]:
                self._h3_steer = h3steer.prepare(
                    self.sockets, early["http3_port"], self.cfg.workers, self.cfg.worker_tmp_dir, self.log
                )
        except config.ConfigError as e:
            self._metrics_error = str(e)

    def load_wsgi(self) -> None:
        # As Gunicorn's base worker and its -k asgi worker: with --reload, a
        # SyntaxError is logged and served as a 500, and the broken file is
        # watched so that fixing it reloads. The base worker's stand-in is
        # a WSGI app, which this worker cannot run, so this one is ASGI.
        try:
            self.wsgi = self.app.wsgi()
        except SyntaxError as e:
            if not self.cfg.reload:
                raise
            self.log.exception(e)
            if self.reloader is not None and e.filename is not None:
                self.reloader.add_extra_file(e.filename)
            gunicorn_dir = os.path.dirname(os.path.realpath(gunicorn.__file__)) + os.sep
            self.wsgi = load_error_app(app_traceback(e, (gunicorn_dir,)))

    def init_signals(self) -> None:
        # Python-level handlers cannot run while the main thread is inside the
        # Rust runtime; Rust registers TERM, INT, QUIT, USR1 and ABRT itself.
        for s in self.SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGWINCH, signal.SIG_IGN)

    def _options(self) -> dict[str, Any]:
        for line in config.misspelt_env():
            self.log.warning("%s", line)
        return config.resolve(fallback=gunicorn_settings.fallback(self.cfg, self.max_requests))

    def _access(self):
        log = self.log
        if not gunicorn_settings.access_log_wanted(log, self.cfg):
            return None  # Gunicorn's logger would drop every line: skip the per-request call

        def access(scope: dict, status: int, headers: Any, size: int, seconds: float) -> None:
            req_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
            resp_headers = [(bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in headers or ()]
            log.access(
                _AccessResponse(status, resp_headers, size),
                _AccessRequest(req_headers),
                environ(scope, req_headers),
                datetime.timedelta(seconds=seconds),
            )

        return access

    def _beat(self) -> None:
        """The heartbeat, on the asyncio loop. Gunicorn's reloader (and
        other code) clears ``self.alive`` to ask the worker to stop."""
        self.notify()
        if not self.alive and self._server is not None:
            self._server.stop()

    def _attach(self, server: Any) -> None:
        self._server = server
        server.set_signal_hook(self._on_signal)

    def _on_signal(self, name: str) -> None:
        """Called from the Rust runtime's thread (the loop may be stuck)."""
        if name == "SIGABRT":
            self.log.error("Worker timed out (pid: %s): SIGABRT", self.pid)
            self.cfg.worker_abort(self)
        else:
            self.cfg.worker_int(self)

    def run(self) -> None:
        problems = gunicorn_settings.check(self.cfg)
        for name, why in problems.inapplicable:
            self.log.warning("skirr: setting %s does not apply: %s", name, why)
        try:
            if problems.errors:
                raise config.ConfigError("; ".join(problems.errors))
            values = self._options()
            if self._metrics_error:
                raise config.ConfigError(self._metrics_error)
            config.check_tls_files(values, config.GUNICORN_NAMES)
            if values.get("http3") and not any(
                getattr(s, "sock", s).family in (socket.AF_INET, socket.AF_INET6) for s in self.sockets
            ):
                # HTTP/3 is served on UDP beside each TCP bind; Unix sockets have none.
                raise config.ConfigError(
                    "skirr_http3 needs a TCP bind (HTTP/3 is served on UDP beside it): every bind is a Unix socket"
                )
        except config.ConfigError as e:
            self.log.error("skirr: %s", e)
            sys.exit(WORKER_BOOT_ERROR)
        try:
            uri = getattr(self.app, "app_uri", None)
            app = as_asgi3(self.wsgi, repr(uri) if uri else "the application")
        except AppLoadError as e:
            self.log.error("skirr: %s", e)
            sys.exit(WORKER_BOOT_ERROR)
        if gunicorn_settings.has_request_hooks(self.cfg):
            app = with_request_hooks(app, self)
        listeners = [(s.sock.fileno(), "unix" if s.sock.family == socket.AF_UNIX else "tcp") for s in self.sockets]
        extra: dict[str, Any] = {}
        if self._recycle_fd is not None and values["max_requests"] > 0:
            extra["recycle_lock_fd"] = self._recycle_fd
        if _own_listeners(self.cfg):
            extra["own_listeners"] = True
        elif self.cfg.workers > 1:
            # Other workers accept on the same socket: a connection this one
            # took during lifespan startup would wait for it.
            extra["accept_during_startup"] = False
        if self._h3_steer is not None:
            extra["http3_steer"] = h3steer.take(self._h3_steer)
        rust = config.rust_config(values, parent_pid=self.ppid, sigint_graceful=False, access_log=True, **extra)
        if self._metrics is not None:
            rust.update(self._metrics.rust_config())
        interval = max(0.5, min(self.timeout / 2.0, 2.0))
        if self.cfg.reload:
            interval = min(interval, 0.5)  # react to the reloader promptly
        self._server = None
        try:
            serve(
                app,
                config=rust,
                listeners=listeners,
                error_logger=self.log.error_log,
                loop_kind=values["loop"],
                access_logger=self._access(),
                reopen_logs=self.log.reopen_files,
                heartbeat=(self._beat, interval),
                on_server=self._attach,
                reserved_signals=GUNICORN_SIGNALS,
            )
        except StartupFailed as e:
            self.log.error("Application startup failed: %s", e)
            sys.exit(WORKER_BOOT_ERROR)
        except (ValueError, TypeError) as e:
            # The Rust core refused a setting (e.g. an unreadable certfile).
            self.log.error("skirr: %s", e)
            sys.exit(WORKER_BOOT_ERROR)
        except OSError as e:
            # A socket the Rust core binds itself (the HTTP/3 UDP port in
            # use or not permitted): every worker would fail alike, so the
            # boot-error status stops the master instead of a respawn loop.
            self.log.error("skirr: %s", e)
            sys.exit(WORKER_BOOT_ERROR)
