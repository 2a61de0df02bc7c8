"""The app of ``bench/loop_stall.py``: ``/block?secs=N`` blocks the worker's
event loop (``time.sleep`` in an async view, the mistake the watchdog is
for); every other path answers at once with the worker's pid."""

from __future__ import annotations

import os
import time
from urllib.parse import parse_qs


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    if scope["path"] == "/block":
        q = parse_qs(scope["query_string"].decode())
        time.sleep(float(q.get("secs", ["1"])[0]))
    body = str(os.getpid()).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})
