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


def test_ranges_validators_and_incompressible_bodies():
    # Issue 17: a 206's Content-Range counts identity bytes (RFC 9110
    # §14.4), so it is left alone; an encoded representation cannot keep a
    # strong ETag (§8.8.3): it becomes weak, a weak one stays as it is; a
    # body that would not shrink (random bytes, known length) goes out
    # as it is, with its Content-Length; opaque binary streams are left
    # alone (c47abb2 encoded all of them).
    with skirr(APP, *ON) as s:
        r = get(s.port, "/whole?status=206&range=1")
        assert r.status == 206 and r.header("content-encoding") is None and r.body == TEXT
        r = get(s.port, '/whole?etag=%22v1%22')
        assert r.header("content-encoding") == "zstd" and r.header("etag") == 'W/"v1"'
        assert decode("zstd", r.body) == TEXT
        assert get(s.port, '/whole?etag=W/%22v2%22').header("etag") == 'W/"v2"'
        r = get(s.port, "/whole", ae="identity")
        assert r.header("etag") is None and r.header("content-encoding") is None
        r = get(s.port, '/whole?etag=%22v1%22', ae="identity")
        assert r.header("etag") == '"v1"'  # unencoded: the app's strong tag
        for ctype in ["application/x-thing", "text/plain"]:
            r = get(s.port, f"/whole?random=20000&type={ctype}")
            assert r.header("content-encoding") is None and len(r.body) == 20000, ctype
            assert r.header("content-length") == "20000"
        with RawConn(s.port) as c:
            c.send(
                b"GET /stream?type=application/octet-stream&cl=1 HTTP/1.1\r\nHost: x\r\n"
                b"Accept-Encoding: gzip\r\n\r\n"
            )
            head = c.read_head()
            assert head.header("content-encoding") is None and head.header("content-length") == "22"
            request(s.port, "GET", "/release")
            assert c.read_exact(22) == b"data: first event\n\nok\n"


def test_a_client_refusing_identity_gets_the_coding_whatever_the_size():
    # `identity;q=0` (or `*;q=0` without identity): a body under
    # compression_min_size is still encoded (c47abb2 sent it unencoded).
    with skirr(APP, *ON) as s:
        for ae in ["gzip, identity;q=0", "gzip, *;q=0"]:
            r = get(s.port, "/whole?n=100", ae=ae)
            assert r.header("content-encoding") == "gzip", ae
            assert decode("gzip", r.body) == TEXT[:100]
        assert get(s.port, "/whole?n=100", ae="gzip").header("content-encoding") is None
