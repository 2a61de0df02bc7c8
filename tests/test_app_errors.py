"""Application errors: a clear answer on the wire, a traceback in the log,
and a worker that keeps serving."""

from __future__ import annotations

import pytest
from harness import RawConn, request, skirr, wait_until


@pytest.fixture(scope="module")
def server():
    with skirr("apps.probe:app", "--no-access-log") as s:
        yield s


def test_exception_before_start_is_a_500_without_traceback(server):
    r = request(server.port, "GET", "/error-before")
    assert r.status == 500
    assert r.body == b"Internal Server Error"
    assert b"secret-token-123" not in r.body and b"Traceback" not in r.body
    log = wait_until(lambda: "secret-token-123" in server.logs() and server.logs(), what="log")
    assert "Exception in ASGI application" in log
    assert "Traceback" in log and "RuntimeError: boom before start" in log


def test_exception_after_start_closes_the_connection(server):
    with RawConn(server.port) as c:
        c.send(b"GET /error-after HTTP/1.1\r\nHost: x\r\n\r\n")
        head = c.read_head()
        assert head.status == 200 and head.header("transfer-encoding") == "chunked"
        data = c.read_to_eof()
        assert b"partial" in data
        assert not data.endswith(b"0\r\n\r\n"), "an aborted response must not look complete"
    wait_until(lambda: "boom after start" in server.logs(), what="log")


def test_app_returning_without_response_is_a_500(server):
    r = request(server.port, "GET", "/no-response")
    assert r.status == 500
    wait_until(lambda: "returned without starting response" in server.logs(), what="log")


def test_app_returning_after_start_only_is_a_500(server):
    r = request(server.port, "GET", "/start-only")
    assert r.status == 500
    wait_until(lambda: "returned without completing response" in server.logs(), what="log")


def test_errors_never_affect_other_connections(server):
    with RawConn(server.port) as slow:
        slow.send(b"GET /sleep?secs=0.5 HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(20):
            assert request(server.port, "GET", "/error-before").status == 500
        assert slow.read_response().body == b"slept"
    assert request(server.port).status == 200
    assert server.proc.poll() is None
