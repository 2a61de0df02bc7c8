"""Apps for the ``http.response.pathsend`` tests: a raw ASGI app whose
query string picks the file and the messages, and a Starlette app serving
``FileResponse`` with every message type it sends recorded."""

from __future__ import annotations

import json
from urllib.parse import parse_qs

SENT: list = []
ERRORS: list = []


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            await send({"type": m["type"] + ".complete"})
            if m["type"] == "lifespan.shutdown":
                return
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    if scope["path"] == "/errors":
        body = json.dumps(ERRORS).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})
        return
    if scope["path"] == "/extensions":
        body = json.dumps(sorted(scope["extensions"])).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})
        return
    headers = [(b"content-type", b"application/octet-stream")]
    if "cl" in q:
        headers.append((b"content-length", q["cl"].encode()))
    await send({"type": "http.response.start", "status": int(q.get("status", 200)), "headers": headers})
    if q.get("body_first"):
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
    try:
        await send({"type": "http.response.pathsend", "path": q["path"]})
    except RuntimeError as e:
        ERRORS.append(str(e))
        if q.get("reraise"):
            raise
        # The start stands: a body that fits what it declared.
        await send({"type": "http.response.body", "body": b"-" * int(q.get("cl", 0)), "more_body": False})


def starlette_app():
    from starlette.applications import Starlette
    from starlette.responses import FileResponse, JSONResponse
    from starlette.routing import Route

    async def file(request):
        return FileResponse(request.query_params["path"])

    async def sent(request):
        return JSONResponse(SENT)

    inner = Starlette(routes=[Route("/file", file), Route("/sent", sent)])

    async def recording(scope, receive, send):
        async def rec(message):
            SENT.append(message["type"])
            await send(message)

        await inner(scope, receive, rec)

    return recording


starlette = starlette_app()
