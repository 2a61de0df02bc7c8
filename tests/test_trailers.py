"""The ASGI HTTP trailers extension (``http.response.trailers``): the
trailer section on the wire, as raw HTTP/1.1 bytes and as HTTP/2 frames."""

from __future__ import annotations

import json

import pytest
from harness import RawConn, request, skirr

pytestmark = pytest.mark.timeout(60)

APP = "apps.trailers_app:app"


def raw_get(port: int, target: str, te: bool) -> bytes:
    extra = "TE: trailers\r\n" if te else ""
    with RawConn(port) as c:
        c.send(f"GET {target} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n".encode())
        return c.read_to_eof()


def errors(port: int) -> list:
    return json.loads(request(port, "GET", "/errors").body)


def test_advertised():
    with skirr(APP) as s:
        assert "http.response.trailers" in json.loads(request(s.port, "GET", "/extensions").body)


def test_http11_trailer_section_when_the_client_accepts_trailers():
    with skirr(APP) as s:
        data = raw_get(s.port, "/", te=True)
        head, _, body = data.partition(b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in head.lower()
        assert body == b"6\r\nhello \r\n5\r\nworld\r\n0\r\nx-checksum: abc\r\nx-count: 2\r\n\r\n"


def test_http11_without_te_trailers_they_are_dropped():
    with skirr(APP) as s:
        data = raw_get(s.port, "/", te=False)
        assert data.endswith(b"5\r\nworld\r\n0\r\n\r\n")
        assert b"x-checksum: abc" not in data


def test_forbidden_field_and_unannounced_trailers_are_errors():
    with skirr(APP) as s:
        data = raw_get(s.port, "/?mode=bad", te=True)
        assert data.endswith(b"0\r\n\r\n")  # the app's empty trailers end it
        assert errors(s.port) == ["http.response.trailers cannot carry \"content-length\" (RFC 9110 §6.5.1)"]
        raw_get(s.port, "/?announce=0", te=True)
        assert errors(s.port)[-1] == "http.response.trailers without 'trailers': True in http.response.start"


def test_app_returning_without_its_trailers_leaves_the_response_incomplete():
    with skirr(APP) as s:
        data = raw_get(s.port, "/?mode=return", te=True)
        assert data.endswith(b"5\r\nworld\r\n"), "no terminating chunk: the client sees a cut response"
        assert "returned without completing response" in s.logs()


def test_http2_trailing_headers_frame():
    from test_http2 import H2C, RawH2, h2events

    with skirr(APP, *H2C) as s:
        c = RawH2(s.port)
        sid = c.request("/", extra=[("te", "trailers")])
        h, body = c.response(sid)
        assert body == b"hello world"
        trailers = [e for e in c.events if isinstance(e, h2events.TrailersReceived) and e.stream_id == sid]
        assert len(trailers) == 1
        assert [(k.decode(), v.decode()) for k, v in trailers[0].headers] == [("x-checksum", "abc"), ("x-count", "2")]
        c.close()


def test_http2_without_te_trailers_they_are_not_sent():
    # ASGI trailers extension: only to a client that sent `TE: trailers`,
    # on HTTP/2 as on HTTP/1.1 (c47abb2 sent them to every HTTP/2 client).
    from test_http2 import H2C, RawH2, h2events

    with skirr(APP, *H2C) as s:
        c = RawH2(s.port)
        sid = c.request("/")
        h, body = c.response(sid)
        assert h[":status"] == ["200"] and body == b"hello world"
        assert not [e for e in c.events if isinstance(e, h2events.TrailersReceived)]
        ended = [e for e in c.events if isinstance(e, h2events.StreamEnded) and e.stream_id == sid]
        assert len(ended) == 1
        c.close()


def test_http11_trailers_the_trailer_header_does_not_name_are_warned_once_per_location():
    # hyper writes only the fields the response's Trailer header names: an
    # app that names none gets an empty trailer section, and a warning
    # saying why (once for its location, however many requests).
    with skirr(APP) as s:
        for _ in range(3):
            data = raw_get(s.port, "/?named=0", te=True)
            assert data.endswith(b"5\r\nworld\r\n0\r\n\r\n"), data
        warned = [ln for ln in s.logs().splitlines() if "trailer fields" in ln]
        assert len(warned) == 1, warned
        assert "x-checksum, x-count" in warned[0] and "trailers_app.py" in warned[0], warned
        # Named ones: no warning.
        assert raw_get(s.port, "/", te=True).endswith(b"0\r\nx-checksum: abc\r\nx-count: 2\r\n\r\n")
        assert len([ln for ln in s.logs().splitlines() if "trailer fields" in ln]) == 1
