"""The process-level core shared by ``python -m skirr`` and the Gunicorn worker.

It creates the asyncio loop (uvloop or asyncio) and hands the app and
listening sockets to the Rust :class:`Server`. The Tokio runtime is built
then: after fork, never in a master. Two shapes (``loop_mode``):

``auto`` (the default) is ``single`` unless the loop is uvloop.

* ``dual``: the loop runs in its own thread, and ``Server.serve``
  blocks the calling thread (without the GIL), running Tokio, until the
  server stops.
* ``single``: one thread does the work. The loop is asyncio's
  ``SelectorEventLoop`` with a :class:`TokioSelector`, whose ``select()`` runs
  the Tokio runtime (``Server.turn``) until a Python fd is ready, requests
  wait for the app, or the timeout passes; a stand-in thread runs the
  runtime while the app keeps this thread away from ``select()``
  (rust/src/server/single.rs).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import importlib.util
import inspect
import logging
import os
import selectors
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from skirr._skirr import Server

LOOP_JOIN_TIMEOUT = 5.0

#: How often the event-loop lag probe runs (seconds), when metrics are on.
LOOP_LAG_INTERVAL = 0.5

#: Signals the Rust core handles while serving.
RUST_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1)

#: Signals Skirr acts on itself (rust/src/server/run.rs), and what for: an
#: app cannot take them with ``loop.add_signal_handler()``.
SKIRR_SIGNALS: dict[int, str] = {
    signal.SIGTERM: "graceful shutdown",
    signal.SIGINT: "shutdown",
    signal.SIGQUIT: "quick shutdown",
    signal.SIGUSR1: "reopening log files",
    signal.SIGABRT: "Gunicorn's worker timeout",
}

#: Also Skirr's under Gunicorn, which gives them a meaning (its master's
#: signals; its workers ignore WINCH).
GUNICORN_SIGNALS: dict[int, str] = {
    signal.SIGHUP: "Gunicorn's reload; send it to the master",
    signal.SIGTTIN: "Gunicorn's one more worker; send it to the master",
    signal.SIGTTOU: "Gunicorn's one worker fewer; send it to the master",
    signal.SIGWINCH: "ignored by Gunicorn's workers",
    signal.SIGCHLD: "Gunicorn's worker supervision",
}

_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)


def _ignore(signum: int, frame: Any) -> None:
    """Python-level no-op: Rust acts on the signal (see rust/src/server/run.rs)."""


def _check_signal(sig: Any) -> int:
    """As asyncio: ``TypeError`` for a non-int, ``ValueError`` out of range."""
    if not isinstance(sig, int):
        raise TypeError(f"sig must be an int, not {sig!r}")
    if sig not in signal.valid_signals():
        raise ValueError(f"sig {sig} out of range(1, {signal.NSIG})")
    return int(sig)


def _name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class SignalForwarder:
    """The app's ``loop.add_signal_handler()`` callbacks on Skirr's loop.

    The loop runs in a thread, where Python cannot install signal handlers;
    the Rust core catches the signal instead (``Server.forward_signal``) and
    each delivery calls :meth:`dispatch` on the loop, which schedules the
    callback with ``call_soon`` (in the context of the registration, as
    asyncio does). ``reserved`` maps the signals Skirr keeps to why.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, server: Server, reserved: Mapping[int, str]) -> None:
        self._loop = loop
        self._server = server
        self._reserved = dict(reserved)
        self._handlers: dict[int, tuple[Callable[..., Any], tuple, contextvars.Context]] = {}
        self._caught: set[int] = set()

    def add(self, sig: Any, callback: Callable[..., Any], args: tuple) -> None:
        if asyncio.iscoroutine(callback) or inspect.iscoroutinefunction(callback):
            raise TypeError("coroutines cannot be used with add_signal_handler()")
        sig = _check_signal(sig)
        why = self._reserved.get(sig)
        if why is not None:
            raise RuntimeError(
                f"{_name(sig)} is Skirr's ({why}): loop.add_signal_handler() cannot take it; "
                f"other signals (e.g. SIGUSR2) are forwarded to the loop"
            )
        if sig in _UNCATCHABLE:
            raise RuntimeError(f"sig {sig} cannot be caught")
        if sig not in self._caught:
            try:
                self._server.forward_signal(sig)
            except ValueError as e:
                raise RuntimeError(f"{_name(sig)}: {e}") from None
            self._caught.add(sig)
        self._handlers[sig] = (callback, args, contextvars.copy_context())

    def remove(self, sig: Any) -> bool:
        """Whether a handler was removed. The process keeps catching the
        signal (Tokio cannot uninstall a handler): it is ignored from then on."""
        return self._handlers.pop(_check_signal(sig), None) is not None

    def dispatch(self, sig: int) -> None:
        """On the loop's thread, from ``Server.drain``."""
        h = self._handlers.get(sig)
        if h is not None:
            callback, args, ctx = h
            self._loop.call_soon(callback, *args, context=ctx)


