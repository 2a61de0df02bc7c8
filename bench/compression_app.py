"""FastAPI returning a ~10 KiB JSON document (serialized once, so the
framework's own cost stays small next to the compression's), for the
compression benchmark. ``BENCH_GZIP_MIDDLEWARE=1`` wraps it in Starlette's
``GZipMiddleware`` (compression in Python)."""

from __future__ import annotations

import json
import os

from fastapi import FastAPI, Response
from starlette.middleware.gzip import GZipMiddleware

app = FastAPI()
ITEMS = [{"id": i, "name": f"item {i}", "price": i * 1.25, "tags": ["a", "b", "c"]} for i in range(160)]
BODY = json.dumps({"items": ITEMS}).encode()


@app.get("/")
async def root():
    return Response(BODY, media_type="application/json")


if os.environ.get("BENCH_GZIP_MIDDLEWARE") == "1":
    app.add_middleware(GZipMiddleware, minimum_size=500)
