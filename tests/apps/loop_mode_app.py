"""An app for tests/test_loop_mode.py: where it runs (thread, loop,
selector), streaming, WebSocket echo, contextvars, a task factory, a thread
pool, and sleeping or blocking for Gunicorn's timeout."""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import re
import threading
import time

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
factory_calls = 0


def counting_factory(loop, coro, **kwargs):
    global factory_calls
    factory_calls += 1
    return asyncio.Task(coro, loop=loop, **kwargs)


async def text(send, body: bytes, status: int = 200) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


async def websocket(scope, receive, send) -> None:
    await receive()
    await send({"type": "websocket.accept"})
    while True:
        m = await receive()
        if m["type"] == "websocket.disconnect":
            return
        await send({"type": "websocket.send", "text": m.get("text"), "bytes": m.get("bytes")})


def thread_names() -> list[str]:
    """The OS names (``comm``) of this process's threads but the main one."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != os.getpid():
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
    return names


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] == "websocket":
        return await websocket(scope, receive, send)
    path, query = scope["path"], scope["query_string"].decode()
    loop = asyncio.get_running_loop()
    if path == "/info":
        info = {
            "thread": threading.current_thread().name,
            "os_threads": len(os.listdir("/proc/self/task")),
            "thread_names": sorted(thread_names()),
            "loop": [c.__name__ for c in type(loop).__mro__],
            "loop_modules": [c.__module__ for c in type(loop).__mro__],
            "selector": type(getattr(loop, "_selector", None)).__name__,
            "task": type(asyncio.current_task()).__name__,
        }
        return await text(send, json.dumps(info).encode())
    if path == "/contextvar":
        before = request_id.get()
        request_id.set(query)
        await asyncio.sleep(0.01)
        return await text(send, json.dumps({"before": before, "after": request_id.get()}).encode())
    if path == "/factory":
        loop.set_task_factory(counting_factory if query == "on" else None)
        return await text(send, str(factory_calls).encode())
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for i in range(int(query or "5")):
            await asyncio.sleep(0.005)
            await send({"type": "http.response.body", "body": b"chunk %d\n" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/executor":
        slept = await loop.run_in_executor(None, lambda: (time.sleep(0.05), threading.current_thread().name)[1])
        return await text(send, slept.encode())
    if path == "/sleep":
        await asyncio.sleep(float(query))
        return await text(send, b"slept")
    if path == "/block":
        time.sleep(float(query))
        return await text(send, b"blocked")
    if path == "/spin":
        # A pure-Python busy loop: it yields the GIL every few ms.
        end = time.monotonic() + float(query)
        while time.monotonic() < end:
            pass
        return await text(send, b"spun")
    if path == "/regex":
        # Catastrophic backtracking: one C call that holds the GIL for
        # hours (2**40 steps).
        re.match(r"(a+)+$", "a" * 40 + "b")
        return await text(send, b"matched")
    if path == "/pid":
        return await text(send, str(os.getpid()).encode())
    return await text(send, b"ok")
