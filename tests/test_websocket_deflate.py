"""permessage-deflate (RFC 7692): negotiation, compressed frames both ways,
the size limit applied while inflating, fail-fast UTF-8, and real clients
(websockets, wsproto) on HTTP/1.1; HTTP/2 (RFC 8441) in
test_http2_websocket.py, Chromium in test_browser.py."""

from __future__ import annotations

import json
import socket
import struct
import zlib

import pytest
from harness import TIMEOUT, gunicorn, request, rss_kib, skirr
from wsraw import BINARY, CLOSE, CONT, PING, PONG, TEXT, WsConn, close_payload, frame

OFFER = "Sec-WebSocket-Extensions: {}\r\n"


def ext_header(resp) -> list[str]:
    return [v for k, v in resp.headers if k.lower() == "sec-websocket-extensions"]


def deflate(data: bytes, wbits: int = 15) -> bytes:
    c = zlib.compressobj(wbits=-wbits)
    out = c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)
    assert out.endswith(b"\x00\x00\xff\xff")
    return out[:-4]


def inflate(data: bytes) -> bytes:
    return zlib.decompressobj(wbits=-15).decompress(data + b"\x00\x00\xff\xff")


@pytest.fixture(scope="module")
def server():
    with skirr("apps.ws_app:app", "--no-access-log", "--ws-deflate-min-size", "16") as s:
        yield s


SNCT = "permessage-deflate; server_no_context_takeover"


@pytest.mark.parametrize(
    "offer, answer",
    [
        # Skirr always declares server_no_context_takeover (RFC 7692
        # §7.1.1.1): its compressor is shared per thread.
        ("permessage-deflate", SNCT),
        # What browsers send: the server picks the client's window.
        ("permessage-deflate; client_max_window_bits", SNCT + "; client_max_window_bits=12"),
        (
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover",
            SNCT + "; client_no_context_takeover",
        ),
        (
            'permessage-deflate; server_max_window_bits="10"; client_max_window_bits=9',
            SNCT + "; server_max_window_bits=10; client_max_window_bits=9",
        ),
        # Several offers: the first acceptable one.
        (
            "x-webkit-deflate-frame, permessage-deflate; bogus, permessage-deflate; server_max_window_bits=9",
            SNCT + "; server_max_window_bits=9",
        ),
        # Declined offers: the handshake succeeds without the extension.
        ("permessage-deflate; server_max_window_bits", None),
        ("permessage-deflate; client_max_window_bits=16", None),
        ("permessage-deflate; server_no_context_takeover; server_no_context_takeover", None),
        ("permessage-deflate; unknown=1", None),
        ('permessage-deflate; x="', None),
        ("deflate-frame", None),
    ],
)
def test_negotiation(server, offer, answer):
    with WsConn(server.port) as c:
        resp = c.handshake("/echo", extra=OFFER.format(offer))
        assert resp.status == 101
        assert ext_header(resp) == ([answer] if answer else [])
        # Either way the connection works; compressed only if agreed.
        c.send(frame(TEXT, b"x" * 100))
        op, fin, payload = c.read_frame()
        assert op == TEXT and fin
        assert payload == b"x" * 100 if answer is None else inflate(payload) == b"x" * 100


