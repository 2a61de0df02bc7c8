"""No request is lost while workers recycle: 4 keep-alive clients POST
1 KiB bodies, back to back and never retried (a client does not retry a
POST), against `-w 2` through `--max-requests` with jitter and through two
HUPs. Every POST must get its 200 (issue 9, item 4)."""

from __future__ import annotations

import http.client
import os
import signal
import threading
import time
from pathlib import Path

from harness import PY, TIMEOUT, free_port, gunicorn, start, wait_until, worker_pids

APP = "apps.fidelity_app:app"
APP_PROBE = "apps.probe:app"
# Recycled workers to wait for (SKIRR_RECYCLE_ROUNDS=60 for a longer run).
ROUNDS = int(os.environ.get("SKIRR_RECYCLE_ROUNDS", "12"))
BODY = b"p" * 1024


class Clients:
    """Four threads POSTing on keep-alive connections until stopped; with
    `fresh`, on a new connection for each request."""

    def __init__(self, port: int, n: int = 4, fresh: bool = False) -> None:
        self.port = port
        self.fresh = fresh
        self.ok = 0
        self.failed: list[str] = []
        self.closes = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(n)]

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
        while not self.stop.is_set():
            try:
                conn.request("POST", "/post", body=BODY, headers={"Content-Type": "application/octet-stream"})
                resp = conn.getresponse()
                body = resp.read()
                good = resp.status == 200 and body == b"1024"
                with self.lock:
                    if good:
                        self.ok += 1
                    else:
                        self.failed.append(f"{resp.status} {body[:80]!r}")
                if resp.will_close:
                    with self.lock:
                        self.closes += 1
                    conn.close()
                elif self.fresh:
                    conn.close()
            except (OSError, http.client.HTTPException) as e:
                # The connection was closed under a request already sent.
                with self.lock:
                    self.failed.append(f"{type(e).__name__}: {e}")
                conn.close()
        conn.close()

    def __enter__(self) -> Clients:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(TIMEOUT)


def test_no_post_fails_across_max_requests_recycling():
    with gunicorn(APP, "-w", "2", "--max-requests", "300", "--max-requests-jitter", "50") as g:
        wait_until(lambda: len(worker_pids(g.proc.pid)) == 2, what="2 workers")
        first = set(worker_pids(g.proc.pid))
        with Clients(g.port) as c:
            wait_until(
                lambda: g.logs().count("Autorestarting worker") >= ROUNDS,
                timeout=30 + ROUNDS * 2,
                what=f"{ROUNDS} recycled workers",
            )
        assert not first & set(worker_pids(g.proc.pid))
    assert c.ok > ROUNDS * 250
    print(f"max-requests: {c.ok} POSTs, {len(c.failed)} failed, {c.closes} closed by Connection: close")
    assert c.failed == [], f"{len(c.failed)} of {c.ok + len(c.failed)} POSTs failed: {c.failed[:5]}"


def test_no_post_fails_across_two_hups():
    with gunicorn(APP, "-w", "2") as g:
        wait_until(lambda: len(worker_pids(g.proc.pid)) == 2, what="2 workers")
        with Clients(g.port) as c:
            for _ in range(2):
                before = set(worker_pids(g.proc.pid))
                wait_until(lambda: c.ok > 300, what="traffic")
                g.send_signal(signal.SIGHUP)
                wait_until(
                    lambda before=before: len(set(worker_pids(g.proc.pid)) - before) == 2
                    and not before & set(worker_pids(g.proc.pid)),
                    timeout=30,
                    what="the old workers replaced",
                )
                served = c.ok
                wait_until(lambda served=served: c.ok > served + 300, what="traffic on the new workers")
    print(f"HUP: {c.ok} POSTs, {len(c.failed)} failed, {c.closes} closed by Connection: close")
    assert c.failed == [], f"{len(c.failed)} of {c.ok + len(c.failed)} POSTs failed: {c.failed[:5]}"


def migrates_requests() -> bool:
    """`net.ipv4.tcp_migrate_req` is on: the kernel moves connections
    queued on a closing `SO_REUSEPORT` socket to another of its group."""
    try:
        return Path("/proc/sys/net/ipv4/tcp_migrate_req").read_text().strip() == "1"
    except OSError:
        return False


