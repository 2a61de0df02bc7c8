"""HTTP/1.1 behaviour of the standalone server, checked on raw bytes."""

from __future__ import annotations

import ctypes
import os
import socket
import threading
import time

import pytest
from harness import TIMEOUT, RawConn, request, skirr, wait_until


@pytest.fixture(scope="module")
def server():
    with skirr("apps.probe:app", "--no-access-log") as s:
        yield s


def test_get_and_content_length(server):
    r = request(server.port, "GET", "/")
    assert r.status == 200
    assert r.body == b"ok"
    assert r.header("content-length") == "2"
    assert r.header("date")


def test_keep_alive_serves_several_requests_on_one_connection(server):
    with RawConn(server.port) as c:
        for _ in range(3):
            c.send(b"GET /pid HTTP/1.1\r\nHost: x\r\n\r\n")
            r = c.read_response()
            assert r.status == 200
        assert not c.is_closed(timeout=0.2)


def test_pipelined_requests_are_answered_in_order(server):
    with RawConn(server.port) as c:
        c.send(b"GET /scope/1 HTTP/1.1\r\nHost: x\r\n\r\nGET /scope/2 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b'"/scope/1"' in c.read_response().body
        assert b'"/scope/2"' in c.read_response().body


def test_http10_closes_by_default(server):
    with RawConn(server.port) as c:
        c.send(b"GET / HTTP/1.0\r\n\r\n")
        r = c.read_response()
        assert r.version == "HTTP/1.0" and r.status == 200 and r.body == b"ok"
        assert c.is_closed()


def test_http10_keep_alive_when_requested(server):
    with RawConn(server.port) as c:
        for _ in range(2):
            c.send(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            r = c.read_response()
            assert r.status == 200 and r.body == b"ok"
            assert (r.header("connection") or "").lower() == "keep-alive"
        assert not c.is_closed(timeout=0.2)


def test_http10_streaming_response_is_never_chunked(server):
    with RawConn(server.port) as c:
        c.send(b"GET /stream?n=3 HTTP/1.0\r\n\r\n")
        head = c.read_head()
        assert head.header("transfer-encoding") is None
        assert c.read_to_eof() == b"chunk0\nchunk1\nchunk2\n"


def test_http11_streaming_response_is_chunked(server):
    r = request(server.port, "GET", "/stream?n=2")
    assert r.header("transfer-encoding") == "chunked"
    assert r.body == b"chunk0\nchunk1\n"


def test_chunked_request_body(server):
    body = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    r = request(server.port, "POST", "/echo", headers=[("Transfer-Encoding", "chunked")], body=body)
    assert r.status == 200 and r.body == b"hello world"


def test_head_keeps_headers_and_sends_no_body(server):
    with RawConn(server.port) as c:
        c.send(b"HEAD /head HTTP/1.1\r\nHost: x\r\n\r\n")
        r = c.read_response(head_request=True)
        assert r.status == 200
        assert r.header("content-length") == "10"
        assert r.header("x-head") == "kept"
        # The next response must start right away: no stray body bytes.
        c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        r2 = c.read_response()
        assert r2.status == 200 and r2.body == b"ok"


def test_expect_100_continue_sent_when_app_reads(server):
    with RawConn(server.port) as c:
        c.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        interim = c.read_head()
        assert interim.status == 100
        c.send(b"hello")
        r = c.read_response()
        assert r.status == 200 and r.body == b"hello"


def test_expect_100_continue_not_sent_when_app_does_not_read(server):
    with RawConn(server.port) as c:
        c.send(b"POST /no-read HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        r = c.read_head()
        assert r.status == 200, "the final response comes without a 100 first"


def _pidfd_getfd(pid: int, fd: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        n = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd(2)
        if n < 0:
            raise OSError(ctypes.get_errno(), "pidfd_getfd")
        return n
    finally:
        os.close(pidfd)


def test_accepted_sockets_have_tcp_nodelay(server):
    with RawConn(server.port) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        c.read_response()
        me = c.sock.getsockname()
        found = None
        for name in os.listdir(f"/proc/{server.proc.pid}/fd"):
            try:
                dup = _pidfd_getfd(server.proc.pid, int(name))
            except OSError:
                continue
            try:
                s = socket.socket(fileno=dup)
            except OSError:
                os.close(dup)
                continue
            try:
                if s.type == socket.SOCK_STREAM and s.getpeername() == me:
                    found = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            except OSError:
                pass
            finally:
                s.close()
        assert found is not None, "the server-side socket of our connection was not found"
        assert found != 0


def test_keepalive_timeout_closes_idle_connections():
    # 1 s: the client's pauses below (0.1 s) stay well under it on a loaded
    # machine; the close comes long before the 30 s header_read_timeout.
    with skirr("apps.probe:app", "--no-access-log", "--keepalive-timeout", "1") as s:
        with RawConn(s.port) as c:
            c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            c.read_response()
            t0 = time.monotonic()
            assert c.is_closed(timeout=TIMEOUT)
            assert 0.9 < time.monotonic() - t0 < 6
        with RawConn(s.port) as c:
            # A connection that keeps making requests is never idle for long.
            for _ in range(4):
                c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                assert c.read_response().status == 200
                time.sleep(0.1)


def test_keep_alive_connection_parked_while_idle_still_serves(server):
    # Idle connections are handed back by hyper after 250 ms (see
    # rust/src/proto/h1/mod.rs); the next request must not notice.
    with RawConn(server.port) as c:
        for _ in range(3):
            c.send(b"GET /pid HTTP/1.1\r\nHost: x\r\n\r\n")
            assert c.read_response().status == 200
            time.sleep(0.4)


def test_request_split_around_the_park_delay(server):
    with RawConn(server.port) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        c.read_response()
        time.sleep(0.4)
        c.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-")
        time.sleep(0.4)
        c.send(b"Length: 5\r\n\r\nhello")
        r = c.read_response()
        assert r.status == 200 and r.body == b"hello"


def test_first_chunk_arrives_before_the_app_sends_the_second(server):
    with RawConn(server.port) as c:
        c.send(b"GET /gated-stream?key=k1 HTTP/1.1\r\nHost: x\r\n\r\n")
        head = c.read_head()
        assert head.status == 200
        first = c.read_until(b"first;")
        assert first.endswith(b"first;")
        # Only now does the app get permission to send its second chunk.
        assert request(server.port, "GET", "/release?key=k1").status == 200
        rest = c.read_until(b"0\r\n\r\n")
        assert b"second" in rest


def test_held_start_is_flushed_when_the_app_waits(server):
    with RawConn(server.port) as c:
        c.send(b"GET /start-then-wait?delay=1.5 HTTP/1.1\r\nHost: x\r\n\r\n")
        t0 = time.monotonic()
        head = c.read_head()
        assert time.monotonic() - t0 < 1.0, "headers must not wait for the first body chunk"
        assert head.header("x-early") == "1"


def test_hundred_concurrent_clients(server):
    results = []
    lock = threading.Lock()

    def one(i):
        r = request(server.port, "POST", "/echo", body=f"client-{i}".encode() * 50)
        with lock:
            results.append((i, r.status, r.body))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 100
    for i, status, body in results:
        assert status == 200 and body == f"client-{i}".encode() * 50


def test_large_response_body(server):
    r = request(server.port, "GET", "/bigbody?n=3000000")
    assert r.status == 200 and len(r.body) == 3_000_000 and set(r.body) == {ord("b")}


def test_unknown_path_is_the_apps_404(server):
    assert request(server.port, "GET", "/nope").status == 404


def test_malformed_request_gets_400_and_server_keeps_serving(server):
    with RawConn(server.port) as c:
        c.send(b"GARBAGE\r\n\r\n")
        r = c.read_response()
        assert r.status == 400
    assert request(server.port).status == 200


def test_events_endpoint_answers(server):
    wait_until(lambda: request(server.port, "GET", "/events").status == 200, what="events")
