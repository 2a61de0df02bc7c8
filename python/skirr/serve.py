"""The process-level core shared by ``python -m skirr`` and the Gunicorn worker.

It creates the asyncio loop (uvloop or asyncio), starts it in its own thread,
and hands the app and listening sockets to the Rust :class:`Server`, which
blocks the calling thread (without the GIL) until the server stops. The
Tokio runtime is built inside that call: after fork, never in a master.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any

from skirr._skirr import Server

LOOP_JOIN_TIMEOUT = 5.0

#: Signals the Rust core handles while serving.
RUST_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1)


def _ignore(signum: int, frame: Any) -> None:
    """Python-level no-op: Rust acts on the signal (see rust/src/server/run.rs)."""


def new_event_loop(kind: str = "auto") -> asyncio.AbstractEventLoop:
    """A new loop: ``uvloop`` (error if missing), ``asyncio``, or ``auto``
    (uvloop when installed)."""
    if kind in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


async def _cancel_everything(server: Server) -> None:
    """Cancels the app's suspended request tasks (Skirr's own task type, not
    listed by ``asyncio.all_tasks``) and every asyncio task it started, and
    waits (bounded) for them to finish."""
    server.cancel_tasks()
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    for t in tasks:
        t.cancel()
    deadline = asyncio.get_running_loop().time() + LOOP_JOIN_TIMEOUT
    while server.pending_tasks or any(not t.done() for t in tasks):
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.01)


def _finish_loop(loop: asyncio.AbstractEventLoop, server: Server, log: logging.Logger) -> None:
    """Cancels what the app left running, then closes the loop."""
    try:
        loop.run_until_complete(_cancel_everything(server))
        loop.run_until_complete(loop.shutdown_asyncgens())
    except Exception:  # noqa: BLE001 - best effort at exit
        log.debug("cleaning up the event loop failed", exc_info=True)
    finally:
        loop.close()


def serve(
    app: Any,
    *,
    config: dict[str, Any],
    listeners: Sequence[tuple[int, str]],
    error_logger: logging.Logger,
    loop_kind: str = "auto",
    access_logger: Callable[..., None] | None = None,
    reopen_logs: Callable[[], None] | None = None,
    heartbeat: tuple[Callable[[], None], float] | None = None,
    on_server: Callable[[Server], None] | None = None,
) -> None:
    """Serves ``app`` (ASGI 3) on ``listeners`` (``[(fd, "tcp"|"unix")]``)
    until a signal or :meth:`Server.stop` ends it.

    ``heartbeat`` is ``(notify, interval_s)``: ``notify()`` runs on the
    asyncio loop every interval, so it stops if an app blocks the loop.

    Raises :class:`skirr.StartupFailed` if lifespan startup fails, and
    ``ValueError``/``TypeError`` for a bad ``config``.
    """
    loop = new_event_loop(loop_kind)
    server = Server(app, loop, config, error_logger, access_logger, reopen_logs)
    loop.add_reader(server.event_fd, server.drain)
    if heartbeat is not None:
        notify, interval = heartbeat

        def beat() -> None:
            try:
                notify()
            finally:
                loop.call_later(interval, beat)

        loop.call_soon(beat)
    thread = threading.Thread(target=_run_loop, args=(loop,), name="skirr-asyncio", daemon=True)
    thread.start()
    if on_server is not None:
        on_server(server)
    # Rust registers its own handlers and chains to these; a no-op here keeps
    # Python from raising KeyboardInterrupt (or exiting) once serve() returns.
    # They are not restored: that would replace Rust's handlers at the OS
    # level, and a second SIGTERM during exit would kill the process.
    for s in RUST_SIGNALS:
        signal.signal(s, _ignore)
    try:
        server.serve(list(listeners))
    finally:
        # One last drain delivers log lines the runtime queued as it stopped.
        loop.call_soon_threadsafe(server.drain)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(LOOP_JOIN_TIMEOUT)
        if not thread.is_alive():
            loop.remove_reader(server.event_fd)
            _finish_loop(loop, server, error_logger)
        else:
            error_logger.warning("the event loop did not stop within %ss", LOOP_JOIN_TIMEOUT)
