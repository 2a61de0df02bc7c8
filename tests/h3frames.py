"""A raw HTTP/3 frame client for conformance and hostile tests.

Unlike ``h3client.py`` (aioquic's ``H3Connection``) it keeps no HTTP/3
state of its own: on an aioquic ``QuicConnection`` it opens the streams a
test asks for and writes exactly the bytes it builds (stream types,
frames, QPACK field sections, valid or not), and it records everything
the server does: each stream's bytes and FIN, RESET_STREAM and
STOP_SENDING codes, and the connection's close. Every wait has a timeout.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pylsqpack
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.buffer import Buffer, BufferReadError, encode_uint_var
from aioquic.h3.connection import H3_ALPN
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import (
    ConnectionTerminated,
    QuicEvent,
    StopSendingReceived,
    StreamDataReceived,
    StreamReset,
)

TIMEOUT = 10.0

# Frame types (RFC 9114 §7.2, §11.2.1).
DATA, HEADERS, CANCEL_PUSH, SETTINGS, PUSH_PROMISE, GOAWAY, MAX_PUSH_ID = 0x0, 0x1, 0x3, 0x4, 0x5, 0x7, 0xD
#: HTTP/2 frame types reserved in HTTP/3: PRIORITY, PING, WINDOW_UPDATE, CONTINUATION.
H2_FRAME_TYPES = (0x2, 0x6, 0x8, 0x9)

# Unidirectional stream types (RFC 9114 §6.2, RFC 9204 §4.2).
CONTROL, PUSH, QPACK_ENCODER, QPACK_DECODER = 0x0, 0x1, 0x2, 0x3

# Settings (RFC 9114 §7.2.4.1, RFC 9204 §5).
QPACK_MAX_TABLE_CAPACITY, MAX_FIELD_SECTION_SIZE, QPACK_BLOCKED_STREAMS = 0x1, 0x6, 0x7

# Error codes (RFC 9114 §8.1, RFC 9204 §6).
H3_NO_ERROR = 0x100
H3_GENERAL_PROTOCOL_ERROR = 0x101
H3_INTERNAL_ERROR = 0x102
H3_STREAM_CREATION_ERROR = 0x103
H3_CLOSED_CRITICAL_STREAM = 0x104
H3_FRAME_UNEXPECTED = 0x105
H3_FRAME_ERROR = 0x106
H3_EXCESSIVE_LOAD = 0x107
H3_ID_ERROR = 0x108
H3_SETTINGS_ERROR = 0x109
H3_MISSING_SETTINGS = 0x10A
H3_REQUEST_REJECTED = 0x10B
H3_REQUEST_CANCELLED = 0x10C
H3_REQUEST_INCOMPLETE = 0x10D
H3_MESSAGE_ERROR = 0x10E
QPACK_DECOMPRESSION_FAILED = 0x200
QPACK_ENCODER_STREAM_ERROR = 0x201
QPACK_DECODER_STREAM_ERROR = 0x202


def grease(n: int = 0) -> int:
    """A reserved ("grease") frame, stream or setting type: 0x1f * N + 0x21."""
    return 0x1F * n + 0x21


def frame(ftype: int, payload: bytes = b"") -> bytes:
    """A frame exactly as given: type, length, payload."""
    return encode_uint_var(ftype) + encode_uint_var(len(payload)) + payload


def settings(pairs: list[tuple[int, int]] | dict[int, int] = ()) -> bytes:
    """A SETTINGS frame with `pairs` in order (repeats kept)."""
    items = pairs.items() if isinstance(pairs, dict) else pairs
    return frame(SETTINGS, b"".join(encode_uint_var(k) + encode_uint_var(v) for k, v in items))


def fields(pairs: list[tuple[str, str]] | list[tuple[bytes, bytes]]) -> bytes:
    """A QPACK field section of `pairs` as given (static table and literals
    only, no dynamic table: what a server advertising capacity 0 takes)."""
    raw = [(k.encode() if isinstance(k, str) else k, v.encode() if isinstance(v, str) else v) for k, v in pairs]
    return pylsqpack.Encoder().encode(0, raw)[1]


def headers(pairs) -> bytes:
    """A HEADERS frame of `pairs` (see `fields`)."""
    return frame(HEADERS, fields(pairs))


def request_fields(method: str = "GET", path: str = "/", extra=()) -> list[tuple[str, str]]:
    return [(":method", method), (":scheme", "https"), (":authority", "localhost"), (":path", path), *extra]


def parse_frames(data: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """The whole frames at the start of `data`, and what is left."""
    out = []
    buf = Buffer(data=data)
    while not buf.eof():
        start = buf.tell()
        try:
            ftype, length = buf.pull_uint_var(), buf.pull_uint_var()
            payload = buf.pull_bytes(length)
        except BufferReadError:
            return out, data[start:]
        out.append((ftype, payload))
    return out, b""


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    buf = Buffer(data=payload)
    out = []
    while not buf.eof():
        out.append((buf.pull_uint_var(), buf.pull_uint_var()))
    return out


@dataclass
class Response:
    """What the server sent on one request stream."""

    status: int = 0
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    trailers: list[tuple[str, str]] = field(default_factory=list)
    #: Every frame type in order, known or not.
    frame_types: list[int] = field(default_factory=list)
    #: RESET_STREAM and STOP_SENDING codes, if the server sent them.
    reset: int | None = None
    stop: int | None = None
    ended: bool = False

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)


class RawH3(QuicConnectionProtocol):
    """One QUIC connection (ALPN h3) driven stream by stream."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.data: dict[int, bytes] = {}
        self.fin: set[int] = set()
        self.resets: dict[int, int] = {}
        self.stops: dict[int, int] = {}
        self.terminated: ConnectionTerminated | None = None
        self._wake = asyncio.Event()

    # --- what the server does -------------------------------------------

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, StreamDataReceived):
            self.data[event.stream_id] = self.data.get(event.stream_id, b"") + event.data
            if event.end_stream:
                self.fin.add(event.stream_id)
        elif isinstance(event, StreamReset):
            self.resets[event.stream_id] = event.error_code
        elif isinstance(event, StopSendingReceived):
            self.stops[event.stream_id] = event.error_code
        elif isinstance(event, ConnectionTerminated):
            self.terminated = event
        self._wake.set()

    async def until(self, pred: Callable[[], object], timeout: float = TIMEOUT, what: str = "the server"):
        """Waits until `pred()` is truthy (re-checked on each QUIC event)
        and returns it; TimeoutError naming `what` otherwise."""
        try:
            async with asyncio.timeout(timeout):
                while not (got := pred()):
                    self._wake.clear()
                    await self._wake.wait()
                return got
        except TimeoutError:
            raise TimeoutError(f"timed out waiting for {what}") from None

    async def closed(self, timeout: float = TIMEOUT) -> ConnectionTerminated:
        """The connection's close (CONNECTION_CLOSE from the server)."""
        return await self.until(lambda: self.terminated, timeout, "the connection to close")

    def server_uni(self, stream_type: int) -> tuple[int, list[tuple[int, bytes]]] | None:
        """The server's unidirectional stream of `stream_type`: its id and
        the frames on it so far (None before its type arrived)."""
        for sid, data in self.data.items():
            if sid % 4 != 3 or not data:
                continue
            buf = Buffer(data=data)
            try:
                if buf.pull_uint_var() != stream_type:
                    continue
            except BufferReadError:
                continue
            return sid, parse_frames(data[buf.tell() :])[0]
        return None

    async def server_settings(self, timeout: float = TIMEOUT) -> tuple[list[tuple[int, bytes]], list[tuple[int, int]]]:
        """The frames on the server's control stream once its first arrived,
        and the settings of the first (which must be SETTINGS)."""

        def first():
            got = self.server_uni(CONTROL)
            return got if got and got[1] else None

        _, frames = await self.until(first, timeout, "the server's control stream")
        ftype, payload = frames[0]
        return frames, parse_settings(payload) if ftype == SETTINGS else []

    def response(self, sid: int) -> Response:
        """The response on `sid` so far, decoded (QPACK without a dynamic
        table, as the server uses none)."""
        r = Response(reset=self.resets.get(sid), stop=self.stops.get(sid), ended=sid in self.fin)
        frames, _ = parse_frames(self.data.get(sid, b""))
        dec = pylsqpack.Decoder(0, 0)
        for ftype, payload in frames:
            r.frame_types.append(ftype)
            if ftype == HEADERS:
                _, pairs = dec.feed_header(sid, payload)
                decoded = [(k.decode(), v.decode()) for k, v in pairs]
                if not r.status:
                    r.status = int(dict(decoded)[":status"])
                    r.headers = decoded
                else:
                    r.trailers = decoded
            elif ftype == DATA:
                r.body += payload
        return r

    async def answer(self, sid: int, timeout: float = TIMEOUT) -> Response:
        """The response on `sid` once it ended, was reset, or the
        connection closed."""
        await self.until(
            lambda: sid in self.fin or sid in self.resets or self.terminated, timeout, f"stream {sid} to end"
        )
        return self.response(sid)

    # --- what the client sends -------------------------------------------

    def uni(self, stream_type: int, data: bytes = b"", end: bool = False) -> int:
        """Opens a unidirectional stream of `stream_type` carrying `data`."""
        sid = self._quic.get_next_available_stream_id(is_unidirectional=True)
        self._quic.send_stream_data(sid, encode_uint_var(stream_type) + data, end_stream=end)
        self.transmit()
        return sid

    def bidi(self, data: bytes = b"", end: bool = True) -> int:
        """Opens a request stream carrying `data` exactly."""
        sid = self._quic.get_next_available_stream_id()
        self.send(sid, data, end)
        return sid

    def send(self, sid: int, data: bytes, end: bool = False) -> None:
        self._quic.send_stream_data(sid, data, end_stream=end)
        self.transmit()

    def request(self, method: str = "GET", path: str = "/", extra=(), body: bytes | None = None) -> int:
        """A well-formed request: HEADERS, DATA if `body`, FIN."""
        data = headers(request_fields(method, path, extra))
        if body:
            data += frame(DATA, body)
        return self.bidi(data)

    async def get(self, path: str = "/", timeout: float = TIMEOUT) -> Response:
        return await self.answer(self.request("GET", path), timeout)


@asynccontextmanager
async def raw_h3(
    port: int,
    ca: str | None = None,
    control: bytes | None = b"",
) -> AsyncIterator[RawH3]:
    """A connection to 127.0.0.1:`port` (verified with `ca` if given). The
    client opens its control stream with an empty SETTINGS frame followed
    by `control`; `control=None` opens none."""
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost")
    if ca:
        cfg.load_verify_locations(ca)
    else:
        cfg.verify_mode = ssl.CERT_NONE
    async with asyncio.timeout(TIMEOUT):
        cm = connect("127.0.0.1", port, configuration=cfg, create_protocol=RawH3, wait_connected=True)
        client: RawH3 = await cm.__aenter__()
    try:
        if control is not None:
            client.control = client.uni(CONTROL, settings() + control)
        yield client
    finally:
        async with asyncio.timeout(TIMEOUT):
            await cm.__aexit__(None, None, None)
