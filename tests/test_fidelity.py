"""An app behaves as under uvicorn: responses complete for the app, several
receive() calls may wait at once, bodiless statuses drop the body, errors
are logged as uvicorn logs them."""

from __future__ import annotations

import json
import os
import socket
from contextlib import contextmanager

import pytest
from harness import PY, RawConn, listening_socket, request, skirr, start, wait_until

# SKIRR_REFERENCE=uvicorn runs the wire-level checks against uvicorn, the
# reference these tests were written against (log wording is Skirr's own).
REFERENCE = os.environ.get("SKIRR_REFERENCE") == "uvicorn"


@contextmanager
def uvicorn(app: str, env: dict | None = None):
    sock = listening_socket()
    cmd = [PY, "-m", "uvicorn", app, "--fd", str(sock.fileno()), "--no-access-log"]
    s = start(cmd, sock=sock, port=sock.getsockname()[1], uds=None, env=env)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def server():
    with (uvicorn if REFERENCE else skirr)("apps.fidelity_app:app", *([] if REFERENCE else ["--no-access-log"])) as s:
        yield s


def skirr_logs(server) -> str | None:
    return None if REFERENCE else server.logs()


def seen(server, rid: str) -> dict:
    return json.loads(request(server.port, "GET", f"/seen?id={rid}").body)


