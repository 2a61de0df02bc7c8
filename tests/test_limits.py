"""Size limits and timeouts: each answered with the right status (or a
clean close) at its documented default, and settable by option."""

from __future__ import annotations

import json
import time

import pytest
from harness import ConnectionClosed, RawConn, request, skirr, wait_until


@pytest.fixture(scope="module")
def server():
    with skirr("apps.probe:app", "--no-access-log") as s:
        yield s


def events(server):
    return [e for e in json.loads(request(server.port, "GET", "/events").body) if isinstance(e, dict)]


def head_with(port: int, target: str = "/", extra: str = "") -> tuple[int, bytes, bool]:
    with RawConn(port) as c:
        c.send(f"GET {target} HTTP/1.1\r\nHost: a\r\n{extra}\r\n".encode())
        r = c.read_response()
        return r.status, r.body, c.is_closed()


# ---------------------------------------------------------------- defaults


def test_request_line_limit_default_4094(server):
    # "GET " + target + " HTTP/1.1" is the request line.
    assert head_with(server.port, "/" + "a" * (4094 - 14))[0] == 404
    status, body, closed = head_with(server.port, "/" + "a" * (4094 - 13))
    assert (status, body, closed) == (414, b"request line too long", True)


def test_header_field_size_default_8190(server):
    # Gunicorn 27 counts the line with its CRLF: `len(line) + 2 > 8190`
    # rejects ("X-A: " is 5 bytes).
    assert head_with(server.port, extra="X-A: " + "v" * (8190 - 7) + "\r\n")[0] == 200
    status, body, closed = head_with(server.port, extra="X-A: " + "v" * (8190 - 6) + "\r\n")
    assert (status, body, closed) == (431, b"header field too large", True)


@pytest.mark.parametrize("pad", ["lead", "trail", "only"])
def test_header_field_size_counts_the_whitespace_the_parser_drops(server, pad):
    # The whole field line as received counts, as in Gunicorn: a 9,006-byte
    # line of spaces is over the limit though its trimmed value is empty.
    spaces = " " * 9000
    line = {"lead": f"X-A:{spaces}v", "trail": f"X-A: v{spaces}", "only": f"X-A:{spaces}  "}[pad]
    status, body, closed = head_with(server.port, extra=line + "\r\n")
    assert (status, body, closed) == (431, b"header field too large", True)
    # At the limit exactly (8188 bytes + CRLF) it passes, whitespace or not.
    assert head_with(server.port, extra="X-A:" + " " * 8184 + "\r\n")[0] == 200
    assert head_with(server.port, extra="X-A:" + " " * 8185 + "\r\n")[0] == 431


def test_header_field_size_counts_whitespace_on_a_reused_connection(server):
    # The second request of a keep-alive connection is measured too, and a
    # long line of one request does not taint the next.
    with RawConn(server.port) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\nX-A: v\r\n\r\n")
        assert c.read_response().status == 200
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\nX-A: v" + b"\t" * 8200 + b"\r\n\r\n")
        assert c.read_response().status == 431
    with RawConn(server.port) as c:
        # Split across writes: the line is counted across reads.
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\nX-A:")
        time.sleep(0.05)
        c.send(b" " * 8190)
        time.sleep(0.05)
        c.send(b"v\r\n\r\n")
        assert c.read_response().status == 431


def test_header_count_default_100(server):
    # Host plus 99 more fields is the limit.
    ok = "".join(f"X-{i}: v\r\n" for i in range(99))
    assert head_with(server.port, extra=ok)[0] == 200
    status, _, closed = head_with(server.port, extra=ok + "X-last: v\r\n")
    assert status == 431 and closed


def test_total_head_size_default_64k(server):
    # Each field under the per-field limit, together over 64 KiB.
    fields = "".join(f"X-{i}: {'v' * 7000}\r\n" for i in range(10))
    status, _, closed = head_with(server.port, extra=fields)
    assert status == 431 and closed


def test_request_body_unlimited_by_default(server):
    body = b"x" * (3 << 20)
    r = request(server.port, "POST", "/upload-count", body=body)
    assert json.loads(r.body)["bytes"] == len(body)


# ---------------------------------------------------------------- options


@pytest.fixture(scope="module")
def strict():
    with skirr(
        "apps.probe:app",
        "--no-access-log",
        "--limit-request-line",
        "200",
        "--limit-request-fields",
        "5",
        "--limit-request-field-size",
        "300",
        "--max-head-size",
        "1024",
        "--max-body-size",
        "1000",
        "--body-read-timeout",
        "1",
        "--header-read-timeout",
        "1",
    ) as s:
        yield s


@pytest.fixture(scope="module")
def deadline():
    with skirr("apps.probe:app", "--no-access-log", "--response-start-timeout", "1") as s:
        yield s


def test_limits_follow_their_options(strict):
    assert head_with(strict.port, "/" + "a" * 150)[0] == 404
    assert head_with(strict.port, "/" + "a" * 200)[0] == 414
    assert head_with(strict.port, extra="X-A: " + "v" * 250 + "\r\n")[0] == 200
    assert head_with(strict.port, extra="X-A: " + "v" * 300 + "\r\n")[0] == 431
    assert head_with(strict.port, extra="".join(f"X-{i}: v\r\n" for i in range(4)))[0] == 200
    assert head_with(strict.port, extra="".join(f"X-{i}: v\r\n" for i in range(5)))[0] == 431
    assert head_with(strict.port, extra="".join(f"X-{i}: {'v' * 280}\r\n" for i in range(4)))[0] == 431


