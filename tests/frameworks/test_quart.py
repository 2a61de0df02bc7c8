"""Quart: routes, send_file of a large file, a WebSocket, and the
before_serving / after_serving hooks (lifespan startup and shutdown)."""

from __future__ import annotations

import json
import signal
import uuid

import pytest
import websockets.sync.client as ws_client
from harness import RawConn, request
from websockets.exceptions import ConnectionClosed

from .helpers import poll_json, sha256
from .servers import serve

APP = "frameworks.apps.quart_app:app"


def test_routes(client):
    assert client.get("/").json()["started"] is True
    r = client.get("/hello/Ada", params={"greeting": "bonjour"})
    assert r.status_code == 200 and r.text == "Hello, Ada! (bonjour)"
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert client.get("/items/7").json() == {"item_id": 7}
    r = client.put("/items/7", json={"name": "lamp"})
    assert r.json() == {"item_id": 7, "updated": {"name": "lamp"}} and r.headers["x-updated"] == "yes"
    assert client.get("/items/700").status_code == 404
    assert client.get("/items/seven").status_code == 404
    assert client.post("/items/7").status_code == 405


def test_streamed_request_body(client):
    def gen():
        for _ in range(40):
            yield b"z" * 65536

    assert client.post("/body-size", content=gen()).json() == {"size": 40 * 65536}


def test_request_body_over_max_content_length_is_413(client):
    assert client.post("/body-size", content=b"z" * (5 * 1024 * 1024)).status_code == 413


@pytest.mark.parametrize("name", ["odd.bin", "exact.bin"])
def test_send_file_of_a_large_file(client, data, name):
    f = data[name]
    r = client.get(f"/file/{name}")
    assert r.status_code == 200
    assert r.headers["content-length"] == str(f.size)
    assert r.headers["content-disposition"] == f"attachment; filename={name}"
    assert sha256(r.content) == f.sha256


def test_send_file_conditional_range(client, data):
    f = data["odd.bin"]
    r = client.get("/file/odd.bin", headers={"Range": "bytes=1000-1999"})
    assert r.status_code == 206
    assert r.headers["content-range"] == f"bytes 1000-1999/{f.size}"
    assert r.content == f.path.read_bytes()[1000:2000]


def test_websocket(server, client):
    tag = uuid.uuid4().hex
    with ws_client.connect(f"ws://127.0.0.1:{server.port}/ws?tag={tag}", open_timeout=10, close_timeout=5) as ws:
        ws.send("hi")
        assert ws.recv(timeout=10) == "echo: hi"
        ws.send(b"\x00\xff" * 1000)
        assert ws.recv(timeout=10) == b"\x00\xff" * 1000
        ws.send("close")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd.code == 1000 and closed.value.rcvd.reason == "done"
    assert tag in client.get("/ws-seen").json()["seen"]


def test_before_serving_ran_once_in_the_worker(server, client):
    pid = client.get("/").json()["pid"]
    lines = (server.scratch / "serving.log").read_text().splitlines()
    assert lines == [f"before_serving {pid}"]


def test_after_serving_runs_on_sigterm(server, tmp_path, data_dir):
    """Its own server (the module's keeps serving): SIGTERM runs the lifespan
    shutdown, so after_serving, before the process exits 0 (uvicorn re-raises
    the SIGTERM once it has shut down)."""
    exits = (0, -signal.SIGTERM) if server.kind == "uvicorn" else (0,)
    env = {"FRAMEWORKS_DATA": str(data_dir), "FRAMEWORKS_SCRATCH": str(tmp_path)}
    with serve(server.kind, APP, env=env) as s:
        r = request(s.port, "GET", "/")
        assert r.status == 200
        pid = json.loads(r.body)["pid"]
        assert s.stop(signal.SIGTERM) in exits, s.logs()
    assert (tmp_path / "serving.log").read_text().splitlines() == [f"before_serving {pid}", f"after_serving {pid}"]


def test_a_stream_stops_when_the_client_leaves(server, client):
    # Issue 17: Quart cancels the request on http.disconnect; the client
    # reads three chunks and closes its socket.
    key = uuid.uuid4().hex
    with RawConn(server.port, timeout=5) as c:
        c.send(f"GET /slow-stream/{key} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        c.read_until(b"chunk 2")
        sent = client.get(f"/slow-stream-state/{key}").json()["sent"]
    st = poll_json(client, f"/slow-stream-state/{key}", lambda v: v["stopped"], "the stream to stop")
    assert st["sent"] <= sent + 1, (sent, st)
