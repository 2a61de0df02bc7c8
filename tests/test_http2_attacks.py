"""HTTP/2 attacks over real sockets (h2c with prior knowledge): each test
sends the attack with raw frames, then checks what the server did to the
attacking connection (GOAWAY and its code, RST_STREAM, or throttling), that
other clients are still served, and that memory (and, for the DATA flood,
CPU time) stays bounded.

What does the work is mostly the h2 crate (0.4.20) under hyper: the limits
each test expects are named in its docstring."""

from __future__ import annotations

import json
import os
import socket
import ssl
import threading
import time

import pytest
from h2frames import (
    CANCEL,
    COMPRESSION_ERROR,
    ENHANCE_YOUR_CALM,
    PROTOCOL_ERROR,
    STREAM_CLOSED,
    Closed,
    Frames,
)
from harness import gunicorn, request, rss_kib, skirr, wait_until

httpx = pytest.importorskip("httpx")
hyperframe = pytest.importorskip("hyperframe.frame")
from hyperframe.frame import (  # noqa: E402
    ContinuationFrame,
    DataFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

pytestmark = pytest.mark.timeout(60)

H2C = ("--http-protocols", "h2,h1", "--http2-cleartext", "prior-knowledge")
APP = "apps.h2attack:app"
MAX_STREAM_ID = 2**31 - 1


def served(server) -> None:
    """A fresh HTTP/2 client on another connection gets its answer."""
    with httpx.Client(base_url=server.url, http1=False, http2=True, timeout=10) as c:
        r = c.get("/")
        assert r.http_version == "HTTP/2" and r.status_code == 200 and r.text == "ok"


def calls(server) -> dict:
    return json.loads(request(server.port, "GET", "/calls").body)


def events(server) -> list:
    return json.loads(request(server.port, "GET", "/events").body)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) with ``first`` in the prefix byte."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_literal_indexed(name: bytes, value: bytes) -> bytes:
    """A literal field with incremental indexing and a new name (RFC 7541
    §6.2.1): it enters the dynamic table at index 62."""
    return b"\x40" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


# :method GET, :scheme http, :path / from the static table (RFC 7541 App. A).
STATIC_GET = b"\x82\x86\x84"


def test_rapid_reset_is_cut_off_with_enhance_your_calm_and_the_app_is_not_flooded():
    """CVE-2023-44487: HEADERS then RST_STREAM at once, thousands of times.
    h2 tolerates 20 streams reset before hyper accepted them
    (max_pending_accept_reset_streams), then GOAWAY ENHANCE_YOUR_CALM; the
    app is called for a small number of them, not thousands."""
    with skirr(APP, *H2C) as s:
        pid = s.proc.pid
        rss0 = rss_kib(pid)
        with Frames(s.port) as c:
            c.pump(lambda c: any(isinstance(f, SettingsFrame) for f in c.frames), what="server SETTINGS")
            burst = b"".join(
                HeadersFrame(
                    sid, c.block(c.request_headers("/slow?secs=0.5")), flags=["END_HEADERS", "END_STREAM"]
                ).serialize()
                + RstStreamFrame(sid, error_code=CANCEL).serialize()
                for sid in range(1, 2 * 5000, 2)
            )
            try:
                c.send_raw(burst)
            except (Closed, OSError):
                pass  # the server closed mid-burst
            g = c.goaway()
            assert g.error_code == ENHANCE_YOUR_CALM
            assert g.additional_data == b"too_many_resets"
            # The GOAWAY names the last stream the server will process: far
            # below the 5,000 opened.
            assert g.last_stream_id < 2 * 1000
            c.wait_closed()
        served(s)
        n = calls(s).get("/slow", 0)
        # Streams hyper accepted before their reset arrived do reach the app
        # (and see http.disconnect); the burst is cut long before 5,000.
        assert n <= 100, f"the app was started for {n} reset streams"
        assert rss_kib(pid) - rss0 < 50_000


def test_rapid_reset_in_small_bursts_stays_under_the_limit_and_is_served():
    """A client resetting streams it opened, a few at a time (below the
    limit), is an ordinary client: nothing is cut off."""
    with skirr(APP, *H2C) as s, Frames(s.port) as c:
        for batch in range(5):
            sids = [1 + 2 * (batch * 11 + i) for i in range(10)]
            for sid in sids:
                c.get(sid, "/")
                c.send(RstStreamFrame(sid, error_code=CANCEL))
            last = sids[-1] + 2
            c.get(last, "/")
            assert c.response(last) == (200, b"ok")
        assert not any(type(f).__name__ == "GoAwayFrame" for f in c.frames)