def test_reuse_port_recycling_and_a_hup_reset_no_queued_connection():
    # With reuse_port Gunicorn binds a socket in each worker, and the kernel
    # hands each socket its share of new connections until it leaves the
    # group. Before, a worker that stopped accepting kept its socket open
    # until it exited, and the connections queued on it meanwhile were
    # reset (37 and 45 of ~6,700 POSTs over 24 recycles and a HUP). Now it
    # takes what is queued and shuts the socket down. A connection whose
    # handshake completes between its last accept and the shutdown is
    # still reset unless the kernel migrates it (`tcp_migrate_req`): 0 or 1
    # per run here, hence the allowance.
    # (Bound by address: an `fd://` socket is one socket shared by every
    # worker even with reuse_port.)
    rounds = max(ROUNDS // 2, 4)
    port = free_port()
    cmd = [PY, "-m", "gunicorn", "-k", "skirr.RustWorker", "--graceful-timeout", "5", "-w", "2", "--reuse-port"]
    cmd += ["--max-requests", "300", "--max-requests-jitter", "50", "-b", f"127.0.0.1:{port}", APP]
    g = start(cmd, sock=None, port=port, uds=None)
    try:
        wait_until(lambda: len(worker_pids(g.proc.pid)) == 2, what="2 workers")
        with Clients(port, n=2) as kept, Clients(port, n=2, fresh=True) as fresh:
            wait_until(
                lambda: g.logs().count("Autorestarting worker") >= rounds,
                timeout=30 + rounds * 3,
                what=f"{rounds} recycled workers",
            )
            before = set(worker_pids(g.proc.pid))
            g.send_signal(signal.SIGHUP)
            wait_until(
                lambda: not before & set(worker_pids(g.proc.pid)),
                timeout=30,
                what="the old workers replaced",
            )
            served = fresh.ok
            wait_until(lambda: fresh.ok > served + 100, what="traffic on the new workers")
    finally:
        g.stop(timeout=15)
    print(
        f"reuse_port: {kept.ok} + {fresh.ok} POSTs (keep-alive + new connections), "
        f"{len(kept.failed)} + {len(fresh.failed)} failed"
    )
    assert fresh.ok > rounds * 50
    assert kept.failed == [], f"{len(kept.failed)} keep-alive POSTs failed: {kept.failed[:5]}"
    allowed = 0 if migrates_requests() else 2
    assert len(fresh.failed) <= allowed, f"{len(fresh.failed)} new-connection POSTs failed: {fresh.failed[:5]}"


class Probe:
    """Keep-alive connections to chosen workers (the kernel picks the worker
    that accepts, often the same one many times over), counting the requests
    each worker served while they were found: those count toward
    `--max-requests` too. A miss waits a little: a worker that is still
    booting accepts nothing yet."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.served: dict[int, int] = {}

    def connect(self, want=lambda pid: True, tries: int = 40) -> tuple[int, http.client.HTTPConnection]:
        """A connection to the first worker whose pid `want` accepts."""
        for _ in range(tries):
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
            c.request("GET", "/pid")
            pid = int(c.getresponse().read())
            self.served[pid] = self.served.get(pid, 0) + 1
            if want(pid):
                return pid, c
            c.close()
            time.sleep(0.1)
        raise AssertionError(f"no wanted worker accepted in {tries} connections: {self.served}")


def _new_connection_answered(port: int, within: float) -> bool:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=within)
        c.request("GET", "/healthz", headers={"Connection": "close"})
        ok = c.getresponse().status == 200
        c.close()
        return ok
    except OSError:
        return False


def test_a_worker_at_max_requests_keeps_serving_while_another_drains():
    # Worker A drains for a while (a request in progress); worker B reaches
    # --max-requests meanwhile. Before issue 23 B drained too, and new
    # connections waited in the backlog until A's replacement booted.
    limit = 100
    with gunicorn(APP_PROBE, "-w", "2", "--max-requests", str(limit), "--graceful-timeout", "20") as g:
        wait_until(lambda: len(worker_pids(g.proc.pid)) == 2, what="2 workers")
        # Finding a connection to each worker costs up to 120 requests, all
        # counted toward the limit: the limit leaves room for them, and the
        # loops below go by what each worker has served.
        probe = Probe(g.port)
        pa, ca = probe.connect()
        pb, cb = probe.connect(lambda pid: pid != pa)
        # A second connection to A carries the request that holds its drain.
        _, hold = probe.connect(lambda pid: pid == pa)
        print(f"requests per worker in setup: {probe.served}")
        # 8 s: A still drains after the ~200 requests below on a loaded machine.
        hold.request("GET", "/sleep?secs=8")
        # A reaches its limit: its response says close, it drains (+2 is
        # slack: the loop ends at that response).
        for _ in range(limit - probe.served[pa] + 2):
            ca.request("GET", "/")
            r = ca.getresponse()
            r.read()
            if r.will_close:
                break
        else:
            raise AssertionError(f"worker A never reached max-requests ({probe.served})")
        ca.close()
        # B goes past its limit while A drains: it keeps serving, and new
        # connections are answered (by B).
        for i in range(limit - probe.served[pb] + 10):
            cb.request("GET", "/pid")
            r = cb.getresponse()
            assert (r.status, int(r.read())) == (200, pb)
            assert not r.will_close, f"B stopped at request {i} while A was draining"
        assert pa in worker_pids(g.proc.pid), "A still drains"
        probes = [_new_connection_answered(g.port, within=2.0) for _ in range(5)]
        assert all(probes), probes
        r = hold.getresponse()
        assert (r.status, r.read()) == (200, b"slept")
        # Once A's replacement accepts, B recycles.
        wait_until(lambda: g.logs().count("Autorestarting worker") >= 2, timeout=30, what="B's recycle")
        wait_until(
            lambda: len(worker_pids(g.proc.pid)) == 2 and not {pa, pb} & set(worker_pids(g.proc.pid)),
            timeout=30,
            what="both replaced",
        )
        assert "serving on until it accepts" in g.logs()
        cb.close()
        hold.close()


def test_recycles_with_slow_clients_leave_no_gap():
    # The shortened soak of issue 23 (bench/recycle_gap.py): -w 2 recycling
    # every ~300 requests under 4 POSTers, with 10 slowloris connections and
    # 4 clients that read nothing attached; a probe opens a new connection
    # every 0.1 s. Before issue 23: probes failed (5 in 40 s) and for ~27 of
    # 40 s no worker accepted.
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    args = ["-w", "2", "--duration", "12", "--max-requests", "300", "--jitter", "30", "--graceful-timeout", "10"]
    out = subprocess.run(
        [sys.executable, str(root / "bench" / "recycle_gap.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    r = json.loads(out.strip().splitlines()[-1])
    print(r)
    assert r["recycles"] >= 2
    assert r["posts_failed"] == 0, r["post_failures"]
    assert r["probes_failed"] == 0
    assert r["probes_ok"] > 50
    # Probes answered at once throughout: no second without a worker
    # accepting (before: most of them).
    assert r["no_worker_accepted_s"] < 1.5, r
