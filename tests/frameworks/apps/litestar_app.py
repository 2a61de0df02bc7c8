"""A Litestar app: lifespan state, typed routes, server-sent events, a large
File response with a background task, and a WebSocket listener."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path

from litestar import Litestar, WebSocket, get, post
from litestar.background_tasks import BackgroundTask
from litestar.datastructures import State
from litestar.handlers import websocket_listener
from litestar.response import File, ServerSentEvent, ServerSentEventMessage, Stream

DATA = Path(os.environ.get("FRAMEWORKS_DATA", "."))
EVENTS: list[str] = []  # WebSocket listener hooks and background tasks, in order


@asynccontextmanager
async def lifespan(app: Litestar) -> AsyncGenerator[None, None]:
    app.state.db = {"apples": 3, "pears": 5}
    app.state.lifespan_ran = True
    yield
    app.state.db.clear()


async def on_startup(app: Litestar) -> None:
    app.state.on_startup_ran = True


@get("/healthz")
async def healthz() -> dict:
    return {"ok": True}


@get("/state")
async def state_view(state: State) -> dict:
    return {"lifespan": state.lifespan_ran, "on_startup": state.on_startup_ran, "db": state.db}


@get("/stock/{fruit:str}")
async def stock(fruit: str, state: State, multiply: int = 1) -> dict:
    return {"fruit": fruit, "count": state.db.get(fruit, 0) * multiply}


@post("/stock/{fruit:str}")
async def add_stock(fruit: str, data: dict, state: State) -> dict:
    state.db[fruit] = state.db.get(fruit, 0) + int(data["add"])
    return {"fruit": fruit, "count": state.db[fruit]}


@get("/sse")
async def sse(n: int = 5) -> ServerSentEvent:
    async def events() -> AsyncGenerator[ServerSentEventMessage, None]:
        for i in range(n):
            yield ServerSentEventMessage(data=f"tick {i}", event="tick", id=i)
            await asyncio.sleep(0.01)

    return ServerSentEvent(events())


SLOW_STREAMS: dict[str, dict] = {}


@get("/slow-stream/{key:str}")
async def slow_stream(key: str) -> Stream:
    """Up to 80 chunks 0.2 s apart; records when the generator stops."""
    rec = SLOW_STREAMS[key] = {"sent": 0, "stopped": False}

    async def chunks() -> AsyncGenerator[bytes, None]:
        try:
            for i in range(80):
                yield f"chunk {i}\n".encode()
                rec["sent"] += 1
                await asyncio.sleep(0.2)
        finally:
            rec["stopped"] = True

    return Stream(chunks(), media_type="text/plain")


@get("/slow-stream-state/{key:str}")
async def slow_stream_state(key: str) -> dict:
    return SLOW_STREAMS.get(key, {})


async def _record(what: str) -> None:
    EVENTS.append(what)


@get("/file/{name:str}")
async def file(name: str, tag: str) -> File:
    return File(path=DATA / name, filename=name, background=BackgroundTask(_record, f"background {tag}"))


@get("/events")
async def events_view() -> list:
    return EVENTS


def _on_accept(socket: WebSocket) -> None:
    EVENTS.append(f"accept {socket.query_params.get('tag')}")


def _on_disconnect(socket: WebSocket) -> None:
    EVENTS.append(f"disconnect {socket.query_params.get('tag')}")


@websocket_listener("/ws", on_accept=_on_accept, on_disconnect=_on_disconnect)
async def ws_listener(data: dict) -> dict:
    return {"echo": data, "sum": sum(data.get("numbers", []))}


@websocket_listener("/ws-text")
async def ws_text(data: str) -> str:
    return data[::-1]


app = Litestar(
    route_handlers=[
        healthz,
        state_view,
        stock,
        add_stock,
        sse,
        slow_stream,
        slow_stream_state,
        file,
        events_view,
        ws_listener,
        ws_text,
    ],
    lifespan=[lifespan],
    on_startup=[on_startup],
)
