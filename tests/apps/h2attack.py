"""A pure-ASGI app for the HTTP/2 attack and conformance tests.

It counts how often each path was called (``GET /calls``) and records what
the app saw when a response was cut off (``GET /events``), so a test can
check from outside how many requests reached the app and how they ended.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from urllib.parse import parse_qs

CALLS: Counter = Counter()
EVENTS: list = []


async def respond(send, body: bytes, status: int = 200, content_type: bytes = b"text/plain") -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]})
    await send({"type": "http.response.body", "body": body})


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif m["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    path = scope["path"]
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    CALLS[path] += 1
    if path in ("/", "/healthz"):
        return await respond(send, b"ok")
    if path == "/calls":
        return await respond(send, json.dumps(CALLS).encode(), content_type=b"application/json")
    if path == "/events":
        return await respond(send, json.dumps(EVENTS).encode(), content_type=b"application/json")
    if path == "/slow":
        # Holds the stream open a while (a Rapid Reset target).
        await asyncio.sleep(float(q.get("secs", "0.5")))
        return await respond(send, b"slow")
    if path == "/big":
        # Streams `n` bytes in `chunk`-byte messages; records how it ended.
        n, chunk, tag = int(q.get("n", "1048576")), int(q.get("chunk", "65536")), q.get("tag")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        sent = 0
        try:
            while sent < n:
                size = min(chunk, n - sent)
                await send({"type": "http.response.body", "body": b"b" * size, "more_body": True})
                sent += size
            await send({"type": "http.response.body", "body": b""})
        except OSError as e:
            EVENTS.append({"big": type(e).__name__, "tag": tag, "sent": sent})
            m = await receive()
            EVENTS.append({"receive": m["type"], "tag": tag})
            return
        EVENTS.append({"big": "done", "tag": tag, "sent": sent})
        return
    if path == "/upload":
        total = messages = 0
        while True:
            m = await receive()
            if m["type"] == "http.disconnect":
                EVENTS.append({"upload": "disconnect", "bytes": total})
                return
            total += len(m["body"])
            messages += 1
            if not m.get("more_body"):
                break
        body = json.dumps({"bytes": total, "messages": messages}).encode()
        return await respond(send, body, content_type=b"application/json")
    return await respond(send, b"not found", status=404)
