"""Responses for the compression tests; the path picks the shape."""

from __future__ import annotations

import asyncio
import os
from urllib.parse import parse_qs

TEXT = b"The quick brown fox jumps over the lazy dog. " * 100  # 4,500 bytes
GATE: asyncio.Event | None = None


async def app(scope, receive, send):
    global GATE
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            await send({"type": m["type"] + ".complete"})
            if m["type"] == "lifespan.shutdown":
                return
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    path = scope["path"]
    ctype = q.get("type", "text/plain; charset=utf-8").encode()
    headers = [(b"content-type", ctype)]
    if path == "/release":
        if GATE:
            GATE.set()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/whole":
        body = TEXT[: int(q.get("n", len(TEXT)))]
        if q.get("random"):
            body = os.urandom(int(q["random"]))
        if q.get("etag"):
            headers.append((b"etag", q["etag"].encode()))
        if q.get("range"):
            headers.append((b"content-range", f"bytes 0-{len(body) - 1}/{len(TEXT) * 2}".encode()))
        if q.get("encoded"):
            headers.append((b"content-encoding", b"gzip"))
        if q.get("vary"):
            headers.append((b"vary", q["vary"].encode()))
        await send({"type": "http.response.start", "status": int(q.get("status", 200)), "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    if path == "/stream":
        # Two events; the second waits for /release, so the first must
        # reach the client (decodable) on its own.
        GATE = asyncio.Event()
        if q.get("cl"):
            headers.append((b"content-length", b"22"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"data: first event\n\n", "more_body": True})
        await asyncio.wait_for(GATE.wait(), 10)
        await send({"type": "http.response.body", "body": b"ok\n", "more_body": False})
        return
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b"not found"})
