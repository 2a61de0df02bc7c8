"""Replays ASGI messages chosen by a test: ``POST /replay`` with a JSON list
of messages (bytes written as ``{"__bytes__": "<latin-1>"}``); every
``send()`` outcome is kept and served by ``GET /last``."""

from __future__ import annotations

import json

LAST: list = []


def decode(v):
    if isinstance(v, dict):
        if set(v) == {"__bytes__"}:
            return v["__bytes__"].encode("latin-1")
        return {k: decode(x) for k, x in v.items()}
    if isinstance(v, list):
        return [decode(x) for x in v]
    return v


async def read_all(receive) -> bytes:
    body = b""
    while True:
        m = await receive()
        if m["type"] != "http.request":
            return body
        body += m.get("body", b"")
        if not m.get("more_body"):
            return body


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/last":
        body = json.dumps(LAST).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})
        return
    if scope["path"] == "/":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    messages = decode(json.loads(await read_all(receive)))
    LAST.clear()
    for m in messages:
        try:
            await send(m)
            LAST.append("ok")
        except Exception as e:  # noqa: BLE001 - the test checks which kinds
            LAST.append(type(e).__name__ + ": " + str(e)[:200])
