"""Malformed and hostile requests (RFC 9112): each gets the right 4xx or a
clean close, the connection's framing never desynchronizes, and other
connections carry on. Raw bytes throughout."""

from __future__ import annotations

import json
import threading

import pytest
from harness import ConnectionClosed, RawConn, request, rss_kib, skirr, wait_until


@pytest.fixture(scope="module")
def server():
    with skirr("apps.probe:app", "--no-access-log") as s:
        yield s


def send_raw(port: int, raw: bytes):
    """Sends ``raw`` on a new connection: (response or None, closed after)."""
    with RawConn(port) as c:
        c.send(raw)
        try:
            r = c.read_response(head_request=raw.startswith(b"HEAD"))
        except (ConnectionClosed, ConnectionResetError):
            return None, True
        return r, c.is_closed(timeout=2.0)


def expect_rejected(port: int, raw: bytes, status: int = 400) -> None:
    r, closed = send_raw(port, raw)
    assert r is not None, "expected an error response, got a bare close"
    assert r.status == status, (r.status, r.body)
    assert closed, "the connection must close after a framing error"


BAD_FRAMING = {
    "conflicting content-length": (
        b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"
    ),
    "content-length list that conflicts": b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 6\r\n\r\nhello!",
    "signed content-length": b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhello",
    "negative content-length": b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\nhello",
    "hex content-length": b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\nhello",
    "te not ending in chunked": b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n",
    "te gzip only": b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\nhello",
    "te lookalike": b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
    "te on http/1.0": b"POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "obs-fold": b"GET / HTTP/1.1\r\nHost: a\r\nX-A: one\r\n two\r\n\r\n",
    "space before colon": b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
    "NUL in value": b"GET / HTTP/1.1\r\nHost: a\r\nX-A: a\x00b\r\n\r\n",
    "bare CR in value": b"GET / HTTP/1.1\r\nHost: a\r\nX-A: a\rb\r\n\r\n",
    "space in name": b"GET / HTTP/1.1\r\nHost: a\r\nX A: b\r\n\r\n",
    "separator in name": b"GET / HTTP/1.1\r\nHost: a\r\nX(A): b\r\n\r\n",
    "empty name": b"GET / HTTP/1.1\r\nHost: a\r\n: b\r\n\r\n",
    "invalid method token": b"G@T / HTTP/1.1\r\nHost: a\r\n\r\n",
    "http/2.0 without preface": b"GET / HTTP/2.0\r\nHost: a\r\n\r\n",
    "http/3": b"GET / HTTP/3\r\nHost: a\r\n\r\n",
    "http/1.2": b"GET / HTTP/1.2\r\nHost: a\r\n\r\n",
    "missing version": b"GET /\r\nHost: a\r\n\r\n",
    "control character in target": b"GET /a\x01b HTTP/1.1\r\nHost: a\r\n\r\n",
}


@pytest.mark.parametrize("case", sorted(BAD_FRAMING))
def test_malformed_head_is_400_and_closes(server, case):
    expect_rejected(server.port, BAD_FRAMING[case])


@pytest.mark.parametrize(
    "te,status",
    [(b"gzip, chunked", 501), (b"x-custom;q=1, chunked", 501), (b"chunked, chunked", 400)],
)
def test_transfer_codings_other_than_one_chunked_are_refused(server, te, status):
    # RFC 9112 §6.1 (501 for a coding the server does not implement) and
    # §7.1 (chunked only once): the app never sees a body still encoded.
    expect_rejected(
        server.port,
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: " + te + b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        status,
    )
    assert request(server.port).status == 200


