"""``metrics_bind``: one Prometheus endpoint for every worker of a process.

The process that forks the workers (Gunicorn's master, which constructs each
``RustWorker`` before forking it; or ``python -m skirr``) calls
:func:`exposition` once: it binds the listener and creates the shared table
(``skirr._skirr.metrics_table``). Each worker inherits both, claims a slot of
the table and serves scrapes on the listener from its Tokio runtime (see
``rust/src/metrics/``), so whichever worker accepts a scrape answers for
all of them.
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass
from typing import Any

from skirr._skirr import metrics_table
from skirr.config import ConfigError, split_host_port


@dataclass(frozen=True)
class Exposition:
    """The bound listener (kept open for the life of the process) and the
    table's descriptor (never closed: closing it would drop this process's
    slot lock)."""

    bind: str
    sock: socket.socket
    table_fd: int

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}/metrics"

    def rust_config(self) -> dict[str, int]:
        """The keys a worker's Rust config needs."""
        return {"metrics_table_fd": self.table_fd, "metrics_fd": self.sock.fileno()}


#: One per (process, bind): Gunicorn constructs a worker object per fork.
_OPEN: dict[tuple[int, str], Exposition] = {}


def exposition(bind: str, setting: str = "metrics_bind", log: Any = None) -> Exposition:
    """The listener for ``bind`` (``HOST:PORT``) and a table, made once per
    process (and announced on ``log`` then). Raises :class:`ConfigError`
    naming ``setting`` when the address cannot be bound (in use, not
    local, permission)."""
    key = (os.getpid(), bind)
    if key in _OPEN:
        return _OPEN[key]
    try:
        host, port = split_host_port(bind)
    except ValueError as e:
        raise ConfigError(f"invalid {setting}: {e}") from None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        reason = "address already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
        raise ConfigError(f"{setting} {bind}: cannot bind: {reason}") from None
    try:
        table = metrics_table()
    except OSError as e:
        sock.close()
        raise ConfigError(f"{setting} {bind}: cannot create the shared metrics table: {e}") from None
    exp = Exposition(bind, sock, table)
    _OPEN[key] = exp
    if log is not None:
        log.info("skirr: Prometheus metrics of every worker at %s", exp.url)
    return exp
