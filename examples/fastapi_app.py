"""The example FastAPI application Skirr serves in the README.

    gunicorn -k skirr.RustWorker -w 2 -b 127.0.0.1:8000 examples.fastapi_app:app
    python -m skirr examples.fastapi_app:app

Endpoints: JSON, path and query parameters, JSON and form uploads, a
streamed response, validation errors (422), 404, and ``/healthz``.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI, Form, HTTPException, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel


@asynccontextmanager
async def lifespan(app: FastAPI):
    # Runs once per worker, after fork: open pools and clients here.
    yield {"started": True, "items": {1: "apple", 2: "pear"}}


app = FastAPI(title="Skirr example", lifespan=lifespan)


class Item(BaseModel):
    name: str
    price: float
    tags: list[str] = []


@app.get("/")
async def root():
    return {"message": "Hello, world!"}


@app.get("/healthz")
async def healthz(request: Request):
    return {"status": "ok", "started": request.state.started}


@app.get("/items/{item_id}")
async def read_item(item_id: int, request: Request, q: str | None = None):
    items = request.state.items
    if item_id not in items:
        raise HTTPException(status_code=404, detail="item not found")
    return {"item_id": item_id, "name": items[item_id], "q": q}


@app.post("/items")
async def create_item(item: Item):
    return {"created": item.model_dump(), "total": item.price * 1.2}


@app.post("/login")
async def login(username: str = Form(...), password: str = Form(...)):
    return {"username": username, "password_length": len(password)}


@app.post("/upload-size")
async def upload_size(request: Request):
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
    return {"size": size}


@app.get("/stream")
async def stream(n: int = 5, delay: float = 0.01):
    async def numbers():
        for i in range(n):
            yield f"chunk {i}\n".encode()
            await asyncio.sleep(delay)

    return StreamingResponse(numbers(), media_type="text/plain")


@app.get("/sync")
def sync_endpoint():
    # Plain `def` endpoints run in FastAPI's thread pool.
    return {"sync": True}
