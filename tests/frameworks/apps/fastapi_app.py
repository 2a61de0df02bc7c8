"""A FastAPI app leaning on what Starlette and friends take from the server:
the request task (asyncio.Task, task factories, anyio task groups and cancel
scopes), lifespan state, sse-starlette, FileResponse with a background task,
UploadFile, WebSockets, and bodiless statuses."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
import time
import weakref
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated

import anyio
from fastapi import FastAPI, File, Form, Request, UploadFile, WebSocket, WebSocketDisconnect
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask

DATA = Path(os.environ.get("FRAMEWORKS_DATA", "."))

# Tasks made by the task factory lifespan startup installs.
FACTORY_TASKS: weakref.WeakSet = weakref.WeakSet()
BACKGROUND_DONE: set[str] = set()
SSE_STOPPED: dict[str, int] = {}  # key -> events sent when the generator stopped


@asynccontextmanager
async def lifespan(app: FastAPI):
    loop = asyncio.get_running_loop()
    previous = loop.get_task_factory()

    def factory(loop, coro, **kwargs):
        if previous is not None:
            task = previous(loop, coro, **kwargs)
        else:
            task = asyncio.Task(coro, loop=loop, **kwargs)
        FACTORY_TASKS.add(task)
        return task

    loop.set_task_factory(factory)
    app.state.factory = factory
    yield {"boot_id": "boot-42", "started_in": threading.current_thread().name}
    loop.set_task_factory(previous)


app = FastAPI(lifespan=lifespan)


@app.get("/healthz")
async def healthz():
    return {"ok": True}


@app.get("/lifespan-state")
async def lifespan_state(request: Request):
    return {"boot_id": request.state.boot_id, "started_in": request.state.started_in}


@app.get("/block")
async def block(seconds: float, marker: str):
    """A view that blocks its worker's event loop (a synchronous call in an
    async view); ``marker`` (a file name) is written first, so a test knows
    the loop is blocked."""
    Path(marker).write_text(str(os.getpid()))
    time.sleep(seconds)
    return {"slept": seconds}


@app.get("/items/{item_id}")
async def item(item_id: int, q: str | None = None):
    return {"item_id": item_id, "q": q}


# ------------------------------------------------------------ the request task


@app.get("/task")
async def task_info():
    task = asyncio.current_task()
    await asyncio.sleep(0)
    return {
        "is_task": isinstance(task, asyncio.Task),
        "type": type(task).__name__,
        "in_all_tasks": task in asyncio.all_tasks(),
        "same_after_await": asyncio.current_task() is task,
        "factory_installed": asyncio.get_running_loop().get_task_factory() is app.state.factory,
        "from_factory": task in FACTORY_TASKS,
    }


@app.get("/task/child")
async def child_task():
    async def child():
        return asyncio.current_task()

    t = asyncio.create_task(child())
    got = await t
    return {"child_from_factory": t in FACTORY_TASKS, "child_is_itself": got is t}


@app.get("/anyio")
async def anyio_features():
    out: dict = {}

    results: list[int] = []

    async def worker(i: int):
        await anyio.sleep(0.005 * (3 - i))
        results.append(i)

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(worker, i)
    out["task_group"] = sorted(results)

    async def starter(*, task_status=anyio.TASK_STATUS_IGNORED):
        task_status.started("ready")
        await anyio.sleep(0.001)

    async with anyio.create_task_group() as tg:
        out["start_value"] = await tg.start(starter)

    with anyio.move_on_after(0.02) as scope:
        await anyio.sleep(5)
    out["move_on_after"] = scope.cancelled_caught

    try:
        with anyio.fail_after(0.02):
            await anyio.sleep(5)
        out["fail_after"] = False
    except TimeoutError:
        out["fail_after"] = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.sleep, 5)
        await anyio.sleep(0.001)
        tg.cancel_scope.cancel()
    out["group_cancelled"] = tg.cancel_scope.cancel_called

    with anyio.CancelScope() as outer:
        outer.cancel()
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.001)
            out["shielded_ran"] = True
        await anyio.sleep(1)  # cancelled here
        out["after_cancel"] = True
    out["outer_caught"] = outer.cancelled_caught

    async def boom():
        await anyio.sleep(0)
        raise ValueError("boom")

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(boom)
            tg.start_soon(anyio.sleep, 5)
    except Exception as exc:  # an ExceptionGroup on anyio 4
        out["errors"] = [type(e).__name__ for e in getattr(exc, "exceptions", [exc])]

    out["to_thread"] = await anyio.to_thread.run_sync(lambda: threading.current_thread() is not threading.main_thread())
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    out["cancelling"] = cancelling() if cancelling else 0
    return out


# --------------------------------------------------------------------- SSE


@app.get("/sse")
async def sse(request: Request, n: int = 5, key: str = ""):
    async def events():
        sent = 0
        try:
            for i in range(n):
                if await request.is_disconnected():
                    break
                yield {"event": "tick", "id": str(i), "data": json.dumps({"i": i})}
                sent += 1
                await asyncio.sleep(0.01)
        finally:
            if key:
                SSE_STOPPED[key] = sent

    return EventSourceResponse(events())


SLOW_STREAMS: dict[str, dict] = {}  # key -> {"sent": n, "stopped": bool}


@app.get("/slow-stream/{kind}/{key}")
async def slow_stream(kind: str, key: str):
    """Up to 80 chunks 0.2 s apart that never ask whether the client is
    still there (an LLM token stream): a StreamingResponse (ASGI spec >= 2.4:
    Starlette stops on send() raising OSError) or an sse-starlette
    EventSourceResponse (which listens for http.disconnect itself)."""
    rec = SLOW_STREAMS[key] = {"sent": 0, "stopped": False}

    async def chunks():
        try:
            for i in range(80):
                yield f"chunk {i}\n" if kind == "plain" else {"data": f"chunk {i}"}
                rec["sent"] += 1
                await asyncio.sleep(0.2)
        finally:
            rec["stopped"] = True

    if kind == "plain":
        return StreamingResponse(chunks(), media_type="text/plain")
    return EventSourceResponse(chunks())


@app.get("/slow-stream-state/{key}")
async def slow_stream_state(key: str):
    return SLOW_STREAMS.get(key, {})


@app.get("/sse/stopped/{key}")
async def sse_stopped(key: str):
    return {"stopped": key in SSE_STOPPED, "sent": SSE_STOPPED.get(key)}


# ------------------------------------------------------------------ files


def _mark_done(tag: str) -> None:
    BACKGROUND_DONE.add(tag)


@app.get("/file/{name}")
async def file(name: str, tag: str):
    return FileResponse(DATA / name, filename=name, background=BackgroundTask(_mark_done, tag))


@app.get("/background/{tag}")
async def background_status(tag: str):
    return {"ran": tag in BACKGROUND_DONE}


@app.get("/plain-background")
async def plain_background(tag: str):
    return JSONResponse({"ok": True}, background=BackgroundTask(_mark_done, tag))


@app.get("/proxied-download")
async def proxied_download(tag: str):
    """A download of known size relayed chunk by chunk (as when proxying
    object storage): a StreamingResponse with a declared Content-Length."""
    chunks = [bytes([65 + i]) * 1000 for i in range(3)]

    async def relay():
        for chunk in chunks:
            await asyncio.sleep(0.005)  # waiting on the upstream
            yield chunk
        await asyncio.sleep(0.005)  # the upstream's end of stream

    return StreamingResponse(
        relay(),
        media_type="application/octet-stream",
        headers={"content-length": str(sum(map(len, chunks)))},
        background=BackgroundTask(_mark_done, tag),
    )


@app.post("/upload")
async def upload(file: Annotated[UploadFile, File()], title: Annotated[str, Form()]):
    h = hashlib.sha256()
    size = 0
    while chunk := await file.read(100_000):
        h.update(chunk)
        size += len(chunk)
    return {
        "filename": file.filename,
        "content_type": file.content_type,
        "size": size,
        "sha256": h.hexdigest(),
        "title": title,
    }


# ------------------------------------------------------- bodiless statuses


@app.get("/no-content")
async def no_content():
    return JSONResponse(None, status_code=204)


@app.delete("/items/{item_id}", status_code=204)
async def delete_item(item_id: int):
    return None


@app.get("/not-modified")
async def not_modified():
    return Response(status_code=304, content=b"x")


# --------------------------------------------------------------- WebSocket


@app.websocket("/ws")
async def ws(websocket: WebSocket):
    protocols = websocket.scope.get("subprotocols") or []
    await websocket.accept(subprotocol="chat" if "chat" in protocols else None)
    try:
        while True:
            msg = await websocket.receive()
            if msg["type"] == "websocket.disconnect":
                return
            if msg.get("bytes") is not None:
                await websocket.send_bytes(msg["bytes"][::-1])
            elif msg["text"] == "bye":
                await websocket.close(code=4001, reason="bye bye")
                return
            elif msg["text"].startswith("{"):
                await websocket.send_json({"echo": json.loads(msg["text"]), "path": websocket.url.path})
            else:
                await websocket.send_text(msg["text"].upper())
    except WebSocketDisconnect:
        pass


@app.websocket("/ws-reject")
async def ws_reject(websocket: WebSocket):
    await websocket.close(code=1008)
