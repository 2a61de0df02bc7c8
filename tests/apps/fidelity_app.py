"""Pure-ASGI app for the fidelity tests: what a framework does on the wire,
written out so each test names the exact message sequence it checks.

Every request records what the app saw (send() outcomes, task facts) under
its `?id=`; `GET /seen?id=X` returns that record as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
from urllib.parse import parse_qs

SEEN: dict[str, dict] = {}
CHUNK = 65536


def _qs(scope) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}


async def _json(send, obj, status=200):
    body = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


async def _text(send, body: bytes):
    headers = [(b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def file_like(scope, receive, send, q, rec):
    """A FileResponse: Content-Length, every chunk with more_body=True, then
    an empty final chunk (Starlette, Django, Quart, Litestar all do this)."""
    size = int(q["size"])
    chunk = int(q.get("chunk", CHUNK))
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(size).encode())]}
    )
    sent = 0
    try:
        while sent < size:
            n = min(chunk, size - sent)
            await send({"type": "http.response.body", "body": b"x" * n, "more_body": True})
            sent += n
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        rec["completed"] = True
    except OSError as e:
        rec["error"] = f"{type(e).__name__}: {e}"


async def two_receivers(scope, receive, send, q, rec):
    """sse-starlette's shape: a listener task waits in receive() for the
    disconnect while the handler polls receive() in a cancelled scope."""
    got: list[str] = []
    assert (await receive())["type"] == "http.request"

    async def listen():
        while True:
            msg = await receive()
            got.append(msg["type"])
            if msg["type"] == "http.disconnect":
                return

    listener = asyncio.ensure_future(listen())
    await asyncio.sleep(0)
    try:
        poll = asyncio.ensure_future(receive())
        await asyncio.sleep(0.05)
        rec["poll_done"] = poll.done()
        if poll.done():
            rec["poll"] = poll.result()["type"] if poll.exception() is None else repr(poll.exception())
        else:
            poll.cancel()
    except Exception as e:  # noqa: BLE001 - recorded for the test
        rec["error"] = f"{type(e).__name__}: {e}"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
    await asyncio.sleep(0.05)
    rec["listener_done"] = listener.done()
    await send({"type": "http.response.body", "body": b"last\n"})
    await asyncio.wait_for(listener, 5)
    rec["listener_got"] = got


async def no_body_status(scope, receive, send, q, rec):
    status = int(q["status"])
    body = q.get("body", "null").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
    rec["completed"] = True


async def cancelled(scope, receive, send, q, rec):
    """Another task cancels the handler's task."""
    me = asyncio.current_task()
    asyncio.get_running_loop().call_later(0.01, me.cancel)
    await asyncio.sleep(5)


FACTORY_CALLS = []


def counting_factory(loop, coro, **kwargs):
    """A task factory as Sentry or OpenTelemetry install one."""
    FACTORY_CALLS.append(getattr(coro, "__qualname__", "?"))
    return asyncio.Task(coro, loop=loop, **kwargs)


async def task_facts(scope, receive, send, q, rec):
    await asyncio.sleep(0)
    me = asyncio.current_task()
    await _json(
        send,
        {
            "is_task": isinstance(me, asyncio.Task),
            "in_all_tasks": me in asyncio.all_tasks(),
            "factory_calls": len(FACTORY_CALLS),
            "name": me.get_name() if me else None,
        },
    )


async def stream_forever(scope, receive, send, q, rec):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    try:
        for _ in range(1000):
            await send({"type": "http.response.body", "body": b"tick\n" * 100, "more_body": True})
            await asyncio.sleep(0.01)
    except OSError:
        rec["gone"] = True
        raise


async def raise_after_start(scope, receive, send, q, rec):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"partial", "more_body": True})
    await asyncio.sleep(0.01)
    raise RuntimeError("boom after start")


async def stream_then_block(scope, receive, send, q, rec):
    """Streams, then blocks the loop: Gunicorn's timeout aborts the worker."""
    import time

    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"first chunk\n", "more_body": True})
    await asyncio.sleep(0.1)
    time.sleep(float(q.get("secs", "30")))


async def conn_header(scope, receive, send, q, rec):
    headers = [(b"content-type", b"text/event-stream"), (b"connection", q["value"].encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def give_up_on_disconnect(scope, receive, send, q, rec):
    """Quart's shape: a listener task ends the request on http.disconnect;
    the handler (slow here) is cancelled and nothing is sent."""

    async def listen():
        while (await receive())["type"] != "http.disconnect":
            pass

    async def handle():
        await asyncio.sleep(5)
        await _text(send, b"too late")

    listener, handler = asyncio.ensure_future(listen()), asyncio.ensure_future(handle())
    done, pending = await asyncio.wait([listener, handler], return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()
    rec["gave_up"] = listener in done


async def slow(scope, receive, send, q, rec):
    await asyncio.sleep(float(q.get("secs", "2")))
    await _text(send, b"late")


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                if os.environ.get("FIDELITY_TASK_FACTORY"):
                    asyncio.get_running_loop().set_task_factory(counting_factory)
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    path = scope["path"]
    if path == "/post":
        size = 0
        while True:
            msg = await receive()
            size += len(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        return await _text(send, str(size).encode())
    q = _qs(scope)
    if path == "/seen":
        return await _json(send, SEEN.get(q.get("id", ""), {}))
    rec = SEEN.setdefault(q.get("id", path), {})
    handler = {
        "/file": file_like,
        "/two-receivers": two_receivers,
        "/no-body-status": no_body_status,
        "/cancelled": cancelled,
        "/task-facts": task_facts,
        "/stream-forever": stream_forever,
        "/raise-after-start": raise_after_start,
        "/slow": slow,
        "/give-up": give_up_on_disconnect,
        "/conn-header": conn_header,
        "/stream-then-block": stream_then_block,
    }[path]
    await handler(scope, receive, send, q, rec)
