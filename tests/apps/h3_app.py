"""An app for the HTTP/3 tests: its own ``alt-svc`` field (never
overridden by the server's), and a large streamed response."""

from __future__ import annotations

from urllib.parse import parse_qs


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            await send({"type": m["type"] + ".complete"})
            if m["type"] == "lifespan.shutdown":
                return
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    if scope["path"] == "/own-alt-svc":
        headers = [(b"alt-svc", b"clear")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"own"})
        return
    if scope["path"] == "/stream":
        # `n` chunks of 64 KiB, each awaited: backpressure reaches the app.
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(int(q.get("n", "32"))):
            await send({"type": "http.response.body", "body": bytes([65 + i % 26]) * 65536, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})
