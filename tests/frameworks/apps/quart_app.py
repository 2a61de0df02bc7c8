"""A Quart app: routes, JSON, send_file of a large file, a WebSocket, and
before/after serving hooks that record themselves in
``$FRAMEWORKS_SCRATCH/serving.log``."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from quart import Quart, abort, jsonify, request, send_file, websocket

DATA = Path(os.environ.get("FRAMEWORKS_DATA", "."))
SCRATCH = Path(os.environ.get("FRAMEWORKS_SCRATCH", "."))

app = Quart(__name__)
app.config["MAX_CONTENT_LENGTH"] = 4 * 1024 * 1024


def _note(line: str) -> None:
    with open(SCRATCH / "serving.log", "a") as f:
        f.write(f"{line} {os.getpid()}\n")


@app.before_serving
async def startup() -> None:
    app.config["STARTED"] = True
    app.config["WS_SEEN"] = []
    _note("before_serving")


@app.after_serving
async def shutdown() -> None:
    await asyncio.sleep(0)
    _note("after_serving")


@app.route("/healthz")
async def healthz():
    return "ok"


@app.route("/")
async def index():
    return {"started": app.config.get("STARTED", False), "pid": os.getpid()}


@app.route("/hello/<name>")
async def hello(name: str):
    return f"Hello, {name}! ({request.args.get('greeting', 'hi')})"


@app.route("/items/<int:item_id>", methods=["GET", "PUT"])
async def item(item_id: int):
    if item_id > 100:
        abort(404)
    if request.method == "PUT":
        body = await request.get_json()
        return jsonify(item_id=item_id, updated=body), 200, {"X-Updated": "yes"}
    return jsonify(item_id=item_id)


@app.route("/body-size", methods=["POST"])
async def body_size():
    size = 0
    async for chunk in request.body:
        size += len(chunk)
    return {"size": size}


@app.route("/file/<name>")
async def file(name: str):
    return await send_file(DATA / name, as_attachment=True, attachment_filename=name, conditional=True)


@app.route("/ws-seen")
async def ws_seen():
    return {"seen": app.config["WS_SEEN"]}


@app.websocket("/ws")
async def ws():
    app.config["WS_SEEN"].append(websocket.args.get("tag"))
    await websocket.accept()
    while True:
        data = await websocket.receive()
        if data == "close":
            await websocket.close(1000, "done")
            return
        await websocket.send(f"echo: {data}" if isinstance(data, str) else data)


SLOW_STREAMS: dict[str, dict] = {}


@app.get("/slow-stream/<key>")
async def slow_stream(key: str):
    """Up to 80 chunks 0.2 s apart; records when the generator stops."""
    rec = SLOW_STREAMS[key] = {"sent": 0, "stopped": False}

    async def chunks():
        try:
            for i in range(80):
                yield f"chunk {i}\n".encode()
                rec["sent"] += 1
                await asyncio.sleep(0.2)
        finally:
            rec["stopped"] = True

    return chunks(), 200, {"content-type": "text/plain"}


@app.get("/slow-stream-state/<key>")
async def slow_stream_state(key: str):
    return jsonify(SLOW_STREAMS.get(key, {}))
