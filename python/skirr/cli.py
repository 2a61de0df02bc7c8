"""``skirr`` / ``python -m skirr``: the standalone server.

    python -m skirr examples.hello:app --port 8000

The same Rust core as the Gunicorn worker, in one process. Options come from
flags, then ``SKIRR_*`` environment variables, then defaults (see
:mod:`skirr.config`). A bad ``APP`` or an address in use prints one line and
exits with status 1; a failed lifespan startup exits with status 3.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import stat
import sys
from collections.abc import Sequence
from typing import Any

from skirr import __version__, config, logs, metrics
from skirr._skirr import StartupFailed
from skirr.asgi import AppLoadError, app_traceback, as_asgi3, import_app
from skirr.serve import serve

EXIT_USAGE = 1
EXIT_STARTUP_FAILED = 3


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, told the terminal width so that it does not
    import `shutil` for it: each `add_argument` builds a formatter, and
    `shutil` (with `bz2` and `lzma`) stayed in every server's memory for
    nothing (~0.6 MiB; bench/NOTES.md, entry 62)."""

    def __init__(self, prog: str, **kw: Any) -> None:
        if kw.get("width") is None:
            # shutil.get_terminal_size's rule: $COLUMNS, stdout's terminal, 80.
            try:
                cols = int(os.environ.get("COLUMNS", "0"))
            except ValueError:
                cols = 0
            if cols <= 0:
                try:
                    cols = os.get_terminal_size(sys.__stdout__.fileno()).columns
                except (AttributeError, ValueError, OSError):
                    cols = 0
            kw["width"] = (cols or 80) - 2
        super().__init__(prog, **kw)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="skirr",
        formatter_class=_Formatter,
        description="Serve an ASGI application with Skirr (standalone, one process).",
    )
    p.add_argument("app", metavar="APP", help="the application, as module:attribute")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8000, help="bind port (default 8000)")
    p.add_argument("--uds", metavar="PATH", help="bind a Unix domain socket instead")
    p.add_argument("--fd", type=int, help="serve on an already listening socket fd")
    p.add_argument("--backlog", type=int, default=2048, help="listen backlog (default 2048)")
    p.add_argument("--factory", action="store_true", help="APP is a factory: call it with no arguments to get the app")
    p.add_argument("--app-dir", default=".", help="directory added to sys.path before importing APP (default .)")
    p.add_argument("--log-level", default="info", choices=list(logs.LEVELS), help="error log level (default info)")
    p.add_argument(
        "--access-log", dest="access_log", action="store_true", default=True, help="log one line per response (default)"
    )
    p.add_argument("--no-access-log", dest="access_log", action="store_false")
    p.add_argument(
        "--timeout-keep-alive",
        dest="keepalive_timeout",
        type=float,
        help="alias of --keepalive-timeout (uvicorn's name)",
    )
    p.add_argument(
        "--http2",
        action="store_true",
        help="serve HTTP/2 too: ALPN h2 on TLS, prior knowledge (h2c) on plain TCP"
        " (as --http-protocols h2,h1 --http2-cleartext prior-knowledge)",
    )
    p.add_argument(
        "--http3",
        action="store_const",
        const=True,
        default=None,
        help="serve HTTP/3 (QUIC) on UDP at the same port too; needs --ssl-certfile/--ssl-keyfile"
        " (default off; env SKIRR_HTTP3=1)",
    )
    p.add_argument("--version", action="version", version=f"skirr {__version__}")
    opts = p.add_argument_group("server options (each also set by SKIRR_<NAME>)")
    for o in config.OPTIONS:
        if o.name == "http3":
            continue  # a switch of its own above (--http3, no value)
        shown = config.shown(o.default)
        opts.add_argument(o.flag, dest=o.name, default=None, help=f"{o.help} (default {shown}; env {o.env})")
    return p


