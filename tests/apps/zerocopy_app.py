"""App for the ``http.response.zerocopysend`` tests: the path picks what
the app sends; the query string gives the file, region and headers. What
``send()`` raised, and where the file position ended, is kept for the
tests to fetch (``/errors``, ``/positions``)."""

from __future__ import annotations

import io
import json
import os
from urllib.parse import parse_qs

ERRORS: list = []
POSITIONS: list = []
ZCS = "http.response.zerocopysend"


async def _json(send, value) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": json.dumps(value).encode()})


def _region(q: dict) -> dict:
    m = {"type": ZCS}
    for k in ("offset", "count"):
        if k in q:
            m[k] = int(q[k])
    return m


async def _bad(send, q: dict) -> None:
    """Sends one invalid zerocopysend message (``q["bad"]`` picks which)."""
    bad = q["bad"]
    with open(q["path"], "rb") as f:
        msgs = {
            "no_file": {"type": ZCS},
            "bytesio": {"type": ZCS, "file": io.BytesIO(b"abc")},
            "int": {"type": ZCS, "file": f.fileno()},
            "offset_str": {"type": ZCS, "file": f, "offset": "1"},
            "offset_bool": {"type": ZCS, "file": f, "offset": True},
            "offset_neg": {"type": ZCS, "file": f, "offset": -1},
            "count_neg": {"type": ZCS, "file": f, "count": -5},
            "offset_past": {"type": ZCS, "file": f, "offset": 1 << 40},
            "count_past": {"type": ZCS, "file": f, "offset": 1, "count": 1 << 40},
        }
        if bad == "closed":
            g = open(q["path"], "rb")  # noqa: SIM115 - closed on purpose
            g.close()
            msgs["closed"] = {"type": ZCS, "file": g}
        if bad == "writeonly":
            with open(q["path"], "ab") as wf:
                return await send({"type": ZCS, "file": wf})
        if bad == "pipe":
            r, w = os.pipe()
            try:
                with open(r, "rb") as pr:
                    await send({"type": ZCS, "file": pr})
            finally:
                os.close(w)
        else:
            await send(msgs[bad])


async def _shrink(send, q: dict) -> None:
    """The file is cut short once send() has accepted its region (send()
    queues when called; its awaitable only waits for room)."""
    with open(q["path"], "rb") as f:
        pending = send({"type": ZCS, "file": f, "more_body": bool(q.get("more"))})
        os.truncate(q["path"], 1000)
        try:
            await pending
            if q.get("more"):
                await send({"type": "http.response.body", "body": b""})
        except OSError as e:
            ERRORS.append(f"{type(e).__name__}: {e}")


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            await send({"type": m["type"] + ".complete"})
            if m["type"] == "lifespan.shutdown":
                return
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    path = scope["path"]
    if path == "/healthz":
        return await _json(send, "ok")
    if path == "/errors":
        return await _json(send, ERRORS)
    if path == "/positions":
        return await _json(send, POSITIONS)
    if path == "/extensions":
        return await _json(send, sorted(scope["extensions"]))
    try:
        await _respond(path, q, send)
    except (TypeError, RuntimeError) as e:
        ERRORS.append(f"{type(e).__name__}: {e}")
        if q.get("reraise"):
            raise
        # The start stands: complete the response the way it declared.
        await send({"type": "http.response.body", "body": b"-" * int(q.get("cl", 0))})


async def _respond(path: str, q: dict, send) -> None:
    if path == "/early":
        # Before the start.
        with open(q["path"], "rb") as f:
            await send({"type": ZCS, "file": f})
        return
    headers = [(b"content-type", q.get("type", "application/octet-stream").encode())]
    if path == "/trailers":
        headers.append((b"trailer", b"x-sum"))
    if "cl" in q:
        headers.append((b"content-length", q["cl"].encode()))
    start = {"type": "http.response.start", "status": int(q.get("status", 200)), "headers": headers}
    await send({**start, "trailers": path == "/trailers"})
    if path == "/bad":
        return await _bad(send, q)
    if path == "/shrink":
        return await _shrink(send, q)
    f = open(q["path"], "rb")  # noqa: SIM115 - closed below, as the app must
    try:
        if path == "/one":
            # One message is the whole body; the app closes its file at once.
            await send({**_region(q), "file": f})
        elif path == "/split":
            # `piece`-byte messages with more_body, then an empty final body.
            size, piece = os.fstat(f.fileno()).st_size, int(q["piece"])
            for off in range(0, size, piece):
                await send({"type": ZCS, "file": f, "offset": off, "count": min(piece, size - off), "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        elif path == "/trailers":
            await send({**_region(q), "file": f})
            await send({"type": "http.response.trailers", "headers": [(b"x-sum", b"42")]})
        elif path == "/mixed":
            await send({"type": "http.response.body", "body": b"<", "more_body": True})
            await send({**_region(q), "file": f, "more_body": True})
            await send({"type": "http.response.body", "body": b">", "more_body": True})
            await send({**_region(q), "file": f, "more_body": True})
            await send({"type": "http.response.body", "body": b"|", "more_body": False})
        elif path == "/position":
            # No offset: from the file object's position, which then moves.
            f.read(int(q["skip"]))
            await send({"type": ZCS, "file": f, "count": 5, "more_body": True})
            await send({"type": ZCS, "file": f, "more_body": True})
            POSITIONS.append(f.tell())
            await send({"type": "http.response.body", "body": b""})
        elif path == "/raw_position":
            # A raw FileIO has no buffer: its position is the descriptor's.
            raw = open(q["path"], "rb", buffering=0)  # noqa: SIM115
            try:
                os.lseek(raw.fileno(), int(q["skip"]), os.SEEK_SET)
                await send({"type": ZCS, "file": raw, "count": 3, "more_body": True})
                POSITIONS.append(os.lseek(raw.fileno(), 0, os.SEEK_CUR))
                await send({"type": "http.response.body", "body": b""})
            finally:
                raw.close()
    finally:
        f.close()
