"""WebSockets over HTTP/2 (RFC 8441 extended CONNECT), with the ``h2``
package as the frame client and WebSocket frames built by hand (masked, as
a client must), over real sockets."""

from __future__ import annotations

import json
import signal
import struct

import pytest
from harness import request, skirr, wait_until
from test_http2 import H2C, RawH2, h2events
from wsraw import BINARY, CLOSE, TEXT, close_payload, frame

pytestmark = pytest.mark.timeout(60)

APP = "apps.ws_app:app"
WS2 = (*H2C, "--http2-websockets", "true")
ENABLE_CONNECT_PROTOCOL = 0x8


def server_settings(c: RawH2) -> dict:
    evs = c.pump(lambda evs: any(isinstance(e, h2events.RemoteSettingsChanged) for e in evs))
    ev = next(e for e in evs if isinstance(e, h2events.RemoteSettingsChanged))
    return {int(k): v.new_value for k, v in ev.changed_settings.items()}


def connect(c: RawH2, path: str, *, protocol: str = "websocket", extra=()) -> int:
    """Opens an extended CONNECT stream (RFC 8441 §4); its id."""
    sid = c.conn.get_next_available_stream_id()
    headers = [
        (":method", "CONNECT"),
        (":protocol", protocol),
        (":scheme", "http"),
        (":path", path),
        (":authority", "example.test"),
        ("sec-websocket-version", "13"),
        *extra,
    ]
    c.conn.send_headers(sid, headers, end_stream=False)
    c.flush()
    return sid


def response_head(c: RawH2, sid: int) -> dict:
    def got(evs):
        return any(
            (isinstance(e, (h2events.ResponseReceived, h2events.StreamReset)) and e.stream_id == sid) or e == "eof"
            for e in evs
        )

    evs = c.pump(got)
    for e in evs:
        if isinstance(e, h2events.ResponseReceived) and e.stream_id == sid:
            return {k.decode(): v.decode() for k, v in e.headers}
        if isinstance(e, h2events.StreamReset) and e.stream_id == sid:
            return {"reset": int(e.error_code)}
    return {"eof": True}


class Stream:
    """The WebSocket on one HTTP/2 stream: masked frames out as DATA,
    the server's (unmasked) frames parsed from the stream's DATA."""

    def __init__(self, c: RawH2, sid: int) -> None:
        self.c, self.sid, self.buf, self.seen = c, sid, b"", 0

    def send(self, opcode: int, payload: bytes = b"", end: bool = False, rsv: int = 0) -> None:
        data = frame(opcode, payload, rsv=rsv)
        if self.c._h2_failed:
            # The h2 package stops at the server's GOAWAY (see RawH2); the
            # stream is still open (RFC 9113 §6.8), so frame it by hand.
            from hyperframe.frame import DataFrame

            f = DataFrame(self.sid, data, flags=["END_STREAM"] if end else [])
            self.c.sock.sendall(f.serialize())
            return
        while True:
            room = min(self.c.conn.local_flow_control_window(self.sid), self.c.conn.max_outbound_frame_size)
            if room == 0:
                # Wait for the server's WINDOW_UPDATE.
                n = len(self.c.events)
                self.c.pump(lambda evs, n=n: len(evs) > n)
                continue
            chunk, data = data[:room], data[room:]
            self.c.conn.send_data(self.sid, chunk, end_stream=end and not data)
            self.c.flush()
            if not data:
                return

    def _take(self):
        b = self.buf
        if len(b) < 2:
            return None
        n, at = b[1] & 0x7F, 2
        if n == 126:
            if len(b) < 4:
                return None
            n, at = struct.unpack("!H", b[2:4])[0], 4
        elif n == 127:
            if len(b) < 10:
                return None
            n, at = struct.unpack("!Q", b[2:10])[0], 10
        if len(b) < at + n:
            return None
        self.buf = b[at + n :]
        self.last_b0 = b[0]
        return b[0] & 0x0F, b[at : at + n]

    def _absorb(self) -> None:
        # From the raw frames, which go on past a GOAWAY (see RawH2).
        from hyperframe.frame import DataFrame

        frames = self.c.frames
        for f in frames[self.seen :]:
            if isinstance(f, DataFrame) and f.stream_id == self.sid:
                self.buf += f.data
        self.seen = len(frames)

    def recv(self, timeout: float = 10.0):
        """The next server frame as (opcode, payload), or "ended"/"reset"."""
        while True:
            self._absorb()
            f = self._take()
            if f is not None:
                return f
            if self.ended():
                return "ended"

            n = len(self.c.frames)
            self.c.pump(lambda _evs, n=n: len(self.c.frames) > n or "eof" in self.c.events, timeout=timeout)

    def ended(self) -> bool:
        from hyperframe.frame import DataFrame, RstStreamFrame

        return "eof" in self.c.events or any(
            f.stream_id == self.sid
            and (isinstance(f, RstStreamFrame) or (isinstance(f, DataFrame) and "END_STREAM" in f.flags))
            for f in self.c.frames
        )