@pytest.mark.parametrize(
    "size,chunk",
    [
        (256 * 1024, 65536),  # a multiple of the send buffer
        (1024 * 1024, 65536),
        (300 * 1024, 300 * 1024),  # one chunk larger than the send buffer
        (1_000_001, 65536),
        (10, 10),
    ],
)
def test_content_length_response_completes_for_the_app(server, size, chunk):
    rid = f"file-{size}-{chunk}"
    with RawConn(server.port) as c:
        c.send(f"GET /file?id={rid}&size={size}&chunk={chunk} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        r = c.read_response()
        assert r.status == 200 and len(r.body) == size
        # The connection stays usable.
        c.send(f"GET /seen?id={rid} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        got = json.loads(c.read_response().body)
    assert got == {"completed": True}


def test_a_second_receive_may_wait_while_one_is_pending(server):
    r = request(server.port, "GET", "/two-receivers?id=two")
    assert r.body == b"first\nlast\n"
    got = wait_until(lambda: seen(server, "two").get("listener_got") and seen(server, "two"))
    assert "error" not in got, got
    assert got["poll_done"] is False
    assert got["listener_done"] is False
    assert got["listener_got"] == ["http.disconnect"]


@pytest.mark.parametrize("status", [204, 304])
def test_a_body_on_a_bodiless_status_is_dropped(server, status):
    # RFC 9110 §15.3.5, §15.4.5, §8.6 (uvicorn sends Content-Length: 4 on
    # the 204, and the body after the 304 head).
    if REFERENCE:
        pytest.skip("uvicorn breaks RFC 9110 here")
    rid = f"nobody-{status}"
    with RawConn(server.port) as c:
        c.send(f"GET /no-body-status?id={rid}&status={status} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = c.read_until(b"\r\n\r\n")
        assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
        if status == 204:
            assert b"content-length" not in head.lower()
        assert b"transfer-encoding" not in head.lower()
        # Nothing follows the head: the next response is the next request's.
        c.send(f"GET /seen?id={rid} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        r = c.read_response()
        assert r.status == 200, r
        assert json.loads(r.body) == {"completed": True}
    if not REFERENCE:
        assert f"a {status} response" in server.logs() and "dropped" in server.logs()


def test_a_bodiless_status_warns_once_per_app_location(server):
    for _ in range(3):
        assert request(server.port, "GET", "/no-body-status?id=w&status=204").status == 204
    if not REFERENCE:
        assert server.logs().count("a 204 response cannot have a body") == 1


def test_a_cancelled_handler_is_logged_as_an_error(server):
    r = request(server.port, "GET", "/cancelled?id=c")
    assert r.status == 500
    logs = wait_until(lambda: "CancelledError" in server.logs() and server.logs())
    assert "Exception in ASGI application" in logs


def task_facts(port) -> dict:
    return json.loads(request(port, "GET", "/task-facts").body)


def test_running_app_calls_are_listed_by_all_tasks(server):
    facts = task_facts(server.port)
    assert facts["in_all_tasks"] is True
    # Skirr's own task type by default (README, "Tasks"): not an asyncio.Task.
    assert facts["is_task"] is REFERENCE


@pytest.mark.skipif(REFERENCE, reason="Skirr option")
def test_tasks_asyncio_runs_app_calls_in_asyncio_tasks():
    with skirr("apps.fidelity_app:app", "--no-access-log", "--tasks", "asyncio") as s:
        facts = task_facts(s.port)
        assert facts["is_task"] is True and facts["in_all_tasks"] is True
        # Everything else behaves the same on this path.
        r = request(s.port, "GET", "/file?id=f&size=262144")
        assert len(r.body) == 262144
        assert request(s.port, "GET", "/two-receivers?id=two").body == b"first\nlast\n"
        assert request(s.port, "GET", "/cancelled?id=c").status == 500
        wait_until(lambda: "CancelledError" in s.logs())


def test_a_task_factory_set_in_lifespan_is_used_for_requests():
    env = {"FIDELITY_TASK_FACTORY": "1"}
    ctx = uvicorn("apps.fidelity_app:app", env=env) if REFERENCE else skirr(
        "apps.fidelity_app:app", "--no-access-log", env=env
    )
    with ctx as s:
        first = task_facts(s.port)
        second = task_facts(s.port)
        assert first["is_task"] is True and first["in_all_tasks"] is True
        assert second["factory_calls"] > first["factory_calls"] >= 1


def test_a_half_closed_client_gets_its_response(server):
    # RFC 9112 §9.6: the client may shut its sending side down and wait
    # (uvicorn drops the request: asyncio closes the transport on EOF).
    if REFERENCE:
        pytest.skip("uvicorn does not serve half-closed clients")
    with RawConn(server.port) as c:
        c.send(b"GET /slow?id=half&secs=0.2 HTTP/1.1\r\nHost: x\r\n\r\n")
        c.sock.shutdown(socket.SHUT_WR)
        r = c.read_response()
        assert r.status == 200 and r.body == b"late"


def test_a_request_the_app_gives_up_after_the_clients_eof_closes_the_connection(server):
    # A client that sent its request and closed (a readiness probe that
    # timed out): the app is told, stops, and the connection must end — not
    # hold the worker's drain until graceful_timeout.
    with RawConn(server.port, timeout=3) as c:
        c.send(b"GET /give-up?id=gaveup HTTP/1.1\r\nHost: x\r\n\r\n")
        c.sock.shutdown(socket.SHUT_WR)
        assert c.read_to_eof() == b""
    # The connection closes as the app is told; its record follows.
    wait_until(lambda: seen(server, "gaveup") == {"gave_up": True}, what="the app to give up")


def test_a_half_closed_upload_gets_its_response(server):
    with RawConn(server.port) as c:
        c.send(b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        c.sock.shutdown(socket.SHUT_WR)
        assert c.read_response().body == b"5"


def test_a_body_cut_short_by_eof_is_never_complete(server):
    with RawConn(server.port) as c:
        c.send(b"POST /post?id=short HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        c.sock.shutdown(socket.SHUT_WR)
        data = c.read_to_eof()
    # Either a 400 or nothing at all, never the app's answer for a body of 3.
    assert not data.endswith(b"\r\n\r\n3"), data
    assert data == b"" or data.startswith(b"HTTP/1.1 400"), data


def test_an_apps_connection_header_never_contradicts_the_server(server):
    # sse-starlette and Litestar send `Connection: keep-alive` on streams.
    with RawConn(server.port) as c:
        c.send(b"GET /conn-header?value=keep-alive HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        r = c.read_response()
        assert r.all("connection") in ([], ["close"]), r.headers
    with RawConn(server.port) as c:
        c.send(b"GET /conn-header?value=keep-alive HTTP/1.0\r\nHost: x\r\n\r\n")
        r = c.read_response()
        assert "keep-alive" not in ",".join(r.all("connection")).lower(), r.headers
    with RawConn(server.port) as c:
        # An app's `close` is honoured.
        c.send(b"GET /conn-header?value=close HTTP/1.1\r\nHost: x\r\n\r\n")
        r = c.read_response()
        assert r.all("connection") == ["close"], r.headers
        assert c.is_closed()


def test_head_of_a_streamed_file_response_completes_for_the_app(server):
    # Starlette's StreamingResponse and Django's FileResponse stream on HEAD
    # too: the body is dropped, the app's sends all succeed.
    with RawConn(server.port) as c:
        c.send(b"HEAD /file?id=head&size=300000 HTTP/1.1\r\nHost: x\r\n\r\n")
        head = c.read_until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"content-length: 300000" in head.lower()
        c.send(b"GET /seen?id=head HTTP/1.1\r\nHost: x\r\n\r\n")
        assert json.loads(c.read_response().body) == {"completed": True}


@pytest.mark.parametrize("status", [499, 299, 520])
def test_an_unregistered_status_has_an_empty_reason_phrase(server, status):
    # As uvicorn (h11/httptools) sends it; hyper's own fallback is "<none>".
    with RawConn(server.port) as c:
        c.send(f"GET /no-body-status?id=reason{status}&status={status}&body=1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        line = c.read_until(b"\r\n")
    assert line == f"HTTP/1.1 {status} \r\n".encode(), line
