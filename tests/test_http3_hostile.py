"""HTTP/3 under hostile input (issue 21): floods and resource exhaustion
over real UDP sockets, each with a normal client served during or after
the attack. Single-frame MUSTs are test_http3_conformance.py's; the TCP and
HTTP/2 equivalents are test_hostile.py and test_http2_attacks.py."""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import socket
import ssl
import time
from collections import Counter

import pytest
from harness import gunicorn, rss_kib, wait_until, worker_pids

pytest.importorskip("trustme")
pytest.importorskip("aioquic")
import test_http3  # noqa: E402
from aioquic.asyncio.client import connect  # noqa: E402
from aioquic.buffer import encode_uint_var  # noqa: E402
from aioquic.h3.connection import H3_ALPN  # noqa: E402
from aioquic.quic.configuration import QuicConfiguration  # noqa: E402
from aioquic.quic.connection import QuicConnection  # noqa: E402
from h3client import REQUEST_CANCELLED, H3Client, h3_connect, run  # noqa: E402
from test_http3 import _tls_ready, h3_skirr, tls_get  # noqa: E402

pki = test_http3.pki  # the fixture, shared

#: The worker's handshakes in progress above which an unvalidated client
#: gets a Retry (proto/h3/mod.rs RETRY_ABOVE).
RETRY_ABOVE = 64
#: QUIC transport error codes (RFC 9000 §20.1).
CONNECTION_REFUSED = 0x2
STREAM_LIMIT_ERROR = 0x4
#: HTTP/3 H3_EXCESSIVE_LOAD (RFC 9114 §8.1).
H3_EXCESSIVE_LOAD = 0x107


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def initial(port: int) -> bytes:
    """A client's first Initial datagram (padded to 1200 bytes, a fresh
    random connection ID), built by aioquic and never followed up."""
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost")
    cfg.verify_mode = ssl.CERT_NONE
    q = QuicConnection(configuration=cfg)
    now = time.monotonic()
    q.connect(("127.0.0.1", port), now=now)
    return q.datagrams_to_send(now=now)[0][0]


def kind(datagram: bytes) -> str:
    """The first packet's type: long header types of QUIC v1 (RFC 9000 §17.2)."""
    if not datagram[0] & 0x80:
        return "short"
    return ("initial", "0rtt", "handshake", "retry")[(datagram[0] >> 4) & 3]


def flood(port: int, n: int) -> list[socket.socket]:
    """One Initial from each of `n` new UDP sockets (source ports)."""
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setblocking(False)
        s.bind(("127.0.0.1", 0))
        s.sendto(initial(port), ("127.0.0.1", port))
        socks.append(s)
    return socks


