"""HTTP/3 under a Gunicorn master (issue 21): a BPF program steers every
QUIC packet to the worker that owns its connection, so that HUP and
``max_requests`` recycles fail no request and break no connection. A
real Gunicorn master, aioquic clients (tests/h3client.py) under load:
GETs and POSTs on several connections, each following GOAWAY to a new
connection as a browser does."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from harness import gunicorn, wait_until, worker_pids

pytest.importorskip("trustme")
pytest.importorskip("aioquic")
import test_http3  # noqa: E402
from h3client import h3_connect, run  # noqa: E402
from test_http3 import _tls_ready  # noqa: E402

pki = test_http3.pki  # the fixture, shared

#: H3_REQUEST_REJECTED (RFC 9114 §8.1): not processed, safe to retry.
REQUEST_REJECTED = 0x10B


def _h3_gunicorn(pki, tmp_path, workers: int, *args: str):
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("skirr_http3 = True\n")
    base = ["-c", str(conf), "-w", str(workers), "--certfile", pki["cert"], "--keyfile", pki["key"]]
    return gunicorn("apps.probe:app", *base, *args, ready=False)


async def _pid(port: int, ca: str) -> int:
    async with h3_connect(port, ca) as c:
        r = await c.request("GET", "/pid")
        assert r.status == 200
        return int(r.body)


def _all_serving(g, pki, workers: int) -> set[int]:
    """Waits until ``workers`` distinct workers answer over HTTP/3 (new
    connections are hashed over the active workers)."""
    wait_until(lambda: _tls_ready(g.port, pki["ca"]), what="TLS server")
    wait_until(lambda: g.logs().count("packets steered by connection ID") >= workers, what="steering")

    async def pids():
        seen: set[int] = set()
        for _ in range(200):
            seen.add(await _pid(g.port, pki["ca"]))
            if len(seen) == workers:
                break
        return seen

    seen = run(pids(), 60)
    assert len(seen) == workers, seen
    return seen


class Load:
    """``n`` clients sending GET /pid and POST /echo in turn until
    stopped, on a connection each, closed after ``per_conn`` requests (new
    connections keep coming); a connection that got GOAWAY finishes its
    request and the client opens a new one. Counts every request, failure and broken
    connection, and which worker answered each connection."""

    def __init__(self, port: int, ca: str, n: int, per_conn: int = 30) -> None:
        self.port, self.ca, self.n, self.per_conn = port, ca, n, per_conn
        self.stop = asyncio.Event()
        self.ok = 0
        self.failures: list[str] = []
        self.broken = 0
        self.refused = 0
        self.conns = 0
        self.pids: list[int] = []  # in order of first answers

    async def _conn(self, k: int) -> None:
        body = os.urandom(8192)
        try:
            async with h3_connect(self.port, self.ca) as c:
                self.conns += 1
                pid = None
                broken = False
                i = 0
                while not self.stop.is_set() and not c.goaway and i < self.per_conn:
                    i += 1
                    try:
                        if i % 2:
                            r = await c.request("GET", "/pid")
                            good = r.status == 200 and (pid is None or int(r.body) == pid)
                            if good and pid is None:
                                pid = int(r.body)
                                self.pids.append(pid)
                        else:
                            r = await c.request("POST", "/echo", body=body)
                            good = r.status == 200 and r.body == body
                        if r.reset == REQUEST_REJECTED:
                            continue  # not processed: the next connection retries
                        if good:
                            self.ok += 1
                        else:
                            self.failures.append(f"conn {k}: status {r.status} reset {r.reset}")
                            broken = True
                    except (ConnectionError, TimeoutError) as e:
                        self.failures.append(f"conn {k}: {e!r}")
                        broken = True
                        break
                self.broken += broken
        except ConnectionError:
            self.refused += 1  # no request sent: the client tries again
        except TimeoutError as e:
            self.failures.append(f"conn {k} handshake: {e!r}")
            self.broken += 1

    async def _client(self, k: int) -> None:
        while not self.stop.is_set():
            await self._conn(k)

    async def run_until(self, done, limit: float) -> None:
        """Runs the load until ``done()`` (polled) or ``limit`` seconds."""
        tasks = [asyncio.create_task(self._client(k)) for k in range(self.n)]
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit and not await asyncio.to_thread(done):
            await asyncio.sleep(0.05)
        self.stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)


@pytest.mark.parametrize("workers", [2, 4])
def test_hup_under_h3_load_fails_no_request(pki, tmp_path, workers):
    with _h3_gunicorn(pki, tmp_path, workers) as g:
        old = _all_serving(g, pki, workers)
        load = Load(g.port, pki["ca"], 6)
        state = {"t": time.monotonic(), "hup": False}

        def done() -> bool:
            if not state["hup"] and load.ok >= 40:
                g.send_signal(signal.SIGHUP)
                state.update(hup=True, t=time.monotonic())
            # Every new worker answered, the old ones are gone, and a moment of load after.
            new = set(load.pids[-20:]) - old
            gone = not (old & set(worker_pids(g.proc.pid)))
            return state["hup"] and len(new) >= workers and gone and time.monotonic() - state["t"] > 1.5

        run(load.run_until(done, 25), 60)
        assert state["hup"]
        assert load.failures == [], load.failures[:5]
        assert load.broken == 0
        assert not (old & set(worker_pids(g.proc.pid))), "old workers still running"
        assert len(set(load.pids) - old) >= workers
        print(f"w={workers} HUP: {load.ok} requests, {load.conns} connections, {load.refused} refused handshakes")


@pytest.mark.parametrize("workers", [2, 4])
def test_max_requests_recycles_under_h3_load_fail_no_request(pki, tmp_path, workers):
    with _h3_gunicorn(pki, tmp_path, workers, "--max-requests", "80") as g:
        first = _all_serving(g, pki, workers)

        def done() -> bool:
            # Two workers or more were replaced while the others kept serving.
            return len(set(load.pids) - first) >= 2 and load.ok >= 300

        load = Load(g.port, pki["ca"], 6)
        run(load.run_until(done, 25), 60)
        assert len(set(load.pids) - first) >= 2, "no recycle seen"
        assert load.failures == [], load.failures[:5]
        assert load.broken == 0
        print(f"w={workers} max-requests: {load.ok} requests, {load.conns} connections, {load.refused} refused")


def test_multi_packet_initials_reach_one_worker(pki, tmp_path):
    """A ClientHello over two Initial packets (long ALPN list): both must
    reach the same worker, for 40 handshakes in a row."""
    from aioquic.asyncio.client import connect
    from aioquic.h3.connection import H3_ALPN
    from aioquic.quic.configuration import QuicConfiguration

    with _h3_gunicorn(pki, tmp_path, 4) as g:
        _all_serving(g, pki, 4)

        async def go():
            ok = 0
            for _ in range(40):
                cfg = QuicConfiguration(
                    is_client=True,
                    alpn_protocols=[f"x-{i}-" + "p" * 200 for i in range(8)] + H3_ALPN,
                    server_name="localhost",
                )
                cfg.load_verify_locations(pki["ca"])
                async with asyncio.timeout(3):
                    async with connect("127.0.0.1", g.port, configuration=cfg) as c:
                        await c.ping()
                        ok += 1
            return ok

        assert run(go(), 120) == 40


def test_sigkill_a_worker_new_connections_reach_live_ones(pki, tmp_path):
    with _h3_gunicorn(pki, tmp_path, 2) as g:
        pids = _all_serving(g, pki, 2)
        victim = min(pids)
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()

        async def go():
            answered = []
            for _ in range(20):
                async with asyncio.timeout(5):
                    answered.append(await _pid(g.port, pki["ca"]))
            return answered

        answered = run(go(), 120)
        assert victim not in answered
        print(f"SIGKILL: 20 new connections answered in {time.monotonic() - t0:.2f}s")


async def _rebind(c) -> object:
    """NAT rebinding: the client's packets leave from a new UDP port (the
    client does not know); returns the new transport, to close."""
    import socket

    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", 0, 0, 0))
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(lambda: c, sock=sock)
    return transport


def test_nat_rebinding_keeps_the_connection_on_its_worker(pki, tmp_path):
    """Steering is by connection ID: a client whose address changes still
    reaches its worker (the kernel's address hash would send most of these
    to another of the 4)."""
    with _h3_gunicorn(pki, tmp_path, 4) as g:
        _all_serving(g, pki, 4)

        async def go():
            transports, answered = [], []
            for _ in range(2):
                async with h3_connect(g.port, pki["ca"]) as c:
                    pid = int((await c.request("GET", "/pid")).body)
                    for _ in range(5):
                        transports.append(await _rebind(c))
                        r = await c.request("POST", "/echo", body=b"m" * 5000)
                        assert r.status == 200 and r.body == b"m" * 5000
                        answered.append((pid, int((await c.request("GET", "/pid")).body)))
            for t in transports:
                t.close()
            return answered

        answered = run(go(), 120)
        assert len(answered) == 10
        assert all(a == b for a, b in answered), answered


class StreamLoad:
    """A user trial's pattern: ``fresh`` clients opening a new connection
    for each request and ``reusing`` clients keeping one until GOAWAY, all
    GETting a slow streamed response, and ``quick`` ones opening a new
    connection for each GET /pid (so the old workers drain for a while
    after a HUP). A refused handshake is a failed request here, as for a
    browser or niquests (aioquic raises ConnectionError for it)."""

    PATH = "/stream?n=5&delay=0.1"
    EXPECT = b"".join(f"chunk{i}\n".encode() for i in range(5))

    def __init__(self, port: int, ca: str, fresh: int = 8, reusing: int = 3, quick: int = 3) -> None:
        self.port, self.ca, self.fresh, self.reusing, self.quick = port, ca, fresh, reusing, quick
        self.stop = asyncio.Event()
        self.ok = 0
        self.failures: list[tuple[float, str]] = []

    async def _one(self, c, quick: bool) -> bool:
        """One request; False once the connection should be left."""
        r = await c.request("GET", "/pid" if quick else self.PATH)
        if r.reset == REQUEST_REJECTED:
            return False  # not processed: retried on a new connection
        if r.status == 200 and (quick or r.body == self.EXPECT):
            self.ok += 1
        else:
            self.failures.append((time.monotonic(), f"status {r.status} reset {r.reset}"))
        return not c.goaway

    async def _client(self, per_conn: int, quick: bool = False) -> None:
        while not self.stop.is_set():
            try:
                async with h3_connect(self.port, self.ca) as c:
                    for _ in range(per_conn):
                        if self.stop.is_set() or not await self._one(c, quick):
                            break
            except (ConnectionError, TimeoutError) as e:
                self.failures.append((time.monotonic(), repr(e)))

    async def run_until(self, done, limit: float) -> None:
        tasks = [asyncio.create_task(self._client(1)) for _ in range(self.fresh)]
        tasks += [asyncio.create_task(self._client(10**6)) for _ in range(self.reusing)]
        # New connections at a higher rate (a quick answer each).
        tasks += [asyncio.create_task(self._client(1, quick=True)) for _ in range(self.quick)]
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit and not await asyncio.to_thread(done):
            await asyncio.sleep(0.05)
        self.stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)


def test_hup_with_slow_requests_refuses_no_new_connection(pki, tmp_path):
    """On HUP both old workers drain at once, before the new ones serve: a
    new connection's Initials must wait for a new worker (dropped, then
    retransmitted), not be refused (CONNECTION_REFUSED fails the request).
    Five HUPs in a row, each once the workers before it are gone."""
    with _h3_gunicorn(pki, tmp_path, 2) as g:
        old = _all_serving(g, pki, 2)
        load = StreamLoad(g.port, pki["ca"], quick=6)
        state = {"t": 0.0, "hups": [], "old": old}

        def done() -> bool:
            gone = not (state["old"] & set(worker_pids(g.proc.pid)))
            if load.ok >= 30 * (len(state["hups"]) + 1) and (not state["hups"] or gone):
                if len(state["hups"]) == 5:
                    return time.monotonic() - state["t"] > 1
                state["old"] = set(worker_pids(g.proc.pid))
                g.send_signal(signal.SIGHUP)
                state["t"] = time.monotonic()
                state["hups"].append(state["t"])
            return False

        run(load.run_until(done, 60), 120)
        assert len(state["hups"]) == 5
        late = [(round(t - state["hups"][0], 2), why) for t, why in load.failures]
        assert late == [], late[:5]
        assert not (old & set(worker_pids(g.proc.pid))), "old workers still running"
        print(f"5 HUPs with slow requests: {load.ok} requests, 0 failed")