def test_enable_connect_protocol_is_sent_only_when_enabled():
    with skirr(APP, *WS2) as s:
        c = RawH2(s.port)
        assert server_settings(c).get(ENABLE_CONNECT_PROTOCOL) == 1
        c.close()
    with skirr(APP, *H2C) as s:
        c = RawH2(s.port)
        assert ENABLE_CONNECT_PROTOCOL not in server_settings(c)
        # Without the setting a :protocol is malformed (RFC 8441 §4): the
        # stream is reset, the app never runs, the connection goes on.
        sid = connect(c, "/scope")
        assert response_head(c, sid) == {"reset": 1}  # PROTOCOL_ERROR
        h, body = c.response(c.request("/"))
        assert h[":status"] == ["200"]
        c.close()


def test_websocket_scope_and_messages_over_an_extended_connect():
    with skirr(APP, *WS2) as s:
        c = RawH2(s.port)
        sid = connect(c, "/scope?x=1", extra=[("sec-websocket-protocol", "chat, json")])
        head = response_head(c, sid)
        assert head[":status"] == "200"  # RFC 8441 §5: 200, not 101
        assert head["x-accepted"] == "yes"
        assert "sec-websocket-accept" not in head and "upgrade" not in head
        ws = Stream(c, sid)
        op, payload = ws.recv()
        assert op == TEXT
        scope = json.loads(payload)
        assert scope["type"] == "websocket"
        assert scope["http_version"] == "2"
        assert scope["scheme"] == "ws"
        assert scope["path"] == "/scope" and scope["query_string"] == "x=1"
        assert scope["subprotocols"] == ["chat", "json"]
        assert ["host", "example.test"] in scope["headers"]
        assert not any(k.startswith(":") for k, _ in scope["headers"])
        assert "websocket.http.response" in scope["extensions"]
        op, payload = ws.recv()
        assert (op, payload) == (CLOSE, close_payload(1000))
        ws.send(CLOSE, close_payload(1000), end=True)
        assert ws.recv() == "ended"
        c.close()


def test_echo_beside_plain_http_streams_then_the_client_closes():
    with skirr(APP, *WS2) as s:
        c = RawH2(s.port)
        sid = connect(c, "/echo?tag=h2")
        assert response_head(c, sid)[":status"] == "200"
        ws = Stream(c, sid)
        ws.send(TEXT, "héllo".encode())
        assert ws.recv() == (TEXT, "héllo".encode())
        # HTTP streams on the same connection while the WebSocket is open.
        for _ in range(3):
            h, body = c.response(c.request("/"))
            assert (h[":status"], body) == (["200"], b"ok")
        big = bytes(range(256)) * 400  # over one DATA frame and one window
        ws.send(BINARY, big)
        assert ws.recv() == (BINARY, big)
        ws.send(CLOSE, close_payload(1000, "bye"))
        assert ws.recv() == (CLOSE, close_payload(1000, "bye"))
        got = wait_until(
            lambda: [e for e in json.loads(request(s.port, "GET", "/events").body) if e.get("tag") == "h2"],
            what="the app's disconnect",
        )
        assert got[0]["disconnect"] == 1000
        c.close()


