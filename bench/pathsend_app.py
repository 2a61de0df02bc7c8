"""FastAPI ``FileResponse`` for the pathsend benchmark: ``GET /1m`` and
``GET /64m`` serve files made at import (``BENCH_FILES_DIR``, default
/tmp/skirr-bench-files). ``BENCH_NO_PATHSEND=1`` hides Skirr's
``http.response.pathsend`` extension, so Starlette reads the file in Python
(its path without the extension) — the "before" of the comparison."""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse

DIR = Path(os.environ.get("BENCH_FILES_DIR", "/tmp/skirr-bench-files"))
DIR.mkdir(parents=True, exist_ok=True)
SIZES = {"1m": 1 << 20, "64m": 64 << 20}
for name, size in SIZES.items():
    p = DIR / f"{name}.bin"
    if not p.exists() or p.stat().st_size != size:
        with open(p, "wb") as f:
            for _ in range(size // (1 << 20)):
                f.write(os.urandom(1 << 20))

api = FastAPI()


@api.get("/{name}")
async def file(name: str):
    return FileResponse(DIR / f"{name}.bin", media_type="application/octet-stream")


async def app(scope, receive, send):
    if os.environ.get("BENCH_NO_PATHSEND") == "1" and scope["type"] == "http":
        scope = dict(scope)
        scope["extensions"] = {k: v for k, v in scope.get("extensions", {}).items() if k != "http.response.pathsend"}
    await api(scope, receive, send)
