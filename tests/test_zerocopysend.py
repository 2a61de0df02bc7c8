"""The ASGI zero copy send extension (``http.response.zerocopysend``): file
regions sent as body chunks, alone, split, mixed with ``http.response.body``,
from the file's position; over HTTP/1.1 and HTTP/2, with and without TLS and
compression; error paths; the server's duplicate descriptors are closed."""

from __future__ import annotations

import gzip
import json
import os
import socket
import ssl
import time
from urllib.parse import quote

import pytest
from harness import RawConn, request, skirr, wait_until

pytestmark = pytest.mark.timeout(60)

APP = "apps.zerocopy_app:app"
SIZE = (1 << 20) + 7


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("zerocopy")
    small = d / "small.bin"
    small.write_bytes(os.urandom(SIZE))
    big = d / "big.bin"
    with open(big, "wb") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB without writing them
    text = d / "text.txt"
    text.write_bytes(b"The quick brown fox jumps over the lazy dog. " * 2000)
    return {"small": small, "big": big, "text": text, "data": small.read_bytes()}


def target(route: str, path, **q) -> str:
    return f"/{route}?path={quote(str(path))}" + "".join(f"&{k}={v}" for k, v in q.items())


def fetch_json(port: int, route: str):
    return json.loads(request(port, "GET", route).body)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_the_extension_is_advertised():
    with skirr(APP) as s:
        assert "http.response.zerocopysend" in fetch_json(s.port, "/extensions")


