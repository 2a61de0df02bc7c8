"""HTTP/3 packet steering under a Gunicorn master: the master's part.

Before the first fork, the master binds K UDP sockets per HTTP/3 address
(K = max(2 × workers + 2, 4), at most 255: every worker and its
replacement during a HUP, and some slack) in one ``SO_REUSEPORT`` group,
in order, and keeps them open for its life, so that each socket's index in
the kernel's group is its bind order for good. It also creates a lock
file (unlinked at once). Every worker inherits both; its Rust core claims
a slot, serves that slot's socket and keeps the group's BPF program up to
date (rust/src/proto/h3/steer.rs). If the kernel refuses the program, the
master logs one warning naming why, closes its sockets, and the workers
bind their own as without a master (the kernel hashes packets by address).
"""

from __future__ import annotations

import os
import socket
import tempfile
from typing import Any

#: Per master pid and UDP address: the group's sockets (kept open); per
#: master pid: the lock file's descriptor. ``None``: steering refused.
_GROUPS: dict[tuple[int, tuple[str, int]], list[socket.socket] | None] = {}
_LOCKS: dict[int, int] = {}


def group_size(workers: int) -> int:
    """K, the sockets per address for ``workers`` workers."""
    return min(max(2 * workers + 2, 4), 255)


def _bind_group(family: int, addr: tuple, k: int) -> list[socket.socket]:
    socks = []
    try:
        for _ in range(k):
            s = socket.socket(family, socket.SOCK_DGRAM)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(addr)
            s.setblocking(False)
        from skirr._skirr import h3_steer_check

        h3_steer_check(socks[0].fileno())
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks


def prepare(listeners: list[Any], port: int, workers: int, tmp_dir: str | None, log: Any) -> tuple | None:
    """In the master: the ``http3_steer`` value for the workers, ``(lock
    fd, [[socket, ...] per address])``, or ``None`` (no TCP listener, or the
    kernel refused: then one warning line). ``listeners``: Gunicorn's
    (``.sock``); ``port``: ``http3_port`` (0: each listener's)."""
    pid = os.getpid()
    k = group_size(workers)
    groups = []
    for lst in listeners:
        sock = getattr(lst, "sock", lst)
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            continue
        host, tcp_port = sock.getsockname()[:2]
        addr = (host, port or tcp_port)
        key = (pid, addr)
        if key not in _GROUPS:
            try:
                _GROUPS[key] = _bind_group(sock.family, addr, k)
            except OSError as e:
                _GROUPS[key] = None
                log.warning(
                    "skirr: HTTP/3 packets are not steered to the worker that owns their connection "
                    "(kernel address hash instead: a worker restart can break connections): %s",
                    e,
                )
        if _GROUPS[key] is None:
            return None
        groups.append(_GROUPS[key])
    if not groups:
        return None
    if pid not in _LOCKS:
        fd, path = tempfile.mkstemp(prefix="skirr-h3-", dir=tmp_dir)
        os.unlink(path)
        _LOCKS[pid] = fd
    return (_LOCKS[pid], groups)


def take(prepared: tuple) -> tuple[int, list[list[int]]]:
    """In the worker, after the fork: the value for the Rust core, which
    owns the descriptors from now on (detached from their Python objects,
    so that Python never closes them). Call once."""
    lock_fd, groups = prepared
    return (lock_fd, [[s.detach() for s in g] for g in groups])
