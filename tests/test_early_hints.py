"""Interim responses (issue 11): ``http.response.early_hint`` (ASGI early
hints extension, RFC 8297) and Gunicorn's ``http.response.informational``,
as raw HTTP/1.1 bytes — including behind a pipelined response hyper still
buffers — and as HTTP/2 HEADERS frames on the request's stream; dropped on
HTTP/1.0, and on an HTTP/2 connection whose client shrank its HPACK table.
The browser test is in test_early_hints_browser.py."""

from __future__ import annotations

import json
import socket

import pytest
from harness import RawConn, gunicorn, request, skirr

pytestmark = pytest.mark.timeout(60)

APP = "apps.early_hints_app:app"
LINK_CSS = "</style.css>; rel=preload; as=style"
LINK_JS = "</app.js>; rel=preload; as=script"
HINTS = (
    b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload; as=style\r\n\r\n"
    b"HTTP/1.1 103 Early Hints\r\nlink: </app.js>; rel=preload; as=script\r\n\r\n"
)


def get(port: int, path: str) -> bytes:
    with RawConn(port) as c:
        c.send(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return c.read_to_eof()


def app_json(port: int, path: str):
    return json.loads(request(port, "GET", path).body)


def test_advertised_on_http11_and_http2_not_http10():
    from test_http2 import H2C, RawH2

    with skirr(APP, *H2C) as s:
        assert "http.response.early_hint" in app_json(s.port, "/extensions")
        with RawConn(s.port) as c:
            c.send(b"GET /extensions HTTP/1.0\r\n\r\n")
            assert "http.response.early_hint" not in json.loads(c.read_response().body)
        c = RawH2(s.port)
        _, body = c.response(c.request("/extensions"))
        assert "http.response.early_hint" in json.loads(body)
        c.close()


def test_hints_come_first_exact_bytes():
    with skirr(APP) as s:
        data = get(s.port, "/hint")
        assert data.startswith(HINTS + b"HTTP/1.1 200 OK\r\n"), data[:400]
        assert data.endswith(b"\r\n\r\nfinal")


def test_hints_reach_the_client_while_the_app_still_works():
    with skirr(APP) as s, RawConn(s.port) as c:
        c.send(b"GET /hint?hold=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c.read_exact(len(HINTS)) == HINTS
        assert not c.is_closed(timeout=0.3) and c.buf == b"", "only the hints before the release"
        assert request(s.port, "GET", "/release").status == 200
        r = c.read_response()
        assert (r.status, r.body) == (200, b"final")
        # The connection goes on: a second request, hints again.
        c.send(b"GET /hint HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c.read_exact(len(HINTS)) == HINTS
        assert c.read_response().body == b"final"


def test_hints_follow_a_pipelined_response_whole():
    """4 MiB in one body (hyper queues it whole) to a chunked POST the app
    does not read, the next request pipelined behind it while the client
    reads nothing: that request's hints come after the last byte of the
    first response, not inside it. (hyper itself reads the next request
    only once its buffer is flushed; Skirr writes a 1xx only from a flush
    of an empty hyper buffer, so it holds either way.)"""
    with skirr(APP) as s, RawConn(s.port) as c:
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        c.send(
            b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
            b"GET /hint HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        first = c.read_response()
        assert first.status == 200 and first.body == b"x" * (4 << 20)
        rest = c.read_to_eof()
        assert rest.startswith(HINTS + b"HTTP/1.1 200 OK\r\n"), rest[:400]
        assert rest.endswith(b"final")


def test_hint_and_100_continue_both_precede_the_response():
    with skirr(APP) as s, RawConn(s.port) as c:
        c.send(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        heads = [c.read_head().status, c.read_head().status]
        assert sorted(heads) == [100, 103], heads
        c.send(b"hello")
        r = c.read_response()
        assert (r.status, r.body) == (200, b"got 5")


def test_many_hints_in_a_row_wait_for_the_wire_instead_of_failing():
    """Past 16 queued 1xx the app's send() waits until they are taken, on
    HTTP/1.1 and HTTP/2; where hints are dropped (HTTP/1.0) nothing waits."""
    from test_http2 import H2C, RawH2

    with skirr(APP, *H2C) as s:
        data = get(s.port, "/many?n=100")
        head, _, rest = data.rpartition(b"HTTP/1.1 200 OK\r\n")
        hint = b"HTTP/1.1 103 Early Hints\r\nlink: </%d.js>; rel=preload\r\n\r\n"
        assert head == b"".join(hint % i for i in range(100))
        assert rest.endswith(b"final")
        with RawConn(s.port) as c:
            c.send(b"GET /many?n=100 HTTP/1.0\r\n\r\n")
            assert c.read_to_eof().startswith(b"HTTP/1.0 200 OK\r\n")
        c = RawH2(s.port)
        sid = c.request("/many?n=100")
        h, body = c.response(sid)
        assert (h[":status"], body) == (["200"], b"final")
        assert [links for links, _ in informational(c, sid)] == [[f"</{i}.js>; rel=preload"] for i in range(100)]
        c.close()


def test_not_to_http10_clients():
    with skirr(APP) as s, RawConn(s.port) as c:
        c.send(b"GET /hint HTTP/1.0\r\n\r\n")
        data = c.read_to_eof()
        assert data.startswith(b"HTTP/1.0 200 OK\r\n") and b" 103 " not in data


def test_gunicorn_informational_message():
    with skirr(APP) as s:
        data = get(s.port, "/info")
        assert data.startswith(
            b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n"
            b"HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 200 OK\r\n"
        ), data[:300]
        assert data.endswith(b"done")


@pytest.mark.parametrize(
    "mode, error",
    [
        (
            "late",
            "RuntimeError: an interim (1xx) response after http.response.start: "
            "it must come before the final response (RFC 9110 §15.2)",
        ),
        ("notbytes", "TypeError: http.response.early_hint 'links' entries must be bytes, got str"),
        ("str", "TypeError: http.response.early_hint 'links' must be an iterable of bytes, got bytes"),
        ("nolinks", "TypeError: http.response.early_hint requires 'links'"),
        (
            "crlf",
            "RuntimeError: http.response.early_hint has an invalid link "
            "\"</x>\\r\\nset-cookie: a=b\": a field value cannot hold CR, LF or NUL",
        ),
        ("empty", "RuntimeError: http.response.early_hint has an empty link"),
        ("huge", "RuntimeError: http.response.early_hint carries 49800 bytes of fields, more than 16384"),
        (
            "status101",
            "RuntimeError: http.response.informational 'status' must be an informational status in "
            "100..=199 other than 101 (RFC 9110 §15.2), got 101",
        ),
        (
            "status200",
            "RuntimeError: http.response.informational 'status' must be an informational status in "
            "100..=199 other than 101 (RFC 9110 §15.2), got 200",
        ),
    ],
)
def test_invalid_messages_raise_and_nothing_reaches_the_wire(mode, error):
    with skirr(APP) as s:
        data = get(s.port, f"/bad?mode={mode}")
        assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b"after"), data[:300]
        assert app_json(s.port, "/errors") == [error]


def informational(c, sid: int) -> list[tuple[list[str], str]]:
    """The 1xx responses on stream ``sid`` so far, in order, each as (its
    link values, its status); asserts each came before the final response."""
    from test_http2 import h2events

    out, final = [], False
    for e in c.events:
        if getattr(e, "stream_id", None) != sid:
            continue
        if isinstance(e, h2events.ResponseReceived):
            final = True
        if isinstance(e, h2events.InformationalResponseReceived):
            assert not final, "a 1xx after the final response"
            h = [(k.decode(), v.decode()) for k, v in e.headers]
            out.append(([v for k, v in h if k == "link"], dict(h)[":status"]))
    return out


def test_http2_hints_are_headers_frames_before_the_response():
    from hyperframe.frame import HeadersFrame
    from test_http2 import H2C, RawH2

    with skirr(APP, *H2C) as s:
        c = RawH2(s.port)
        sid = c.request("/hint")
        h, body = c.response(sid)
        assert (h[":status"], body) == (["200"], b"final")
        assert informational(c, sid) == [([LINK_CSS], "103"), ([LINK_JS], "103")]
        # On the wire: three HEADERS frames on the stream, the 1xx ones
        # without END_STREAM, each a whole field block.
        frames = [f for f in c.frames if isinstance(f, HeadersFrame) and f.stream_id == sid]
        assert len(frames) == 3
        assert all("END_HEADERS" in f.flags and "END_STREAM" not in f.flags for f in frames[:2])
        # The connection goes on: a second request, no hints asked.
        h, body = c.response(c.request("/extensions"))
        assert h[":status"] == ["200"]
        c.close()


def test_http2_hints_reach_the_client_while_the_app_still_works():
    from test_http2 import H2C, RawH2, h2events

    with skirr(APP, *H2C) as s:
        c = RawH2(s.port)
        sid = c.request("/hint?hold=1")
        c.pump(lambda evs: len(informational(c, sid)) == 2)
        assert not [e for e in c.events if isinstance(e, h2events.ResponseReceived)]
        assert request(s.port, "GET", "/release").status == 200
        h, body = c.response(sid)
        assert (h[":status"], body) == (["200"], b"final")
        c.close()


def test_http2_concurrent_streams_each_get_their_own_hints():
    from test_http2 import H2C, RawH2

    with skirr(APP, *H2C) as s:
        c = RawH2(s.port)
        sids = [c.request("/many?n=20") for _ in range(8)]
        for sid in sids:
            h, body = c.response(sid)
            assert (h[":status"], body) == (["200"], b"final")
        for sid in sids:
            got = informational(c, sid)
            assert got == [([f"</{i}.js>; rel=preload"], "103") for i in range(20)], (sid, got[:3])
        c.close()


def test_http2_a_client_sent_stream_field_is_neither_seen_nor_believed():
    """The transport tells the service each request's stream id in a field
    of its own; one the client sends under that name changes nothing."""
    from test_http2 import H2C, RawH2

    with skirr(APP, *H2C) as s:
        c = RawH2(s.port)
        fake = [("x-skirr-h2-stream", "99"), ("x-skirr-h2-stream", "1")]
        first = c.request("/extensions")
        c.response(first)
        sid = c.request("/hint", extra=fake)
        h, _ = c.response(sid)
        assert h[":status"] == ["200"]
        assert [s for _, s in informational(c, sid)] == ["103", "103"]
        assert informational(c, first) == []
        sid = c.request("/headers", extra=fake)
        names = [k for k, _ in json.loads(c.response(sid)[1])]
        assert "x-skirr-h2-stream" not in names
        c.close()


def test_http2_request_blocks_in_continuation_frames_and_request_trailers():
    from hyperframe.frame import ContinuationFrame
    from test_http2 import H2C, RawH2

    with skirr(APP, *H2C, "--limit-request-field-size", "0") as s:
        c = RawH2(s.port)
        # 20 KB of fields: more than one 16 KiB frame, so the client sends
        # HEADERS + CONTINUATION.
        sid = c.request("/hint", extra=[("x-big", "v" * 20_000)])
        sent = [f for f in c.sent_frames() if isinstance(f, ContinuationFrame)]
        assert sent, "the client did not continue its field block"
        h, body = c.response(sid)
        assert (h[":status"], body, len(informational(c, sid))) == (["200"], b"final", 2)
        # A body, then trailers: the trailers' HEADERS is not a new request.
        sid = c.request("/upload", method="POST", end=False)
        c.conn.send_data(sid, b"hello")
        c.conn.send_headers(sid, [("x-checksum", "1")], end_stream=True)
        c.flush()
        h, body = c.response(sid)
        assert (h[":status"], body) == (["200"], b"got 5")
        assert informational(c, sid) == [([LINK_CSS], "103")]
        c.close()


def test_http2_client_that_shrinks_its_hpack_table_gets_no_hints():
    """A smaller table needs a size update at the start of the server's next
    field block, which h2 puts in its own; Skirr's hints would come first,
    so they stop on that connection (the responses do not)."""
    from h2.settings import SettingCodes
    from test_http2 import H2C, RawH2

    with skirr(APP, *H2C) as s:
        c = RawH2(s.port)
        c.conn.update_settings({SettingCodes.HEADER_TABLE_SIZE: 0})
        c.flush()
        for _ in range(2):
            sid = c.request("/hint")
            h, body = c.response(sid)
            assert (h[":status"], body) == (["200"], b"final")
            assert informational(c, sid) == []
        _, body = c.response(c.request("/extensions"))
        assert "http.response.early_hint" not in json.loads(body)
        c.close()
        # Other connections still get them.
        c = RawH2(s.port)
        sid = c.request("/hint")
        c.response(sid)
        assert len(informational(c, sid)) == 2
        c.close()


def test_http2_gunicorn_informational_messages():
    from test_http2 import H2C, RawH2

    with skirr(APP, *H2C) as s:
        c = RawH2(s.port)
        sid = c.request("/info")
        h, body = c.response(sid)
        assert (h[":status"], body) == (["200"], b"done")
        assert informational(c, sid) == [(["</a.css>; rel=preload"], "103"), ([], "102")]
        c.close()


def test_http2_curl_shows_the_103():
    import shutil
    import subprocess

    from test_http2 import H2C

    if not shutil.which("curl"):
        pytest.skip("curl is not installed")
    with skirr(APP, *H2C) as s:
        out = subprocess.run(
            ["curl", "-si", "--max-time", "10", "--http2-prior-knowledge", f"http://127.0.0.1:{s.port}/hint"],
            capture_output=True,
            timeout=20,
        ).stdout
        codes = [line.split()[1] for line in out.split(b"\r\n") if line.startswith(b"HTTP/2 ")]
        assert codes == [b"103", b"103", b"200"], out[:500]
        assert b"link: </style.css>; rel=preload; as=style" in out and out.endswith(b"final")


def test_http2_under_gunicorn():
    from test_http2 import RawH2

    with gunicorn(APP, "-w", "1", "--http-protocols", "h2,h1", "--http2-cleartext", "prior-knowledge") as g:
        c = RawH2(g.port)
        sid = c.request("/hint")
        h, body = c.response(sid)
        assert (h[":status"], body) == (["200"], b"final")
        assert len(informational(c, sid)) == 2
        c.close()


def test_under_gunicorn():
    with gunicorn(APP, "-w", "1") as g:
        data = get(g.port, "/hint")
        assert data.startswith(HINTS + b"HTTP/1.1 200 OK\r\n"), data[:400]
