"""What a drain does to each kind of connection (issue 23): a response that
started before the drain keeps its connection for a request already on its
way (answered with `Connection: close`); a request head not complete, a new
connection that sent nothing and a client that reads nothing hold the drain
only `drain_grace`; open WebSockets get close 1012 on a `max_requests`
recycle, 1001 on SIGTERM, once `drain_grace` has passed; requests in
progress complete. Raw sockets, real servers (standalone and under a
Gunicorn master)."""

from __future__ import annotations

import json
import signal
import socket
import time

from harness import (
    TIMEOUT,
    ConnectionClosed,
    RawConn,
    gunicorn,
    request,
    skirr,
    wait_accepted,
    wait_until,
    worker_pids,
)
from wsraw import CLOSE, WsConn, close_payload, frame

GET = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"


def in_app(port: int, tag: str) -> None:
    """Waits until the app holds ``/sleep?tag=TAG`` (``GET /events``)."""
    wait_until(lambda: {"sleeping": tag} in json.loads(request(port, "GET", "/events").body), what=f"{tag} in the app")


def _read_chunked(c: RawConn) -> bytes:
    body = b""
    while True:
        size = int(c.read_until(b"\r\n").strip().split(b";")[0], 16)
        chunk = c.read_exact(size + 2)[:size]
        if size == 0:
            return body
        body += chunk


def test_a_stream_started_before_the_drain_keeps_its_connection_for_the_next_request():
    # The streamed response's head went out without `Connection: close`: a
    # client may reuse the connection right after it. That request is
    # answered (with `Connection: close`), not lost to a silent close.
    with skirr("apps.probe:app", "--no-access-log", "--graceful-timeout", "15") as s:
        with RawConn(s.port) as c:
            c.send(b"GET /stream?n=15&delay=0.2 HTTP/1.1\r\nHost: a\r\n\r\n")
            head = c.read_head()
            assert head.status == 200 and head.header("connection") is None
            s.send_signal(signal.SIGTERM)
            assert _read_chunked(c).startswith(b"chunk0\nchunk1\n")
            c.send(GET)
            r = c.read_response()
            assert r.status == 200
            assert r.header("connection") == "close"
            assert c.is_closed()
        assert s.wait(15) == 0


def test_a_response_whose_head_is_written_after_the_drain_began_says_close():
    with skirr("apps.probe:app", "--no-access-log", "--graceful-timeout", "15") as s:
        with RawConn(s.port) as c:
            c.send(GET)
            assert c.read_response().status == 200
            c.send(b"GET /sleep?secs=1.5&tag=head-after HTTP/1.1\r\nHost: a\r\n\r\n")
            in_app(s.port, "head-after")  # the request is in the app when the drain begins
            s.send_signal(signal.SIGTERM)
            r = c.read_response()
            assert (r.status, r.body, r.header("connection")) == (200, b"slept", "close")
            assert c.is_closed()
        assert s.wait(15) == 0


