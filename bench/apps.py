"""The benchmark's applications: identical pure-ASGI apps for every server.

raw_get       GET  -> 200 "Hello, world!" (13 bytes)
get_64k       GET  -> 200, 65,536-byte body
post_4k       POST -> reads the whole body, answers its length
stream        GET  -> first chunk, 50 ms sleep, last chunk
"""

import asyncio

HELLO = b"Hello, world!"
BIG = b"x" * 65536
TEXT = [(b"content-type", b"text/plain")]


async def _lifespan(receive, send):
    while True:
        m = await receive()
        if m["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif m["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def raw_get(scope, receive, send):
    if scope["type"] != "http":
        return await _lifespan(receive, send)
    await send({"type": "http.response.start", "status": 200, "headers": TEXT})
    await send({"type": "http.response.body", "body": HELLO})


async def get_64k(scope, receive, send):
    if scope["type"] != "http":
        return await _lifespan(receive, send)
    await send({"type": "http.response.start", "status": 200, "headers": TEXT})
    await send({"type": "http.response.body", "body": BIG})


async def post_4k(scope, receive, send):
    if scope["type"] != "http":
        return await _lifespan(receive, send)
    size = 0
    while True:
        m = await receive()
        size += len(m.get("body", b""))
        if not m.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": TEXT})
    await send({"type": "http.response.body", "body": str(size).encode()})


async def stream(scope, receive, send):
    if scope["type"] != "http":
        return await _lifespan(receive, send)
    await send({"type": "http.response.start", "status": 200, "headers": TEXT})
    await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
    await asyncio.sleep(0.05)
    await send({"type": "http.response.body", "body": b"last\n"})


async def ws_echo(scope, receive, send):
    """ws_echo: a WebSocket echo; HTTP requests get a plain 200."""
    if scope["type"] == "lifespan":
        return await _lifespan(receive, send)
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": TEXT})
        await send({"type": "http.response.body", "body": b"ws"})
        return
    await receive()
    await send({"type": "websocket.accept"})
    while True:
        m = await receive()
        if m["type"] == "websocket.disconnect":
            return
        if m.get("text") is not None:
            await send({"type": "websocket.send", "text": m["text"]})
        else:
            await send({"type": "websocket.send", "bytes": m["bytes"]})
