"""Small applications for loading and protocol-version tests."""

from __future__ import annotations


class ASGI2App:
    """An ASGI 2 (double-callable) application."""

    def __init__(self, scope):
        self.scope = scope

    async def __call__(self, receive, send):
        if self.scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"asgi2 " + self.scope["path"].encode()})


def asgi2_function(scope):
    async def instance(receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"asgi2-function"})

    return instance


def create_app():
    """A factory (``--factory``)."""

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"from factory"})

    return app


not_callable = 42

broken_factory_calls = 0


def broken_factory():
    raise ValueError("factory cannot start")


class Middleware:
    """An ASGI 3 class-instance app (async __call__)."""

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"instance"})


instance_app = Middleware()
