"""A page with 50 subresources for the HTTP/2 browser test: 20 images, 15
scripts and 15 fetch() calls, each answered after a short sleep so they are
in flight together. Every request is recorded under the page's token
(``?t=``): its path, ``http_version``, scheme and client address, and how
many of the token's requests were in progress at once; ``GET
/seen?t=TOKEN`` returns the record (the page fetches it on its own
connection, so under Gunicorn it reaches the same worker)."""

from __future__ import annotations

import asyncio
import base64
import json
from urllib.parse import parse_qs

IMAGES, SCRIPTS, FETCHES = 20, 15, 15
DELAY = 0.3
# A 1x1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
SEEN: dict[str, dict] = {}


def page(t: str) -> bytes:
    imgs = "".join(f'<img id="i{i}" src="/img/{i}.png?t={t}" width="1" height="1">' for i in range(IMAGES))
    scripts = "".join(f'<script async src="/js/{i}.js?t={t}"></script>' for i in range(SCRIPTS))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>h2 page</title><link rel="icon" href="data:,">
<script>
window.ran = [];
window.fetched = Promise.all(Array.from({{length: {FETCHES}}}, (_, i) =>
  fetch("/data/" + i + "?t={t}").then(r => r.json()).then(j => j.n === i ? "ok" : "wrong " + JSON.stringify(j),
                                                        e => "failed " + e)));
</script>
{scripts}
</head><body>{imgs}</body></html>""".encode()


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            await send({"type": m["type"] + ".complete"})
            if m["type"] == "lifespan.shutdown":
                return
    path = scope["path"]
    t = parse_qs(scope["query_string"].decode()).get("t", [""])[0]
    if path == "/healthz":
        return await respond(send, b"text/plain", b"ok")
    if path == "/":
        return await respond(send, b"text/html; charset=utf-8", page(t))
    if path == "/seen":
        return await respond(send, b"application/json", json.dumps(SEEN.get(t, {})).encode())
    rec = SEEN.setdefault(t, {"requests": [], "active": 0, "max_active": 0})
    rec["requests"].append(
        {"path": path, "http_version": scope["http_version"], "scheme": scope["scheme"], "client": scope["client"]}
    )
    rec["active"] += 1
    rec["max_active"] = max(rec["max_active"], rec["active"])
    try:
        await asyncio.sleep(DELAY)
    finally:
        rec["active"] -= 1
    name = path.rsplit("/", 1)[-1]
    if path.startswith("/img/"):
        return await respond(send, b"image/png", PNG)
    if path.startswith("/js/"):
        n = int(name.split(".")[0])
        return await respond(send, b"text/javascript", f"window.ran.push({n});".encode())
    if path.startswith("/data/"):
        return await respond(send, b"application/json", json.dumps({"n": int(name)}).encode())
    return await respond(send, b"text/plain", b"not found", 404)


async def respond(send, content_type: bytes, body: bytes, status: int = 200):
    headers = [(b"content-type", content_type), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
