"""Which servers the framework suite runs against, and starting them.

``SKIRR_FRAMEWORKS_SERVER`` picks them: a comma-separated list of
``standalone`` (``python -m skirr``), ``gunicorn`` (``gunicorn -k
skirr.RustWorker -w 1``) and ``uvicorn`` (the reference). The default is
``standalone,gunicorn``; ``SKIRR_FRAMEWORKS_SERVER=uvicorn`` runs the same
tests against uvicorn, which every test must pass.
"""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness import PY, gunicorn, listening_socket, skirr, start

KINDS = ("standalone", "gunicorn", "uvicorn")


def selected() -> list[str]:
    raw = os.environ.get("SKIRR_FRAMEWORKS_SERVER", "standalone,gunicorn")
    kinds = [k.strip() for k in raw.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"SKIRR_FRAMEWORKS_SERVER={raw!r}: pick from {', '.join(KINDS)}")
    return kinds


@contextmanager
def uvicorn(app: str, *args: str, env: dict | None = None):
    """``python -m uvicorn APP --fd N``: the reference server."""
    sock = listening_socket()
    port = sock.getsockname()[1]
    cmd = [PY, "-m", "uvicorn", app, "--fd", str(sock.fileno()), "--no-access-log", *args]
    server = start(cmd, sock=sock, port=port, uds=None, env=env)
    try:
        yield server
    finally:
        server.stop(timeout=15)


def serve(kind: str, app: str, env: dict | None = None):
    """A context manager serving ``app`` with the server ``kind``."""
    if kind == "standalone":
        return skirr(app, "--no-access-log", env=env)
    if kind == "gunicorn":
        return gunicorn(app, "-w", "1", env=env)
    if kind == "uvicorn":
        return uvicorn(app, env=env)
    raise ValueError(kind)


# ------------------------------------------------------------------ data files

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class DataFile:
    name: str
    size: int
    sha256: str
    path: Path


# ``odd``: over 1 MiB and a multiple of no chunk size a framework uses;
# ``exact``: 5 x 256 KiB, so 64 KiB / 128 KiB / 256 KiB chunkers end on a
# full chunk (sent with more_body=True) followed by an empty final one.
SIZES = {"odd.bin": MIB + 12345, "exact.bin": 5 * 256 * KIB}


def make_data(directory: Path) -> dict[str, DataFile]:
    files = {}
    for name, size in SIZES.items():
        data = os.urandom(size)
        path = directory / name
        path.write_bytes(data)
        files[name] = DataFile(name, size, hashlib.sha256(data).hexdigest(), path)
    return files