def test_compressed_frames_both_ways_with_fragments_and_context(server):
    with WsConn(server.port) as c:
        c.handshake("/echo", extra=OFFER.format("permessage-deflate"))
        comp = zlib.compressobj(wbits=-15)
        dec = zlib.decompressobj(wbits=-15)
        msg = json.dumps({"user": "ada", "text": "hello " * 20}).encode()
        sizes = []
        for _ in range(3):
            z = comp.compress(msg) + comp.flush(zlib.Z_SYNC_FLUSH)
            z = z[:-4]
            # First frame carries RSV1, continuations do not; a ping between.
            c.send(frame(TEXT, z[:5], fin=False, rsv=0b100))
            c.send(frame(PING, b"p"))
            c.send(frame(CONT, z[5:]))
            assert c.read_frame() == (PONG, True, b"p")
            b0, b1 = c.read_exact(2)
            assert b0 == 0x80 | 0x40 | TEXT, hex(b0)  # FIN + RSV1: compressed
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", c.read_exact(2))[0]
            payload = c.read_exact(n)
            assert dec.decompress(payload + b"\x00\x00\xff\xff") == msg
            sizes.append(n)
        # The client's context is kept (its repeats inflate right); the
        # server's is not (server_no_context_takeover): same size each time.
        assert len(set(sizes)) == 1 and sizes[0] < len(msg)
        # Below ws_deflate_min_size (16 here): plain.
        c.send(frame(BINARY, deflate(b"tiny"), rsv=0b100))
        assert c.read_frame() == (BINARY, True, b"tiny")
        c.send(frame(CLOSE, close_payload(1000)))
        assert c.read_close() == (1000, "")


@pytest.mark.parametrize("offer", ["permessage-deflate", "permessage-deflate; client_no_context_takeover"])
def test_messages_ending_in_a_final_block_are_read(server, offer):
    # RFC 7692 §7.2.3.4: a sender without sync flush ends each message with
    # a final DEFLATE block (zlib's Z_FINISH); the RFC's example adds a 00
    # octet. The next message, sync-flushed or not, starts a new stream.
    rfc_hello = bytes.fromhex("f348cdc9c90700")

    def finished(data: bytes) -> bytes:
        c = zlib.compressobj(wbits=-15)
        return c.compress(data) + c.flush(zlib.Z_FINISH)

    long_text = b"the quick brown fox " * 10
    sent = [
        (rfc_hello + b"\x00", b"Hello"),
        (rfc_hello, b"Hello"),
        (finished(long_text), long_text),
        (deflate(long_text), long_text),
        (finished(long_text) + b"\x00", long_text),
    ]
    with WsConn(server.port) as c:
        c.handshake("/echo", extra=OFFER.format(offer))
        for payload, text in sent:
            c.send(frame(TEXT, payload, rsv=0b100))
            opcode, fin, got = c.read_frame()
            if len(text) >= 16:  # ws_deflate_min_size: echoed compressed
                got = inflate(got)
            assert (opcode, fin, got) == (TEXT, True, text), payload.hex()
        c.send(frame(CLOSE, close_payload(1000)))
        assert c.read_close() == (1000, "")


@pytest.mark.parametrize(
    "frames",
    [
        # Data after a final block that is not DEFLATE.
        lambda: frame(BINARY, bytes.fromhex("f348cdc9c90700") + b"\xff\xff", rsv=0b100),
        # RSV1 on a continuation frame.
        lambda: frame(TEXT, deflate(b"ab"), fin=False, rsv=0b100) + frame(CONT, b"", rsv=0b100),
        # RSV1 on a control frame.
        lambda: frame(PING, b"", rsv=0b100),
        # Not DEFLATE data.
        lambda: frame(BINARY, b"\xff\xff\xff\xff", rsv=0b100),
    ],
)
def test_compression_protocol_errors_close_1002(server, frames):
    with WsConn(server.port) as c:
        c.handshake("/echo", extra=OFFER.format("permessage-deflate"))
        c.send(frames())
        assert c.read_close()[0] == 1002


def test_rsv1_without_negotiation_is_1002(server):
    with WsConn(server.port) as c:
        resp = c.handshake("/echo")
        assert ext_header(resp) == []
        c.send(frame(BINARY, deflate(b"hello"), rsv=0b100))
        assert c.read_close()[0] == 1002


