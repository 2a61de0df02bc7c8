"""Django 5 through its ASGI handler: async and sync views, FileResponse,
StreamingHttpResponse, multipart uploads and the request_finished signal."""

from __future__ import annotations

import uuid

from harness import RawConn, request

from .helpers import poll_json, read_chunk, read_chunked_rest, sha256

APP = "frameworks.apps.django_app:application"


def test_async_view(client, server):
    r = client.get("/async", params={"a": "1", "b": "two"}, headers={"X-Test": "hello"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {
        "view": "async",
        "method": "GET",
        "path": "/async",
        "rest": "",
        "query": {"a": "1", "b": "two"},
        "scheme": "http",
        "host": f"127.0.0.1:{server.port}",
        "remote_addr": "127.0.0.1",
        "x_test": "hello",
        "absolute": f"http://127.0.0.1:{server.port}/x?y=1",
    }


def test_percent_encoded_path_reaches_the_view_decoded(client):
    r = client.get("/async/caf%C3%A9/a%20b")
    assert r.status_code == 200
    assert r.json()["path"] == "/async/café/a b"
    assert r.json()["rest"] == "café/a b"


def test_sync_view_runs_in_a_thread(client):
    r = client.get("/sync", headers={"Cookie": "flavour=mint"})
    assert r.status_code == 200
    assert r.json() == {"view": "sync", "main_thread": False, "loop_in_thread": False, "cookie": "mint"}


def test_request_body_and_cookie_out(client):
    body = bytes(range(256)) * 1000
    r = client.post("/echo", content=body, headers={"Content-Type": "application/x-thing"})
    assert r.status_code == 200
    assert r.content == body
    assert r.headers["x-body-length"] == str(len(body))
    assert r.headers["content-type"] == "application/x-thing"
    assert r.cookies["seen"] == "yes"


def test_404_from_the_urlconf(client):
    r = client.get("/no/such/page")
    assert r.status_code == 404


def test_file_response_of_a_large_file(client, data):
    f = data["odd.bin"]
    r = client.get("/file/odd.bin")
    assert r.status_code == 200
    assert r.headers["content-length"] == str(f.size)
    assert r.headers["content-disposition"] == 'attachment; filename="odd.bin"'
    assert len(r.content) == f.size and sha256(r.content) == f.sha256


def test_streaming_response_is_streamed(server):
    """The first chunk reaches the client while the view's iterator is
    still waiting (for the client's own /release request)."""
    key = uuid.uuid4().hex
    with RawConn(server.port) as c:
        c.send(f"GET /stream?key={key} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        head = c.read_head()
        assert head.status == 200
        assert head.header("transfer-encoding") == "chunked"
        assert head.header("content-length") is None
        assert read_chunk(c) == b"first\n"
        assert request(server.port, "GET", f"/release?key={key}").status == 200
        assert read_chunked_rest(c) == b"chunk 0\nchunk 1\nchunk 2\n"


def test_client_leaving_a_stream_cancels_it(server, client):
    """Django listens for http.disconnect while streaming: the client going
    away cancels the view's iterator (well before its 5 s wait ends) and
    request_finished still fires."""
    key = uuid.uuid4().hex
    before = client.get("/signals").json()["finished"]
    with RawConn(server.port) as c:
        c.send(f"GET /stream?key={key} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        assert c.read_head().status == 200
        assert read_chunk(c) == b"first\n"
    # request_finished for the first /signals and for the stream, at least
    poll_json(
        client,
        "/signals",
        lambda v: key in v["streams_cancelled"] and v["finished"] >= before + 2,
        "the stream to be cancelled and finished",
    )  # the key is recorded only if the cancel came within the view's 5 s wait


def test_streaming_response_from_a_sync_iterator(client):
    r = client.get("/stream-sync", params={"n": 50})
    assert r.status_code == 200
    assert r.text == "".join(f"line {i}\n" for i in range(50))


def test_multipart_upload(client):
    big = bytes(range(256)) * 4096  # 1 MiB: spills to a temporary file
    small = b"hello, django\n"
    r = client.post(
        "/upload",
        data={"title": "holiday", "note": "héllo"},
        files={"big": ("big.bin", big, "application/octet-stream"), "small": ("small.txt", small, "text/plain")},
    )
    assert r.status_code == 200
    assert r.json() == {
        "fields": {"title": "holiday", "note": "héllo"},
        "files": {
            "big": {
                "name": "big.bin",
                "size": len(big),
                "sha256": sha256(big),
                "content_type": "application/octet-stream",
                "on_disk": True,  # over FILE_UPLOAD_MAX_MEMORY_SIZE: a TemporaryUploadedFile
            },
            "small": {
                "name": "small.txt",
                "size": len(small),
                "sha256": sha256(small),
                "content_type": "text/plain",
                "on_disk": True,  # Django decides by the whole request's size
            },
        },
    }


def _finished_after(client, work) -> None:
    """Run ``work()`` (which makes ``n`` requests, its return value) and wait
    until request_finished has fired for every request started so far except
    the /signals request reading the counts. Counting against request_started
    rather than a count read before ``work()`` matters: Django fires
    request_finished from ``response.close()`` after the body is sent, so an
    earlier test's last request may still finish after that read. The counts
    can meet only if no request was missed."""
    started_before = client.get("/signals").json()["started"]
    n = work()

    def done(v):
        return v["started"] >= started_before + n + 1 and v["finished"] == v["started"] - 1

    poll_json(client, "/signals", done, f"request_finished for all {n} requests")


def test_request_finished_fires_for_plain_and_streaming_responses(client):
    def work():
        assert client.get("/async").status_code == 200
        assert client.get("/sync").status_code == 200
        assert client.get("/stream-sync").status_code == 200
        assert client.post("/upload", files={"f": ("f.txt", b"x")}).status_code == 200
        assert client.get("/no/such/page").status_code == 404
        return 5

    _finished_after(client, work)


def test_request_finished_fires_for_file_responses(client, data):
    def work():
        for name in ("odd.bin", "exact.bin"):
            r = client.get(f"/file/{name}")
            assert r.status_code == 200 and sha256(r.content) == data[name].sha256
        return 2

    _finished_after(client, work)
