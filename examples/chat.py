"""A FastAPI WebSocket chat room served by Skirr.

    python -m skirr examples.chat:app
    gunicorn -k skirr.RustWorker -w 1 examples.chat:app   # one worker: rooms live in memory

Open http://127.0.0.1:8000 in two browser tabs (``/?room=NAME`` preselects a
room), pick a name and a room, and join; or connect with any WebSocket client
to ``ws://127.0.0.1:8000/ws/{room}?name=ada``. Every text message is
broadcast to that room only, as ``{"from": name, "text": ...}``; joins and
leaves are announced. Served over TLS (``--ssl-certfile``/``--ssl-keyfile``),
the page connects with ``wss://``.
"""

from __future__ import annotations

from collections import defaultdict

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from fastapi.responses import HTMLResponse

app = FastAPI(title="Skirr chat")
rooms: dict[str, set[WebSocket]] = defaultdict(set)

PAGE = """<!doctype html><meta charset=utf-8><title>Skirr chat</title>
<form id=join><input id=name placeholder=name required> in room
<input id=room required> <button>join</button></form>
<form id=say hidden><input id=msg placeholder=message autocomplete=off> <button>send</button></form>
<pre id=log></pre><script>
// Elements by id, never as globals: in a browser `name` is window.name.
const $ = id => document.getElementById(id), show = line => { $("log").textContent += line + "\\n"; };
$("room").value = new URLSearchParams(location.search).get("room") || "lobby";
let ws;
$("join").onsubmit = e => {
  e.preventDefault();
  if (ws) { ws.onmessage = ws.onclose = null; ws.close(); }
  const room = $("room").value, name = $("name").value;
  const scheme = location.protocol === "https:" ? "wss" : "ws";  // TLS page, TLS socket
  ws = new WebSocket(`${scheme}://${location.host}/ws/${encodeURIComponent(room)}?name=${encodeURIComponent(name)}`);
  ws.onopen = () => { show(`(in room ${room} as ${name})`); $("say").hidden = false; $("msg").focus(); };
  ws.onmessage = e => { const m = JSON.parse(e.data); show(`${m.from}: ${m.text}`); };
  ws.onclose = e => { show(`(disconnected: ${e.code})`); $("say").hidden = true; };
};
$("say").onsubmit = e => { e.preventDefault(); ws.send($("msg").value); $("msg").value = ""; };
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
        if not rooms[room]:
            del rooms[room]  # the last one out: forget the room
