"""The ASGI path send extension (``http.response.pathsend``): Skirr reads
the file and writes it as the body, over HTTP/1.1 and HTTP/2, with
Starlette's ``FileResponse`` using it; error paths and descriptors."""

from __future__ import annotations

import json
import os
from urllib.parse import quote

import pytest
from harness import RawConn, request, skirr, wait_until

pytestmark = pytest.mark.timeout(60)

APP = "apps.pathsend_app:app"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pathsend")
    small = d / "small.bin"
    small.write_bytes(os.urandom(1 << 20) + b"tail")
    big = d / "big.bin"
    with open(big, "wb") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB without writing them
    empty = d / "empty.txt"
    empty.write_bytes(b"")
    return {"small": small, "big": big, "empty": empty, "dir": d}


def target(path, **q) -> str:
    extra = "".join(f"&{k}={v}" for k, v in q.items())
    return f"/?path={quote(str(path))}{extra}"


def errors(port: int) -> list:
    return json.loads(request(port, "GET", "/errors").body)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_the_extension_is_advertised():
    with skirr(APP) as s:
        assert "http.response.pathsend" in json.loads(request(s.port, "GET", "/extensions").body)


def test_file_is_the_body_with_its_length(files):
    with skirr(APP) as s:
        r = request(s.port, "GET", target(files["small"]))
        assert r.status == 200
        assert r.header("content-length") == str((1 << 20) + 4)
        assert r.header("transfer-encoding") is None
        assert r.body == files["small"].read_bytes()
        # The app's own matching Content-Length is kept; an empty file works.
        r = request(s.port, "GET", target(files["small"], cl=(1 << 20) + 4))
        assert r.body == files["small"].read_bytes()
        r = request(s.port, "GET", target(files["empty"]))
        assert (r.status, r.header("content-length"), r.body) == (200, "0", b"")


def test_keep_alive_after_a_file_and_head_sends_the_head_only(files):
    with skirr(APP) as s, RawConn(s.port) as c:
        for _ in range(2):
            c.send(f"GET {target(files['small'])} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            r = c.read_response()
            assert r.body == files["small"].read_bytes()
        c.send(f"HEAD {target(files['small'])} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        r = c.read_response(head_request=True)
        assert r.header("content-length") == str((1 << 20) + 4)
        c.send(b"GET /extensions HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c.read_response().status == 200, "the HEAD left no body bytes behind"


@pytest.mark.parametrize(
    ("which", "q", "want"),
    [
        ("missing", {}, "cannot open"),
        ("dir", {}, "is not a regular file"),
        ("small", {"cl": 10}, "does not match"),
        ("small", {"body_first": 1}, "the file must be the whole body"),
    ],
)
def test_errors_reach_the_app_before_anything_is_written(files, which, q, want):
    path = files["dir"] / "nope.bin" if which == "missing" else files[which]
    with skirr(APP) as s:
        r = request(s.port, "GET", target(path, **q))
        errs = errors(s.port)
        assert len(errs) == 1 and want in errs[0] and "http.response.pathsend" in errs[0]
        if "body_first" not in q:
            # The app went on with an empty body: the head it started stands.
            assert r.status == 200
            r = request(s.port, "GET", target(path, reraise=1, **q))
            assert r.status == 500  # nothing was written: the server's 500
            assert want in s.logs()


def test_client_leaving_mid_file_closes_the_descriptor(files):
    with skirr(APP, "--no-access-log") as s:
        base = open_fds(s.proc.pid)
        for _ in range(3):
            with RawConn(s.port) as c:
                c.send(f"GET {target(files['big'])} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert c.read_head().header("content-length") == str(64 << 20)
                c.read_exact(1 << 16)
        wait_until(lambda: open_fds(s.proc.pid) <= base, what="the file descriptors to be closed")
        assert request(s.port, "GET", target(files["small"])).body == files["small"].read_bytes()


def test_a_whole_big_file(files):
    with skirr(APP, "--no-access-log") as s, RawConn(s.port) as c:
        c.send(f"GET {target(files['big'])} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        r = c.read_head()
        assert r.header("content-length") == str(64 << 20)
        # Counted, not joined (64 MiB).
        n, zeros = len(c.buf), c.buf.count(0)
        while chunk := c.sock.recv(1 << 20):
            n += len(chunk)
            zeros += chunk.count(0)
        assert n == zeros == 64 << 20


def test_over_http2(files):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("h2")
    with (
        skirr(APP, "--http2") as s,
        httpx.Client(base_url=s.url, http1=False, http2=True, timeout=10) as c,
    ):
        r = c.get(target(files["small"]))
        assert r.http_version == "HTTP/2"
        assert r.headers["content-length"] == str((1 << 20) + 4)
        assert r.content == files["small"].read_bytes()


def test_starlette_file_response_uses_it(files):
    pytest.importorskip("starlette")
    with skirr("apps.pathsend_app:starlette") as s:
        r = request(s.port, "GET", f"/file?path={quote(str(files['small']))}")
        assert r.status == 200 and r.body == files["small"].read_bytes()
        assert r.header("content-length") == str((1 << 20) + 4)
        assert r.header("etag") and r.header("last-modified")
        sent = json.loads(request(s.port, "GET", "/sent").body)
        # The last response before /sent's own (the harness's readiness
        # probe came first).
        assert sent[-2:] == ["http.response.start", "http.response.pathsend"]