class _NonReader:
    """A client that asks for a large body and never reads it."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(TIMEOUT)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(b"GET /bigbody?n=67108864 HTTP/1.1\r\nHost: a\r\n\r\n")

    def received(self) -> int:
        """Reads what the server wrote until its end of stream (or reset)."""
        n = 0
        try:
            while data := self.sock.recv(1 << 20):
                n += len(data)
        except ConnectionResetError:
            pass
        return n


def test_gunicorn_drain_is_short_with_slowloris_and_non_reading_clients():
    # Before issue 23 such a drain lasted until the master's graceful
    # timeout (here 15 s): the partial head held it for header_read_timeout
    # (30 s), the non-reading client for send_timeout (60 s).
    env = {"SKIRR_DRAIN_GRACE": "1"}
    with gunicorn("apps.probe:app", "-w", "1", "--graceful-timeout", "15", env=env) as g:
        wait_until(lambda: len(worker_pids(g.proc.pid)) == 1, what="the worker")
        slow = RawConn(g.port)
        slow.send(b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: ")
        non_reader = _NonReader(g.port)
        idle = RawConn(g.port)
        idle.send(GET)
        assert idle.read_response().status == 200
        busy = RawConn(g.port)
        busy.send(b"POST /sleep?secs=2&tag=busy HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
        # Every client above is in its state when the drain begins: the busy
        # request in the app (the others were accepted before it, in order).
        in_app(g.port, "busy")
        wait_accepted(g.port)
        t0 = time.monotonic()
        g.send_signal(signal.SIGTERM)
        # The request in progress completes, and says close.
        r = busy.read_response()
        assert (r.status, r.body, r.header("connection")) == (200, b"slept", "close")
        for c in (slow, idle):
            assert c.is_closed(timeout=TIMEOUT)
        assert g.wait(20) == 0
        took = time.monotonic() - t0
        # The drain takes the request's 2 s and the 1 s grace, not 15 s.
        assert took < 8, f"the drain took {took:.1f} s"
        # The non-reading client's response was cut, not completed.
        assert non_reader.received() < 67108864
        for c in (slow, idle, busy):
            c.close()
        non_reader.sock.close()


def _answer_close(c: WsConn, code: int) -> None:
    c.send(frame(CLOSE, close_payload(code)))
    try:
        c.read_to_eof()
    except ConnectionClosed:
        pass


def test_a_max_requests_recycle_closes_websockets_with_1012_after_the_grace():
    # A recycle would otherwise hold the WebSocket, and the worker, until
    # the drain deadline (here 20 s): the client is told to reconnect.
    args = ("--max-requests", "3", "--drain-grace", "0.5", "--graceful-timeout", "20")
    with skirr("apps.ws_app:app", *args) as s:  # the readiness probe is request 1
        with WsConn(s.port) as ws:
            assert ws.handshake("/idle").status == 101  # request 2
            with RawConn(s.port) as c:
                c.send(GET)  # request 3: the worker recycles
                r = c.read_response()
                assert (r.status, r.header("connection")) == (200, "close")
            t0 = time.monotonic()
            code, reason = ws.read_close()
            assert (code, reason) == (1012, "service restart")
            assert time.monotonic() - t0 < 10
            _answer_close(ws, 1012)
        assert s.wait(15) == 0


def test_sigterm_closes_websockets_with_1001_after_the_grace_not_the_deadline():
    with skirr("apps.ws_app:app", "--drain-grace", "0.5", "--graceful-timeout", "20") as s:
        with WsConn(s.port) as ws:
            assert ws.handshake("/idle").status == 101
            s.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            assert ws.read_close() == (1001, "server shutting down")
            waited = time.monotonic() - t0
            assert 0.3 < waited < 10, waited
            _answer_close(ws, 1001)
        assert s.wait(15) == 0


def test_drain_grace_zero_keeps_the_old_drain():
    # Off: a partial head is given header_read_timeout, as before.
    with skirr("apps.probe:app", "--drain-grace", "0", "--graceful-timeout", "1.5") as s:
        with RawConn(s.port) as slow:
            slow.send(b"GET / HTTP/1.1\r\nHost: a\r\n")
            wait_accepted(s.port)  # one left queued would never be closed
            t0 = time.monotonic()
            s.send_signal(signal.SIGTERM)
            assert slow.is_closed(timeout=TIMEOUT)
            assert time.monotonic() - t0 >= 1.0, "held until the graceful timeout"
        assert s.wait(15) == 0


def test_a_head_completed_within_the_grace_is_served_with_close():
    with skirr("apps.probe:app", "--drain-grace", "3", "--graceful-timeout", "15") as s:
        with RawConn(s.port) as c:
            c.send(b"GET / HTTP/1.1\r\nHost: a\r\n")
            wait_accepted(s.port)  # one left queued would never be served
            s.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            c.send(b"\r\n")
            r = c.read_response()
            assert (r.status, r.header("connection")) == (200, "close")
        assert s.wait(15) == 0

