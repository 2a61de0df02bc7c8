"""receive() and send(): messages, ordering, validation, disconnects."""

from __future__ import annotations

import json
import socket
import time

import pytest
from harness import RawConn, request, rss_kib, skirr, wait_until


@pytest.fixture(scope="module")
def server():
    with skirr("apps.probe:app", "--no-access-log") as s:
        yield s


def paths(server) -> list:
    """The path of every request the app was called for."""
    return json.loads(request(server.port, "GET", "/paths").body)


def events(server):
    """The app's recorded events (dicts only)."""
    return [e for e in json.loads(request(server.port, "GET", "/events").body) if isinstance(e, dict)]


@pytest.mark.parametrize(
    "case,error,words",
    [
        ("status_str", "TypeError", ["status", "int", "str"]),
        ("status_bool", "TypeError", ["status", "bool"]),
        ("status_range", "RuntimeError", ["status", "1000"]),
        ("status_missing", "TypeError", ["status"]),
        ("status_1xx", "RuntimeError", ["status", "101"]),
        ("content_length_bad", "RuntimeError", ["invalid Content-Length"]),
        ("content_length_conflict", "RuntimeError", ["conflicting Content-Length"]),
        ("header_str", "TypeError", ["header names", "bytes", "str"]),
        ("header_value_int", "TypeError", ["header values", "bytes", "int", "x-n"]),
        ("header_crlf", "RuntimeError", ["x-a", "invalid value"]),
        ("header_bad_name", "RuntimeError", ["invalid header name", "bad name"]),
        ("header_not_pair", "TypeError", ["[name, value]"]),
        ("body_before_start", "RuntimeError", ["http.response.body", "before", "http.response.start"]),
        ("double_start", "RuntimeError", ["http.response.start", "twice"]),
        ("unknown_type", "RuntimeError", ["http.response.nope"]),
        ("no_type", "TypeError", ["'type'"]),
        ("not_dict", "TypeError", ["dict", "list"]),
        ("body_str", "TypeError", ["body", "bytes", "str"]),
    ],
)
def test_invalid_send_raises_a_clear_error(server, case, error, words):
    r = request(server.port, "GET", f"/invalid?case={case}")
    assert r.status == 200
    got = json.loads(r.body)
    assert got["error"] == error, got
    for w in words:
        assert w in got["message"], (w, got["message"])


def test_message_keys_equal_to_the_names_are_read_as_the_names(server):
    # The usual literal keys are read by identity in one pass; any other
    # key must give what `message[key]` gives.
    r = request(server.port, "GET", "/keys-built")
    assert (r.status, r.header("x-k"), r.body) == (201, "1", b"abc")


def test_send_after_complete_raises_oserror_and_receive_reports_disconnect(server):
    r = request(server.port, "GET", "/after-complete")
    assert r.body == b"done"
    evs = wait_until(
        lambda: [e for e in events(server) if "receive_after_complete" in e or "after_complete" in e] or None,
        what="events",
    )
    kinds = {k: v for e in evs for k, v in e.items()}
    assert kinds["after_complete"] == "ClientDisconnected"
    assert "already complete" in kinds["message"]
    assert kinds["receive_after_complete"] == "http.disconnect"


def test_client_disconnected_is_an_oserror():
    import skirr

    assert issubclass(skirr.ClientDisconnected, OSError)


