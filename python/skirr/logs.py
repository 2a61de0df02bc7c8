"""Logging for the standalone server (under Gunicorn, Gunicorn's loggers are used).

Two loggers: ``skirr.error`` (server messages, app tracebacks, Rust's log
lines) and ``skirr.access`` (one line per response). Both are plain
:mod:`logging` loggers: configure them like any other.
"""

from __future__ import annotations

import logging
import sys
from typing import Any
from urllib.parse import quote

LEVELS = {
    "critical": logging.CRITICAL,
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "trace": 5,
}

FORMAT = "%(asctime)s [%(process)d] [%(levelname)s] %(message)s"
DATEFMT = "[%Y-%m-%d %H:%M:%S %z]"


def setup(level: str = "info", access: bool = True) -> tuple[logging.Logger, logging.Logger | None]:
    """Configures ``skirr.error`` (stderr) and ``skirr.access`` (stdout)
    unless the application already gave them handlers."""
    logging.addLevelName(5, "TRACE")
    error = logging.getLogger("skirr.error")
    if not error.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter(FORMAT, DATEFMT))
        error.addHandler(h)
        error.propagate = False
    error.setLevel(LEVELS[level])
    if not access:
        return error, None
    acc = logging.getLogger("skirr.access")
    if not acc.handlers:
        h = logging.StreamHandler(sys.stdout)
        h.setFormatter(logging.Formatter("%(asctime)s %(message)s", DATEFMT))
        acc.addHandler(h)
        acc.propagate = False
    acc.setLevel(logging.INFO)
    return error, acc


def client_str(scope: dict[str, Any]) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "-"


def access_logger(log: logging.Logger):
    """An ``access(scope, status, headers, size, seconds)`` callable for the
    Rust core that writes ``client - "METHOD /path?query HTTP/x" status size time``."""

    def access(scope: dict, status: int, headers: Any, size: int, seconds: float) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        qs = scope.get("query_string") or b""
        # The decoded path, percent-encoded again as uvicorn logs it: a CR,
        # LF or NUL in it cannot forge or break a line.
        target = quote(scope["path"]) + ("?" + qs.decode("latin-1") if qs else "")
        log.info(
            '%s - "%s %s HTTP/%s" %d %d %.3fms',
            client_str(scope),
            scope["method"],
            target,
            scope["http_version"] + ".0" if scope["http_version"] in ("2", "3") else scope["http_version"],
            status,
            size,
            seconds * 1000.0,
        )

    return access