def test_exact_bytes_over_http11(files):
    data = files["data"]
    with skirr(APP, "--no-access-log") as s, RawConn(s.port) as c:
        # One message, the whole file: framed by its length.
        c.send(f"GET {target('one', files['small'])} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        r = c.read_response()
        assert (r.status, r.header("content-length"), r.header("transfer-encoding")) == (200, str(SIZE), None)
        assert r.body == data
        # A region, on the same connection (nothing left behind on the wire).
        c.send(f"GET {target('one', files['small'], offset=1000, count=70000)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        r = c.read_response()
        assert r.header("content-length") == "70000" and r.body == data[1000:71000]
        # From an offset to the end; an empty region.
        c.send(f"GET {target('one', files['small'], offset=SIZE - 3)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert c.read_response().body == data[-3:]
        c.send(f"GET {target('one', files['small'], offset=5, count=0)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        r = c.read_response()
        assert (r.header("content-length"), r.body) == ("0", b"")
        # The app's own matching Content-Length; HEAD sends the head only.
        c.send(f"GET {target('one', files['small'], count=10, cl=10)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert c.read_response().body == data[:10]
        c.send(f"HEAD {target('one', files['small'])} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert c.read_response(head_request=True).header("content-length") == str(SIZE)
        c.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c.read_response().body == b'"ok"', "the HEAD left no body bytes behind"


def test_several_messages_with_more_body(files):
    data = files["data"]
    with skirr(APP, "--no-access-log") as s, RawConn(s.port) as c:
        # Pieces smaller and larger than a 256 KiB frame; chunked without a length.
        for piece in (100_000, 300_000):
            c.send(f"GET {target('split', files['small'], piece=piece)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            r = c.read_response()
            assert r.header("transfer-encoding") == "chunked" and r.body == data
        # With a declared length the same pieces are framed by it.
        c.send(f"GET {target('split', files['small'], piece=300_000, cl=SIZE)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        r = c.read_response()
        assert r.header("content-length") == str(SIZE) and r.body == data
        # Mixed with http.response.body, in order.
        c.send(f"GET {target('mixed', files['small'], offset=10, count=20)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert c.read_response().body == b"<" + data[10:30] + b">" + data[10:30] + b"|"


def test_trailers_follow_the_file(files):
    with skirr(APP, "--no-access-log") as s, RawConn(s.port) as c:
        t = target("trailers", files["small"], offset=2, count=300_000)
        c.send(f"GET {t} HTTP/1.1\r\nHost: x\r\nTE: trailers\r\n\r\n".encode())
        assert c.read_head().header("transfer-encoding") == "chunked"
        body = b""
        while size := int(c.read_until(b"\r\n").strip(), 16):
            body += c.read_exact(size)
            c.read_exact(2)
        assert body == files["data"][2:300_002]
        assert c.read_until(b"\r\n\r\n").lower() == b"x-sum: 42\r\n\r\n"


def test_without_an_offset_the_file_position_is_used_and_moved(files):
    data = files["data"]
    with skirr(APP) as s:
        # A buffered reader: its tell(), not the descriptor's read-ahead.
        r = request(s.port, "GET", target("position", files["small"], skip=10))
        assert r.body == data[10:15] + data[15:]
        # No offset, no count: from the position to the end of the file.
        r = request(s.port, "GET", target("mixed", files["small"], count=4))
        assert r.body == b"<" + data[0:4] + b">" + data[4:8] + b"|"
        r = request(s.port, "GET", target("raw_position", files["small"], skip=100))
        assert r.body == data[100:103]
        assert fetch_json(s.port, "/positions") == [SIZE, 103]


def test_the_app_closing_its_file_at_once_does_not_matter(files):
    # /one closes its file as soon as send() returns, before the 64 MiB
    # region is read: the server reads its own duplicate.
    with skirr(APP, "--no-access-log") as s, RawConn(s.port) as c:
        c.send(f"GET {target('one', files['big'])} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        assert c.read_head().header("content-length") == str(64 << 20)
        n, zeros = len(c.buf), c.buf.count(0)
        while chunk := c.sock.recv(1 << 20):
            n += len(chunk)
            zeros += chunk.count(0)
        assert n == zeros == 64 << 20


@pytest.mark.parametrize("route", ["one", "split"])
def test_descriptors_are_closed_after_responses_and_aborts(files, route):
    with skirr(APP, "--no-access-log") as s:
        pid = s.proc.pid
        request(s.port, "GET", target("one", files["small"]))  # warm up lazily opened fds
        base = open_fds(pid)
        for _ in range(3):
            assert request(s.port, "GET", target(route, files["small"], piece=200_000)).body == files["data"]
        wait_until(lambda: open_fds(pid) <= base, what="the descriptors of complete responses to close")
        for _ in range(3):
            # The client leaves mid-file (8 MiB pieces: the app waits in send()).
            with RawConn(s.port) as c:
                c.send(f"GET {target(route, files['big'], piece=8 << 20)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                c.read_head()
                c.read_exact(1 << 16)
        wait_until(lambda: open_fds(pid) <= base, what="the descriptors of aborted responses to close")
        assert request(s.port, "GET", target("one", files["small"])).body == files["data"]


def test_a_stalled_client_holds_two_descriptors_however_small_the_regions(files):
    """64-byte regions to a client that reads nothing: each region holds a
    descriptor, and the queue is bounded by bytes, so without a bound on
    regions one client would hold thousands (send_buffer / 64)."""
    with skirr(APP, "--no-access-log") as s:
        pid = s.proc.pid
        request(s.port, "GET", target("one", files["small"]))
        base = open_fds(pid)
        with RawConn(s.port) as c:
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.send(f"GET {target('split', files['big'], piece=64)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            c.read_head()
            most, deadline = 0, time.monotonic() + 1.0
            while time.monotonic() < deadline:  # the client stalls; the app keeps sending
                most = max(most, open_fds(pid))
                time.sleep(0.02)
        # The connection's socket, the app's own file, and the server's two
        # duplicates (one region queued, one being read).
        assert most <= base + 4, (base, most)
        wait_until(lambda: open_fds(pid) <= base, what="the descriptors to close after the client left")


@pytest.mark.parametrize(
    ("bad", "want"),
    [
        ("no_file", "TypeError: http.response.zerocopysend has no 'file'"),
        ("bytesio", "TypeError: http.response.zerocopysend 'file' must be a file object"),
        ("int", "TypeError: http.response.zerocopysend 'file' must be a file object"),
        ("closed", "TypeError: http.response.zerocopysend 'file' must be a file object"),
        ("offset_str", "TypeError: http.response.zerocopysend 'offset' must be an int, got str"),
        ("offset_bool", "TypeError: http.response.zerocopysend 'offset' must be an int, got bool"),
        ("offset_neg", "RuntimeError: http.response.zerocopysend 'offset' must be a non-negative int"),
        ("count_neg", "RuntimeError: http.response.zerocopysend 'count' must be a non-negative int"),
        ("offset_past", "RuntimeError: http.response.zerocopysend 'offset' 1099511627776 is past the end"),
        ("count_past", "RuntimeError: http.response.zerocopysend 'count' 1099511627776 from offset 1 runs past"),
        ("pipe", "RuntimeError: http.response.zerocopysend 'file' must be a regular file"),
        ("writeonly", "RuntimeError: http.response.zerocopysend: the file (descriptor"),
    ],
)
def test_invalid_messages_raise_naming_the_field(files, bad, want):
    with skirr(APP, "--no-access-log") as s:
        base = open_fds(s.proc.pid)
        r = request(s.port, "GET", target("bad", files["small"], bad=bad))
        assert r.status == 200 and r.body == b"", "the app went on with an empty body"
        errors = fetch_json(s.port, "/errors")
        assert len(errors) == 1 and errors[0].startswith(want), errors
        wait_until(lambda: open_fds(s.proc.pid) <= base, what="no descriptor kept")


def test_order_and_length_errors(files):
    with skirr(APP, "--no-access-log") as s:
        r = request(s.port, "GET", target("early", files["small"]))
        assert r.status == 500
        # Longer than the declared Content-Length: refused before writing.
        r = request(s.port, "GET", target("one", files["small"], count=11, cl=10))
        assert (r.status, r.body) == (200, b"-" * 10)
        r = request(s.port, "GET", target("one", files["small"], count=11, cl=10, reraise=1))
        assert r.status == 500, "nothing was written: the server's 500"
        errors = fetch_json(s.port, "/errors")
        assert errors[0] == "RuntimeError: http.response.zerocopysend sent before http.response.start"
        assert errors[1].startswith("RuntimeError: response body is longer than its Content-Length of 10 bytes")
        # Shorter: what was sent is written, then the connection closes.
        with RawConn(s.port) as c:
            c.send(f"GET {target('one', files['small'], count=5, cl=10)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert c.read_head().header("content-length") == "10"
            assert c.read_to_eof() == files["data"][:5]


@pytest.mark.parametrize("more", [0, 1])
def test_a_file_cut_short_closes_the_connection(files, tmp_path, more):
    victim = tmp_path / "victim.bin"
    victim.write_bytes(files["data"])
    with skirr(APP, "--no-access-log") as s:
        with RawConn(s.port) as c:
            c.send(f"GET {target('shrink', victim, more=more)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = c.read_head()
            body = c.read_to_eof()
        if head.header("content-length"):
            assert head.header("content-length") == str(SIZE)
        assert len(body) < SIZE, "the response must not look complete"
        wait_until(lambda: "the file ended" in s.logs(), what="the error logged")
        if more:
            # The app waiting in send() learns it as a disconnect.
            wait_until(lambda: fetch_json(s.port, "/errors"), what="the app's error")
            assert fetch_json(s.port, "/errors") == ["ClientDisconnected: the client disconnected"]
        assert request(s.port, "GET", target("one", files["small"])).body == files["data"]


def test_compression_codes_the_file_like_a_stream(files):
    text = files["text"].read_bytes()
    gz = [("Accept-Encoding", "gzip")]
    with skirr(APP, "--compression", "gzip") as s:
        r = request(s.port, "GET", target("one", files["text"], type="text/plain"), headers=gz)
        assert r.header("content-encoding") == "gzip" and r.header("content-length") is None
        assert gzip.decompress(r.body) == text
        r = request(s.port, "GET", target("mixed", files["text"], offset=0, count=999, type="text/plain"), headers=gz)
        assert gzip.decompress(r.body) == b"<" + text[:999] + b">" + text[:999] + b"|"
        # application/octet-stream (a download) is left alone, its length kept.
        r = request(s.port, "GET", target("one", files["text"]), headers=gz)
        assert r.header("content-encoding") is None and r.header("content-length") == str(len(text))
        assert r.body == text


def test_over_http2(files):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("h2")
    data = files["data"]
    with (
        skirr(APP, "--http2") as s,
        httpx.Client(base_url=s.url, http1=False, http2=True, timeout=10) as c,
    ):
        r = c.get(target("one", files["small"]))
        assert r.http_version == "HTTP/2"
        assert r.headers["content-length"] == str(SIZE) and r.content == data
        assert c.get(target("split", files["small"], piece=300_000)).content == data
        r = c.get(target("mixed", files["small"], offset=3, count=4))
        assert r.content == b"<" + data[3:7] + b">" + data[3:7] + b"|"


def tls_ready(port: int, ca: str) -> bool:
    ctx = ssl.create_default_context(cafile=ca)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            ctx.wrap_socket(raw, server_hostname="localhost").close()
            return True
    except OSError:
        return False


def test_over_tls_on_both_protocols(files, pki):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("h2")
    data = files["data"]
    args = ("--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"], "--http2")
    with skirr(APP, *args, ready=False) as s:
        wait_until(lambda: tls_ready(s.port, pki["ca"]), what="TLS server")
        ctx = ssl.create_default_context(cafile=pki["ca"])
        for h2 in (True, False):
            with httpx.Client(base_url=f"https://localhost:{s.port}", http2=h2, verify=ctx, timeout=10) as c:
                r = c.get(target("one", files["small"], offset=1, count=SIZE - 2))
                assert r.http_version == ("HTTP/2" if h2 else "HTTP/1.1")
                assert r.content == data[1:-1]
                assert c.get(target("split", files["small"], piece=500_000)).content == data
