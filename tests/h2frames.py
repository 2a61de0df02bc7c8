"""A raw HTTP/2 frame client for hostile and conformance tests.

Unlike ``RawH2`` in test_http2.py it keeps no protocol state of its own:
it writes exactly the frames a test builds (with ``hyperframe``, and
``hpack`` for header blocks) and parses whatever the server sends back,
so it can send what a correct client never would. Every socket operation
has a timeout.
"""

from __future__ import annotations

import socket
import time

from hpack import Decoder, Encoder
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Error codes (RFC 9113 §7).
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB


class Closed(Exception):
    """The server closed the connection."""


class Frames:
    """One prior-knowledge HTTP/2 connection driven frame by frame."""

    def __init__(
        self,
        port: int,
        *,
        settings: dict | None = None,
        preface: bool = True,
        timeout: float = 10.0,
        rcvbuf: int | None = None,
    ):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        if rcvbuf:
            # Before connect, so the window the client advertises is small.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.enc = Encoder()
        self.dec = Decoder()
        self.frames: list = []
        self.closed = False
        self._buf = b""
        self._block: dict[int, bytes] = {}
        #: Decoded response headers and body per stream.
        self.headers: dict[int, list] = {}
        self.body: dict[int, bytes] = {}
        self.ended: set[int] = set()
        #: Send WINDOW_UPDATE for the DATA received (a reading client).
        self.auto_window = True
        if preface:
            self.send_raw(PREFACE + SettingsFrame(0, settings=settings or {}).serialize())

    # --- sending -----------------------------------------------------------

    def send_raw(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise Closed() from e

    def send(self, *frames: Frame) -> None:
        self.send_raw(b"".join(f.serialize() for f in frames))

    def block(self, headers) -> bytes:
        return self.enc.encode(list(headers))

    def request_headers(self, path: str = "/", method: str = "GET", extra=()) -> list:
        return [(":method", method), (":scheme", "http"), (":authority", "example.test"), (":path", path), *extra]

    def get(self, sid: int, path: str = "/", *, end: bool = True, extra=(), method: str = "GET") -> None:
        flags = ["END_HEADERS"] + (["END_STREAM"] if end else [])
        self.send(HeadersFrame(sid, self.block(self.request_headers(path, method, extra)), flags=flags))

    def data(self, sid: int, payload: bytes, *, end: bool = False) -> None:
        self.send(DataFrame(sid, payload, flags=["END_STREAM"] if end else []))

    # --- receiving ---------------------------------------------------------

    def _parse(self) -> None:
        while len(self._buf) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(self._buf[:9]))
            if len(self._buf) < 9 + length:
                return
            frame.parse_body(memoryview(self._buf[9 : 9 + length]))
            self._buf = self._buf[9 + length :]
            self.frames.append(frame)
            self._on_frame(frame)

    def _on_frame(self, f) -> None:
        if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
            self.send_quietly(SettingsFrame(0, flags=["ACK"]))
        elif isinstance(f, PingFrame) and "ACK" not in f.flags:
            self.send_quietly(PingFrame(0, f.opaque_data, flags=["ACK"]))
        elif isinstance(f, (HeadersFrame, ContinuationFrame)):
            self._block[f.stream_id] = self._block.get(f.stream_id, b"") + f.data
            if "END_HEADERS" in f.flags:
                hs = self.dec.decode(self._block.pop(f.stream_id))
                self.headers.setdefault(f.stream_id, []).extend(hs)
            if "END_STREAM" in f.flags:
                self.ended.add(f.stream_id)
        elif isinstance(f, DataFrame):
            self.body[f.stream_id] = self.body.get(f.stream_id, b"") + f.data
            if self.auto_window and f.flow_controlled_length:
                self.send_quietly(
                    WindowUpdateFrame(0, window_increment=f.flow_controlled_length),
                    WindowUpdateFrame(f.stream_id, window_increment=f.flow_controlled_length),
                )
            if "END_STREAM" in f.flags:
                self.ended.add(f.stream_id)
        elif isinstance(f, RstStreamFrame):
            self.ended.add(f.stream_id)

    def send_quietly(self, *frames: Frame) -> None:
        try:
            self.send(*frames)
        except (Closed, OSError):
            pass

    def read_some(self, timeout: float) -> bool:
        """Reads what arrives within ``timeout``; False once closed."""
        if self.closed:
            return False
        self.sock.settimeout(max(0.01, timeout))
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return True
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.closed = True
            return False
        self._buf += data
        self._parse()
        return True

    def pump(self, until, timeout: float = 10.0, what: str = "frames"):
        """Reads until ``until(self)`` is true; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            got = until(self)
            if got:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{what}: {self.frames[-10:]} closed={self.closed}")
            if not self.read_some(min(left, 0.5)) and not until(self):
                raise Closed(f"closed waiting for {what}: {self.frames[-10:]}")

    def goaway(self, timeout: float = 10.0) -> GoAwayFrame:
        """The server's GOAWAY, waited for."""

        def found(c):
            return next((f for f in c.frames if isinstance(f, GoAwayFrame)), None) or (c.closed and "closed")

        got = self.pump(found, timeout, "GOAWAY")
        if got == "closed":
            raise Closed(f"closed without GOAWAY: {self.frames[-10:]}")
        return got

    def rst(self, sid: int, timeout: float = 10.0) -> RstStreamFrame:
        def found(c):
            return next((f for f in c.frames if isinstance(f, RstStreamFrame) and f.stream_id == sid), None)

        return self.pump(found, timeout, f"RST_STREAM on {sid}")

    def stream_error_or_goaway(self, sid: int, timeout: float = 10.0):
        """RST_STREAM on ``sid`` or a GOAWAY, whichever comes."""

        def found(c):
            return next(
                (
                    f
                    for f in c.frames
                    if isinstance(f, GoAwayFrame) or (isinstance(f, RstStreamFrame) and f.stream_id == sid)
                ),
                None,
            )

        return self.pump(found, timeout, f"RST_STREAM on {sid} or GOAWAY")

    def response(self, sid: int, timeout: float = 10.0) -> tuple[int, bytes]:
        """``(status, body)`` of a stream's complete response."""
        self.pump(lambda c: sid in c.ended, timeout, f"response on {sid}")
        rst = [f for f in self.frames if isinstance(f, RstStreamFrame) and f.stream_id == sid]
        hs = dict(self.headers.get(sid, []))
        status = hs.get(b":status") or hs.get(":status")
        if status is None:
            raise AssertionError(f"stream {sid} ended without a response: {rst}")
        return int(status), self.body.get(sid, b"")

    def count_raw(self, ftype: int, flags: int, count: int, timeout: float = 30.0) -> int:
        """Reads without parsing bodies (fast, for floods) until ``count``
        frames of ``ftype`` with exactly ``flags`` have arrived; the frames
        are not kept. Returns how many there were."""
        deadline = time.monotonic() + timeout
        seen = 0
        buf = self._buf
        self._buf = b""
        while True:
            i = 0
            while len(buf) - i >= 9:
                length = int.from_bytes(buf[i : i + 3], "big")
                if len(buf) - i < 9 + length:
                    break
                if buf[i + 3] == ftype and buf[i + 4] == flags:
                    seen += 1
                i += 9 + length
            buf = buf[i:]
            if seen >= count:
                self._buf = buf
                return seen
            if time.monotonic() > deadline:
                raise TimeoutError(f"{seen} of {count} frames of type {ftype}")
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            data = self.sock.recv(1 << 20)
            if not data:
                self.closed = True
                raise Closed(f"closed after {seen} of {count} frames")
            buf += data

    def wait_closed(self, timeout: float = 10.0) -> None:
        self.pump(lambda c: c.closed, timeout, "connection close")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Frames:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
