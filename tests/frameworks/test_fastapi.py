"""FastAPI / Starlette: the request task, anyio, lifespan state, sse-starlette,
FileResponse with a background task, UploadFile, WebSockets and bodiless
statuses."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid

import harness
import httpx
import pytest
import websockets.sync.client as ws_client
from harness import RawConn, gunicorn, request, wait_until
from websockets.exceptions import ConnectionClosed, InvalidStatus

from .helpers import assert_bodyless, poll_json, sha256, sse_events
from .servers import selected

APP = "frameworks.apps.fastapi_app:app"


def test_route_and_validation(client):
    assert client.get("/items/3", params={"q": "x"}).json() == {"item_id": 3, "q": "x"}
    r = client.get("/items/three")
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["path", "item_id"]


def test_lifespan_state_reaches_requests(client):
    assert client.get("/lifespan-state").json()["boot_id"] == "boot-42"


def test_request_task_is_an_asyncio_task(client):
    got = client.get("/task").json()
    assert got["is_task"] is True, got
    assert got["in_all_tasks"] is True, got
    assert got["same_after_await"] is True, got


def test_task_factory_from_lifespan_makes_request_tasks(client):
    got = client.get("/task").json()
    assert got["factory_installed"] is True, got
    assert got["from_factory"] is True, got


def test_task_factory_makes_tasks_a_request_creates(client):
    assert client.get("/task/child").json() == {"child_from_factory": True, "child_is_itself": True}


def test_anyio_task_groups_and_cancel_scopes(client):
    assert client.get("/anyio").json() == {
        "task_group": [0, 1, 2],
        "start_value": "ready",
        "move_on_after": True,
        "fail_after": True,
        "group_cancelled": True,
        "shielded_ran": True,
        "outer_caught": True,
        "errors": ["ValueError"],
        "to_thread": True,
        "cancelling": 0,
    }


def test_sse_delivers_every_event(client):
    with client.stream("GET", "/sse", params={"n": 5}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        body = r.read().decode()
    events = sse_events(body)
    assert [e.get("event") for e in events] == ["tick"] * 5, body
    assert [e.get("id") for e in events] == ["0", "1", "2", "3", "4"]
    assert [json.loads(e["data"]) for e in events] == [{"i": i} for i in range(5)]


def test_sse_generator_stops_when_the_client_leaves(server, client):
    key = uuid.uuid4().hex
    with (
        httpx.Client(base_url=server.url, timeout=10) as c,
        c.stream("GET", "/sse", params={"n": 100000, "key": key}) as r,
    ):
        assert r.status_code == 200
        got = ""
        for text in r.iter_text():
            got += text
            if len(sse_events(got)) >= 2:
                break
    stopped = poll_json(client, f"/sse/stopped/{key}", lambda v: v["stopped"], "the SSE generator to stop")
    assert 2 <= stopped["sent"] < 100000


@pytest.mark.parametrize("kind", ["plain", "sse"])
def test_a_stream_that_never_asks_stops_when_the_client_leaves(server, client, kind):
    # Issue 17: a StreamingResponse learns that its client left only from
    # send() raising (ASGI spec >= 2.4). The client reads three chunks and
    # closes its socket (a FIN: only the reset that answers the next chunk
    # tells it from a half close); at most that one chunk more is produced.
    key = uuid.uuid4().hex
    with RawConn(server.port, timeout=5) as c:
        c.send(f"GET /slow-stream/{kind}/{key} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        c.read_until(b"chunk 2")
        sent = client.get(f"/slow-stream-state/{key}").json()["sent"]
    st = poll_json(client, f"/slow-stream-state/{key}", lambda v: v["stopped"], "the stream to stop")
    assert st["sent"] <= sent + 1, (sent, st)


@pytest.mark.parametrize("name", ["odd.bin", "exact.bin"])
def test_file_response_runs_its_background_task(client, data, name):
    f = data[name]
    tag = uuid.uuid4().hex
    r = client.get(f"/file/{name}", params={"tag": tag})
    assert r.status_code == 200
    assert r.headers["content-length"] == str(f.size)
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["content-disposition"] == f'attachment; filename="{name}"'
    assert "etag" in r.headers and "last-modified" in r.headers
    assert sha256(r.content) == f.sha256
    poll_json(client, f"/background/{tag}", lambda v: v["ran"], f"the background task after {name}")


def test_file_response_range(client, data):
    f = data["exact.bin"]
    r = client.get("/file/exact.bin", params={"tag": "range"}, headers={"Range": "bytes=1000-1999"})
    assert r.status_code == 206
    assert r.headers["content-range"] == f"bytes 1000-1999/{f.size}"
    assert r.content == f.path.read_bytes()[1000:2000]


def test_plain_response_runs_its_background_task(client):
    tag = uuid.uuid4().hex
    assert client.get("/plain-background", params={"tag": tag}).json() == {"ok": True}
    poll_json(client, f"/background/{tag}", lambda v: v["ran"], "the background task")


def test_streaming_response_with_content_length_runs_its_background_task(client):
    """Small, but the final empty more_body=False message comes a moment
    after the last declared byte."""
    tag = uuid.uuid4().hex
    r = client.get("/proxied-download", params={"tag": tag})
    assert r.status_code == 200
    assert r.headers["content-length"] == "3000" and "transfer-encoding" not in r.headers
    assert r.content == b"A" * 1000 + b"B" * 1000 + b"C" * 1000
    poll_json(client, f"/background/{tag}", lambda v: v["ran"], "the background task")


def test_upload_file(client):
    payload = bytes(range(256)) * 3000
    r = client.post("/upload", data={"title": "report"}, files={"file": ("report.pdf", payload, "application/pdf")})
    assert r.status_code == 200
    assert r.json() == {
        "filename": "report.pdf",
        "content_type": "application/pdf",
        "size": len(payload),
        "sha256": sha256(payload),
        "title": "report",
    }


def test_json_response_none_with_204_has_no_body(server):
    assert_bodyless(server.port, "/no-content", 204)


def test_fastapi_status_code_204_route_has_no_body(server, client):
    r = client.delete("/items/7")
    assert r.status_code == 204 and r.content == b""


def test_304_with_content_has_no_body(server):
    assert_bodyless(server.port, "/not-modified", 304)


def test_websocket_echo(server):
    url = f"ws://127.0.0.1:{server.port}/ws"
    with ws_client.connect(url, subprotocols=["chat"], open_timeout=10, close_timeout=5) as ws:
        assert ws.subprotocol == "chat"
        ws.send("hello")
        assert ws.recv(timeout=10) == "HELLO"
        ws.send(b"\x01\x02\x03")
        assert ws.recv(timeout=10) == b"\x03\x02\x01"
        ws.send(json.dumps({"a": [1, 2]}))
        assert json.loads(ws.recv(timeout=10)) == {"echo": {"a": [1, 2]}, "path": "/ws"}
        big = "x" * 200_000
        ws.send(big)
        assert ws.recv(timeout=10) == big.upper()
        ws.send("bye")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd.code == 4001 and closed.value.rcvd.reason == "bye bye"


def test_websocket_closed_before_accept_is_403(server):
    with pytest.raises(InvalidStatus) as exc:
        ws_client.connect(f"ws://127.0.0.1:{server.port}/ws-reject", open_timeout=10)
    assert exc.value.response.status_code == 403


def test_upload_with_expect_100_continue(server):
    """What curl does for uploads over 1 KiB: send the head, wait for
    ``100 Continue``, then the body."""
    payload = b"q" * 300_000
    boundary = "skirrboundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="title"\r\n\r\ncurl\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="q.bin"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + payload
        + f"\r\n--{boundary}--\r\n".encode()
    )
    head = (
        "POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nExpect: 100-continue\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with RawConn(server.port) as c:
        c.send(head.encode())
        interim = c.read_head()
        assert interim.status == 100, interim
        c.send(body)
        r = c.read_response()
    assert r.status == 200, r
    assert json.loads(r.body) == {
        "filename": "q.bin",
        "content_type": "application/octet-stream",
        "size": len(payload),
        "sha256": sha256(payload),
        "title": "curl",
    }


@pytest.mark.parametrize("kind", [k for k in ("gunicorn", "uvicorn") if k in selected()])
def test_a_blocked_worker_leaves_new_connections_to_the_other_one(kind, tmp_path):
    """Issue 17 item 1, with two Gunicorn workers: one view blocks its
    worker's loop past Gunicorn's timeout (the worker is killed); requests
    on new connections meanwhile all get an answer — 200 from the other
    worker, or a 503 + Retry-After that is safe to retry — never an empty
    reply from a worker that took them and died (c47abb2: several)."""
    worker = "skirr.RustWorker" if kind == "gunicorn" else "uvicorn.workers.UvicornWorker"
    marker = tmp_path / "blocked"
    with gunicorn(APP, "-k", worker, "-w", "2", "--timeout", "4") as g:

        def block():
            # Its own answer is lost with the killed worker, as under uvicorn.
            with contextlib.suppress(OSError, harness.ConnectionClosed):
                request(g.port, "GET", f"/block?seconds=8&marker={marker}")

        blocker = threading.Thread(target=block)
        blocker.start()
        wait_until(marker.exists, what="a worker's loop blocked")
        answers = []
        deadline = time.monotonic() + 6  # past the 4 s timeout: the blocked worker is killed
        while time.monotonic() < deadline:
            try:
                r = request(g.port, "GET", "/items/1")
                answers.append((r.status, r.header("retry-after")))
            except (OSError, harness.ConnectionClosed) as e:
                answers.append(("no answer", type(e).__name__))
            time.sleep(0.2)
        blocker.join(20)
    failed = [a for a in answers if a[0] not in (200, 503) or (a[0] == 503 and a[1] is None)]
    assert not failed, f"{len(failed)} of {len(answers)}: {failed}"