BAD_BODIES = {
    "invalid chunk size": b"zz\r\nhello\r\n0\r\n\r\n",
    "chunk size overflow": b"ffffffffffffffffffff\r\nhello\r\n0\r\n\r\n",
    "chunk data longer than its size": b"5\r\nhelloEXTRA\r\n0\r\n\r\n",
    "chunk without CRLF after data": b"5\r\nhelloX0\r\n\r\n",
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_malformed_chunked_body_is_400_and_closes(server, case):
    head = b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    expect_rejected(server.port, head + BAD_BODIES[case])


def test_content_length_with_transfer_encoding_reads_chunked_then_closes(server):
    # A smuggling attempt: a front end honouring Content-Length would pass the
    # second request through inside the body. Skirr reads the chunked body
    # (RFC 9112 §6.1), answers once, and closes: the inner request is never served.
    smuggled = b"GET /events HTTP/1.1\r\nHost: a\r\n\r\n"
    raw = (
        b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n" + smuggled
    )
    with RawConn(server.port) as c:
        c.send(raw)
        r = c.read_response()
        assert r.status == 200 and r.body == b"hello"
        assert r.header("connection") == "close"
        assert c.read_to_eof() == b"", "nothing after the first response: the inner request was not served"


def test_identical_duplicate_content_length_is_accepted(server):
    raw = b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    r, _ = send_raw(server.port, raw)
    assert r.status == 200 and r.body == b"hello"


@pytest.mark.parametrize(
    "headers,why",
    [
        (b"", b"missing Host header"),
        (b"Host: a\r\nHost: b\r\n", b"more than one Host header"),
        (b"Host: a b\r\n", b"invalid Host header"),
        (b"Host: user@example.com\r\n", b"invalid Host header"),
        (b"Host: example.com:http\r\n", b"invalid Host header"),
    ],
)
def test_host_rules_on_http11(server, headers, why):
    r, closed = send_raw(server.port, b"GET / HTTP/1.1\r\n" + headers + b"\r\n")
    assert r.status == 400 and r.body == why and closed


def test_http10_without_host_is_served(server):
    r, _ = send_raw(server.port, b"GET / HTTP/1.0\r\n\r\n")
    assert r.status == 200 and r.body == b"ok"


def test_ipv6_host_with_port_is_valid(server):
    r, _ = send_raw(server.port, b"GET / HTTP/1.1\r\nHost: [::1]:8000\r\nConnection: close\r\n\r\n")
    assert r.status == 200


def test_absolute_form_target_routes_on_its_path(server):
    raw = b"GET http://example.com/scope/x?q=1 HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n"
    r, _ = send_raw(server.port, raw)
    assert r.status == 200
    scope = json.loads(r.body)
    assert scope["path"] == "/scope/x"
    assert scope["query_string"] == {"bytes": "q=1"}


def test_asterisk_form_is_for_options_only(server):
    r, _ = send_raw(server.port, b"OPTIONS * HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert r.status == 404 and r.body == b"not found", "OPTIONS * reaches the app (path '*')"
    expect_rejected(server.port, b"GET * HTTP/1.1\r\nHost: a\r\n\r\n")


def test_authority_form_and_connect(server):
    expect_rejected(server.port, b"GET example.com:80 HTTP/1.1\r\nHost: a\r\n\r\n")
    expect_rejected(server.port, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 501)


def test_other_schemes_in_absolute_form(server):
    expect_rejected(server.port, b"GET ftp://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n")


def test_unknown_methods_reach_the_app(server):
    r, _ = send_raw(server.port, b"BREW /scope HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert r.status == 200 and json.loads(r.body)["method"] == "BREW"


def test_http2_prior_knowledge_preface_is_closed_cleanly(server):
    r, closed = send_raw(server.port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert closed
    assert r is None or r.status in (400, 505)


def test_bare_lf_line_endings_are_accepted(server):
    # RFC 9112 §2.2 lets a recipient accept a bare LF as a line terminator;
    # hyper (like nginx) does, and the request is framed the same way.
    r, _ = send_raw(server.port, b"GET / HTTP/1.1\nHost: a\nConnection: close\n\n")
    assert r.status == 200 and r.body == b"ok"


def test_keep_alive_framing_survives_a_rejected_pipelined_request(server):
    # A valid request, then a bad one, pipelined: the first is answered
    # exactly, the second rejected, and nothing after it is read as a request.
    raw = (
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
        b"GET / HTTP/1.1\r\nHost: a\r\nX A: b\r\n\r\n"
        b"GET /events HTTP/1.1\r\nHost: a\r\n\r\n"
    )
    with RawConn(server.port) as c:
        c.send(raw)
        assert c.read_response().body == b"ok"
        assert c.read_response().status == 400
        assert c.read_to_eof() == b""


def test_hostile_clients_do_not_disturb_an_in_flight_request(server):
    result = {}

    def slow():
        result["r"] = request(server.port, "GET", "/sleep?secs=1")

    t = threading.Thread(target=slow)
    t.start()
    for raw in list(BAD_FRAMING.values()) * 3:
        send_raw(server.port, raw)
    t.join(10)
    assert result["r"].status == 200 and result["r"].body == b"slept"


def _in_flight(server_port: int, client_port: int) -> int:
    """Bytes of one loopback connection the server has not read yet: the
    client's unsent queue plus the server's unread one (/proc/net/tcp)."""
    total, seen = 0, 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, remote, _, queues = line.split()[1:5]
            ports = (int(local.split(":")[1], 16), int(remote.split(":")[1], 16))
            tx, rx = (int(q, 16) for q in queues.split(":"))
            if ports == (server_port, client_port):
                total, seen = total + rx, seen + 1
            elif ports == (client_port, server_port):
                total, seen = total + tx, seen + 1
    assert seen == 2, "connection not found in /proc/net/tcp"
    return total


def test_one_byte_chunks_to_an_app_not_reading_keep_memory_bounded():
    """200,000 one-byte chunks (1.2 MB on the wire) to an app that has not
    read its body, within `body_buffer`: the server reads them all and
    holds them in memory near their size (before, an entry per chunk:
    +14.9 MB), and serves another client meanwhile."""
    with skirr("apps.probe:app", "--body-buffer", "1048576") as s:
        c = RawConn(s.port)
        c.send(b"POST /sleep?secs=5 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        client_port = c.sock.getsockname()[1]
        wait_until(lambda: _in_flight(s.port, client_port) == 0, what="head read")
        rss0 = rss_kib(s.proc.pid)
        c.send(b"1\r\na\r\n" * 200_000)
        wait_until(lambda: _in_flight(s.port, client_port) == 0, what="every chunk read")
        grew = rss_kib(s.proc.pid) - rss0
        print(f"200,000 one-byte chunks: RSS +{grew} KiB")
        assert grew < 4_000, f"RSS grew {grew} KiB"
        assert request(s.port, "GET", "/").status == 200
