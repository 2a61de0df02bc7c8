"""Every response Skirr writes, or starts to write, gets exactly one
access-log line with the status on the wire and the body bytes sent:
answers given before the app runs, the server's answers while it runs,
streams the client aborted, and apps that fail after the start."""

from __future__ import annotations

import re
import socket

import pytest
from harness import RawConn, gunicorn, request, skirr, wait_until

APP = "apps.fidelity_app:app"
ARGS = (
    "--max-body-size", "1000",
    "--body-read-timeout", "0.5",
    "--response-start-timeout", "0.5",
    "--limit-request-field-size", "200",
)  # fmt: skip


@pytest.fixture(scope="module", params=["standalone", "gunicorn"])
def server(request):
    if request.param == "standalone":
        with skirr(APP, *ARGS) as s:
            yield s
    else:
        env = {
            "SKIRR_MAX_BODY_SIZE": "1000",
            "SKIRR_BODY_READ_TIMEOUT": "0.5",
            "SKIRR_RESPONSE_START_TIMEOUT": "0.5",
        }
        fmt = '%(r)s %(s)s %(B)s'
        with gunicorn(APP, "-w", "1", "--access-logfile", "-", "--access-logformat", fmt,
                      "--limit-request-field_size", "200", env=env) as g:  # fmt: skip
            yield g


def lines(server, marker: str) -> list[str]:
    return [ln for ln in server.logs().splitlines() if marker in ln and ("HTTP/1.1" in ln or "HTTP/1.0" in ln)]


def one_line(server, marker: str) -> str:
    got = wait_until(lambda: lines(server, marker) or None, what=f"an access line for {marker}")
    # No second line follows.
    request(server.port, "GET", "/seen?id=flush")
    wait_until(lambda: lines(server, "/seen?id=flush"), what="the flush line")
    got = lines(server, marker)
    assert len(got) == 1, got
    return got[0]


def status_and_size(line: str) -> tuple[int, int]:
    m = re.search(r'HTTP/1\.[01]"? (\d{3}) (\d+)', line)
    assert m, line
    return int(m.group(1)), int(m.group(2))


def test_a_header_too_large_is_logged(server):
    with RawConn(server.port) as c:
        c.send(b"GET /seen?id=big-header HTTP/1.1\r\nHost: a\r\nX-Big: " + b"b" * 300 + b"\r\n\r\n")
        assert c.read_response().status == 431
    assert status_and_size(one_line(server, "/seen?id=big-header"))[0] == 431


def test_a_body_too_large_is_logged(server):
    with RawConn(server.port) as c:
        c.send(b"POST /post?id=too-large HTTP/1.1\r\nHost: a\r\nContent-Length: 5000\r\n\r\n")
        assert c.read_response().status == 413
    assert status_and_size(one_line(server, "/post?id=too-large"))[0] == 413


def test_a_stalled_body_is_logged_408(server):
    with RawConn(server.port) as c:
        c.send(b"POST /post?id=stalled HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nabc")
        assert c.read_response().status == 408
    assert status_and_size(one_line(server, "/post?id=stalled"))[0] == 408


def test_a_response_start_timeout_is_logged_when_answered(server):
    with RawConn(server.port) as c:
        c.send(b"GET /slow?id=late&secs=3 HTTP/1.1\r\nHost: a\r\n\r\n")
        assert c.read_response().status == 503
        # Logged now, not when the app ends three seconds later.
        assert status_and_size(one_line(server, "/slow?id=late"))[0] == 503


def test_a_response_start_timeout_line_counts_the_time_waited():
    # The 503 is the server's answer after response_start_timeout (0.5 s):
    # its line must say so (c47abb2 logged 0.000ms).
    with skirr(APP, *ARGS) as s, RawConn(s.port) as c:
        c.send(b"GET /slow?id=waited&secs=3 HTTP/1.1\r\nHost: a\r\n\r\n")
        assert c.read_response().status == 503
        line = one_line(s, "/slow?id=waited")
        m = re.search(r" 503 \d+ ([\d.]+)ms", line)
        assert m, line
        assert float(m.group(1)) >= 400, line  # the 0.5 s waited (clocks start a little apart)


def test_a_stream_the_client_aborted_is_logged(server):
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    s.sendall(b"GET /stream-forever?id=aborted HTTP/1.1\r\nHost: a\r\n\r\n")
    got = b""
    while len(got) < 2000:
        got += s.recv(65536)
    s.close()
    status, size = status_and_size(one_line(server, "/stream-forever?id=aborted"))
    assert status == 200 and 1000 <= size < 500_000


def test_an_app_failing_after_the_start_is_logged(server):
    with RawConn(server.port) as c:
        c.send(b"GET /raise-after-start?id=fail HTTP/1.1\r\nHost: a\r\n\r\n")
        head = c.read_until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        c.read_to_eof()
    assert status_and_size(one_line(server, "/raise-after-start?id=fail")) == (200, 7)


def test_an_ordinary_response_has_one_line(server):
    request(server.port, "GET", "/file?id=ordinary&size=300000")
    assert status_and_size(one_line(server, "/file?id=ordinary")) == (200, 300000)


def test_control_characters_in_the_path_cannot_forge_a_line(server):
    """A CR/LF/NUL sent percent-encoded is decoded into the scope's path;
    the standalone log encodes it again, as uvicorn does (Gunicorn's
    ``%(r)s`` is the raw request line, encoded as sent)."""
    forged = '[2026-12-01 16:00:00 +0000] 10.0.0.1:1 - "GET /admin HTTP/1.1" 200 1 1ms'
    target = "/seen%0D%0A" + forged.replace(" ", "%20").replace('"', "%22") + "%00?id=forge"
    with RawConn(server.port) as c:
        c.send(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        c.read_to_eof()
    line = one_line(server, "id=forge")
    assert "\r" not in server.logs() and "\x00" not in server.logs()
    assert "/seen%0D%0A" in line, line
    assert not [ln for ln in server.logs().splitlines() if ln.startswith("[2026-12-01 16:00:00")]


WS_HEAD = (
    "GET {path} HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: {version}\r\n\r\n"
)


@pytest.mark.parametrize("kind", ["standalone", "gunicorn"])
def test_every_websocket_handshake_gets_one_line_with_the_status_on_the_wire(kind):
    # Accepted (101), denied by the app (403), the app's own response (401,
    # with its body bytes), Skirr's refusals (426 wrong version, 400 no
    # key): one line each, as uvicorn logs them (c47abb2 logged none).
    fmt = "%(r)s %(s)s %(B)s"
    ctx = (
        skirr("apps.ws_app:app")
        if kind == "standalone"
        else gunicorn("apps.ws_app:app", "-w", "1", "--access-logfile", "-", "--access-logformat", fmt)
    )
    with ctx as s:
        cases = [
            ("/echo?id=ws-ok", "13", 101),
            ("/deny?id=ws-deny", "13", 403),
            ("/http-deny?id=ws-app", "13", 401),
            ("/echo?id=ws-version", "8", 426),
        ]
        for path, version, status in cases:
            with RawConn(s.port) as c:
                c.send(WS_HEAD.format(path=path, version=version).encode())
                assert c.read_head().status == status
        with RawConn(s.port) as c:
            c.send(b"GET /echo?id=ws-nokey HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
            assert c.read_response().status == 400
        for path, _, status in [*cases, ("/echo?id=ws-nokey", "", 400)]:
            got = wait_until(lambda p=path: lines(s, p) or None, what=f"the line for {path}")
            assert len(got) == 1, got
            st, size = status_and_size(got[0])
            assert st == status, got
            if status == 401:
                assert size == len(b"no entry"), got