def test_continuation_flood_is_cut_off_with_enhance_your_calm():
    """HEADERS without END_HEADERS, then CONTINUATION frames without end.
    h2 allows as many CONTINUATION frames as the header list size needs
    (max_header_list_size / max_frame_size, +25%, at least 5), then GOAWAY
    ENHANCE_YOUR_CALM; nothing reaches the app."""
    with skirr(APP, *H2C) as s:
        pid = s.proc.pid
        rss0 = rss_kib(pid)
        with Frames(s.port) as c:
            c.send(HeadersFrame(1, STATIC_GET, flags=[]))
            # Tiny frames (one field each) so the size limit never trips.
            field = b"\x00\x01a\x01b"  # a literal field, not indexed
            try:
                for _ in range(10_000):
                    c.send(ContinuationFrame(1, field, flags=[]))
            except Closed:
                pass
            g = c.goaway()
            assert g.error_code == ENHANCE_YOUR_CALM
            assert g.additional_data == b"too_many_continuations"
            c.wait_closed()
        assert calls(s).get("/", 0) == 0
        assert rss_kib(pid) - rss0 < 20_000
        served(s)


def test_continuation_flood_of_large_frames_is_cut_at_the_header_list_size():
    """Large CONTINUATION frames of one endless header value: the block is
    cut at the header list size (64 KiB): COMPRESSION_ERROR (h2: block
    "over ignorable limit") or ENHANCE_YOUR_CALM (too many frames)."""
    with skirr(APP, *H2C) as s:
        with Frames(s.port) as c:
            # A literal whose value claims 16 MiB: HPACK needs more, forever.
            c.send(HeadersFrame(1, STATIC_GET + b"\x00\x01x" + hpack_int(1 << 24, 7) + b"v" * 1000, flags=[]))
            sent = 0
            try:
                while sent < 4 << 20:
                    c.send(ContinuationFrame(1, b"v" * 16000, flags=[]))
                    sent += 16000
            except Closed:
                pass
            g = c.goaway()
            assert g.error_code in (COMPRESSION_ERROR, ENHANCE_YOUR_CALM)
            c.wait_closed()
        served(s)


def test_hpack_bomb_over_the_header_list_size_is_431_for_that_stream():
    """One 4,000-byte dynamic-table entry referenced 20 times (one byte
    each): 80 KB decoded from a 4 KB block, over the 64 KiB header list
    size. h2 answers 431 on that stream and resets it; the connection
    carries on."""
    with skirr(APP, *H2C) as s, Frames(s.port) as c:
        block = STATIC_GET + hpack_literal_indexed(b"x-bomb", b"a" * 4000) + b"\xbe" * 20
        c.send(HeadersFrame(1, block, flags=["END_HEADERS", "END_STREAM"]))
        status, _ = c.response(1)
        assert status == 431
        # The HPACK state stayed in step: the same connection is served.
        c.get(3, "/")
        assert c.response(3) == (200, b"ok")
        assert calls(s).get("/", 0) == 1


def test_hpack_bomb_far_over_the_limit_is_a_connection_error():
    """The same entry referenced 12,000 times: 48 MB decoded from 16 KB.
    Past 4 x the header list size h2 stops decoding: GOAWAY
    ENHANCE_YOUR_CALM ("header_list_way_too_large"), memory unmoved."""
    with skirr(APP, *H2C) as s:
        pid = s.proc.pid
        rss0 = rss_kib(pid)
        with Frames(s.port) as c:
            block = STATIC_GET + hpack_literal_indexed(b"x-bomb", b"a" * 4000) + b"\xbe" * 12_000
            c.send(HeadersFrame(1, block, flags=["END_HEADERS", "END_STREAM"]))
            g = c.goaway()
            assert g.error_code == ENHANCE_YOUR_CALM
            assert g.additional_data == b"header_list_way_too_large"
            c.wait_closed()
        assert rss_kib(pid) - rss0 < 20_000
        served(s)


