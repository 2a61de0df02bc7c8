"""Client-side helpers shared by the framework tests."""

from __future__ import annotations

import hashlib
import json

from harness import TIMEOUT, ConnectionClosed, RawConn, wait_until


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_chunk(conn: RawConn) -> bytes:
    """One chunk of a chunked body (b"" for the last one, trailers consumed)."""
    size = int(conn.read_until(b"\r\n").split(b";")[0].strip(), 16)
    if size == 0:
        conn.read_until(b"\r\n")
        return b""
    data = conn.read_exact(size)
    assert conn.read_exact(2) == b"\r\n"
    return data


def read_chunked_rest(conn: RawConn) -> bytes:
    out = b""
    while chunk := read_chunk(conn):
        out += chunk
    return out


def assert_bodyless(port: int, target: str, status: int) -> None:
    """``target`` answers ``status`` with no body on the wire: on the same
    keep-alive connection the next bytes are the next response's, or the
    server closes the connection (uvicorn does, after the app's body made
    its HTTP layer raise) without having sent any."""
    with RawConn(port) as c:
        c.send(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        head = c.read_head()
        assert head.status == status, head
        assert head.header("transfer-encoding") is None, head.headers
        assert head.header("content-length") in (None, "0"), head.headers
        try:
            c.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            nxt = c.read_until(b"\r\n\r\n")
        except (ConnectionClosed, ConnectionResetError, BrokenPipeError):
            assert c.buf == b"", f"body bytes after the {status} head: {c.buf[:80]!r}"
        else:
            assert nxt.startswith(b"HTTP/1.1 200 "), f"bytes after the {status} head: {nxt[:80]!r}"


def sse_events(text: str) -> list[dict]:
    """Parse a text/event-stream body into events (comments dropped)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        event: dict = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                event["data"] = event["data"] + "\n" + value if "data" in event else value
            else:
                event[field] = value
        if event:
            events.append(event)
    return events


def poll_json(client, path: str, predicate, what: str, timeout: float = TIMEOUT):
    """GET ``path`` until ``predicate(json)`` holds; returns that json."""
    last = {}

    def check():
        last["v"] = client.get(path).json()
        return predicate(last["v"])

    try:
        wait_until(check, timeout, 0.05, what)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}; last {path}: {json.dumps(last.get('v'))}") from None
    return last["v"]
