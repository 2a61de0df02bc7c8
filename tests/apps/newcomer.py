"""Apps whose interface (ASGI 3, ASGI 2, WSGI) Skirr must tell apart at boot."""

from __future__ import annotations

import functools


def wsgi_app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"wsgi"]


async def _greet(scope, receive, send, *, word: bytes):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": word})


#: functools.partial of an async function: ASGI 3.
partial_app = functools.partial(_greet, word=b"partial")


class SyncMiddleware:
    """A plain-``def`` middleware returning the wrapped app's coroutine: ASGI 3."""

    def __init__(self, app):
        self.app = app

    def __call__(self, scope, receive, send):
        return self.app(scope, receive, send)


wrapped_app = SyncMiddleware(functools.partial(_greet, word=b"wrapped"))
