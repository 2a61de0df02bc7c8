"""No HTTP/2 request is lost while Gunicorn recycles workers (issue 10).

Four h2c (prior knowledge) clients keep 4 POSTs of 1 KiB each in flight
on one connection at a time, never retrying anything the server may have
processed, against `-w 2` through `--max-requests` with jitter and through
two HUPs. The client (``h2follow.FrameClient``) follows a graceful GOAWAY
as browsers and curl do: no new stream after the first GOAWAY, the open
ones read to their end, then a new connection.

What counts (RFC 9113 §6.8, §8.7):

* failed: a response that is not the 200 for the 1 KiB, a stream reset
  with any code but REFUSED_STREAM, a connection closed (or silent for
  10 s) with a stream open that no GOAWAY excluded — i.e. a request the
  server may have processed and never answered;
* refused: a stream above the final GOAWAY's last-stream-id or reset with
  REFUSED_STREAM: the server says it never processed it, and a client may
  send it again (these are counted, and the clients go on with new
  requests on a new connection); such a stream must get no frame after
  the GOAWAY ("never half-served": that would be a failure too).

httpx is not used here: the ``h2`` package it speaks HTTP/2 through stops
reading at the first GOAWAY, so httpx fails every response still in flight
when a graceful GOAWAY arrives (see the README's HTTP/2 section).
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import threading

import pytest
from h2follow import FrameClient
from harness import TIMEOUT, gunicorn, wait_until, worker_pids

pytest.importorskip("hyperframe")
pytest.importorskip("hpack")

pytestmark = pytest.mark.timeout(240)

APP = "apps.fidelity_app:app"
H2C = ("--http-protocols", "h2,h1", "--http2-cleartext", "prior-knowledge")
# Recycled workers to wait for (SKIRR_RECYCLE_ROUNDS=60 for a longer run).
ROUNDS = int(os.environ.get("SKIRR_RECYCLE_ROUNDS", "12"))
BODY = b"p" * 1024
DEPTH = 4  # streams in flight per connection


class H2Clients:
    """Threads POSTing over HTTP/2 until stopped."""

    def __init__(self, port: int, n: int = 4, depth: int = DEPTH, connect=None, body: bytes = BODY) -> None:
        self.port = port
        self.depth = depth
        self.body = body
        self.connect = connect or (lambda: FrameClient.connect(port, timeout=TIMEOUT))
        self.ok = 0
        self.refused = 0
        self.connections = 0
        self.goaways = 0
        self.failed: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(n)]

    def _tally(self, c: FrameClient, counted: set[int]) -> None:
        with self.lock:
            for st in c.streams.values():
                if st.outcome is None or st.sid in counted:
                    continue
                counted.add(st.sid)
                if st.outcome == "ok" and st.status == 200 and st.body == b"%d" % len(self.body):
                    self.ok += 1
                elif st.outcome == "refused":
                    self.refused += 1
                else:
                    self.failed.append(f"stream {st.sid}: {st.outcome} {st.status} {st.body[:60]!r} {st.why}")
                if st.frames_after_refusal:
                    self.failed.append(f"stream {st.sid}: {st.frames_after_refusal} frames after it was refused")

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                c = self.connect()
            except OSError as e:
                with self.lock:
                    self.failed.append(f"connect: {type(e).__name__}: {e}")
                continue
            with self.lock:
                self.connections += 1
            counted: set[int] = set()
            try:
                while not self.stop.is_set() and not c.going_away:
                    while len(c.open_streams()) < self.depth and not c.going_away:
                        c.request("POST", "/post", self.body, [("content-type", "application/octet-stream")])
                    c.read_some(timeout=TIMEOUT)
                    self._tally(c, counted)
                # Going away (or stopping): the open streams are read to their end.
                c.wait(c.open_streams(), timeout=TIMEOUT)
                if c.goaways:
                    # Nothing sent after the final GOAWAY may be served.
                    c.read_to_eof(timeout=TIMEOUT)
            except TimeoutError as e:
                for st in c.open_streams():
                    st.outcome, st.why = "failed", f"timed out: {e}"
            finally:
                self._tally(c, counted)
                with self.lock:
                    self.goaways += bool(c.goaways)
                    bad = [g for g in c.goaways if g.error_code != 0]
                    if bad:
                        self.failed.append(f"GOAWAY with error {[(g.last_stream_id, g.error_code) for g in bad]}")
                c.close()

    def summary(self) -> str:
        return (
            f"{self.ok} POSTs ok, {len(self.failed)} failed, {self.refused} refused unprocessed "
            f"(GOAWAY/REFUSED_STREAM), {self.connections} connections, {self.goaways} ended by GOAWAY"
        )

    def __enter__(self) -> H2Clients:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(TIMEOUT * 3)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    trustme = pytest.importorskip("trustme")
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    ca.issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(str(d / "both.pem"))
    return str(d / "ca.pem"), str(d / "both.pem")


@pytest.mark.parametrize("transport", ["h2c", "tls"])
def test_no_h2_post_fails_across_max_requests_recycling(transport, pki):
    """h2c with ROUNDS recycles; h2 over TLS (ALPN) with a third of them."""
    rounds = ROUNDS if transport == "h2c" else max(2, ROUNDS // 3)
    connect = None
    if transport == "tls":
        ca, both = pki
        args = ("--http-protocols", "h2,h1", "--certfile", both, "--keyfile", both)
        ctx = ssl.create_default_context(cafile=ca)
        ctx.set_alpn_protocols(["h2"])
    else:
        args = H2C
    with gunicorn(APP, *args, "-w", "2", "--max-requests", "300", "--max-requests-jitter", "50", ready=False) as g:
        # Workers up (the listening socket is the test's: connections wait in its backlog).
        wait_until(lambda: len(worker_pids(g.proc.pid)) == 2, what="2 workers")
        first = set(worker_pids(g.proc.pid))
        if transport == "tls":

            def connect():
                raw = socket.create_connection(("127.0.0.1", g.port), timeout=TIMEOUT)
                sock = ctx.wrap_socket(raw, server_hostname="localhost")
                assert sock.selected_alpn_protocol() == "h2"
                return FrameClient(sock, scheme="https")

        with H2Clients(g.port, connect=connect) as c:
            wait_until(
                lambda: g.logs().count("Autorestarting worker") >= rounds,
                timeout=30 + rounds * 3,
                what=f"{rounds} recycled workers",
            )
        assert not first & set(worker_pids(g.proc.pid))
        recycles = g.logs().count("Autorestarting worker")
    print(f"h2 ({transport}) max-requests: {recycles} recycles, {c.summary()}")
    assert c.failed == [], f"{len(c.failed)} of {c.ok + len(c.failed)} POSTs failed: {c.failed[:5]}"
    assert c.ok > rounds * 250
    assert c.goaways >= rounds // 2  # the recycles did reach these clients' connections


def test_no_h2_post_fails_across_two_hups():
    with gunicorn(APP, *H2C, "-w", "2") as g:
        wait_until(lambda: len(worker_pids(g.proc.pid)) == 2, what="2 workers")
        with H2Clients(g.port) as c:
            for _ in range(2):
                before = set(worker_pids(g.proc.pid))
                wait_until(lambda: c.ok > 300, what="traffic")
                g.send_signal(signal.SIGHUP)
                wait_until(
                    lambda before=before: (
                        len(set(worker_pids(g.proc.pid)) - before) == 2 and not before & set(worker_pids(g.proc.pid))
                    ),
                    timeout=30,
                    what="the old workers replaced",
                )
                served = c.ok
                wait_until(lambda served=served: c.ok > served + 300, what="traffic on the new workers")
    print(f"h2 HUP: {c.summary()}")
    assert c.failed == [], f"{len(c.failed)} of {c.ok + len(c.failed)} POSTs failed: {c.failed[:5]}"
    assert c.goaways >= 2
