"""An app that takes SIGTERM with ``signal.signal()`` (on the main thread,
where uvicorn and ``loop_mode single`` run it): GET /take installs the
handler, GET /got lists the signals it saw."""

import json
import signal
import threading

got: list[str] = []


def on_term(signum, frame):
    got.append(f"{signal.Signals(signum).name}@{threading.current_thread().name}")


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/take":
        signal.signal(signal.SIGTERM, on_term)
    body = json.dumps(got).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})