class _ForwardedSignals:
    """Mixed into Skirr's loop class: ``add_signal_handler`` and
    ``remove_signal_handler`` go to its :class:`SignalForwarder` while the
    server runs (the loop's own versions only work in the main thread)."""

    _skirr_signals: SignalForwarder | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.__dict__["_skirr_task_factory"] = self.get_task_factory()  # type: ignore[attr-defined]

    def set_task_factory(self, factory: Any) -> None:
        super().set_task_factory(factory)  # type: ignore[misc]
        # Mirrored in the instance dict, where the server reads it for each
        # request with one dict lookup (uvloop keeps its own where only a
        # method call reaches it).
        self.__dict__["_skirr_task_factory"] = factory

    def add_signal_handler(self, sig: int, callback: Callable[..., Any], *args: Any) -> None:
        if self._skirr_signals is None:
            return super().add_signal_handler(sig, callback, *args)  # type: ignore[misc]
        self._skirr_signals.add(sig, callback, args)

    def remove_signal_handler(self, sig: int) -> bool:
        if self._skirr_signals is None:
            return super().remove_signal_handler(sig)  # type: ignore[misc]
        return self._skirr_signals.remove(sig)


@functools.cache
def _loop_class(base: type) -> type:
    return type(base.__name__, (_ForwardedSignals, base), {"__module__": __name__})


def new_event_loop(kind: str = "auto") -> asyncio.AbstractEventLoop:
    """A new loop: ``uvloop`` (error if missing), ``asyncio``, or ``auto``
    (uvloop when installed); either with signal forwarding (see
    :class:`SignalForwarder`)."""
    if kind in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise
        else:
            return _loop_class(uvloop.Loop)()
    return _loop_class(asyncio.SelectorEventLoop)()


class TokioSelector(selectors.EpollSelector):
    """The selector of single mode: an epoll selector whose ``select()``
    runs the server's Tokio runtime while it waits (``Server.turn``). The
    turn ends when the epoll fd is readable (Python's epoll is then read
    without waiting), when requests wait for the app (``Server.drain`` runs
    inside the turn: their tasks are stepped there), or at the timeout.
    Without a server attached (before ``start``, after ``finish``) it is a
    plain ``EpollSelector``."""

    def __init__(self) -> None:
        super().__init__()
        self._turn: Callable[[int, float | None], int] | None = None
        self._on_finished: Callable[[], None] = lambda: None
        #: The last read of the epoll returned events: read it again before
        #: waiting (a level-triggered fd its callback did not drain stays
        #: ready without a new edge for Tokio's reactor).
        self._again = False

    def attach(self, server: Server, on_finished: Callable[[], None]) -> None:
        self._turn = server.turn
        self._on_finished = on_finished

    def detach(self) -> None:
        self._turn = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        turn = self._turn
        if turn is None:
            return super().select(timeout)
        ready = super().select(0) if self._again else []
        flags = turn(self._selector.fileno(), 0 if ready else timeout)  # type: ignore[attr-defined]
        if flags & 2 and not ready:
            ready = super().select(0)
        self._again = bool(ready)
        if flags & 4:
            self._turn = None
            self._on_finished()
        return ready


def _uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def _single_mode(config: dict[str, Any], loop_kind: str, log: logging.Logger) -> bool:
    """Whether to run single mode. ``auto`` (the default) runs it unless the
    loop is uvloop (``loop`` uvloop, or auto with uvloop installed), whose
    loop has no selector to run Tokio from; ``single`` asked for and not to
    be had warns (one line); ``auto`` that runs dual because of
    ``tokio_threads`` says so (one info line: the user asked for threads)."""
    mode = config.get("loop_mode", "auto")
    if mode == "dual":
        return False
    threads = int(config.get("tokio_threads", 1))
    if mode == "auto":
        if not (loop_kind == "asyncio" or (loop_kind == "auto" and not _uvloop_installed())):
            return False
        if threads > 1:
            log.info("skirr: tokio_threads %d runs Tokio on threads of its own: running loop_mode dual", threads)
            return False
        return True
    if loop_kind == "uvloop":
        log.warning("skirr: loop_mode single needs asyncio's loop, not uvloop: running loop_mode dual")
        return False
    if threads > 1:
        log.warning("skirr: loop_mode single runs one thread, tokio_threads > 1: running loop_mode dual")
        return False
    return True


