"""An app that registers signal handlers with ``loop.add_signal_handler()``
in lifespan startup; ``/signals`` tells what it got."""

from __future__ import annotations

import asyncio
import json
import signal
import threading

#: One entry per handler run: the thread it ran on.
GOT: list[str] = []
#: What each registration attempt gave: "ok" or "ExceptionType: message".
RESULTS: dict[str, str] = {}


def on_usr2(tag: str) -> None:
    GOT.append(f"{tag}@{threading.current_thread().name}")


def attempt(name: str, fn) -> None:
    try:
        fn()
        RESULTS[name] = "ok"
    except Exception as e:  # noqa: BLE001 - the test reads what happened
        RESULTS[name] = f"{type(e).__name__}: {e}"


async def app(scope, receive, send):
    loop = asyncio.get_running_loop()
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                loop.add_signal_handler(signal.SIGUSR2, on_usr2, "usr2")
                attempt("SIGTERM", lambda: loop.add_signal_handler(signal.SIGTERM, on_usr2, "term"))
                attempt("SIGUSR1", lambda: loop.add_signal_handler(signal.SIGUSR1, on_usr2, "usr1"))
                attempt("SIGHUP", lambda: loop.add_signal_handler(signal.SIGHUP, on_usr2, "hup"))
                attempt("SIGKILL", lambda: loop.add_signal_handler(signal.SIGKILL, on_usr2, "kill"))
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    if scope["path"] == "/remove":
        body = json.dumps(loop.remove_signal_handler(signal.SIGUSR2)).encode()
    else:
        body = json.dumps({"got": GOT, "results": RESULTS}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})
