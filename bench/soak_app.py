"""The soak test's app (pure ASGI): every kind of traffic on one worker.

GET  /        -> "ok"
POST /        -> reads the whole body, answers its length
GET  /stream  -> 20 chunks 5 ms apart, then "last"
WS   /ws      -> echo
"""

import asyncio

TEXT = [(b"content-type", b"text/plain")]


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
        if (await receive())["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        while True:
            m = await receive()
            if m["type"] == "websocket.disconnect":
                return
            if m.get("text") is not None:
                await send({"type": "websocket.send", "text": m["text"]})
            else:
                await send({"type": "websocket.send", "bytes": m["bytes"]})
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
