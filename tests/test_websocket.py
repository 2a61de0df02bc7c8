"""WebSockets: handshake decisions, the ASGI events, RFC 6455 protocol rules
(hand-made frames on raw sockets), backpressure, pings and shutdown."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time

import pytest
import websockets
from harness import RawConn, request, rss_kib, skirr, wait_until
from wsraw import BINARY, CLOSE, CONT, PING, PONG, TEXT, WsConn, close_payload, frame

APP = "apps.ws_app:app"


@pytest.fixture(scope="module")
def server():
    with skirr(APP, "--no-access-log", "--ws-max-message-size", "100000") as s:
        yield s


def events(server):
    return [e for e in json.loads(request(server.port, "GET", "/events").body) if isinstance(e, dict)]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


# ----------------------------------------------------------------- handshake


def test_accept_with_subprotocol_from_repeated_headers_and_lists(server):
    with WsConn(server.port) as c:
        head = c.handshake("/echo?pick=first", protocols=["  chat , superchat", "v2"])
        assert head.status == 101
        assert head.header("sec-websocket-protocol") == "chat"
        assert head.header("x-accepted") == "yes"
        assert head.header("upgrade").lower() == "websocket"


def test_scope_of_a_websocket(server):
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/scope?x=1", subprotocols=["a", "b"]) as ws:
            return json.loads(await ws.recv())

    s = run(go())
    assert s["type"] == "websocket"
    assert s["asgi"] == {"version": "3.0", "spec_version": "2.5"}
    assert s["scheme"] == "ws" and s["http_version"] == "1.1"
    assert s["path"] == "/scope" and s["raw_path"] == "/scope" and s["query_string"] == "x=1"
    assert s["root_path"] == ""
    assert s["subprotocols"] == ["a", "b"]
    assert s["client"][0] == "127.0.0.1" and s["server"] == ["127.0.0.1", server.port]
    assert "websocket.http.response" in s["extensions"]
    assert any(k == "sec-websocket-key" for k, _ in s["headers"])


def test_nothing_is_sent_before_the_app_decides(server):
    with WsConn(server.port) as c:
        key = "dGhlIHNhbXBsZSBub25jZQ=="
        c.send(
            f"GET /leave-before-accept HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        assert not c.is_closed(timeout=0.3)
        assert c.buf == b"", "no response may be written before the app's decision"


def test_close_before_accept_is_403(server):
    with WsConn(server.port) as c:
        assert c.handshake("/deny").status == 403


def test_http_response_extension(server):
    with WsConn(server.port) as c:
        head = c.handshake("/http-deny")
        assert head.status == 401
        assert head.header("x-why") == "token"
        assert c.read_exact(int(head.header("content-length"))) == b"no entry"


def test_exception_before_accept_is_500_and_logged(server):
    with WsConn(server.port) as c:
        assert c.handshake("/error-before-accept").status == 500
    wait_until(lambda: "ws boom before accept" in server.logs(), what="traceback")


def test_disconnect_is_delivered_when_the_client_leaves_before_accept(server):
    with WsConn(server.port) as c:
        c.send(
            b"GET /leave-before-accept HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        time.sleep(0.1)
    got = wait_until(lambda: [e for e in events(server) if "before_accept" in e], what="event")
    assert got[0]["before_accept"] == "websocket.disconnect" and got[0]["code"] == 1006


def test_bad_handshakes_are_refused_without_the_app(server):
    with RawConn(server.port) as c:
        c.send(
            b"GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n"
        )
        r = c.read_response()
        assert r.status == 426 and r.header("sec-websocket-version") == "13"
    with RawConn(server.port) as c:
        c.send(b"GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        assert c.read_response().status == 400
    with RawConn(server.port) as c:  # two keys (RFC 6455 §11.3.1: at most one)
        c.send(
            b"GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Key: AQIDBAUGBwgJCgsMDQ4PEA==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n"
        )
        assert c.read_response().status == 400


# ------------------------------------------------------------------ messages


def test_text_and_bytes_echo_with_a_real_client(server):
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/echo") as ws:
            await ws.send("héllo")
            t = await ws.recv()
            await ws.send(b"\x00\xff")
            b = await ws.recv()
            return t, b

    assert run(go()) == ("héllo", b"\x00\xff")


def test_fragmented_message_with_a_ping_between_fragments(server):
    with WsConn(server.port) as c:
        assert c.handshake().status == 101
        c.send(frame(TEXT, b"frag", fin=False))
        c.send(frame(PING, b"in-between"))
        c.send(frame(CONT, b"ment", fin=False))
        c.send(frame(CONT, b"ed"))
        frames = [c.read_frame(), c.read_frame()]
        assert (PONG, True, b"in-between") in frames
        assert (TEXT, True, b"fragmented") in frames


def test_ping_is_answered_with_the_same_payload(server):
    with WsConn(server.port) as c:
        c.handshake()
        c.send(frame(PING, b"are you there"))
        assert c.read_frame() == (PONG, True, b"are you there")


def test_close_code_and_reason_from_the_client_reach_the_app(server):
    with WsConn(server.port) as c:
        c.handshake("/echo?tag=c1")
        c.send(frame(CLOSE, close_payload(4001, "bye now")))
        assert c.read_close() == (4001, "bye now")
        assert c.is_closed()
    got = wait_until(lambda: [e for e in events(server) if e.get("tag") == "c1"], what="disconnect")
    assert got[0]["disconnect"] == 4001 and got[0]["reason"] == "bye now"


def test_close_without_code_is_1005_to_the_app(server):
    with WsConn(server.port) as c:
        c.handshake("/echo?tag=c2")
        c.send(frame(CLOSE))
        c.read_close()
    got = wait_until(lambda: [e for e in events(server) if e.get("tag") == "c2"], what="disconnect")
    assert got[0]["disconnect"] == 1005


def test_abnormal_drop_is_1006_to_the_app(server):
    with WsConn(server.port) as c:
        c.handshake("/echo?tag=c3")
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    got = wait_until(lambda: [e for e in events(server) if e.get("tag") == "c3"], what="disconnect")
    assert got[0]["disconnect"] == 1006


def test_a_half_closed_client_still_gets_the_reply_to_its_message(server):
    # A message, then the TCP sending side shut down with no close frame:
    # the app's reply still goes out (as uvicorn's does), then the
    # connection ends and the app sees 1006.
    with WsConn(server.port) as c:
        assert c.handshake("/echo?tag=halfws").status == 101
        c.send(frame(TEXT, b"still there?"))
        c.sock.shutdown(socket.SHUT_WR)
        assert c.read_frame() == (TEXT, True, b"still there?")
        assert c.read_to_eof() == b""
    got = wait_until(lambda: [e for e in events(server) if e.get("tag") == "halfws"], what="disconnect")
    assert got[0]["disconnect"] == 1006


def test_app_close_code_and_reason_reach_the_client_and_send_after_close_raises(server):
    with WsConn(server.port) as c:
        c.handshake("/close-with?code=4002&reason=done")
        assert c.read_close() == (4002, "done")
        c.send(frame(CLOSE, close_payload(4002, "done")))
        assert c.is_closed()
    got = wait_until(
        lambda: (lambda e: e if len(e) >= 2 else None)(
            [e for e in events(server) if "after_close" in e or "send_after_close" in e]
        ),
        what="events",
    )
    kinds = {k: v for e in got for k, v in e.items()}
    assert kinds["after_close"] == "websocket.disconnect" and kinds["code"] == 4002
    assert kinds["send_after_close"] in ("ClientDisconnected", "RuntimeError")


def test_invalid_send_messages_raise_clear_errors(server):
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/invalid") as ws:
            return [await ws.recv(), await ws.recv()]

    a, b = run(go())
    assert a.startswith("RuntimeError:") and "exactly one of 'bytes' or 'text'" in a
    assert b.startswith("TypeError:") and "'text' must be a str" in b


def test_send_keys_equal_to_the_names_are_read_as_the_names(server):
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/keys-built") as ws:
            return [await ws.recv(), await ws.recv(), await ws.recv()]

    assert run(go()) == ["a", b"b", "c"]


def test_exception_after_accept_closes_with_1011(server):
    with WsConn(server.port) as c:
        c.handshake("/error-after-accept")
        assert c.read_close()[0] == 1011


def test_two_concurrent_receivers_take_turns_and_both_see_the_disconnect(server):
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/two-receivers?tag=r1") as ws:
            out = []
            for i in range(10):
                await ws.send(f"m{i}")
                out.append(await ws.recv())
            await ws.close(4001, "bye")
            return out

    seq = [o.split(":") for o in run(go())]
    assert [int(n) for n, _, _ in seq] == list(range(1, 11))
    assert [text for _, _, text in seq] == [f"m{i}" for i in range(10)]
    # Each message goes to the receive() that has waited longest, so they
    # alternate (from the second message on: the first may arrive before
    # both receivers wait).
    tags = [tag for _, tag, _ in seq]
    assert all(tags[i] != tags[i + 1] for i in range(1, 9)), tags
    done = wait_until(
        lambda: (lambda e: e if len(e) == 2 else None)(
            [e for e in events(server) if e.get("tag") == "r1" and "receiver_done" in e]
        ),
        what="both receivers' disconnects",
    )
    assert {e["receiver_done"] for e in done} == {"a", "b"}
    assert all(e["code"] == 4001 and e["reason"] == "bye" for e in done)


def test_two_concurrent_receivers_under_a_burst_get_every_message_once_in_order(server):
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/two-receivers?tag=r2") as ws:
            for i in range(50):
                await ws.send(f"m{i}")
            return [await ws.recv() for _ in range(50)]

    seq = [o.split(":") for o in run(go())]
    assert sorted(int(text[1:]) for _, _, text in seq) == list(range(50))
    for tag in ("a", "b"):
        mine = [int(text[1:]) for _, t, text in seq if t == tag]
        assert mine == sorted(mine), f"receiver {tag} got messages out of order: {mine}"
    wait_until(
        lambda: len([e for e in events(server) if e.get("tag") == "r2" and "receiver_done" in e]) == 2,
        what="both receivers' disconnects",
    )


def test_a_cancelled_receive_loses_no_message(server):
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/receive-timeouts") as ws:
            out = []
            for i in range(5):
                await asyncio.sleep(0.05)  # several receive() calls time out meanwhile
                await ws.send(f"t{i}")
                out.append(await ws.recv())
            return out

    assert run(go()) == [f"t{i}" for i in range(5)]


# ------------------------------------------------------------ protocol rules


@pytest.mark.parametrize(
    "bad,code",
    [
        (frame(TEXT, b"\xff\xfe"), 1007),  # invalid UTF-8
        (frame(TEXT, b"unmasked", mask=False), 1002),
        (frame(TEXT, b"x", rsv=4), 1002),  # reserved bit
        (frame(0x3, b"x"), 1002),  # reserved data opcode
        (frame(0xB, b"x"), 1002),  # reserved control opcode
        (frame(PING, b"p" * 126), 1002),  # control frame over 125 bytes
        (frame(PING, b"p", fin=False), 1002),  # fragmented control frame
        (frame(CONT, b"nothing to continue"), 1002),
        (frame(CLOSE, b"\x03"), 1002),  # close payload of one byte
        (frame(CLOSE, close_payload(1005)), 1002),  # a code that may not be sent
        (frame(BINARY, b"b" * 100_001), 1009),  # above --ws-max-message-size
    ],
)
def test_protocol_violations_close_with_the_right_code(server, bad, code):
    with WsConn(server.port) as c:
        assert c.handshake().status == 101
        c.send(bad)
        assert c.read_close()[0] == code
        assert c.is_closed(timeout=5)


def test_messages_before_a_bad_frame_are_answered_first(server):
    with WsConn(server.port) as c:
        c.handshake()
        c.send(frame(TEXT, b"first") + frame(TEXT, b"x", rsv=2))
        assert c.read_frame() == (TEXT, True, b"first")
        assert c.read_close()[0] == 1002


# -------------------------------------------------------- flow and liveness


def test_server_pings_and_closes_a_dead_peer():
    with skirr(APP, "--ws-ping-interval", "0.3", "--ws-ping-timeout", "0.3") as s:
        with WsConn(s.port) as c:
            c.handshake()
            op, _, _ = c.read_frame()
            assert op == PING, "an idle socket is pinged"
            # Never answer: the server gives up with 1011.
            code, reason = c.read_close()
            assert code == 1011 and "ping timeout" in reason


def test_answered_pings_keep_the_socket_open():
    # Each pong may take the client up to 1 s on a loaded machine (0.2 s
    # did not always do); ten pings 0.2 s apart outlast that timeout, so a
    # server that ignored the pongs would close before the loop ends.
    with skirr(APP, "--ws-ping-interval", "0.2", "--ws-ping-timeout", "1") as s:
        with WsConn(s.port) as c:
            c.handshake()
            for _ in range(10):
                op, _, payload = c.read_frame()
                assert op == PING
                c.send(frame(PONG, payload))
            c.send(frame(TEXT, b"still here"))
            assert c.read_frame() == (TEXT, True, b"still here")


def test_slow_app_makes_the_server_stop_reading(server):
    with WsConn(server.port, timeout=10) as c:
        c.handshake("/slow-reader?secs=4")
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 * 1024)
        c.sock.setblocking(False)
        sent, msg = 0, frame(BINARY, b"s" * 60_000)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            try:
                sent += c.sock.send(msg)
            except BlockingIOError:
                time.sleep(0.01)
        # The app reads nothing; the server queues at most ws_max_queue (32)
        # messages plus socket buffers before it stops reading.
        assert sent < 32 * 60_000 + 8 * 1024 * 1024, f"server accepted {sent} bytes"


def test_slow_client_makes_the_apps_send_wait():
    with skirr(APP, "--no-access-log") as s:
        base = rss_kib(s.proc.pid)
        with WsConn(s.port, timeout=10) as c:
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
            c.handshake("/flood?n=2000&size=65536")  # 128 MiB if it were all buffered
            time.sleep(1.0)
            grown = rss_kib(s.proc.pid) - base
            assert grown < 40 * 1024, f"RSS grew {grown / 1024:.1f} MiB: send() must wait for the client"
            got = 0
            while got < 200 * 65536:
                got += len(c.read_frame()[2])


def test_two_tasks_sending_to_one_slow_client_both_finish(server):
    with WsConn(server.port, timeout=20) as c:
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
        c.handshake("/two-senders")
        time.sleep(0.5)  # both senders block on the full queue meanwhile
        n = 0
        while True:
            op, _, _ = c.read_frame()
            if op == CLOSE:
                break
            n += 1
        assert n == 200
    done = wait_until(
        lambda: (lambda e: e if len(e) == 2 else None)([e for e in events(server) if "sender_done" in e]),
        what="both senders",
    )
    assert {e["sender_done"] for e in done} == {"a", "b"}


def test_thousand_idle_websockets_on_one_worker():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    n = 1000
    with skirr(APP, "--no-access-log", "--log-level", "warning") as s:
        request(s.port)
        base = rss_kib(s.proc.pid)
        conns = []
        try:
            for _ in range(n):
                c = WsConn(s.port)
                c.send(
                    b"GET /idle HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
                )
                conns.append(c)
            for c in conns:
                assert c.read_head().status == 101
            per_conn = (rss_kib(s.proc.pid) - base) / n
            print(f"\n{n} idle WebSockets: {per_conn:.1f} KiB RSS each")
            assert per_conn < 64, f"{per_conn:.1f} KiB per idle WebSocket"
            c = conns[-1]
            c.send(frame(TEXT, b"alive?"))
            c.send(frame(CLOSE, close_payload(1000)))
        finally:
            for c in conns:
                c.close()
        assert request(s.port).status == 200


def _client_with_small_window(port: int) -> WsConn:
    """A client whose receive window is small (set before connecting), so a
    client that stops reading backs up into the server quickly."""
    c = WsConn.__new__(WsConn)
    c.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
    c.sock.settimeout(10)
    c.sock.connect(("127.0.0.1", port))
    c.buf = b""
    return c


def _sent(server) -> dict:
    return json.loads(request(server.port, "GET", "/sent").body)


def test_send_to_a_client_that_stops_reading_waits_after_a_bounded_amount():
    with skirr(APP, "--no-access-log") as s:
        request(s.port)
        base = rss_kib(s.proc.pid)
        with _client_with_small_window(s.port) as c:
            assert c.handshake("/count-sends?size=1048576&tag=big").status == 101
            # The app sends 1 MiB messages in a loop and never stops by itself.
            wait_until(lambda: _sent(s).get("big", 0) >= 3, what="first sends")
            time.sleep(1.0)
            n = _sent(s)["big"]
            # send_buffer (256 KiB) queued + one message in tungstenite +
            # what the kernel buffers: a handful of 1 MiB messages, not
            # ws_max_queue (32) of them.
            assert n <= 12, f"{n} send() calls of 1 MiB completed for a client that reads nothing"
            grown = rss_kib(s.proc.pid) - base
            assert grown < 16 * 1024, f"RSS grew {grown / 1024:.1f} MiB"
            # Other connections are served meanwhile.
            assert request(s.port).status == 200

            async def echo():
                async with websockets.connect(f"ws://127.0.0.1:{s.port}/echo") as ws:
                    await ws.send("still served")
                    return await ws.recv()

            assert run(echo()) == "still served"
            time.sleep(0.3)
            assert _sent(s)["big"] == n, "send() kept completing while nothing was read"
            # Reading resumes the sender, and every message arrives whole.
            for _ in range(n + 2):
                op, fin, payload = c.read_frame()
                assert (op, fin, len(payload)) == (BINARY, True, 1048576)
            wait_until(lambda: _sent(s)["big"] > n, what="send() resuming")


def test_many_tasks_sending_to_a_stuck_client_are_held_back_without_copies():
    with skirr(APP, "--no-access-log") as s:
        request(s.port)
        base = rss_kib(s.proc.pid)
        with _client_with_small_window(s.port) as c:
            # 1000 tasks each send the same 64 KiB str: 64 MiB if the server
            # copied and queued them all.
            assert c.handshake("/many-senders?n=1000&size=65536&tag=many").status == 101
            wait_until(lambda: _sent(s).get("many", 0) > 0, what="first sends")
            time.sleep(1.0)
            n = _sent(s)["many"]
            assert n < 200, f"{n} of 1000 concurrent send() calls completed for a client that reads nothing"
            grown = rss_kib(s.proc.pid) - base
            assert grown < 24 * 1024, f"RSS grew {grown / 1024:.1f} MiB"
            assert request(s.port).status == 200
            got = 0
            while got < 1000:
                op, _, payload = c.read_frame()
                assert op == TEXT and len(payload) == 65536
                got += 1
        assert _sent(s)["many"] == 1000


def _flood(c: WsConn, n: int = 200) -> None:
    """Sends up to n messages without blocking: the client keeps talking."""
    c.sock.setblocking(False)
    try:
        for _ in range(n):
            c.sock.send(frame(TEXT, b"x" * 1000))
    except BlockingIOError:
        pass
    finally:
        c.sock.setblocking(True)
        c.sock.settimeout(10)


def _answer_close_and_see_eof(c: WsConn, within: float, delay: float = 0.0) -> tuple[int, str]:
    """Reads to the server's close frame, answers it (after ``delay``), and
    checks the server then closes TCP cleanly (EOF, not a reset) within
    ``within`` seconds."""
    code, reason = c.read_close()
    time.sleep(delay)  # a client slow to answer
    # The server still waits for the reply: no EOF yet.
    c.sock.setblocking(False)
    try:
        early = c.sock.recv(1, socket.MSG_PEEK)
        pytest.fail(f"the server closed before the peer's close frame ({early!r})")
    except BlockingIOError:
        pass
    finally:
        c.sock.setblocking(True)
    t0 = time.monotonic()
    c.send(frame(CLOSE, close_payload(code)))
    c.sock.settimeout(within + 1)
    try:
        assert c.sock.recv(1) == b"", "nothing may follow the close frame"
    except ConnectionResetError:
        pytest.fail("the server reset the connection instead of closing it after the close handshake")
    assert time.monotonic() - t0 < within, "the server waited for its close timeout"
    return code, reason


def test_app_close_after_a_large_message_reaches_a_real_client_cleanly(server):
    async def go(code):
        url = f"ws://127.0.0.1:{server.port}/send-then-close?size=1048576&code={code}&reason=bye"
        async with websockets.connect(url, max_size=None) as ws:
            big = await ws.recv()
            with pytest.raises(websockets.ConnectionClosed) as e:
                await ws.recv()
            return big, e.value

    big, closed = run(go(1000))
    assert big == b"m" * 1048576
    assert isinstance(closed, websockets.ConnectionClosedOK)
    assert (closed.rcvd.code, closed.rcvd.reason) == (1000, "bye")
    big, closed = run(go(4002))
    assert len(big) == 1048576
    assert (closed.rcvd.code, closed.rcvd.reason) == (4002, "bye")
    assert closed.sent is not None and closed.sent.code == 4002, "the close handshake completed"


def test_app_close_while_the_client_keeps_sending_ends_without_a_reset(server):
    with WsConn(server.port) as c:
        c.handshake("/send-then-close?size=1048576&reason=bye&tag=busy")
        _flood(c)  # more than ws_max_queue messages the app never reads
        op, fin, payload = c.read_frame()
        assert (op, fin, len(payload)) == (BINARY, True, 1048576)
        assert _answer_close_and_see_eof(c, within=2) == (1000, "bye")
    got = wait_until(lambda: [e for e in events(server) if e.get("tag") == "busy"], what="app's disconnect")
    assert got[0] == {"closed_by_app": "websocket.disconnect", "code": 1000, "tag": "busy"}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGQUIT])
def test_shutdown_going_away_waits_for_the_peers_close_while_it_keeps_sending(sig):
    with skirr(APP, "--no-access-log", "--graceful-timeout", "0.3") as s:
        with WsConn(s.port) as c:
            c.handshake("/slow-reader?secs=30")  # an app that reads nothing
            _flood(c)
            time.sleep(0.2)
            s.send_signal(sig)
            code, reason = _answer_close_and_see_eof(c, within=1.5)
            assert (code, reason) == (1001, "server shutting down")
        assert s.wait(15) == 0


def test_gunicorn_shutdown_fits_the_close_handshake_inside_the_masters_deadline():
    from harness import gunicorn

    # The master kills the worker at --graceful-timeout: the 1001 and the
    # peer's reply must both happen before that.
    # 4 s (drain_grace longer): the 1001 goes out at 2 s, leaving the other
    # half for the reply (the standalone schedule, 1001 at the graceful
    # timeout, would be killed); the client's 0.5 s and the close leave a
    # loaded machine 1.5 s.
    with gunicorn(APP, "-w", "1", "--graceful-timeout", "4", env={"SKIRR_DRAIN_GRACE": "10"}) as g:
        with WsConn(g.port) as c:
            assert c.handshake("/idle").status == 101
            g.send_signal(signal.SIGTERM)
            code, _ = _answer_close_and_see_eof(c, within=1.5, delay=0.5)
            assert code == 1001
        assert g.wait(15) == 0
        assert "SIGKILL" not in g.logs()


# ------------------------------------------------------------------ shutdown


def test_sigterm_closes_websockets_with_1001_after_the_drain_deadline():
    with skirr(APP, "--graceful-timeout", "0.5") as s:
        with WsConn(s.port) as c:
            c.handshake("/idle")
            t0 = time.monotonic()
            s.send_signal(signal.SIGTERM)
            code, _ = c.read_close()
            assert code == 1001
            assert time.monotonic() - t0 >= 0.4, "WebSockets keep going until the drain deadline"
            c.send(frame(CLOSE, close_payload(1001)))
        assert s.wait(15) == 0


def test_websocket_outlives_gunicorns_timeout():
    from harness import gunicorn

    with gunicorn(APP, "-w", "1", "--timeout", "2", "--graceful-timeout", "1") as g:

        async def go():
            async with websockets.connect(f"ws://127.0.0.1:{g.port}/echo") as ws:
                for i in range(5):
                    await ws.send(f"beat {i}")
                    assert await ws.recv() == f"beat {i}"
                    await asyncio.sleep(1)
                return True

        assert run(go())
        with WsConn(g.port) as c:
            c.handshake("/idle")
            g.send_signal(signal.SIGTERM)
            assert c.read_close()[0] == 1001
        assert g.wait(15) == 0
