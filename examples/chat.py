"""A FastAPI WebSocket chat room served by Skirr.

    python -m skirr examples.chat:app
    gunicorn -k skirr.RustWorker -w 1 examples.chat:app   # one worker: rooms live in memory

Open http://127.0.0.1:8000 in two browser tabs, or connect with any
WebSocket client to ``ws://127.0.0.1:8000/ws/{room}?name=ada``. Every text
message is broadcast to the room as ``{"from": name, "text": ...}``; joins
and leaves are announced.
"""

from __future__ import annotations

from collections import defaultdict

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from fastapi.responses import HTMLResponse

app = FastAPI(title="Skirr chat")
rooms: dict[str, set[WebSocket]] = defaultdict(set)

PAGE = """<!doctype html><meta charset=utf-8><title>Skirr chat</title>
<input id=name placeholder=name value=guest> <input id=msg placeholder=message autofocus>
<pre id=log></pre><script>
const ws = new WebSocket(`ws://${location.host}/ws/lobby?name=${encodeURIComponent(name.value)}`);
ws.onmessage = e => { const m = JSON.parse(e.data); log.textContent += `${m.from}: ${m.text}\\n`; };
msg.onkeydown = e => { if (e.key === "Enter") { ws.send(msg.value); msg.value = ""; } };
</script>"""


async def broadcast(room: str, message: dict) -> None:
    for peer in list(rooms[room]):
        try:
            await peer.send_json(message)
        except (WebSocketDisconnect, RuntimeError, OSError):
            # That peer left (Starlette reports a send to it as a disconnect).
            rooms[room].discard(peer)


@app.get("/")
async def index():
    return HTMLResponse(PAGE)


@app.websocket("/ws/{room}")
async def chat(ws: WebSocket, room: str, name: str = "anonymous"):
    if name == "banned":
        await ws.close(code=4003, reason="banned")
        return
    await ws.accept(subprotocol="chat.v1" if "chat.v1" in ws.scope["subprotocols"] else None)
    rooms[room].add(ws)
    await broadcast(room, {"from": "server", "text": f"{name} joined"})
    try:
        while True:
            text = await ws.receive_text()
            await broadcast(room, {"from": name, "text": text})
    except WebSocketDisconnect:
        pass
    finally:
        rooms[room].discard(ws)
        await broadcast(room, {"from": "server", "text": f"{name} left"})