class Flood:
    """Sends one frame over and over from a thread, in 1,000-frame chunks,
    on a connection whose client reads nothing until told to."""

    PER_CHUNK = 1000

    def __init__(self, c: Frames, frame: bytes, cap_bytes: int = 64 << 20) -> None:
        self.c = c
        self.chunk = frame * self.PER_CHUNK
        self.cap = cap_bytes // len(self.chunk)
        self.started = 0
        self.stop = threading.Event()
        self.done = threading.Event()
        self.error: OSError | None = None
        c.sock.settimeout(30)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set() and self.started < self.cap:
                self.started += 1
                self.c.sock.sendall(self.chunk)
        except OSError as e:
            self.error = e
        self.done.set()

    def stalled(self, quiet: float = 1.0, timeout: float = 20.0) -> bool:
        """Whether sending stops making progress (the server stopped
        reading) before the cap."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.done.is_set():
            before = self.started
            time.sleep(quiet)
            if self.started == before:
                self.stop.set()
                return True
        return False

    @property
    def frames(self) -> int:
        return self.started * self.PER_CHUNK


@pytest.mark.parametrize("kind", ["ping", "settings"])
def test_ping_and_settings_floods_are_throttled_by_unread_acks(kind):
    """PINGs (or SETTINGS) sent without end by a client that reads
    nothing. h2 holds at most one PING ack (and one SETTINGS ack) and reads
    no further frame until it is written, so once the socket buffers are
    full (a few MiB of acks on loopback) the server stops reading: the
    flood is throttled to the client's own reading speed and costs the
    server neither memory nor CPU meanwhile. Once the client reads, every
    frame is acknowledged and the connection still serves requests."""
    if kind == "ping":
        frame, ftype = PingFrame(0, b"12345678").serialize(), 0x6
    else:
        frame, ftype = SettingsFrame(0, settings={SettingsFrame.HEADER_TABLE_SIZE: 4096}).serialize(), 0x4
    # A connection with no stream open is closed after keepalive_timeout,
    # flood or not (see the next test): long enough here.
    with skirr(APP, *H2C, "--keepalive-timeout", "30") as s:
        pid = s.proc.pid
        rss0 = rss_kib(pid)
        with Frames(s.port, rcvbuf=4096) as c:
            flood = Flood(c, frame)
            assert flood.stalled(), f"the server read {flood.frames} frames without its acks being read"
            assert rss_kib(pid) - rss0 < 30_000
            served(s)
            cpu0 = cpu_seconds(pid)
            time.sleep(0.5)  # a stalled flood costs no CPU meanwhile
            assert cpu_seconds(pid) - cpu0 < 0.2
            # Reading resumes the flood; every frame gets its ack (SETTINGS:
            # +1 for the client's first one).
            c.count_raw(ftype, 0x1, flood.frames + (kind == "settings"))
            assert flood.done.wait(10) and flood.error is None
            c.get(1, "/")
            assert c.response(1) == (200, b"ok")


def test_ping_flood_without_a_stream_is_closed_by_the_idle_timeout():
    """PINGs are not requests: a connection that only pings (no stream
    open) is closed after keepalive_timeout like an idle one (GOAWAY, then
    the close once the GOAWAY is unanswered; here the client reads nothing,
    so its sending fails)."""
    with skirr(APP, *H2C, "--keepalive-timeout", "1") as s, Frames(s.port, rcvbuf=4096) as c:
        t0 = time.monotonic()
        flood = Flood(c, PingFrame(0, b"12345678").serialize())
        assert flood.done.wait(10), "still flooding after 10 s"
        assert isinstance(flood.error, OSError) and flood.started < flood.cap
        assert time.monotonic() - t0 < 5
        served(s)


def test_zero_window_slow_reader_many_streams_memory_bounded_and_reset_after_send_timeout():
    """A client with SETTINGS_INITIAL_WINDOW_SIZE 0 asks for 1 MiB on 50
    streams and never opens a window. Each stream holds at most one
    send_buffer of the app's chunks plus hyper's piece; after
    send_timeout every stream is reset (CANCEL) and the app sees the
    disconnect; other connections are served meanwhile."""
    n = 50
    with skirr(APP, *H2C, "--send-timeout", "2") as s:
        pid = s.proc.pid
        rss0 = rss_kib(pid)
        with Frames(s.port, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 0}) as c:
            sids = [1 + 2 * i for i in range(n)]
            for sid in sids:
                c.get(sid, f"/big?n={1 << 20}&tag={sid}")
            c.pump(lambda c: all(sid in c.headers for sid in sids), what="response heads")
            served(s)
            # The apps are all blocked in send(): bounded memory.
            grown = rss_kib(pid) - rss0
            assert grown < n * 1024, f"RSS grew {grown} KiB for {n} stalled streams"
            c.pump(lambda c: all(sid in c.ended for sid in sids), timeout=15, what="resets")
            rsts = {f.stream_id: f.error_code for f in c.frames if isinstance(f, RstStreamFrame)}
            assert {rsts.get(sid) for sid in sids} == {CANCEL}
            assert not any(c.body.get(sid) for sid in sids)
            # The connection itself is fine: a stream with a window is served.
            c.get(201, "/")
            c.send(WindowUpdateFrame(201, window_increment=100))
            assert c.response(201) == (200, b"ok")
        evs = wait_until(lambda: [e for e in events(s) if "receive" in e] if len(events(s)) >= 2 * n else None)
        assert len(evs) == n and {e["receive"] for e in evs} == {"http.disconnect"}
        assert {e["big"] for e in events(s) if "big" in e} == {"ClientDisconnected"}


def test_connection_window_held_at_zero_other_connections_unaffected():
    """The stream windows are open but the client never returns the
    connection window: the first 64 KiB go out, then every stream stalls
    and is reset after send_timeout; another connection is served all the
    while."""
    with skirr(APP, *H2C, "--send-timeout", "1") as s:
        with Frames(s.port, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 1 << 20}) as c:
            c.auto_window = False
            for sid in (1, 3, 5):
                c.get(sid, f"/big?n={1 << 20}&tag=w{sid}")
            served(s)
            c.pump(lambda c: {1, 3, 5} <= c.ended, timeout=10, what="resets")
            got = sum(len(c.body.get(sid, b"")) for sid in (1, 3, 5))
            assert got == 65535  # the connection's initial window, no more
            rsts = {f.stream_id: f.error_code for f in c.frames if isinstance(f, RstStreamFrame)}
            assert rsts == {1: CANCEL, 3: CANCEL, 5: CANCEL}
        served(s)


def test_many_one_byte_data_frames_upload_cpu_bounded():
    """60,000 DATA frames of one byte each (within the stream's 64 KiB
    window): the upload is read whole, the server's CPU time for it stays
    bounded and other clients are served."""
    n = 60_000
    with skirr(APP, *H2C, "--http2-initial-window-size", "1048576") as s:
        pid = s.proc.pid
        cpu0 = cpu_seconds(pid)
        with Frames(s.port) as c:
            c.get(1, "/upload", method="POST", end=False)
            frames = DataFrame(1, b"x").serialize() * n + DataFrame(1, b"", flags=["END_STREAM"]).serialize()
            c.send_raw(frames)
            status, body = c.response(1, timeout=30)
            assert status == 200
            assert json.loads(body)["bytes"] == n
        used = cpu_seconds(pid) - cpu0
        assert used < 10.0, f"{used:.1f} s of CPU for {n} one-byte frames"
        served(s)


def test_stream_id_exhaustion_then_reuse_is_a_protocol_error():
    """A client jumping to the last stream id (2^31-1) is served; a lower
    id after it is a connection error PROTOCOL_ERROR (RFC 9113 §5.1.1),
    GOAWAY naming 2^31-1 as the last stream processed."""
    with skirr(APP, *H2C) as s, Frames(s.port) as c:
        c.get(MAX_STREAM_ID, "/")
        assert c.response(MAX_STREAM_ID) == (200, b"ok")
        c.get(3, "/")
        g = c.goaway()
        assert g.error_code == PROTOCOL_ERROR
        assert g.last_stream_id == MAX_STREAM_ID
        c.wait_closed()
        served(s)


def test_reusing_a_closed_stream_id_is_a_protocol_error():
    """A second HEADERS on a stream id already used and closed: a
    connection error (RFC 9113 §5.1.1: ids must increase), GOAWAY
    PROTOCOL_ERROR (h2 may report it as STREAM_CLOSED on the stream)."""
    with skirr(APP, *H2C) as s, Frames(s.port) as c:
        c.get(1, "/")
        c.get(3, "/")
        assert c.response(3) == (200, b"ok")
        c.get(1, "/")
        f = c.stream_error_or_goaway(1)
        assert type(f).__name__ == "GoAwayFrame"
        assert f.error_code in (PROTOCOL_ERROR, STREAM_CLOSED)
        served(s)


# --- send_timeout: a response the client takes nothing of ----------------------


def test_send_timeout_resets_a_stalled_stream_the_app_sees_the_disconnect():
    """A stream whose window stays 0: after send_timeout (1 s) it is reset
    with CANCEL, the app's send() raised ClientDisconnected and receive()
    gave http.disconnect; a second stream on the same connection, given a
    window, is served before and after."""
    with skirr(APP, *H2C, "--send-timeout", "1") as s:
        with Frames(s.port, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 0}) as c:
            t0 = time.monotonic()
            c.get(1, f"/big?n={1 << 20}&tag=stalled")
            c.get(3, "/")
            c.send(WindowUpdateFrame(3, window_increment=100))
            assert c.response(3) == (200, b"ok")
            assert c.rst(1).error_code == CANCEL
            assert 0.9 < time.monotonic() - t0 < 5
            c.get(5, "/")
            c.send(WindowUpdateFrame(5, window_increment=100))
            assert c.response(5) == (200, b"ok")
        evs = wait_until(lambda: events(s) if len(events(s)) >= 2 else None)
        assert evs[0]["big"] == "ClientDisconnected" and evs[0]["tag"] == "stalled"
        assert evs[1] == {"receive": "http.disconnect", "tag": "stalled"}


def test_send_timeout_spares_a_slow_reader_that_makes_progress():
    """A client opening its window 32 KiB at a time every 0.4 s takes 4 s
    for 320 KiB, longer than send_timeout (2 s): each piece it reads is
    progress, so the response completes. (With a 1 s timeout a client
    paused for 0.6 s on a loaded machine made no progress for too long.)"""
    n = 320 * 1024
    with skirr(APP, *H2C, "--send-timeout", "2") as s:
        with Frames(s.port, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 0}) as c:
            c.auto_window = False
            c.get(1, f"/big?n={n}&chunk={n}&tag=slow")
            t0 = time.monotonic()
            while 1 not in c.ended and time.monotonic() - t0 < 20:
                c.send(WindowUpdateFrame(1, window_increment=32 * 1024))
                c.send(WindowUpdateFrame(0, window_increment=32 * 1024))
                end = time.monotonic() + 0.4
                while time.monotonic() < end and c.read_some(end - time.monotonic()):
                    pass
            assert time.monotonic() - t0 > 3
            assert c.response(1) == (200, b"b" * n)
            assert not any(isinstance(f, RstStreamFrame) for f in c.frames)
        # Recorded after the app's last send() returned: maybe after the
        # client read the end of the stream.
        wait_until(lambda: events(s), what="the app's record")
        assert events(s) == [{"big": "done", "tag": "slow", "sent": n}]


def test_send_timeout_on_http11_closes_a_connection_whose_socket_takes_nothing():
    """HTTP/1.1: a client that never reads a 100 MiB response; once the
    socket has accepted nothing for send_timeout (noticed within one
    keep-alive period more), the connection is closed and the app's send()
    raised ClientDisconnected."""
    with skirr(APP, "--send-timeout", "1", "--keepalive-timeout", "1") as s:
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.settimeout(10)
        try:
            c.connect(("127.0.0.1", s.port))
            t0 = time.monotonic()
            c.sendall(b"GET /big?n=104857600&tag=h1 HTTP/1.1\r\nHost: x\r\n\r\n")
            evs = wait_until(lambda: events(s) if len(events(s)) >= 2 else None)
            assert 0.9 < time.monotonic() - t0 < 5
            assert evs[0]["big"] == "ClientDisconnected" and evs[0]["sent"] < 100 << 20
            assert evs[1] == {"receive": "http.disconnect", "tag": "h1"}
            # Closed: reading drains what was buffered, then the end.
            got = 0
            while True:
                data = c.recv(1 << 20)
                if not data:
                    break
                got += len(data)
            assert got < 100 << 20
        finally:
            c.close()
        assert request(s.port, "GET", "/").status == 200


def _stalled_stream_reset(port: int, wait: float) -> RstStreamFrame | None:
    """Asks for 1 MiB on a stream whose window stays 0; its RST_STREAM if
    one comes within ``wait`` seconds."""
    with Frames(port, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 0}) as c:
        c.get(1, f"/big?n={1 << 20}&tag=cfg")
        try:
            return c.rst(1, timeout=wait)
        except TimeoutError:
            return None


def test_send_timeout_under_gunicorn_from_skirr_send_timeout(tmp_path):
    """Gunicorn: ``skirr_send_timeout`` in the config file."""
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("skirr_send_timeout = 1\n")
    with gunicorn(APP, "-c", str(conf), *H2C) as g:
        t0 = time.monotonic()
        rst = _stalled_stream_reset(g.port, 10)
        assert rst is not None and rst.error_code == CANCEL
        assert time.monotonic() - t0 < 5


def test_send_timeout_zero_never_resets_and_the_environment_sets_it():
    """``SKIRR_SEND_TIMEOUT=0``: a stalled stream is left alone (the client
    owns its window), here for 2.5 s, twice the 1 s it would take with
    SKIRR_SEND_TIMEOUT=1."""
    with skirr(APP, *H2C, env={"SKIRR_SEND_TIMEOUT": "0"}) as s:
        assert _stalled_stream_reset(s.port, 2.5) is None
    with skirr(APP, *H2C, env={"SKIRR_SEND_TIMEOUT": "1"}) as s:
        rst = _stalled_stream_reset(s.port, 10)
        assert rst is not None and rst.error_code == CANCEL


def test_send_timeout_over_tls_closes_without_waiting_on_the_stalled_socket(tmp_path):
    """HTTP/1.1 over TLS: closing a connection whose client reads nothing
    must not wait for the TLS close_notify to be written (it never would
    be). With one connection slot, the next client is served only once the
    stalled one has really gone."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    ca_pem, cert, key = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    leaf.private_key_pem.write_to_path(str(key))
    for i, blob in enumerate(leaf.cert_chain_pems):
        blob.write_to_path(str(cert), append=i > 0)
    ctx = ssl.create_default_context(cafile=str(ca_pem))
    args = ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--send-timeout", "1", "--keepalive-timeout", "1"]

    def get(port: int, path: str) -> bytes:
        with ctx.wrap_socket(
            socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="127.0.0.1"
        ) as t:
            t.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := t.recv(65536):
                data += chunk
            return data.partition(b"\r\n\r\n")[2]

    def up(port: int) -> bool:
        try:
            return get(port, "/") == b"ok"
        except OSError:
            return False

    with skirr(APP, *args, "--max-connections", "1", ready=False) as s:
        wait_until(lambda: up(s.port), 20, 0.05, "TLS server")
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.settimeout(10)
        raw.connect(("127.0.0.1", s.port))
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as stalled:
            stalled.sendall(b"GET /big?n=104857600&tag=tls HTTP/1.1\r\nHost: x\r\n\r\n")
            t0 = time.monotonic()
            # Waits in the backlog until the stalled connection's slot frees.
            evs = json.loads(get(s.port, "/events"))
            assert time.monotonic() - t0 < 6
            assert evs[0]["big"] == "ClientDisconnected" and evs[0]["tag"] == "tls"


def test_send_timeout_on_http2_when_the_socket_takes_nothing():
    """HTTP/2 with the windows wide open but a client that reads nothing
    from its socket: h2's buffer for the stream fills, hyper stops asking
    for pieces, and after send_timeout the stream is given up (the app's
    send() raised ClientDisconnected) even though no RST_STREAM can reach
    the client."""
    with skirr(APP, *H2C, "--send-timeout", "1") as s:
        with Frames(s.port, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 2**31 - 1}, rcvbuf=4096) as c:
            c.send(WindowUpdateFrame(0, window_increment=2**31 - 1 - 65535))
            t0 = time.monotonic()
            c.get(1, f"/big?n={100 << 20}&tag=sock")
            evs = wait_until(lambda: events(s) if len(events(s)) >= 2 else None)
            assert time.monotonic() - t0 < 6
            assert evs[0]["big"] == "ClientDisconnected" and evs[0]["sent"] < 100 << 20
            assert evs[1] == {"receive": "http.disconnect", "tag": "sock"}
        served(s)