def test_body_over_max_body_size_with_content_length_is_413(strict):
    with RawConn(strict.port) as c:
        c.send(b"POST /upload-count HTTP/1.1\r\nHost: a\r\nContent-Length: 1001\r\n\r\n")
        r = c.read_response()
        assert (r.status, r.body) == (413, b"request body too large")
        assert r.header("connection") == "close"
        assert c.is_closed()
    r = request(strict.port, "POST", "/upload-count", body=b"x" * 1000)
    assert json.loads(r.body)["bytes"] == 1000


def test_chunked_body_growing_past_max_body_size_is_413(strict):
    with RawConn(strict.port) as c:
        c.send(b"POST /upload-count?tag=big HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(3):
            c.send(b"1f4\r\n" + b"x" * 500 + b"\r\n")
        r = c.read_response()
        assert r.status == 413
        assert c.is_closed()
    # The app saw the request end as a disconnect, not as a complete body.
    wait_until(lambda: any("upload_disconnect" in e for e in events(strict)), what="app saw disconnect")


def test_stalled_request_body_is_408(strict):
    with RawConn(strict.port) as c:
        # Chunked: streamed to the app as it arrives (not prefetched).
        c.send(b"POST /upload-count HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n")
        t0 = time.monotonic()
        r = c.read_response()
        waited = time.monotonic() - t0
        assert (r.status, r.body) == (408, b"request body not received in time")
        assert c.is_closed()
    assert 0.9 <= waited < 8, waited


def test_stalled_small_body_read_before_the_app_is_408(strict):
    # Bodies up to body_prefetch are read before the app starts.
    with RawConn(strict.port) as c:
        c.send(b"POST /upload-count HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        r = c.read_response()
        assert (r.status, r.body) == (408, b"request body not received in time")
        assert c.is_closed()


def test_a_slow_but_steady_body_is_not_cut_off(strict):
    with RawConn(strict.port) as c:
        c.send(b"POST /upload-count HTTP/1.1\r\nHost: a\r\nContent-Length: 8\r\nConnection: close\r\n\r\n")
        for _ in range(8):
            time.sleep(0.3)  # the client's pace, 2.4 s in all: over the 1 s timeout, each gap under it
            c.send(b"x")
        r = c.read_response()
        assert json.loads(r.body)["bytes"] == 8


def test_slowloris_head_is_cut_off(strict):
    with RawConn(strict.port) as c:
        c.send(b"GET / HTTP/1.1\r\n")
        t0 = time.monotonic()
        closed = False
        try:
            for _ in range(40):
                time.sleep(0.1)
                c.send(b"X")
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        closed = closed or c.is_closed(timeout=3)
        assert closed, "a trickled head must be cut off"
        assert time.monotonic() - t0 < 6


def test_app_not_starting_its_response_gets_503(deadline):
    t0 = time.monotonic()
    with RawConn(deadline.port) as c:
        c.send(b"GET /slow-start?secs=3 HTTP/1.1\r\nHost: a\r\n\r\n")
        r = c.read_response()
        assert r.status == 503 and c.is_closed()
    # The server's answer at 1 s, not the app's at 3 s (a loaded machine
    # may take a good part of a second more).
    assert time.monotonic() - t0 < 2.8
    # The app learns the client is gone when it finally sends.
    wait_until(lambda: any(e.get("slow_start") == "ClientDisconnected" for e in events(deadline)), what="app error")
    # A response started in time is unaffected.
    assert request(deadline.port, "GET", "/sleep?secs=0.2").status == 200


def test_response_start_deadline_is_off_by_default(server):
    r = request(server.port, "GET", "/sleep?secs=1.2")
    assert r.status == 200


def test_gunicorn_limit_settings_are_honoured():
    from harness import gunicorn

    with gunicorn("apps.probe:app", "--limit-request-line", "100", "--limit-request-field_size", "200") as g:
        assert head_with(g.port, "/" + "a" * 50)[0] == 404
        assert head_with(g.port, "/" + "a" * 100)[0] == 414
        assert head_with(g.port, extra="X-A: " + "v" * 250 + "\r\n")[0] == 431
        assert head_with(g.port, extra="X-A:" + " " * 250 + "v\r\n")[0] == 431


def test_rejected_requests_leave_no_half_read_head(server):
    # After a 431 the connection closes, so a half-read head can never be
    # taken for the start of the next request.
    with RawConn(server.port) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\nX-A: " + b"v" * 9000 + b"\r\n\r\nGET /events HTTP/1.1\r\nHost: a\r\n\r\n")
        assert c.read_response().status == 431
        try:
            rest = c.read_to_eof()
        except ConnectionClosed:
            rest = b""
        assert rest == b""


def test_a_request_line_too_long_to_buffer_is_414_not_431():
    # 256 KiB of target: more than hyper buffers for a head (64 KiB), which
    # answers 431 itself; the request line is what is too long (c47abb2: 431).
    with skirr("apps.probe:app", "--no-access-log") as s, RawConn(s.port) as c:
        c.send(b"GET /" + b"a" * (256 * 1024) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        r = c.read_response()
        assert r.status == 414 and r.body == b"request line too long", r
        assert r.header("connection") == "close"
        # Under the buffer, the head checks answer 414 too.
    with skirr("apps.probe:app", "--no-access-log") as s, RawConn(s.port) as c:
        c.send(b"GET /" + b"a" * (20 * 1024) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c.read_response().status == 414
    # A head too large because of its fields is still hyper's 431.
    with skirr("apps.probe:app", "--no-access-log") as s, RawConn(s.port) as c:
        fields = b"".join(b"X-F%d: %s\r\n" % (i, b"v" * 4000) for i in range(20))
        c.send(b"GET / HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
        assert c.read_response().status == 431
