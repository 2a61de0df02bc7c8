"""A frame-level HTTP/2 client (prior knowledge or over a TLS socket) that
follows a graceful GOAWAY the way browsers, curl and nghttp2 do.

Why not the ``h2`` package (and so httpx/httpcore): its connection state
machine goes to CLOSED on the first GOAWAY and raises ``ProtocolError`` on
every later frame but another GOAWAY, so the rest of a response still in
flight when a graceful GOAWAY (last-stream-id 2^31-1, RFC 9113 §6.8)
arrives cannot be read; httpcore then fails that request with
``RemoteProtocolError`` although the server finishes it. This client parses
frames with ``hyperframe``/``hpack`` only and keeps reading after GOAWAY.

What a stream's outcome means (RFC 9113 §6.8, §8.7):

* ``ok``: a complete response.
* ``refused``: the server said it did not process the stream — a GOAWAY
  whose last-stream-id is below it, or RST_STREAM(REFUSED_STREAM). Safe to
  send again; the caller counts it and resends on a new connection.
* ``failed``: anything else — RST_STREAM with another code, the connection
  closing (or a read timing out) with the stream open and not excluded by a
  GOAWAY. A request the server may have processed and never answered.
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
REFUSED_STREAM = 0x7
MAX_ID = (1 << 31) - 1


class Stream:
    def __init__(self, sid: int, tag: object = None) -> None:
        self.sid = sid
        self.tag = tag
        self.status: int | None = None
        self.headers: list[tuple[str, str]] = []
        self.body = b""
        #: None while open, then "ok", "refused" or "failed".
        self.outcome: str | None = None
        self.why = ""
        #: Frames of this stream received after the final GOAWAY excluded it.
        self.frames_after_refusal = 0


class FrameClient:
    """One HTTP/2 connection; every socket operation has a timeout."""

    def __init__(self, sock: socket.socket, *, authority: str = "localhost", scheme: str = "http") -> None:
        self.sock = sock
        self.authority, self.scheme = authority, scheme
        self.enc, self.dec = Encoder(), Decoder()
        self.next_sid = 1
        self.streams: dict[int, Stream] = {}
        self.goaways: list[GoAwayFrame] = []
        self.eof = False
        self.send_window = 65535  # the connection's, for our DATA
        self.stream_window = 65535  # the server's SETTINGS_INITIAL_WINDOW_SIZE
        self.windows: dict[int, int] = {}  # each stream's, for our DATA
        self.max_streams = 100
        self._buf = b""
        self._cont: tuple[int, bytes, bool] | None = None  # a header block awaiting CONTINUATION
        self.sock.sendall(PREFACE + SettingsFrame(0, settings={0x2: 0}).serialize())  # no push

    @classmethod
    def connect(cls, port: int, timeout: float = 10.0, **kw) -> FrameClient:
        return cls(socket.create_connection(("127.0.0.1", port), timeout=timeout), **kw)

    # --- sending ---------------------------------------------------------

    @property
    def going_away(self) -> bool:
        return bool(self.goaways) or self.eof

    def open_streams(self) -> list[Stream]:
        return [s for s in self.streams.values() if s.outcome is None]

    def request(
        self, method: str, path: str, body: bytes = b"", headers=(), tag: object = None, end: bool = True
    ) -> Stream:
        """Opens a stream and sends ``body``; with ``end=False`` the request
        stays open for :meth:`send_data`."""
        sid = self.next_sid
        self.next_sid += 2
        st = self.streams[sid] = Stream(sid, tag)
        last = min((g.last_stream_id for g in self.goaways), default=MAX_ID)
        if sid > last:
            # Sent after the GOAWAY that excludes it (as if it crossed it in flight).
            st.outcome, st.why = "refused", f"above GOAWAY last-stream-id {last}"
        hs = [(":method", method), (":scheme", self.scheme), (":authority", self.authority), (":path", path)]
        hs += list(headers)
        if body and end:
            hs.append(("content-length", str(len(body))))
        flags = ["END_HEADERS"] + (["END_STREAM"] if end and not body else [])
        self.windows[sid] = self.stream_window
        try:
            self.sock.sendall(HeadersFrame(sid, self.enc.encode(hs), flags=flags).serialize())
        except OSError as e:
            # The server closed: what it sent before (a GOAWAY) decides.
            self.read_to_eof(timeout=2.0, why=f"{type(e).__name__} sending")
        if body:
            self.send_data(st, body, end)
        return st

    def send_data(self, st: Stream, data: bytes, end: bool) -> None:
        """DATA in frames of at most 16 KiB (the default SETTINGS_MAX_FRAME_SIZE),
        each within the connection's and the stream's flow-control windows."""
        sent = 0
        try:
            while sent < len(data) and not self.eof and st.outcome in (None, "refused"):
                n = min(16384, len(data) - sent, self.send_window, self.windows[st.sid])
                if n <= 0:
                    self.read_some(timeout=10.0)
                    continue
                flags = ["END_STREAM"] if end and sent + n == len(data) else []
                self.sock.sendall(DataFrame(st.sid, data[sent : sent + n], flags=flags).serialize())
                self.send_window -= n
                self.windows[st.sid] -= n
                sent += n
        except OSError as e:
            self.read_to_eof(timeout=2.0, why=f"{type(e).__name__} sending")

    # --- receiving -------------------------------------------------------

    def read_some(self, timeout: float | None = None) -> None:
        """Reads once from the socket (blocking up to the socket's timeout,
        or ``timeout``) and handles every complete frame."""
        if self.eof:
            return
        if timeout is not None:
            self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise
        except OSError as e:  # reset by the peer
            self._closed(f"{type(e).__name__}: {e}")
            return
        if not data:
            self._closed("connection closed")
            return
        self._buf += data
        while len(self._buf) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(self._buf[:9]))
            if len(self._buf) < 9 + length:
                break
            frame.parse_body(memoryview(self._buf[9 : 9 + length]))
            self._buf = self._buf[9 + length :]
            self._handle(frame)

    def _closed(self, why: str) -> None:
        self.eof = True
        last = min((g.last_stream_id for g in self.goaways), default=MAX_ID)
        for st in self.open_streams():
            if self.goaways and st.sid > last:
                st.outcome, st.why = "refused", f"above GOAWAY last-stream-id {last}"
            else:
                st.outcome, st.why = "failed", f"{why} with the stream open (GOAWAYs: {self._goaway_ids()})"

    def _send_ctrl(self, data: bytes) -> None:
        """ACKs and WINDOW_UPDATEs; if the socket broke, reading tells."""
        try:
            self.sock.sendall(data)
        except OSError:
            pass

    def _goaway_ids(self) -> list[tuple[int, int]]:
        return [(g.last_stream_id, g.error_code) for g in self.goaways]

    def _handle(self, f: Frame) -> None:
        if isinstance(f, SettingsFrame):
            if "ACK" not in f.flags:
                if 0x4 in f.settings:
                    for sid in self.windows:  # RFC 9113 §6.9.2: open streams adjust by the difference
                        self.windows[sid] += f.settings[0x4] - self.stream_window
                    self.stream_window = f.settings[0x4]
                if 0x3 in f.settings:
                    self.max_streams = f.settings[0x3]
                self._send_ctrl(SettingsFrame(0, flags=["ACK"]).serialize())
        elif isinstance(f, PingFrame):
            if "ACK" not in f.flags:
                self._send_ctrl(PingFrame(0, f.opaque_data, flags=["ACK"]).serialize())
        elif isinstance(f, WindowUpdateFrame):
            if f.stream_id == 0:
                self.send_window += f.window_increment
            elif f.stream_id in self.windows:
                self.windows[f.stream_id] += f.window_increment
        elif isinstance(f, GoAwayFrame):
            self.goaways.append(f)
            for st in self.open_streams():
                if st.sid > f.last_stream_id:
                    st.outcome, st.why = "refused", f"above GOAWAY last-stream-id {f.last_stream_id}"
        elif isinstance(f, (HeadersFrame, ContinuationFrame)):
            if isinstance(f, HeadersFrame):
                self._cont = (f.stream_id, f.data, "END_STREAM" in f.flags)
            else:
                sid, block, end = self._cont
                self._cont = (sid, block + f.data, end)
            if "END_HEADERS" in f.flags:
                sid, block, end = self._cont
                self._cont = None
                headers = [
                    (k.decode() if isinstance(k, bytes) else k, v.decode() if isinstance(v, bytes) else v)
                    for k, v in self.dec.decode(block)
                ]
                st = self._stream(sid)
                if st is not None:
                    status = dict(headers).get(":status")
                    if st.status is None or (st.status < 200):
                        st.status = int(status) if status else st.status
                        st.headers = headers
                    if end:
                        self._end(st)
        elif isinstance(f, DataFrame):
            if f.flow_controlled_length:
                # Give back what the data used, on the connection and the stream.
                n = f.flow_controlled_length
                self._send_ctrl(
                    WindowUpdateFrame(0, window_increment=n).serialize()
                    + WindowUpdateFrame(f.stream_id, window_increment=n).serialize()
                )
            st = self._stream(f.stream_id)
            if st is not None:
                st.body += f.data
                if "END_STREAM" in f.flags:
                    self._end(st)
        elif isinstance(f, RstStreamFrame):
            st = self._stream(f.stream_id)
            if st is not None:
                # (RST_STREAM(NO_ERROR) after a complete response is fine: the
                # stream has its outcome then and is not looked up here.)
                if f.error_code == REFUSED_STREAM:
                    st.outcome, st.why = "refused", "RST_STREAM(REFUSED_STREAM)"
                else:
                    st.outcome, st.why = "failed", f"RST_STREAM({f.error_code})"

    def _stream(self, sid: int) -> Stream | None:
        st = self.streams.get(sid)
        if st is None:
            return None
        if st.outcome == "refused":
            # A refused stream must never be (half-)served afterwards.
            st.frames_after_refusal += 1
            return None
        if st.outcome is not None:
            return None
        return st

    def _end(self, st: Stream) -> None:
        st.outcome = "ok" if st.status is not None and st.status >= 200 else "failed"
        if st.outcome == "failed":
            st.why = "stream ended without a final response"

    def pump(self, until, timeout: float = 10.0, what: str = "condition"):
        """Reads until ``until()`` is true (or EOF); returns its value."""
        deadline = time.monotonic() + timeout
        while not (done := until()) and not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out waiting for {what}; GOAWAYs so far: {self._goaway_ids()}")
            try:
                self.read_some(timeout=left)
            except TimeoutError:
                continue
        return done or until()

    def wait(self, streams, timeout: float = 10.0) -> None:
        """Reads until every stream in ``streams`` has an outcome (or EOF)."""
        deadline = time.monotonic() + timeout
        while any(s.outcome is None for s in streams) and not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"streams still open: {[s.sid for s in streams if s.outcome is None]}")
            try:
                self.read_some(timeout=left)
            except TimeoutError:
                continue

    def read_to_eof(self, timeout: float = 15.0, why: str | None = None) -> None:
        deadline = time.monotonic() + timeout
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                if why:
                    self._closed(why)
                    return
                raise TimeoutError(f"no EOF; GOAWAYs so far: {self._goaway_ids()}")
            try:
                self.read_some(timeout=left)
            except TimeoutError:
                continue

    def close(self) -> None:
        self.sock.close()