def _port(v: str) -> int:
    try:
        port = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {v!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {port}")
    return port


def _fail(msg: str) -> int:
    print(f"skirr: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def open_listener(args: argparse.Namespace) -> tuple[socket.socket, str, str]:
    """The listening socket, its kind ("tcp"/"unix") and a URL-ish name.

    Raises ``OSError`` with a message naming the address.
    """
    if args.fd is not None:
        sock = socket.socket(fileno=args.fd)
        kind = "unix" if sock.family == socket.AF_UNIX else "tcp"
        return sock, kind, f"fd://{args.fd}"
    if args.uds:
        path = args.uds
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISSOCK(mode):
                os.unlink(path)  # a stale socket from a previous run
            else:
                # bind() would say "Address already in use", which reads as another server.
                what = (
                    "a directory"
                    if stat.S_ISDIR(mode)
                    else "a regular file"
                    if stat.S_ISREG(mode)
                    else "a file that is not a socket"
                )
                raise OSError(
                    errno.EEXIST,
                    f"cannot bind unix:{path}: it is {what}, which Skirr will not replace "
                    "(remove it or choose another path)",
                )
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.listen(args.backlog)
        except OSError as e:
            sock.close()
            raise OSError(e.errno, f"cannot bind unix:{path}: {e.strerror}") from None
        return sock, "unix", f"unix:{path}"
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    host = f"[{args.host}]" if family == socket.AF_INET6 else args.host
    try:
        sock.bind((args.host, args.port))
        sock.listen(args.backlog)
    except OSError as e:
        sock.close()
        reason = "address already in use" if e.errno == errno.EADDRINUSE else e.strerror
        raise OSError(e.errno, f"cannot bind {host}:{args.port}: {reason}") from None
    return sock, "tcp", f"http://{host}:{sock.getsockname()[1]}"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    explicit = {o.name: getattr(args, o.name) for o in config.OPTIONS}
    if args.http2:
        explicit["http_protocols"] = explicit["http_protocols"] or "h2,h1"
        explicit["http2_cleartext"] = explicit["http2_cleartext"] or "prior-knowledge"
    try:
        values = config.resolve(explicit)
        config.check_tls_files(values)
    except config.ConfigError as e:
        return _fail(str(e))
    error_log, access_log = logs.setup(args.log_level, args.access_log)
    for line in config.misspelt_env():
        error_log.warning("%s", line)
    try:
        app = as_asgi3(import_app(args.app, factory=args.factory, app_dir=args.app_dir), repr(args.app))
    except AppLoadError as e:
        if e.cause is None:
            return _fail(str(e))
        if error_log.isEnabledFor(logging.DEBUG):
            print(app_traceback(e.cause), end="", file=sys.stderr)
            return _fail(str(e))
        return _fail(f"{e}; --log-level debug shows the traceback")
    exposition = None
    if values["metrics_bind"]:
        try:
            exposition = metrics.exposition(values["metrics_bind"], "--metrics-bind", error_log)
        except config.ConfigError as e:
            return _fail(str(e))
    try:
        sock, kind, name = open_listener(args)
    except OSError as e:
        return _fail(e.strerror or str(e))
    if values.get("http3") and kind != "tcp":
        # HTTP/3 is served on UDP beside a TCP listener, which a Unix socket is not.
        sock.close()
        if args.uds:
            os.unlink(args.uds)
        return _fail("http3 needs a TCP listener (HTTP/3 is served on UDP beside it): a Unix socket has none")
    h3_at = None
    if values.get("http3"):
        host, port = sock.getsockname()[:2]
        h3_at = f"[{host}]" if sock.family == socket.AF_INET6 else host
        h3_at += f":{values.get('http3_port') or port}"
    if values.get("ssl_certfile") and name.startswith("http://"):
        name = "https://" + name[len("http://") :]
    rust = config.rust_config(values, access_log=access_log is not None, sigint_graceful=True)
    if exposition is not None:
        rust.update(exposition.rust_config())

    def announce(server: Any) -> None:
        # Only once the Rust core has accepted the settings (TLS files
        # included) and lifespan startup has succeeded: a server whose
        # startup fails never listened as far as a reader can tell.
        def ready() -> None:
            error_log.info("Skirr %s listening at %s (pid %d)", __version__, name, os.getpid())
            if h3_at:
                error_log.info("HTTP/3 served on UDP %s", h3_at)

        server.set_ready_hook(ready)

    try:
        serve(
            app,
            config=rust,
            listeners=[(sock.fileno(), kind)],
            error_logger=error_log,
            loop_kind=values["loop"],
            access_logger=logs.access_logger(access_log) if access_log else None,
            on_server=announce,
        )
    except StartupFailed as e:
        error_log.error("Application startup failed: %s", e)
        return EXIT_STARTUP_FAILED
    except (ValueError, TypeError) as e:
        # The Rust core refused a setting (e.g. an unreadable certfile).
        return _fail(str(e))
    except OSError as e:
        # The Rust core could not set up a socket it binds itself (the
        # HTTP/3 UDP port in use or not permitted): a boot error.
        return _fail(str(e))
    finally:
        if kind == "unix" and args.uds:
            try:
                os.unlink(args.uds)
            except OSError:
                pass
        sock.close()
    error_log.info("Shut down (pid %d)", os.getpid())
    return 0