def test_inflation_bomb_closes_1009_within_the_limit():
    """1 GiB of zeros in a ~1 MiB frame: the limit (4 MiB) holds while
    inflating; the server's memory grows by far less than the message."""
    comp = zlib.compressobj(level=9, wbits=-15)
    chunk = bytes(1 << 20)
    z = b"".join(comp.compress(chunk) for _ in range(1024)) + comp.flush(zlib.Z_SYNC_FLUSH)
    z = z[:-4]
    assert len(z) < 2 << 20
    with skirr("apps.ws_app:app", "--no-access-log", "--ws-max-message-size", str(4 << 20)) as s:
        before = rss_kib(s.proc.pid)
        with WsConn(s.port, timeout=30) as c:
            c.handshake("/echo", extra=OFFER.format("permessage-deflate"))
            c.send(frame(BINARY, z, rsv=0b100))
            assert c.read_close()[0] == 1009
        grown_mib = (rss_kib(s.proc.pid) - before) / 1024
        assert grown_mib < 64, grown_mib


def test_fragmented_text_with_invalid_utf8_fails_fast(server):
    """Autobahn 6.4.3: the message turns invalid inside a frame that has
    not fully arrived; the close comes at once (not once the frame ends)."""
    with WsConn(server.port) as c:
        c.handshake("/echo")
        c.send(frame(TEXT, "κόσμε".encode(), fin=False))
        second = frame(CONT, b"\xf4\x90\x80\x80" + b"a" * 100)
        # Header (2 + 4 mask bytes) and the first two payload bytes only.
        c.send(second[:8])
        assert c.read_close()[0] == 1007


def test_compressed_text_with_invalid_utf8_is_1007(server):
    with WsConn(server.port) as c:
        c.handshake("/echo", extra=OFFER.format("permessage-deflate"))
        c.send(frame(TEXT, deflate(b"ok \xff\xfe"), rsv=0b100))
        assert c.read_close()[0] == 1007


def test_app_extension_header_is_sent_after_skirrs(server):
    """As uvicorn: Skirr negotiates; an app's own Sec-WebSocket-Extensions
    field in websocket.accept is passed on after Skirr's."""
    with WsConn(server.port) as c:
        resp = c.handshake("/echo?ext=x-app", extra=OFFER.format("permessage-deflate"))
        assert ext_header(resp) == [SNCT, "x-app"]
    with WsConn(server.port) as c:
        resp = c.handshake("/echo?ext=x-app")
        assert ext_header(resp) == ["x-app"]


def test_context_takeover_option_keeps_the_servers_context():
    with skirr("apps.ws_app:app", "--no-access-log", "--ws-deflate-context-takeover", "1") as s:
        with WsConn(s.port) as c:
            resp = c.handshake("/echo", extra=OFFER.format("permessage-deflate"))
            assert ext_header(resp) == ["permessage-deflate"]
            dec = zlib.decompressobj(wbits=-15)
            msg = json.dumps({"user": "ada", "text": "hello " * 20}).encode()
            sizes = []
            for _ in range(3):
                c.send(frame(TEXT, msg))
                op, _, p = c.read_frame()
                assert op == TEXT and dec.decompress(p + b"\x00\x00\xff\xff") == msg
                sizes.append(len(p))
            # Repeats refer back to the first message.
            assert sizes[1] < sizes[0] and sizes[2] < sizes[0], sizes
        with WsConn(s.port) as c:
            # A client that asks for server_no_context_takeover gets it.
            resp = c.handshake("/echo", extra=OFFER.format("permessage-deflate; server_no_context_takeover"))
            assert ext_header(resp) == [SNCT]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_option_off_declines(how):
    if how == "env":
        args, env = (), {"SKIRR_WS_PER_MESSAGE_DEFLATE": "0"}
    else:
        args, env = ("--ws-per-message-deflate", "0"), None
    with skirr("apps.ws_app:app", "--no-access-log", *args, env=env) as s:
        with WsConn(s.port) as c:
            resp = c.handshake("/echo", extra=OFFER.format("permessage-deflate"))
            assert resp.status == 101 and ext_header(resp) == []
            c.send(frame(BINARY, deflate(b"hello"), rsv=0b100))
            assert c.read_close()[0] == 1002


SIZES = [1, 100, 4096, 70_000, 1 << 20]