def test_permessage_deflate_over_an_extended_connect():
    """RFC 7692 over RFC 8441: negotiated in the CONNECT's headers, then
    compressed frames both ways on the stream."""
    import zlib

    with skirr(APP, *WS2) as s:
        c = RawH2(s.port)
        sid = connect(c, "/echo", extra=[("sec-websocket-extensions", "permessage-deflate; client_max_window_bits")])
        head = response_head(c, sid)
        assert head[":status"] == "200"
        assert head["sec-websocket-extensions"] == (
            "permessage-deflate; server_no_context_takeover; client_max_window_bits=12"
        )
        ws = Stream(c, sid)
        msg = ("héllo, " * 2000).encode()
        comp = zlib.compressobj(wbits=-12)
        ws.send(TEXT, (comp.compress(msg) + comp.flush(zlib.Z_SYNC_FLUSH))[:-4], rsv=0b100)
        op, payload = ws.recv()
        assert op == TEXT and ws.last_b0 & 0x40, "RSV1: compressed"
        assert len(payload) < len(msg) // 10
        assert zlib.decompressobj(wbits=-15).decompress(payload + b"\x00\x00\xff\xff") == msg
        ws.send(CLOSE, close_payload(1000))
        assert ws.recv() == (CLOSE, close_payload(1000))
        c.close()


def test_denials_are_http_responses_on_the_stream():
    with skirr(APP, *WS2) as s:
        c = RawH2(s.port)
        sid = connect(c, "/deny")
        assert response_head(c, sid)[":status"] == "403"
        sid = connect(c, "/http-deny")
        h, body = c.response(sid)
        assert h[":status"] == ["401"] and h["x-why"] == ["token"]
        assert body == b"no entry"
        # A :protocol Skirr does not speak, and a missing version.
        sid = connect(c, "/echo", protocol="connect-udp")
        assert response_head(c, sid)[":status"] == "501"
        sid = c.conn.get_next_available_stream_id()
        c.conn.send_headers(
            sid,
            [
                (":method", "CONNECT"),
                (":protocol", "websocket"),
                (":scheme", "http"),
                (":path", "/echo"),
                (":authority", "example.test"),
            ],
        )
        c.flush()
        assert response_head(c, sid)[":status"] == "400"
        c.close()


def test_client_reset_of_the_stream_is_a_disconnect_for_the_app():
    with skirr(APP, *WS2) as s:
        c = RawH2(s.port)
        sid = connect(c, "/echo?tag=rst")
        assert response_head(c, sid)[":status"] == "200"
        c.conn.reset_stream(sid, error_code=8)  # CANCEL
        c.flush()
        got = wait_until(
            lambda: [e for e in json.loads(request(s.port, "GET", "/events").body) if e.get("tag") == "rst"],
            what="the app's disconnect",
        )
        assert got[0]["disconnect"] == 1006
        h, _ = c.response(c.request("/"))
        assert h[":status"] == ["200"]
        c.close()


def test_sigterm_sends_goaway_then_close_1001_at_the_drain_deadline():
    with skirr(APP, *WS2, "--graceful-timeout", "0.5") as s:
        c = RawH2(s.port)
        sid = connect(c, "/idle")
        assert response_head(c, sid)[":status"] == "200"
        ws = Stream(c, sid)
        s.send_signal(signal.SIGTERM)
        c.pump(lambda evs: any(isinstance(e, h2events.ConnectionTerminated) for e in evs))
        op, payload = ws.recv()
        assert (op, payload[:2]) == (CLOSE, struct.pack("!H", 1001))
        ws.send(CLOSE, close_payload(1001), end=True)
        assert s.wait(15) == 0
        c.close()


def test_under_gunicorn_with_the_environment_variable():
    from harness import gunicorn

    args = ("--http-protocols", "h2,h1", "--http2-cleartext", "prior-knowledge", "-w", "1")
    with gunicorn(APP, *args, env={"SKIRR_HTTP2_WEBSOCKETS": "1"}) as g:
        c = RawH2(g.port)
        assert server_settings(c).get(ENABLE_CONNECT_PROTOCOL) == 1
        sid = connect(c, "/echo")
        assert response_head(c, sid)[":status"] == "200"
        ws = Stream(c, sid)
        ws.send(TEXT, b"over h2")
        assert ws.recv() == (TEXT, b"over h2")
        ws.send(CLOSE, close_payload(1000), end=True)
        assert ws.recv() == (CLOSE, close_payload(1000))
        c.close()
