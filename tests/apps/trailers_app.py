"""An app for the ``http.response.trailers`` tests; the query picks what
it sends. Errors from ``send()`` are kept for ``/errors``."""

from __future__ import annotations

import json
from urllib.parse import parse_qs

ERRORS: list = []


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            await send({"type": m["type"] + ".complete"})
            if m["type"] == "lifespan.shutdown":
                return
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    if scope["path"] in ("/errors", "/extensions"):
        data = ERRORS if scope["path"] == "/errors" else sorted(scope["extensions"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": json.dumps(data).encode()})
        return
    announce = q.get("announce", "1") == "1"
    headers = [(b"content-type", b"text/plain")]
    if q.get("named", "1") == "1":
        headers.append((b"trailer", b"x-checksum, x-count"))
    await send({"type": "http.response.start", "status": 200, "headers": headers, "trailers": announce})
    await send({"type": "http.response.body", "body": b"hello ", "more_body": True})
    await send({"type": "http.response.body", "body": b"world"})
    if q.get("mode") == "return":
        return  # the announced trailers never come
    try:
        if q.get("mode") == "bad":
            await send({"type": "http.response.trailers", "headers": [(b"content-length", b"5")]})
        await send({"type": "http.response.trailers", "headers": [(b"x-checksum", b"abc")], "more_trailers": True})
        await send({"type": "http.response.trailers", "headers": [(b"x-count", b"2")]})
    except RuntimeError as e:
        ERRORS.append(str(e))
        await send({"type": "http.response.trailers", "headers": []})
