"""An app exercising what frameworks need from the task running a request."""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import sys

import anyio

REQUEST_ID = contextvars.ContextVar("request_id", default=None)
SEEN: list = []


async def reply(send, obj, status=200):
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(obj).encode()})


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                marker = os.environ.get("TASKS_SHUTDOWN_FILE")
                if marker:
                    with open(marker, "a") as f:
                        f.write("lifespan-shutdown\n")
                await send({"type": "lifespan.shutdown.complete"})
                return
    path = scope["path"]
    if path == "/healthz":
        return await reply(send, "ok")

    if path == "/current-task":
        t = asyncio.current_task()
        t2 = None
        await asyncio.sleep(0)  # a bare yield: the next step comes from call_soon
        t2 = asyncio.current_task()
        await asyncio.sleep(0.01)  # a real future
        t3 = asyncio.current_task()
        return await reply(
            send,
            {
                "same": t is t2 is t3,
                "not_none": t is not None,
                "name": t.get_name(),
                "done": t.done(),
                "coro_is_coroutine": asyncio.iscoroutine(t.get_coro()),
                "loop_ok": t.get_loop() is asyncio.get_running_loop(),
            },
        )

    if path == "/contextvar":
        before = REQUEST_ID.get()
        rid = scope["query_string"].decode()
        REQUEST_ID.set(rid)
        await asyncio.sleep(0.05)  # other requests run meanwhile
        return await reply(send, {"before": before, "after": REQUEST_ID.get(), "rid": rid})

    if path == "/anyio-cancel-scope":
        with anyio.move_on_after(0.05) as scope_:
            await anyio.sleep(5)
        with anyio.CancelScope() as cs:
            cs.cancel()
            await anyio.sleep(1)
        return await reply(send, {"timed_out": scope_.cancelled_caught, "cancelled": cs.cancelled_caught})

    if path == "/anyio-task-group":
        results = []

        async def child(i):
            await anyio.sleep(0.01 * i)
            results.append(i)

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(child, i)
        try:
            async with anyio.create_task_group() as tg:

                async def fails():
                    await anyio.sleep(0.01)
                    raise ValueError("child failed")

                tg.start_soon(fails)
                tg.start_soon(anyio.sleep, 5)
        except BaseException as e:  # ExceptionGroup on 3.11+
            err = type(e).__name__
        return await reply(send, {"results": sorted(results), "err": err})

    if path == "/asyncio-timeout":
        out = {}
        if sys.version_info >= (3, 11):
            try:
                async with asyncio.timeout(0.05):
                    await asyncio.sleep(5)
            except TimeoutError:
                out["timeout"] = True
            t = asyncio.current_task()
            out["cancelling_after"] = t.cancelling()
            async with asyncio.TaskGroup() as tg:
                a = tg.create_task(asyncio.sleep(0.01, result=1))
                b = tg.create_task(asyncio.sleep(0.02, result=2))
            out["taskgroup"] = a.result() + b.result()
        try:
            await asyncio.wait_for(asyncio.sleep(5), 0.05)
        except asyncio.TimeoutError:
            out["wait_for"] = True
        out["shield"] = await asyncio.shield(asyncio.sleep(0.01, result="shielded"))
        return await reply(send, out)

    if path == "/gather":

        async def one(i):
            await asyncio.sleep(0.01)
            return i * 2

        return await reply(send, {"gather": await asyncio.gather(*(one(i) for i in range(5)))})

    if path == "/self-cancel":
        t = asyncio.current_task()
        try:
            t.cancel()
            await asyncio.sleep(1)
            caught = False
        except asyncio.CancelledError:
            caught = True
            t.uncancel()
        return await reply(send, {"caught": caught, "cancelling": t.cancelling()})

    if path == "/hang":
        marker = os.environ.get("TASKS_SHUTDOWN_FILE")
        with open(marker, "a") as f:
            f.write("request-started\n")
        try:
            await asyncio.sleep(3600)
        finally:
            if marker:
                with open(marker, "a") as f:
                    f.write("request-finally\n")

    return await reply(send, {"error": "no route"}, status=404)
