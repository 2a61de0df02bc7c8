"""Litestar 2: lifespan state, typed routes, SSE, a large File response with
a background task, and a WebSocket listener with its hooks."""

from __future__ import annotations

import json
import uuid

import pytest
import websockets.sync.client as ws_client
from harness import RawConn

from .helpers import poll_json, sha256, sse_events

APP = "frameworks.apps.litestar_app:app"


def test_lifespan_state(client):
    assert client.get("/state").json() == {"lifespan": True, "on_startup": True, "db": {"apples": 3, "pears": 5}}


def test_typed_route_query_and_json_body(client):
    assert client.get("/stock/apples", params={"multiply": 2}).json() == {"fruit": "apples", "count": 6}
    assert client.get("/stock/apples", params={"multiply": "lots"}).status_code == 400
    r = client.post("/stock/kiwis", json={"add": 4})
    assert r.status_code == 201 and r.json() == {"fruit": "kiwis", "count": 4}
    assert client.get("/nowhere").status_code == 404
    assert client.delete("/stock/apples").status_code == 405


def test_server_sent_events(client):
    with client.stream("GET", "/sse", params={"n": 5}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        body = r.read().decode()
    events = sse_events(body)
    assert events == [{"id": str(i), "event": "tick", "data": f"tick {i}"} for i in range(5)], body


@pytest.mark.parametrize("name", ["odd.bin", "exact.bin"])
def test_large_file_response_and_its_background_task(client, data, name):
    f = data[name]
    tag = uuid.uuid4().hex
    r = client.get(f"/file/{name}", params={"tag": tag})
    assert r.status_code == 200
    assert r.headers["content-length"] == str(f.size)
    assert r.headers["content-disposition"] == f'attachment; filename="{name}"'
    assert sha256(r.content) == f.sha256
    poll_json(client, "/events", lambda v: f"background {tag}" in v, f"the background task after {name}")


def test_websocket_listener_and_hooks(server, client):
    tag = uuid.uuid4().hex
    url = f"ws://127.0.0.1:{server.port}/ws?tag={tag}"
    with ws_client.connect(url, open_timeout=10, close_timeout=5) as ws:
        for i in range(3):
            msg = {"n": i, "numbers": list(range(i + 2))}
            ws.send(json.dumps(msg))
            assert json.loads(ws.recv(timeout=10)) == {"echo": msg, "sum": sum(range(i + 2))}
    events = poll_json(client, "/events", lambda v: f"disconnect {tag}" in v, "the on_disconnect hook")
    assert events.index(f"accept {tag}") < events.index(f"disconnect {tag}")


def test_websocket_listener_text(server):
    with ws_client.connect(f"ws://127.0.0.1:{server.port}/ws-text", open_timeout=10, close_timeout=5) as ws:
        ws.send("stressed")
        assert ws.recv(timeout=10) == "desserts"
        ws.send("é" * 70_000)
        assert ws.recv(timeout=10) == "é" * 70_000


def test_a_stream_stops_when_the_client_leaves(server, client):
    # Issue 17: Litestar listens for http.disconnect while it streams; the
    # client reads three chunks and closes its socket.
    key = uuid.uuid4().hex
    with RawConn(server.port, timeout=5) as c:
        c.send(f"GET /slow-stream/{key} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        c.read_until(b"chunk 2")
        sent = client.get(f"/slow-stream-state/{key}").json()["sent"]
    st = poll_json(client, f"/slow-stream-state/{key}", lambda v: v["stopped"], "the stream to stop")
    assert st["sent"] <= sent + 1, (sent, st)
