"""The soak test's app (pure ASGI): every kind of traffic on one worker.

GET  /        -> "ok"
POST /        -> reads the whole body, answers its length
GET  /stream  -> 20 chunks 5 ms apart, then "last"
WS   /ws      -> echo
"""

import asyncio

from bench.apps import TEXT, _lifespan, ws_echo


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        return await _lifespan(receive, send)
    if scope["type"] == "websocket":
        return await ws_echo(scope, receive, send)
    if scope["method"] == "POST":
        size = 0
        while True:
            m = await receive()
            if m["type"] == "http.disconnect":
                return
            size += len(m.get("body", b""))
            if not m.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": TEXT})
        await send({"type": "http.response.body", "body": str(size).encode()})
        return
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": TEXT})
        try:
            for i in range(20):
                await send({"type": "http.response.body", "body": b"chunk %d\n" % i, "more_body": True})
                await asyncio.sleep(0.005)
            await send({"type": "http.response.body", "body": b"last\n"})
        except OSError:
            pass  # the client left mid-stream
        return
    await send({"type": "http.response.start", "status": 200, "headers": TEXT})
    await send({"type": "http.response.body", "body": b"ok"})
