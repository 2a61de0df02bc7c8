"""A small HTTP/3 client for the tests, on aioquic's ``H3Connection`` over
``aioquic.asyncio.connect``: one QUIC connection, requests as coroutines,
and the raw controls the tests need (a request left open, a stream reset).
Every wait has a timeout."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, H3Event, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, QuicEvent, StopSendingReceived, StreamReset

TIMEOUT = 10.0
#: H3_REQUEST_CANCELLED and H3_REQUEST_REJECTED (RFC 9114 §8.1).
REQUEST_CANCELLED = 0x10C
REQUEST_REJECTED = 0x10B


@dataclass
class H3Response:
    status: int = 0
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    trailers: list[tuple[str, str]] = field(default_factory=list)
    reset: int | None = None
    #: The error code of the server's STOP_SENDING for the request, if any.
    stop_sending: int | None = None
    #: Interim (1xx) responses before the final one: (status, fields).
    interim: list[tuple[int, list[tuple[str, str]]]] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name.lower():
                return v
        return None


class _Stream:
    def __init__(self) -> None:
        self.resp = H3Response()
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()
        self.head: asyncio.Future = asyncio.get_running_loop().create_future()
        self.more_interim = asyncio.Event()


#: The GOAWAY frame type (RFC 9114 §7.2.6).
GOAWAY = 0x7


class _H3(H3Connection):
    """aioquic's H3Connection, noting the GOAWAY frames it otherwise drops."""

    goaways: list[int]

    def _check_control_frame_type(self, frame_type: int) -> None:
        # Called as each control-stream frame's header is parsed.
        if frame_type == GOAWAY:
            self.goaways.append(frame_type)
        super()._check_control_frame_type(frame_type)


class H3Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = _H3(self._quic)
        self.h3.goaways = []
        self.streams: dict[int, _Stream] = {}
        self.terminated: asyncio.Future = asyncio.get_running_loop().create_future()

    @property
    def goaway(self) -> bool:
        """Whether the server sent GOAWAY."""
        return bool(self.h3.goaways)

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, StreamReset) and event.stream_id in self.streams:
            st = self.streams[event.stream_id]
            st.resp.reset = event.error_code
            for f in (st.head, st.done):
                if not f.done():
                    f.set_result(st.resp)
        if isinstance(event, StopSendingReceived) and event.stream_id in self.streams:
            self.streams[event.stream_id].resp.stop_sending = event.error_code
        if isinstance(event, ConnectionTerminated):
            for st in self.streams.values():
                for f in (st.head, st.done):
                    if not f.done():
                        f.set_exception(ConnectionError(f"connection closed: {event.reason_phrase!r}"))
            if not self.terminated.done():
                self.terminated.set_result(event)
        for e in self.h3.handle_event(event):
            self._h3_event(e)

    def _h3_event(self, e: H3Event) -> None:
        st = self.streams.get(getattr(e, "stream_id", -1))
        if st is None:
            return
        if isinstance(e, HeadersReceived):
            fields = [(k.decode(), v.decode()) for k, v in e.headers]
            status = int(dict(fields).get(":status", "0"))
            if not st.head.done() and 100 <= status < 200:
                st.resp.interim.append((status, [(k, v) for k, v in fields if not k.startswith(":")]))
                st.more_interim.set()
            elif not st.head.done():
                st.resp.status = int(dict(fields)[":status"])
                st.resp.headers = [(k, v) for k, v in fields if not k.startswith(":")]
                st.head.set_result(st.resp)
            else:
                st.resp.trailers = fields
        elif isinstance(e, DataReceived):
            st.resp.body += e.data
        if getattr(e, "stream_ended", False) and not st.done.done():
            st.done.set_result(st.resp)

    def start(self, method: str, path: str, headers=(), body: bytes | None = b"", end: bool = True) -> int:
        """Sends a request head (and `body`); the stream stays open for more
        body unless `end`. Returns the stream id."""
        sid = self._quic.get_next_available_stream_id()
        self.streams[sid] = _Stream()
        fields = [
            (b":method", method.encode()),
            (b":scheme", b"https"),
            (b":authority", b"localhost"),
            (b":path", path.encode()),
            *[(k.encode(), v.encode()) for k, v in headers],
        ]
        self.h3.send_headers(sid, fields, end_stream=end and not body)
        if body:
            self.h3.send_data(sid, body, end_stream=end)
        self.transmit()
        return sid

    def start_raw(self, data: bytes) -> int:
        """Opens a request stream carrying `data` as is (say, part of a
        HEADERS frame), kept open. Returns the stream id."""
        sid = self._quic.get_next_available_stream_id()
        self.streams[sid] = _Stream()
        self._quic.send_stream_data(sid, data, end_stream=False)
        self.transmit()
        return sid

    def send_more(self, sid: int, data: bytes, end: bool = False) -> None:
        self.h3.send_data(sid, data, end_stream=end)
        self.transmit()

    def reset(self, sid: int, code: int = REQUEST_CANCELLED) -> None:
        """Abandons a request: RESET_STREAM and STOP_SENDING (RFC 9114 §4.1.1)."""
        self._quic.reset_stream(sid, code)
        self._quic.stop_stream(sid, code)
        self.transmit()

    def withhold_credit(self, sid: int) -> None:
        """The client "stops reading" stream `sid`: it sends no more
        MAX_STREAM_DATA for it (aioquic raises the credit as data arrives,
        not as the app reads)."""
        limits = self._quic._write_stream_limits

        def write_stream_limits(builder, space, stream) -> None:
            if stream.stream_id != sid:
                limits(builder=builder, space=space, stream=stream)

        self._quic._write_stream_limits = write_stream_limits

    async def response(self, sid: int, timeout: float = TIMEOUT) -> H3Response:
        return await asyncio.wait_for(asyncio.shield(self.streams[sid].done), timeout)

    async def head(self, sid: int, timeout: float = TIMEOUT) -> H3Response:
        return await asyncio.wait_for(asyncio.shield(self.streams[sid].head), timeout)

    async def interim(self, sid: int, n: int, timeout: float = TIMEOUT) -> list:
        """Waits until stream `sid` got `n` interim responses; returns them."""
        st = self.streams[sid]
        async with asyncio.timeout(timeout):
            while len(st.resp.interim) < n:
                st.more_interim.clear()
                await st.more_interim.wait()
        return st.resp.interim

    async def request(self, method: str, path: str, headers=(), body: bytes = b"") -> H3Response:
        return await self.response(self.start(method, path, headers, body))


@asynccontextmanager
async def h3_connect(
    port: int,
    ca: str | None,
    host: str = "127.0.0.1",
    cert: tuple[str, str] | None = None,
    max_stream_data: int | None = None,
) -> AsyncIterator[H3Client]:
    """A connection to 127.0.0.1:`port` verified with `ca` (`None`: not
    verified), presenting `cert` (certificate and key files) if given;
    `max_stream_data`: each stream's initial flow-control credit."""
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost")
    if max_stream_data is not None:
        cfg.max_stream_data = max_stream_data
    if cert:
        cfg.load_cert_chain(*cert)
    if ca:
        cfg.load_verify_locations(ca)
    else:
        cfg.verify_mode = ssl.CERT_NONE
    async with asyncio.timeout(TIMEOUT):
        cm = connect(host, port, configuration=cfg, create_protocol=H3Client, wait_connected=True)
        client = await cm.__aenter__()
    try:
        yield client
    finally:
        await cm.__aexit__(None, None, None)


def run(coro, timeout: float = 30.0):
    """Runs a test coroutine on a fresh event loop, bounded by `timeout`."""

    async def bounded():
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())
