"""App for ``bench/recycle_gap.py --mixed``: tests/apps/probe.py's HTTP
routes (``/echo``, ``/stream``, ``/bigbody``, ``/healthz``) plus a
WebSocket echo, under one Gunicorn master."""

from __future__ import annotations

from apps import probe


async def app(scope, receive, send):
    if scope["type"] != "websocket":
        return await probe.app(scope, receive, send)
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    while True:
        m = await receive()
        if m["type"] == "websocket.disconnect":
            return
        await send({"type": "websocket.send", "bytes": m.get("bytes"), "text": m.get("text")})