def test_chunked_upload_arrives_as_several_messages_with_more_body(server):
    with RawConn(server.port) as c:
        c.send(b"POST /echo?log=chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        # The first chunk reaches the app on its own.
        wait_until(lambda: {"body_message": 5, "log": "chunked"} in events(server), what="the first chunk in the app")
        c.send(b"6\r\n world\r\n0\r\n\r\n")
        r = c.read_response()
        assert r.body == b"hello world"
        assert int(r.header("x-chunks")) >= 2


def test_small_body_is_one_message(server):
    r = request(server.port, "POST", "/echo", body=b"x" * 4096)
    assert r.body == b"x" * 4096 and r.header("x-chunks") == "1"


def test_body_chunks_handed_to_the_app_are_bounded(server):
    size = 5 * 1024 * 1024
    with RawConn(server.port) as c:
        c.send(f"POST /upload-count HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode())
        block = b"y" * 1024 * 1024
        for _ in range(5):
            c.send(block)
        got = json.loads(c.read_response().body)
    assert got["bytes"] == size
    assert got["max_chunk"] <= 64 * 1024


def test_disconnect_reaches_the_app_and_later_send_raises(server):
    with RawConn(server.port) as c:
        c.send(b"GET /wait-disconnect?tag=d1 HTTP/1.1\r\nHost: x\r\n\r\n")
        # The client leaves once the app has the request.
        wait_until(lambda: "/wait-disconnect" in paths(server), what="the request in the app")

    def both():
        evs = [e for e in events(server) if e.get("tag") == "d1"]
        return evs if len(evs) == 2 else None

    evs = wait_until(both, what="disconnect events")
    assert {"disconnect": "http.disconnect", "tag": "d1"} in evs
    err = [e for e in evs if "send_after_disconnect" in e][0]
    assert err["is_oserror"] is True and err["send_after_disconnect"] == "ClientDisconnected"


def test_disconnect_while_streaming_stops_the_app(server):
    with RawConn(server.port) as c:
        c.send(b"GET /stream-until-disconnect?tag=s1 HTTP/1.1\r\nHost: x\r\n\r\n")
        c.read_head()
        c.read_exact(4096)
    evs = wait_until(lambda: [e for e in events(server) if e.get("tag") == "s1"] or None, what="stream error event")
    assert evs[0]["stream_error"] == "ClientDisconnected"


def test_a_disconnect_error_the_app_wraps_is_not_logged_as_an_app_error():
    # Starlette turns our ClientDisconnected into its own ClientDisconnect;
    # any client aborting a stream must not put a traceback in the log.
    with skirr("apps.probe:app", "--no-access-log", "--log-level", "debug") as s:
        with RawConn(s.port) as c:
            c.send(b"GET /stream-until-disconnect?tag=w1&reraise=1 HTTP/1.1\r\nHost: x\r\n\r\n")
            c.read_head()
            c.read_exact(4096)
        wait_until(lambda: "client disconnected" in s.logs(), what="debug line")
        assert "Exception in ASGI application" not in s.logs()
        assert "LookupError" not in s.logs()
        # An app error while the client is still there is still logged.
        assert request(s.port, "GET", "/crash").status == 500
        wait_until(lambda: "Exception in ASGI application" in s.logs(), what="error log")


def test_receive_reports_disconnect_while_the_app_streams(server):
    with RawConn(server.port) as c:
        c.send(b"GET /listen-disconnect?tag=l1 HTTP/1.1\r\nHost: x\r\n\r\n")
        c.read_head()
        c.read_until(b"tick")
    evs = wait_until(lambda: [e for e in events(server) if e.get("tag") == "l1"] or None, what="listen event")
    assert evs[0]["listen"] == "http.disconnect"


def test_streamed_upload_of_100mb_keeps_memory_flat(server):
    size = 100 * 1024 * 1024
    base = rss_kib(server.proc.pid)
    peak = base
    with RawConn(server.port, timeout=60) as c:
        c.send(f"POST /upload-count?slow=0 HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode())
        block = b"z" * (1024 * 1024)
        for i in range(100):
            c.send(block)
            if i % 10 == 0:
                peak = max(peak, rss_kib(server.proc.pid))
        got = json.loads(c.read_response().body)
    peak = max(peak, rss_kib(server.proc.pid))
    assert got["bytes"] == size
    assert peak - base < 20 * 1024, f"RSS grew by {(peak - base) / 1024:.1f} MiB"


def test_slow_app_applies_backpressure_to_the_client(server):
    """An app reading slowly makes the server stop reading: the client's
    send buffer fills instead of the server's memory."""
    size = 64 * 1024 * 1024
    with RawConn(server.port, timeout=30) as c:
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        c.send(f"POST /upload-count?slow=0.05 HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode())
        c.sock.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 1.5
        block = b"q" * 65536
        while time.monotonic() < deadline:
            try:
                sent += c.sock.send(block)
            except BlockingIOError:
                time.sleep(0.01)
        # In 1.5 s an app taking 50 ms per chunk consumes at most ~2 MiB; the
        # server buffers a bounded amount beyond that; everything else waits.
        assert sent < 16 * 1024 * 1024, f"server accepted {sent} bytes"


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_body_chunk_size_bounds_every_http_request_message(framing):
    # A body small enough to be read whole before the app starts
    # (`body_prefetch`) was handed over as one message, over
    # `body_chunk_size`; a streamed one was split.
    body = b"x" * 1500
    with skirr("apps.probe:app", "--body-chunk-size", "1000") as s:
        if framing == "chunked":
            r = request(
                s.port,
                "POST",
                "/upload-count",
                headers=[("Transfer-Encoding", "chunked")],
                body=b"5dc\r\n" + body + b"\r\n0\r\n\r\n",
            )
        else:
            r = request(s.port, "POST", "/upload-count", body=body)
        assert r.status == 200
        assert json.loads(r.body) == {"bytes": 1500, "chunks": 2, "max_chunk": 1000}