def first_replies(socks: list[socket.socket], timeout: float = 10.0) -> Counter:
    """The type of the first datagram each socket gets back, counted."""
    kinds: Counter = Counter()
    with selectors.DefaultSelector() as sel:
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        end = time.monotonic() + timeout
        while sel.get_map() and (left := end - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                kinds[kind(key.fileobj.recv(65535))] += 1
                sel.unregister(key.fileobj)
    return kinds


async def get_root(port: int, ca: str) -> tuple[int, int]:
    """A normal client's GET /: its status and how many Retry packets it followed."""
    async with h3_connect(port, ca) as c:
        r = await c.request("GET", "/")
        return r.status, c._quic._retry_count


def test_initial_flood_is_answered_with_retry_and_a_real_client_is_served(pki):
    """Initials from 150 source ports that never go on: the first 64 hold a
    handshake each, the rest get a Retry (no state kept); a real client
    follows its Retry and is served during the flood, and once the flood's
    handshakes time out a new client is accepted without one."""
    with h3_skirr(pki, "apps.probe:app", "--tls-handshake-timeout", "3") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        rss0 = rss_kib(s.proc.pid)
        socks = flood(s.port, 150)
        try:
            kinds = first_replies(socks)
            during = run(get_root(s.port, pki["ca"]))
            rss = rss_kib(s.proc.pid) - rss0
            print(f"Initial flood: first replies {dict(kinds)}, RSS +{rss} KiB")
        finally:
            for sk in socks:
                sk.close()
        assert kinds["initial"] <= RETRY_ABOVE, kinds
        assert kinds["retry"] >= 150 - RETRY_ABOVE - 20, kinds
        assert during == (200, 1)
        assert rss < 30_000, f"RSS grew {rss} KiB"
        wait_until(lambda: run(get_root(s.port, pki["ca"])) == (200, 0), timeout=20, interval=0.5, what="no Retry")


def test_initial_flood_under_gunicorn_retry_routes_back_to_its_worker(pki, tmp_path):
    """-w 2: the flood is hashed over both workers, each past its
    threshold; a client's Initial after a Retry carries the worker's
    connection ID, so it is steered back to the worker whose key checks
    the token: real clients (aioquic, niquests) are served during it."""
    niquests = pytest.importorskip("niquests")
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("skirr_http3 = True\nskirr_tls_handshake_timeout = 5\n")
    args = ["-c", str(conf), "-w", "2", "--certfile", pki["cert"], "--keyfile", pki["key"]]
    with gunicorn("apps.probe:app", *args, ready=False) as g:
        wait_until(lambda: _tls_ready(g.port, pki["ca"]), what="TLS server")
        wait_until(lambda: "serves slot" in g.logs() and g.logs().count("serves slot") == 2, what="steering")
        socks = flood(g.port, 320)
        try:
            kinds = first_replies(socks)
            clients = [run(get_root(g.port, pki["ca"])) for _ in range(4)]
            with niquests.Session(disable_http1=True, disable_http2=True, timeout=10) as sess:
                sess.quic_cache_layer.add_domain("127.0.0.1", g.port)
                r = sess.get(f"https://127.0.0.1:{g.port}/", verify=pki["ca"])
            print(f"Initial flood, -w 2: first replies {dict(kinds)}")
        finally:
            for sk in socks:
                sk.close()
        assert len(worker_pids(g.proc.pid)) == 2
        assert kinds["initial"] <= 2 * RETRY_ABOVE, kinds
        assert kinds["retry"] >= 320 - 2 * RETRY_ABOVE - 40, kinds
        assert clients == [(200, 1)] * 4
        assert (r.status_code, r.http_version) == (200, 30)


def test_amplification_limit_before_the_client_address_is_validated(pki):
    """One valid Initial, never answered: the server's handshake flight and
    its retransmissions stay within 3x the bytes received (RFC 9000 §8.1),
    give or take the last datagram: quinn starts one while any budget is
    left (quinn-rs/quinn#1082), 3822 bytes for 1200 measured."""
    with h3_skirr(pki) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind(("127.0.0.1", 0))
            sent = initial(s.port)
            u.sendto(sent, ("127.0.0.1", s.port))
            got, end = 0, time.monotonic() + 4
            with selectors.DefaultSelector() as sel:
                sel.register(u, selectors.EVENT_READ)
                while (left := end - time.monotonic()) > 0:
                    if sel.select(left):
                        got += len(u.recv(65535))
        print(f"amplification: {got} bytes back for {len(sent)} received ({got / len(sent):.2f}x)")
        assert 0 < got < 3 * len(sent) + 1200
        assert run(get_root(s.port, pki["ca"]))[0] == 200


def test_max_streams_bounds_request_streams_and_a_client_over_it_is_closed(pki):
    """--http2-max-concurrent-streams 5: MAX_STREAMS is 5, twelve 0.5 s
    requests take three rounds; a client that opens streams past the
    limit is closed with STREAM_LIMIT_ERROR; another is served."""
    with h3_skirr(pki, "apps.probe:app", "--http2-max-concurrent-streams", "5") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                limit = c._quic._remote_max_streams_bidi
                t0 = time.monotonic()
                sids = [c.start("GET", "/sleep?secs=0.5") for _ in range(12)]
                statuses = [(await c.response(sid)).status for sid in sids]
                took = time.monotonic() - t0
            async with h3_connect(s.port, pki["ca"]) as bad:
                bad._quic._remote_max_streams_bidi = 1000  # ignore the server's limit
                for _ in range(8):
                    bad.start("GET", "/sleep?secs=2")
                closed = await asyncio.wait_for(bad.terminated, 10)
            return limit, statuses, took, closed.error_code, await get_root(s.port, pki["ca"])

        limit, statuses, took, code, after = run(go())
        assert limit == 5
        assert statuses == [200] * 12
        assert took >= 1.4, f"12 requests in {took:.2f}s: more than 5 at once"
        assert code == STREAM_LIMIT_ERROR
        assert after == (200, 0)


def test_rapid_reset_is_bounded_by_max_streams_and_others_are_served(pki):
    """CVE-2023-44487 on HTTP/3: open a request stream and reset it at once,
    as fast as MAX_STREAMS lets a client (a stream's credit comes back only
    once the server is done with it): the app runs at most
    http2_max_concurrent_streams of them at a time, and another client is
    served during the attack."""
    with h3_skirr(pki, "apps.probe:app", "--http2-max-concurrent-streams", "20") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        pid = s.proc.pid
        cpu0, rss0 = cpu_seconds(pid), rss_kib(pid)

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c, h3_connect(s.port, pki["ca"]) as other:
                q, n, served = c._quic, 0, []
                t0 = time.monotonic()
                while n < 5000 and time.monotonic() - t0 < 3:
                    if q.get_next_available_stream_id() // 4 < q._remote_max_streams_bidi:
                        c.reset(c.start("GET", "/sleep?secs=0.5"))
                        n += 1
                        if n % 500 == 0:
                            served.append((await other.request("GET", "/")).status)
                    else:
                        await asyncio.sleep(0.002)  # wait for MAX_STREAMS
                return n, time.monotonic() - t0, served, (await other.request("GET", "/")).status

        n, took, served, after = run(go())
        paths = json.loads(tls_get(s.port, pki["ca"], "/paths")[2])
        cpu = cpu_seconds(pid) - cpu0
        app_calls = paths.count("/sleep")
        print(f"rapid reset: {n} streams in {took:.1f}s, app called {app_calls}, server CPU {cpu:.2f}s")
        assert after == 200 and all(st == 200 for st in served)
        # A 0.5 s app call holds its stream's credit: at most 20 per 0.5 s.
        assert app_calls <= 20 * (took / 0.5 + 2)
        assert cpu < 1.5, f"{cpu:.2f}s of server CPU"
        assert rss_kib(pid) - rss0 < 30_000


def _recording():
    made: list[H3Client] = []

    def create(*a, **k):
        made.append(H3Client(*a, **k))
        return made[-1]

    return made, create


async def _refused_code(port: int, ca: str) -> int | str:
    """Connects; the transport error code the server closes with, or "served"."""
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost")
    cfg.load_verify_locations(ca)
    made, create = _recording()
    try:
        async with asyncio.timeout(10):
            async with connect("127.0.0.1", port, configuration=cfg, create_protocol=create) as c:
                await c.request("GET", "/")
                return "served"
    except ConnectionError:
        return (await asyncio.wait_for(made[0].terminated, 5)).error_code


def test_a_storm_of_quic_connections_beyond_max_connections_is_refused_fast(pki):
    """--max-connections 3, all held by QUIC connections: 20 more at once
    are each refused with CONNECTION_REFUSED within seconds (no handshake
    timeout); once the holders close, QUIC and TCP are served again (no
    slot leaked)."""
    with h3_skirr(pki, "apps.probe:app", "--max-connections", "3") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as a, h3_connect(s.port, pki["ca"]) as b:
                async with h3_connect(s.port, pki["ca"]) as c:
                    for x in (a, b, c):
                        assert (await x.request("GET", "/")).status == 200
                    t0 = time.monotonic()
                    codes = await asyncio.gather(*(_refused_code(s.port, pki["ca"]) for _ in range(20)))
                    return codes, time.monotonic() - t0

        codes, took = run(go())
        assert codes == [CONNECTION_REFUSED] * 20
        assert took < 5
        wait_until(lambda: run(get_root(s.port, pki["ca"]))[0] == 200, what="QUIC served again")
        assert tls_get(s.port, pki["ca"])[0] == 200


def test_zero_credit_reader_on_many_streams_memory_bounded_then_reset(pki):
    """20 streaming responses to a client that grants no flow-control
    credit: memory stays bounded, each stream is reset after send_timeout,
    and another connection is served meanwhile."""
    with h3_skirr(pki, "apps.probe:app", "--send-timeout", "1") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        pid = s.proc.pid
        rss0 = rss_kib(pid)

        async def go():
            async with h3_connect(s.port, pki["ca"], max_stream_data=16 * 1024) as c:
                c._quic._write_stream_limits = lambda **k: None  # never more credit
                sids = [c.start("GET", "/stream-until-disconnect") for _ in range(20)]
                async with h3_connect(s.port, pki["ca"]) as other:
                    during = (await other.request("GET", "/")).status
                resps = [await c.response(sid, timeout=10) for sid in sids]
                return resps, during

        resps, during = run(go())
        assert during == 200
        assert [r.reset for r in resps] == [REQUEST_CANCELLED] * 20
        assert all(len(r.body) <= 16 * 1024 for r in resps)
        assert rss_kib(pid) - rss0 < 30_000
        assert run(get_root(s.port, pki["ca"]))[0] == 200


def test_a_body_over_max_body_size_is_413_and_the_connection_goes_on(pki):
    with h3_skirr(pki, "apps.probe:app", "--max-body-size", "10000") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                declared = await c.request("POST", "/echo", [("content-length", "50000")], b"x" * 50000)
                sid = c.start("POST", "/echo", body=b"y" * 8000, end=False)  # no content-length
                for _ in range(10):
                    c.send_more(sid, b"y" * 8000)
                streamed = await c.response(sid)
                return declared.status, streamed.status, (await c.request("POST", "/echo", body=b"ok")).body

        assert run(go()) == (413, 413, b"ok")


def _grease(n: int, size: int) -> bytes:
    """`n` reserved frames (type 0x21 + 0x1f·k, RFC 9114 §7.2.8) of `size` bytes."""
    frame = encode_uint_var(0x21 + 0x1F * 7) + encode_uint_var(size) + b"g" * size
    return frame * n


def test_megabytes_of_unknown_frames_on_a_request_stream_are_skipped(pki):
    """4 MiB of small reserved frames between HEADERS and DATA are read and
    dropped: the request is answered and memory stays bounded."""
    with h3_skirr(pki, "apps.probe:app") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        pid = s.proc.pid
        rss0 = rss_kib(pid)

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                sid = c.start("POST", "/echo", end=False, body=None)
                for _ in range(16):
                    c._quic.send_stream_data(sid, _grease(256, 1024))
                    c.transmit()
                    await asyncio.sleep(0)
                c.send_more(sid, b"abc", end=True)
                return await c.response(sid, timeout=20)

        r = run(go())
        assert (r.status, r.body) == (200, b"abc")
        assert rss_kib(pid) - rss0 < 30_000
        assert run(get_root(s.port, pki["ca"]))[0] == 200


@pytest.mark.parametrize("where", ["unknown-after-headers", "headers", "control-stream"])
def test_one_huge_frame_closes_the_connection_without_buffering_it(pki, where):
    """A non-DATA frame declaring 1 GiB (h3 would buffer it whole before
    decoding it), its payload then sent: the connection is closed with
    H3_EXCESSIVE_LOAD at the frame header, memory stays bounded, and
    another connection is served."""
    with h3_skirr(pki, "apps.probe:app") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        pid = s.proc.pid
        rss0 = rss_kib(pid)

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                if where == "control-stream":
                    sid, ty = c.h3._local_control_stream_id, 0x21
                elif where == "headers":
                    sid, ty = c._quic.get_next_available_stream_id(), 0x01
                else:
                    sid, ty = c.start("POST", "/echo", end=False, body=None), 0x21
                c._quic.send_stream_data(sid, encode_uint_var(ty) + encode_uint_var(1 << 30))
                chunk = b"h" * (1 << 20)
                for _ in range(16):
                    if c.terminated.done():
                        break
                    c._quic.send_stream_data(sid, chunk)
                    c.transmit()
                    await asyncio.sleep(0.01)
                closed = await asyncio.wait_for(c.terminated, 10)
                return closed.error_code, rss_kib(pid) - rss0

        code, grew = run(go())
        assert code == H3_EXCESSIVE_LOAD
        assert grew < 8_000, f"RSS grew {grew} KiB"
        assert run(get_root(s.port, pki["ca"]))[0] == 200


def test_uploads_the_app_does_not_read_are_bounded_per_connection(pki):
    """20 request streams each sending 1 MiB to an app that never reads
    its body: QUIC flow control holds the client back once the
    connection's receive window is full; memory stays bounded and
    another connection is served."""
    with h3_skirr(pki, "apps.probe:app") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        pid = s.proc.pid
        rss0 = rss_kib(pid)

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                for _ in range(20):
                    c.start("POST", "/sleep?secs=30", body=b"u" * (1 << 20), end=False)
                sent = 0
                for _ in range(100):  # until the client's credit stops growing
                    await asyncio.sleep(0.05)
                    now = c._quic._remote_max_data_used
                    if now == sent and now > 0:
                        break
                    sent = now
                async with h3_connect(s.port, pki["ca"]) as other:
                    during = (await other.request("GET", "/")).status
                return sent, rss_kib(pid) - rss0, during

        sent, grew, during = run(go())
        print(f"unread uploads: {sent} bytes taken by the server, RSS +{grew} KiB")
        assert during == 200
        assert sent < 12 << 20
        assert grew < 20_000


def test_a_byte_per_data_frame_to_an_app_not_reading_keeps_memory_bounded(pki):
    """One stream declaring a huge body, then two 1-byte DATA frames per
    packet to an app that has not read yet. The read-ahead bound counts
    bytes: before, each read's buffer was sized to the declared length
    (64 KiB for 2 bytes: +90 MB for 40 KB sent) and each tiny chunk was an
    entry of its own in the body queue (~60 bytes each)."""
    with h3_skirr(pki, "apps.probe:app") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        pid = s.proc.pid

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                sid = c.start("POST", "/sleep?secs=30", headers=[("content-length", str(10**12))], body=None, end=False)
                await asyncio.sleep(0.3)
                rss0 = rss_kib(pid)
                for i in range(20_000):
                    c.h3.send_data(sid, b"a", end_stream=False)
                    c.h3.send_data(sid, b"b", end_stream=False)
                    c.transmit()
                    if i % 20 == 0:
                        await asyncio.sleep(0.001)
                await c.ping()  # every packet before it is in
                await asyncio.sleep(0.3)
                grew = rss_kib(pid) - rss0
                c.reset(sid)
                async with h3_connect(s.port, pki["ca"]) as other:
                    during = (await other.request("GET", "/")).status
                return grew, during

        grew, during = run(go(), 90)
        print(f"40,000 bytes in 1-byte DATA frames: RSS +{grew} KiB")
        assert during == 200
        assert grew < 8_000, f"RSS grew {grew} KiB"
        assert "panicked" not in s.logs()
