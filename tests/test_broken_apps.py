"""Apps that misbehave get a clear error (to the app or the log) and the
wire stays correct; clients that vanish leave nothing behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading

import pytest
from harness import ConnectionClosed, RawConn, request, rss_kib, skirr, wait_until


@pytest.fixture(scope="module")
def server():
    with skirr("apps.probe:app", "--no-access-log") as s:
        yield s


def events(server):
    return [e for e in json.loads(request(server.port, "GET", "/events").body) if isinstance(e, dict)]


def test_body_shorter_than_content_length_closes_the_connection(server):
    with RawConn(server.port) as c:
        c.send(b"GET /cl-short HTTP/1.1\r\nHost: a\r\n\r\n")
        r = c.read_head()
        assert r.status == 200 and r.header("content-length") == "10"
        with pytest.raises(ConnectionClosed) as e:
            c.read_exact(10)
        assert e.value.args[0] == b"12345", "what the app sent, then a close: never padded"
    wait_until(lambda: "shorter than its Content-Length (5 of 10 bytes)" in server.logs(), what="logged")


def test_body_longer_than_content_length_raises_in_the_app(server):
    with RawConn(server.port) as c:
        c.send(b"GET /cl-long HTTP/1.1\r\nHost: a\r\n\r\n")
        r = c.read_response()
        assert r.body == b"12345", "the wire carries exactly the declared length"
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        assert c.read_response().body == b"ok", "framing intact: the connection is reusable"
    err = wait_until(lambda: [e["cl_long"] for e in events(server) if "cl_long" in e], what="app error")
    assert "longer than its Content-Length of 5 bytes (7 bytes sent)" in err[0]


@pytest.mark.parametrize("status", [204, 304])
def test_body_on_a_bodiless_status_is_dropped_not_raised(server, status):
    # As every peer does (RFC 9110 §15.3.5, §15.4.5); tests/test_fidelity.py
    # checks the warning.
    with RawConn(server.port) as c:
        c.send(f"GET /status-body?status={status} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
        r = c.read_response()
        assert r.status == status
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        assert c.read_response().body == b"ok", "no stray body bytes on the wire"
    assert not [e for e in events(server) if "status_body" in e]


def test_app_ignoring_a_large_upload_buffers_a_bounded_amount(server):
    pid = server.proc.pid
    before = rss_kib(pid)
    total = 200 << 20
    with RawConn(server.port) as c:
        c.send(f"POST /no-read HTTP/1.1\r\nHost: a\r\nContent-Length: {total}\r\n\r\n".encode())
        r = c.read_response()
        assert r.body == b"did not read"
        # The rest is either drained or the connection closed: keep sending
        # until the server stops taking it, never more than the upload.
        sent, chunk = 0, b"x" * 65536
        try:
            c.sock.settimeout(3)
            while sent < total:
                c.sock.send(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
    grown = (rss_kib(pid) - before) / 1024
    assert grown < 32, f"server RSS grew {grown:.1f} MiB for an unread {total >> 20} MiB upload"
    assert request(server.port).status == 200


def test_leaked_tasks_are_cancelled_at_shutdown(tmp_path):
    marker = tmp_path / "cancelled"
    with skirr("apps.probe:app", "--no-access-log", "--graceful-timeout", "5") as s:
        r = request(s.port, "GET", f"/leak-tasks?n=50&marker={marker}")
        assert r.body == b"50"
        assert request(s.port).status == 200, "leaked tasks do not stop the server"
        s.send_signal(signal.SIGTERM)
        assert s.wait(10) == 0
    assert marker.read_text() == "cancelled", "the leaked task's finally ran"


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_ten_thousand_disconnects_leave_nothing_behind(server):
    pid = server.proc.pid
    for _ in range(50):
        request(server.port)
    rss0, fds0 = rss_kib(pid), _fds(pid)

    def mid_request(n: int):
        # Head and part of a body, then gone.
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            s.sendall(b"POST /upload-count HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
            s.close()

    def mid_stream(n: int):
        # A streaming response started, then gone.
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            s.sendall(b"GET /stream?n=1000&delay=0.001 HTTP/1.1\r\nHost: a\r\n\r\n")
            s.recv(64)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()

    threads = [threading.Thread(target=mid_request, args=(1750,)) for _ in range(4)]
    threads += [threading.Thread(target=mid_stream, args=(750,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive()

    wait_until(lambda: _fds(pid) <= fds0 + 2, timeout=30, what="descriptors back to baseline")
    cpu0 = _cpu_seconds(pid)
    wait_until(lambda: request(server.port).status == 200, what="still serving")
    # Idle now: nothing left spinning.
    import time

    time.sleep(1.0)  # a measured idle interval, not a wait for readiness
    idle_cpu = _cpu_seconds(pid) - cpu0
    grown = (rss_kib(pid) - rss0) / 1024
    print(f"\n10,000 disconnects: RSS {grown:+.1f} MiB, fds {_fds(pid) - fds0:+d}, idle CPU {idle_cpu:.2f} s/s")
    assert idle_cpu < 0.2, f"{idle_cpu:.2f} s of CPU in 1 s idle: something spins"
    assert grown < 16, f"RSS grew {grown:.1f} MiB over 10,000 disconnects"
