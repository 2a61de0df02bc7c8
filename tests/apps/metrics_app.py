"""App for tests/test_metrics.py: plain answers, a status of choice, a
request that holds the event loop (and the GIL) busy, a slow one, and a
WebSocket echo."""

from __future__ import annotations

import asyncio
import time


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while True:
            m = await receive()
            if m["type"] == "websocket.disconnect":
                return
            await send({"type": "websocket.send", "text": m.get("text") or ""})
    path = scope["path"]
    more = True
    while more:
        m = await receive()
        more = m.get("more_body", False)
    status = 200
    if path.startswith("/status/"):
        status = int(path.rsplit("/", 1)[1])
    elif path == "/busy":
        # Holds the loop (and the GIL, but for the interpreter's switches)
        # for 1.5 s.
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            pass
    elif path == "/slow":
        await asyncio.sleep(1.5)
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
