"""Interim responses: ``http.response.early_hint`` (ASGI early hints
extension) and Gunicorn's ``http.response.informational``.

``/hint``         two early hints, then (``?hold=1``) waits for ``/release``
                  before the final response.
``/page``         a preload hint for ``/style.css``, then waits (at most 5 s)
                  for the browser to fetch it before answering the HTML that
                  uses it: ``/state`` tells whether the preload came first.
``/info``         Gunicorn-style informational messages: a 100 (dropped: Skirr
                  sends its own), a 103 and a 102 (its Content-Length dropped).
``/many?n=``      ``n`` hints in a row, then the final response.
``/upload``       a hint, then reads the body (``Expect: 100-continue``).
``/big``          4 MiB in one body (for pipelining behind a hint).
``/bad?mode=``    invalid messages; ``/errors`` lists what send() raised.
``/extensions``   the scope's extension names.
``/headers``      the scope's headers, as ``[[name, value], ...]``.
"""

from __future__ import annotations

import asyncio
import json

LINKS = [b"</style.css>; rel=preload; as=style", b"</app.js>; rel=preload; as=script"]
BIG = b"x" * (4 << 20)

state: dict = {"hinted": 0, "style_fetches": 0, "preload_first": None}
errors: list[str] = []
release = asyncio.Event()
style_fetched = asyncio.Event()


async def text(send, body: bytes, ctype: bytes = b"text/plain", status: int = 200, extra=()) -> None:
    headers = [(b"content-type", ctype), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    path = scope["path"]
    query = scope["query_string"].decode()
    if path == "/headers":
        return await text(send, json.dumps([[k.decode(), v.decode()] for k, v in scope["headers"]]).encode())
    if path == "/extensions":
        return await text(send, json.dumps(sorted(scope.get("extensions") or {})).encode())
    if path == "/state":
        return await text(send, json.dumps(state).encode())
    if path == "/errors":
        return await text(send, json.dumps(errors).encode())
    if path == "/release":
        release.set()
        return await text(send, b"released")
    if path == "/big":
        return await text(send, BIG)
    if path == "/hint":
        await send({"type": "http.response.early_hint", "links": LINKS[:1]})
        await send({"type": "http.response.early_hint", "links": LINKS[1:]})
        state["hinted"] += 1
        if "hold=1" in query:
            await asyncio.wait_for(release.wait(), 10)
            release.clear()
        return await text(send, b"final")
    if path == "/many":
        for i in range(int(query.removeprefix("n="))):
            await send({"type": "http.response.early_hint", "links": [b"</%d.js>; rel=preload" % i]})
        return await text(send, b"final")
    if path == "/upload":
        await send({"type": "http.response.early_hint", "links": LINKS[:1]})
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        return await text(send, b"got %d" % len(body))
    if path == "/info":
        await send({"type": "http.response.informational", "status": 100, "headers": []})
        await send(
            {"type": "http.response.informational", "status": 103, "headers": [(b"link", b"</a.css>; rel=preload")]}
        )
        await send({"type": "http.response.informational", "status": 102, "headers": [(b"content-length", b"5")]})
        return await text(send, b"done")
    if path == "/bad":
        message = {
            "late": None,
            "notbytes": {"type": "http.response.early_hint", "links": ["</x>; rel=preload"]},
            "str": {"type": "http.response.early_hint", "links": b"</x>"},
            "crlf": {"type": "http.response.early_hint", "links": [b"</x>\r\nset-cookie: a=b"]},
            "empty": {"type": "http.response.early_hint", "links": [b""]},
            "huge": {"type": "http.response.early_hint", "links": [b"</%d>" % i * 100 for i in range(100)]},
            "nolinks": {"type": "http.response.early_hint"},
            "status101": {"type": "http.response.informational", "status": 101, "headers": []},
            "status200": {"type": "http.response.informational", "status": 200, "headers": []},
        }[query.removeprefix("mode=")]
        try:
            if message is None:
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.early_hint", "links": LINKS})
            else:
                await send(message)
        except (TypeError, RuntimeError) as e:
            errors.append(f"{type(e).__name__}: {e}")
        if message is not None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        return await send({"type": "http.response.body", "body": b"after"})
    if path == "/page":
        if query.startswith("pause="):
            # As an app that looks something up first would: the hint then
            # reaches a browser that is ready for it (see the browser test).
            await asyncio.sleep(float(query.removeprefix("pause=")))
        await send({"type": "http.response.early_hint", "links": LINKS[:1]})
        try:
            await asyncio.wait_for(style_fetched.wait(), 5)
        except asyncio.TimeoutError:
            pass
        state["preload_first"] = style_fetched.is_set()
        html = b'<!doctype html><html><head><link rel="stylesheet" href="/style.css"></head>'
        html += b"<body><p id=p>hi</p></body></html>"
        return await text(send, html, b"text/html; charset=utf-8")
    if path == "/style.css":
        state["style_fetches"] += 1
        style_fetched.set()
        # Cacheable, as a preload must be for the page to reuse it.
        css = b"p { color: rgb(1, 2, 3); }"
        return await text(send, css, b"text/css", extra=[(b"cache-control", b"max-age=60")])
    return await text(send, b"not found", status=404)
