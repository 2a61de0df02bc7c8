"""Response compression (``--compression``): negotiation, what is left
alone, streaming with a flush per chunk, on HTTP/1.1 and HTTP/2, checked
by decoding what came over the socket (and with curl --compressed)."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import zlib

import pytest
from harness import RawConn, request, skirr

pytestmark = pytest.mark.timeout(60)

APP = "apps.compress_app:app"
ON = ("--compression", "zstd,br,gzip")
TEXT = b"The quick brown fox jumps over the lazy dog. " * 100


def decode(coding: str | None, data: bytes) -> bytes:
    if coding is None:
        return data
    if coding == "gzip":
        return gzip.decompress(data)
    if coding == "br":
        import brotli

        return brotli.decompress(data)
    if coding == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    raise AssertionError(coding)


def get(port, target, ae="gzip, deflate, br, zstd", method="GET"):
    headers = [("Accept-Encoding", ae)] if ae is not None else []
    return request(port, method, target, headers=headers)


def test_off_by_default():
    with skirr(APP) as s:
        r = get(s.port, "/whole")
        assert r.header("content-encoding") is None and r.body == TEXT


@pytest.mark.parametrize(
    ("ae", "want"),
    [
        ("gzip, deflate, br, zstd", "zstd"),  # the server's order breaks ties
        ("gzip;q=1.0, br;q=0.5", "gzip"),
        ("br, gzip;q=0.9", "br"),
        ("x-gzip", "gzip"),
        ("*", "zstd"),
        ("zstd;q=0, *;q=0.1", "br"),
        ("identity", None),
        ("*;q=0", None),
        (None, None),
    ],
)
def test_negotiation_from_accept_encoding(ae, want):
    with skirr(APP, *ON) as s:
        r = get(s.port, "/whole", ae=ae)
        assert r.header("content-encoding") == want
        assert decode(want, r.body) == TEXT
        if want:
            assert r.header("content-length") == str(len(r.body))
            assert len(r.body) < len(TEXT) / 10
            assert r.header("vary") == "Accept-Encoding"


def test_left_alone_small_encoded_precompressed_head_304():
    with skirr(APP, *ON) as s:
        assert get(s.port, "/whole?n=400").header("content-encoding") is None  # under 500 bytes
        r = get(s.port, "/whole?encoded=1")
        assert r.header("content-encoding") == "gzip" and r.body == TEXT  # the app's own
        assert get(s.port, "/whole?type=image/png").header("content-encoding") is None
        assert get(s.port, "/whole?type=image/svg%2Bxml").header("content-encoding") == "zstd"
        r = get(s.port, "/whole", method="HEAD")
        assert r.header("content-encoding") is None and r.header("vary") is None
        assert get(s.port, "/whole?status=304").header("content-encoding") is None
        # An app's Vary keeps its fields, gains Accept-Encoding once.
        assert get(s.port, "/whole?vary=Origin").all("vary") == ["Origin", "Accept-Encoding"]
        assert get(s.port, "/whole?vary=accept-encoding").all("vary") == ["accept-encoding"]


@pytest.mark.parametrize("cl", [False, True])
def test_a_streamed_chunk_is_decodable_before_the_next(cl):
    with skirr(APP, "--compression", "gzip", "--compression-min-size", "0") as s, RawConn(s.port) as c:
        c.send(f"GET /stream{'?cl=1' if cl else ''} HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n".encode())
        head = c.read_head()
        assert head.header("content-encoding") == "gzip"
        assert head.header("content-length") is None and head.header("transfer-encoding") == "chunked"
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        size = int(c.read_until(b"\r\n").strip(), 16)
        first = d.decompress(c.read_exact(size))
        assert first == b"data: first event\n\n", "the first event decodes before the app sends more"
        c.read_exact(2)
        request(s.port, "GET", "/release")
        rest = b""
        while (size := int(c.read_until(b"\r\n").strip(), 16)) != 0:
            rest += c.read_exact(size)
            c.read_exact(2)
        assert d.decompress(rest) + d.flush() == b"ok\n" and d.eof


def test_event_streams_only_when_asked():
    sse = "/whole?type=text/event-stream"
    with skirr(APP, *ON) as s:
        assert get(s.port, sse).header("content-encoding") is None
    with skirr(APP, *ON, "--compression-event-stream", "true") as s:
        assert get(s.port, sse).header("content-encoding") == "zstd"


def test_bad_coding_stops_the_boot():
    with skirr(APP, "--compression", "gzip,lz4", ready=False) as s:
        assert s.wait(20) != 0
        assert "lz4" in s.logs()


def test_over_http2_with_httpx():
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("h2")
    with (
        skirr(APP, *ON, "--http2") as s,
        httpx.Client(base_url=s.url, http1=False, http2=True, timeout=10) as c,
    ):
        r = c.get("/whole", headers={"accept-encoding": "br"})
        assert r.http_version == "HTTP/2"
        assert r.headers["content-encoding"] == "br" and r.content == TEXT


@pytest.mark.skipif(not shutil.which("curl"), reason="curl not installed")
def test_curl_compressed():
    with skirr(APP, *ON) as s:
        out = subprocess.run(
            ["curl", "-s", "--compressed", "-D", "-", f"{s.url}/whole"], capture_output=True, timeout=20, check=True
        ).stdout
        head, _, body = out.partition(b"\r\n\r\n")
        assert b"content-encoding: zstd" in head.lower()
        assert body == TEXT