def payload(n: int) -> bytes:
    # Compressible but not trivial.
    return (b"skirr %d " * (n // 6 + 1) % tuple(range(n // 6 + 1)))[:n]


def test_websockets_client_round_trips(server):
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{server.port}/echo", compression="deflate", max_size=None) as ws:
        assert ws.response.headers["Sec-WebSocket-Extensions"].startswith("permessage-deflate")
        for n in SIZES:
            data = payload(n)
            ws.send(data)
            assert ws.recv(timeout=TIMEOUT) == data
            ws.send(data.decode())
            assert ws.recv(timeout=TIMEOUT) == data.decode()


def test_wsproto_client_round_trips(server):
    wsproto = pytest.importorskip("wsproto")
    from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Request, TextMessage
    from wsproto.extensions import PerMessageDeflate

    ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
    with sock:
        sock.sendall(ws.send(Request(host="x", target="/echo", extensions=[PerMessageDeflate()])))

        def events():
            while True:
                yield from ws.events()
                data = sock.recv(65536)
                assert data, "server closed"
                ws.receive_data(data)

        it = events()
        accepted = next(it)
        assert isinstance(accepted, AcceptConnection)
        assert [type(e).__name__ for e in accepted.extensions] == ["PerMessageDeflate"]
        for n in SIZES:
            data = payload(n)
            for msg, kind in ((data, BytesMessage), (data.decode(), TextMessage)):
                sock.sendall(ws.send(kind(data=msg)))
                got = type(msg)()
                while True:
                    e = next(it)
                    assert isinstance(e, kind)
                    got += e.data
                    if e.message_finished:
                        break
                assert got == msg
        sock.sendall(ws.send(CloseConnection(code=1000)))
        assert isinstance(next(it), CloseConnection)


def test_memory_per_compressed_connection():
    """RSS per connection with permessage-deflate agreed: idle, then after
    each side compressed a 2 KiB message (the client's decompression state
    then exists). Printed for the README; bounded well below uvicorn's
    ~316 KiB."""
    n = 200
    msg = json.dumps([{"id": i, "name": f"user{i}", "ok": True} for i in range(60)]).encode()[:2048]
    z = deflate(msg, wbits=12)
    with skirr("apps.ws_app:app", "--no-access-log", "--ws-ping-interval", "0") as s:
        request(s.port, "/")
        conns = []
        try:
            base = rss_kib(s.proc.pid)
            for _ in range(n):
                c = WsConn(s.port)
                c.__enter__()
                conns.append(c)
                # As browsers offer: the client's window is Skirr's choice (12 bits).
                resp = c.handshake("/echo", extra=OFFER.format("permessage-deflate; client_max_window_bits"))
                assert ext_header(resp) == [SNCT + "; client_max_window_bits=12"]
            idle = (rss_kib(s.proc.pid) - base) / n
            for c in conns:
                c.send(frame(BINARY, z, rsv=0b100))
            for c in conns:
                op, _, p = c.read_frame()
                assert op == BINARY and inflate(p) == msg
            active = (rss_kib(s.proc.pid) - base) / n
            print(f"\nper compressed connection: idle {idle:.1f} KiB, after a message each way {active:.1f} KiB")
            assert active < 100, active
        finally:
            for c in conns:
                c.__exit__(None, None, None)


def test_under_gunicorn_with_settings(tmp_path):
    conf = tmp_path / "gconf.py"
    conf.write_text("skirr_ws_deflate_window_bits = 10\n")
    with gunicorn("apps.ws_app:app", "-c", str(conf)) as s:
        with WsConn(s.port) as c:
            resp = c.handshake("/echo", extra=OFFER.format("permessage-deflate; client_max_window_bits"))
            assert ext_header(resp) == [SNCT + "; client_max_window_bits=10"]
            c.send(frame(TEXT, deflate(b"y" * 500, wbits=10), rsv=0b100))
            op, _, p = c.read_frame()
            assert op == TEXT and inflate(p) == b"y" * 500
