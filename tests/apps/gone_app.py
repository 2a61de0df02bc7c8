"""A FastAPI ``StreamingResponse`` whose generator sleeps between chunks,
for the client-gone tests (issue 17, item 2): ``GET /slow/{key}`` streams
up to 80 chunks 0.2 s apart (16 s to its natural end) and records how the
generator ended; ``GET /state/{key}`` reports it.

Starlette's ``StreamingResponse`` under ASGI spec >= 2.4 never calls
``receive()``: it relies on ``send()`` raising ``OSError`` once the client
is gone (uvicorn, which says 2.3, instead cancels it on
``http.disconnect``).
"""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.background import BackgroundTask

app = FastAPI()
STATE: dict[str, dict] = {}
CHUNKS = 80


@app.get("/slow/{key}")
async def slow(key: str, delay: float = 0.2):
    state = STATE[key] = {"sent": 0, "ended": None, "how": None}

    async def gen():
        try:
            for i in range(CHUNKS):
                yield f"chunk {i}\n".encode()
                state["sent"] += 1
                await asyncio.sleep(delay)
            state["how"] = "natural end"
        except BaseException as e:  # GeneratorExit (closed) or CancelledError
            state["how"] = type(e).__name__
            raise
        finally:
            state["ended"] = time.time()

    return StreamingResponse(gen(), media_type="text/plain")


@app.get("/state/{key}")
async def state(key: str):
    return STATE.get(key) or {}


@app.get("/then-work")
async def then_work(secs: float = 5):
    """A response, then background work that keeps the app running."""
    return PlainTextResponse("done", background=BackgroundTask(asyncio.sleep, secs))
