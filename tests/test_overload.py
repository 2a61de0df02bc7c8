"""Overload: the per-worker connection limit, descriptor exhaustion, and
10,000 concurrent connections on one worker with bounded memory."""

from __future__ import annotations

import os
import resource
import selectors
import socket
import sys

import pytest
from harness import PY, ConnectionClosed, RawConn, listening_socket, request, rss_kib, skirr, start, wait_until

GET = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"


def test_connection_limit_queues_extra_clients_in_the_backlog():
    with skirr("apps.probe:app", "--no-access-log", "--max-connections", "2") as s:
        # The readiness probe's connection may still hold a slot for a moment.
        a, b = RawConn(s.port), RawConn(s.port)
        for c in (a, b):
            c.send(GET)
            assert c.read_response().status == 200
        third = RawConn(s.port)  # the kernel completes the handshake; Skirr does not accept
        third.send(GET)
        third.sock.settimeout(0.05)
        with pytest.raises(TimeoutError):
            third.sock.recv(1)
        third.sock.settimeout(10)
        # The held connections are retired for it (server::admission): the
        # waiting client is served without either client leaving.
        assert third.read_response().status == 200
        third.send(GET)
        assert third.read_response().status == 200
        a.close()
        b.close()
        third.close()


def test_every_new_connection_is_answered_while_busy_clients_hold_every_slot():
    # Issue 23: 40 keep-alive clients sending back to back hold all 20 slots
    # of one worker. Before fair admission every newcomer waited in the
    # backlog for as long as they kept sending (12 of 12 probes timed out
    # in the run); now held connections are retired, oldest first,
    # after their current response (with Connection: close).
    import http.client
    import threading
    import time

    from harness import TIMEOUT, gunicorn

    with gunicorn("apps.probe:app", "-w", "1", "--worker-connections", "20") as g:
        stop = threading.Event()
        served = [0]
        closes = [0]

        def busy() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=30)
            while not stop.is_set():
                try:
                    conn.request("GET", "/")
                    r = conn.getresponse()
                    r.read()
                    served[0] += 1
                    if r.will_close:
                        closes[0] += 1
                        conn.close()
                except (OSError, http.client.HTTPException):
                    conn.close()
            conn.close()

        threads = [threading.Thread(target=busy, daemon=True) for _ in range(40)]
        for t in threads:
            t.start()
        wait_until(lambda: served[0] > 2000, timeout=TIMEOUT * 3, what="busy clients holding every slot")
        waits = []
        try:
            for _ in range(8):
                t0 = time.monotonic()
                c = http.client.HTTPConnection("127.0.0.1", g.port, timeout=10)
                c.request("GET", "/healthz", headers={"Connection": "close"})
                r = c.getresponse()
                assert (r.status, r.read()) == (200, b"ok")
                c.close()
                waits.append(time.monotonic() - t0)
        finally:
            stop.set()
            for t in threads:
                t.join(TIMEOUT)
        shown = ", ".join(f"{w:.2f}" for w in waits)
        print(f"probes answered in {shown} s; {served[0]} busy requests, {closes[0]} retired")
        assert closes[0] > 0


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _limited_server(nofile: int):
    """``python -m skirr`` with RLIMIT_NOFILE lowered to ``nofile``."""
    sock = listening_socket()
    port = sock.getsockname()[1]
    prelude = (
        "import resource, runpy, sys;"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile}));"
        "sys.argv = ['skirr', *sys.argv[1:]];"
        "runpy.run_module('skirr', run_name='__main__')"
    )
    cmd = [PY, "-c", prelude, "apps.probe:app", "--fd", str(sock.fileno()), "--no-access-log"]
    return start(cmd, sock=sock, port=port, uds=None)


def test_descriptor_exhaustion_pauses_accepting_and_recovers():
    server = _limited_server(64)
    try:
        pid = server.proc.pid
        base = _fd_count(pid)
        kept = RawConn(server.port)
        kept.send(GET)
        assert kept.read_response().status == 200
        # Fill the descriptor table; the extra clients wait in the backlog.
        conns = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(80)]
        wait_until(lambda: _fd_count(pid) >= 64 - 2, what="descriptors exhausted")
        wait_until(lambda: "pausing accepts" in server.logs(), what="EMFILE logged")
        # An existing connection is still served.
        kept.send(GET)
        assert kept.read_response().status == 200
        assert server.logs().count("pausing accepts") == 1, "logged once per episode"
        # Free descriptors: accepting resumes and the waiting clients are served.
        for c in conns:
            c.close()
        wait_until(lambda: _fd_count(pid) <= base + 4, what="descriptors freed")
        assert request(server.port).status == 200
        kept.close()
    finally:
        server.stop()


def test_ten_thousand_concurrent_connections_with_bounded_memory():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 10_000 + 500  # per process: the server's and this client's
    if hard < need:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below {need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sock = listening_socket()
    sock.listen(4096)
    port = sock.getsockname()[1]
    prelude = (
        "import resource, runpy, sys;"
        "h = resource.getrlimit(resource.RLIMIT_NOFILE)[1];"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (h, h));"
        "sys.argv = ['skirr', *sys.argv[1:]];"
        "runpy.run_module('skirr', run_name='__main__')"
    )
    cmd = [PY, "-c", prelude, "apps.probe:app", "--fd", str(sock.fileno()), "--no-access-log"]
    server = start(cmd, sock=sock, port=port, uds=None)
    conns: list[socket.socket] = []
    try:
        pid = server.proc.pid
        for _ in range(20):
            request(port)
        before = rss_kib(pid)
        sel = selectors.DefaultSelector()
        for _ in range(10_000):
            c = socket.socket()
            c.settimeout(10)
            c.connect(("127.0.0.1", port))
            conns.append(c)
        for c in conns:
            c.sendall(GET)
            c.setblocking(False)
            sel.register(c, selectors.EVENT_READ, bytearray())
        answered = 0
        while answered < len(conns):
            events = sel.select(timeout=20)
            assert events, f"only {answered} of {len(conns)} connections answered"
            for key, _ in events:
                buf = key.data
                data = key.fileobj.recv(4096)
                if not data:
                    raise ConnectionClosed(bytes(buf))
                buf += data
                if buf.endswith(b"ok"):
                    answered += 1
                    sel.unregister(key.fileobj)
        peak_mib = (rss_kib(pid) - before) / 1024
        # Idle connections are parked (hyper's buffers freed) after 250 ms.
        try:
            wait_until(lambda: rss_kib(pid) - before < 48 * 1024, timeout=10, what="idle connections parked")
        finally:
            grown_mib = (rss_kib(pid) - before) / 1024
            print(f"\n10,000 open connections, each answered once: RSS +{peak_mib:.1f} MiB, +{grown_mib:.1f} MiB idle")
        assert request(port).status == 200, "still serving new clients"
    finally:
        for c in conns:
            c.close()
        server.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