def _probe_loop_lag(loop: asyncio.AbstractEventLoop, server: Server) -> None:
    """A timer on the loop that reports how late it runs
    (``skirr_event_loop_lag_seconds``); the Rust side also reports a probe
    that is overdue, which is how a blocked loop shows."""
    due = loop.time() + LOOP_LAG_INTERVAL

    def probe() -> None:
        nonlocal due
        now = loop.time()
        server.loop_lag(max(0.0, now - due), LOOP_LAG_INTERVAL)
        due = now + LOOP_LAG_INTERVAL
        loop.call_at(due, probe)

    loop.call_at(due, probe)


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
    reserved_signals: Mapping[int, str] | None = None,
) -> None:
    """Serves ``app`` (ASGI 3) on ``listeners`` (``[(fd, "tcp"|"unix")]``)
    until a signal or :meth:`Server.stop` ends it.

    ``heartbeat`` is ``(notify, interval_s)``: ``notify()`` runs on the
    asyncio loop every interval, so it stops if an app blocks the loop.

    ``loop.add_signal_handler()`` works for signals other than
    :data:`SKIRR_SIGNALS` and ``reserved_signals`` (see
    :class:`SignalForwarder`).

    Raises :class:`skirr.StartupFailed` if lifespan startup fails, and
    ``ValueError``/``TypeError`` for a bad ``config``.
    """
    single = _single_mode(config, loop_kind, error_logger)
    selector = None
    if single:
        config = {**config, "loop_mode": "single"}
        selector = TokioSelector()
        loop: asyncio.AbstractEventLoop = _loop_class(asyncio.SelectorEventLoop)(selector)
    else:
        config = {**config, "loop_mode": "dual"}
        loop = new_event_loop(loop_kind)
    server = Server(app, loop, config, error_logger, access_logger, reopen_logs)
    forwarder = SignalForwarder(loop, server, {**SKIRR_SIGNALS, **(reserved_signals or {})})
    server.set_signal_dispatch(forwarder.dispatch)
    if isinstance(loop, _ForwardedSignals):
        loop._skirr_signals = forwarder
    loop.add_reader(server.event_fd, server.drain)
    if server.metrics_worker is not None:
        _probe_loop_lag(loop, server)
    if heartbeat is not None:
        notify, interval = heartbeat

        def beat() -> None:
            try:
                notify()
            finally:
                loop.call_later(interval, beat)

        loop.call_soon(beat)
    tick = server.loop_tick_interval
    if tick is not None:
        # The loop watchdog's stamp (rust/src/server/watchdog.rs): a timer
        # that runs late is a loop that does not turn.
        def turned() -> None:
            server.loop_turned()
            loop.call_later(tick, turned)

        loop.call_soon(turned)
    if selector is not None:
        return _serve_single(loop, selector, server, listeners, on_server, error_logger)
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
            server.write_queued_logs()
            error_logger.warning(
                "the event loop did not stop within %gs of the server's end (the app blocks its thread): exiting",
                LOOP_JOIN_TIMEOUT,
            )
            _exit_now()


def _exit_now() -> NoReturn:
    """Ends the process at once with status 0, as rust/src/server/give_up.rs
    does: an interpreter shutdown would run ``atexit`` handlers under the
    loop's thread, still inside the app, and unwind that thread through the
    extension's frames (an abort)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _serve_single(
    loop: asyncio.AbstractEventLoop,
    selector: TokioSelector,
    server: Server,
    listeners: Sequence[tuple[int, str]],
    on_server: Callable[[Server], None] | None,
    log: logging.Logger,
) -> None:
    """Single mode: the loop runs on this thread and Tokio inside its
    selector, until the server's main task ends."""
    asyncio.set_event_loop(loop)
    selector.attach(server, loop.stop)
    if on_server is not None:
        on_server(server)
    for s in RUST_SIGNALS:
        signal.signal(s, _ignore)

    def abort(signum: int, frame: Any) -> None:
        # Gunicorn's timeout while the app blocks the loop: Python runs this
        # at its next bytecode (a blocking sleep is interrupted), and Tokio's
        # own SIGABRT task runs on the stand-in thread; the hook runs once.
        server.call_signal_hook("SIGABRT")
        os._exit(1)

    # Before start(): Tokio's handler chains to this one.
    signal.signal(signal.SIGABRT, abort)
    server.start(list(listeners))
    try:
        loop.run_forever()
    finally:
        selector.detach()
        try:
            server.finish()
        finally:
            # Log lines the runtime queued as it stopped.
            server.drain()
            loop.remove_reader(server.event_fd)
            _finish_loop(loop, server, log)
            asyncio.set_event_loop(None)
