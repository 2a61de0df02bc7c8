"""Options for running behind load balancers (issue 19): ``health_path``
answered by the server itself, ``drain_delay`` on SIGTERM, and
``limit_concurrency``. Real sockets; a real Gunicorn master where the
issue asks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest
from harness import PY, ROOT, RawConn, gunicorn, request, skirr, wait_until, worker_pids

APP = "apps.probe:app"
HEALTH = {"SKIRR_HEALTH_PATH": "/_health"}


def paths(port: int) -> list:
    return json.loads(request(port, "GET", "/paths").body)


def health(port: int):
    r = request(port, "GET", "/_health")
    return r.status, json.loads(r.body)["status"]


def test_health_path_never_reaches_the_app_nor_the_access_log():
    with skirr(APP, "--health-path", "/_health") as s:
        with RawConn(s.port) as c:
            for _ in range(3):
                c.send(b"GET /_health HTTP/1.1\r\nHost: x\r\n\r\n")
                r = c.read_response()
                assert r.status == 200
                assert json.loads(r.body) == {"status": "ok"}
                assert r.header("content-type") == "application/json"
            c.send(b"HEAD /_health HTTP/1.1\r\nHost: x\r\n\r\n")
            r = c.read_response(head_request=True)
            assert r.status == 200 and r.header("content-length") == str(len(b'{"status": "ok"}'))
            c.send(b"GET /pid HTTP/1.1\r\nHost: x\r\n\r\n")
            assert c.read_response().status == 200
        assert "/_health" not in paths(s.port)
        wait_until(lambda: "GET /pid" in s.logs(), what="the access line of /pid")
        assert "/_health" not in s.logs()


def test_health_path_over_http2():
    curl = subprocess.run(["curl", "--version"], capture_output=True, text=True)
    if "HTTP2" not in curl.stdout:
        pytest.skip("curl without HTTP/2")
    h2c = ("--http-protocols", "h2,h1", "--http2-cleartext", "prior-knowledge")
    with skirr(APP, "--health-path", "/_health", *h2c) as s:
        out = subprocess.run(
            ["curl", "-s", "--max-time", "10", "--http2-prior-knowledge", "-w", " %{http_code} %{http_version}",
             f"{s.url}/_health"],
            capture_output=True, text=True, timeout=20,
        ).stdout  # fmt: skip
        assert out == '{"status": "ok"} 200 2', out
        assert "/_health" not in paths(s.port)


def test_health_path_says_starting_until_lifespan_startup_completes():
    env = {"PROBE_LIFESPAN": "slow-startup", "PROBE_STARTUP_DELAY": "3"}
    with skirr(APP, "--health-path", "/_health", env=env, ready=False) as s:
        wait_until(lambda: _health_or_none(s.port) == (503, "starting"), what="health to say starting")
        # An ordinary request waits for startup, then is served.
        r = request(s.port, "GET", "/events")
        assert r.status == 200 and json.loads(r.body) == ["startup"]
        assert health(s.port) == (200, "ok")


def test_a_starting_worker_leaves_a_shared_socket_to_the_worker_that_serves():
    # -w 2 on Gunicorn's shared socket: a worker replaced (here killed)
    # spends 3 s in lifespan startup. Accepting meanwhile (for "starting"
    # on the health path) it took about half of the new connections, which
    # waited for its startup, and probes flapped to 503 while the other
    # worker served. It now accepts once started; the other takes them all.
    env = {**HEALTH, "PROBE_LIFESPAN": "slow-startup", "PROBE_STARTUP_DELAY": "3"}
    with gunicorn(APP, "-w", "2", env=env) as g:
        wait_until(lambda: len(worker_pids(g.proc.pid)) == 2, what="2 workers")
        wait_until(lambda: _health_or_none(g.port) == (200, "ok"), timeout=20, what="a worker serving")
        old = set(worker_pids(g.proc.pid))
        seen = set()
        # Both serving: each has answered /pid (the kernel picks the one).
        wait_until(
            lambda: seen.add(int(request(g.port, "GET", "/pid").body)) or seen == old,
            timeout=20,
            what="both workers serving",
        )
        os.kill(sorted(old)[0], signal.SIGKILL)
        wait_until(lambda: len(set(worker_pids(g.proc.pid)) - old) == 1, what="a replacement")
        answers, slow = [], []
        end = time.monotonic() + 2.0  # inside the replacement's startup
        while time.monotonic() < end:
            t = time.monotonic()
            answers.append(_health_or_none(g.port))
            if time.monotonic() - t > 1.0:
                slow.append(round(time.monotonic() - t, 2))
        assert answers and all(a == (200, "ok") for a in answers), answers
        assert slow == [], slow
        assert "starting" not in {a[1] for a in answers if a}


def _health_or_none(port: int):
    try:
        return health(port)
    except Exception:  # noqa: BLE001 - not answering yet
        return None


def test_limit_concurrency_refuses_with_503_and_health_stays_200_under_gunicorn():
    env = {**HEALTH, "SKIRR_LIMIT_CONCURRENCY": "2"}
    with gunicorn(APP, "-w", "1", "--access-logfile", "-", env=env) as g:
        # Both slow requests are sent before any probe connects, so they
        # are accepted and read first and hold both slots.
        slow = [RawConn(g.port, timeout=15) for _ in range(2)]
        for i, c in enumerate(slow):
            c.send(f"GET /sleep?secs=3&tag={i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        answered = []

        def refused():
            with RawConn(g.port) as c:
                c.send(b"GET /scope?probe HTTP/1.1\r\nHost: x\r\n\r\n")
                r = c.read_response()
            answered.append(r.status)
            return r if r.status == 503 else None

        r = wait_until(refused, what="both slots taken")
        assert r.header("retry-after") == "1"
        assert health(g.port) == (200, "ok")
        assert [c.read_response().status for c in slow] == [200, 200]
        for c in slow:
            c.close()
        # The refused request never reached the app.
        assert paths(g.port).count("/scope") == answered.count(200)
        wait_until(lambda: '"GET /scope?probe HTTP/1.1" 503' in g.logs(), what="the 503 in the access log")


def test_limit_concurrency_refuses_one_http2_stream_not_the_connection():
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("h2")
    h2c = ("--http-protocols", "h2,h1", "--http2-cleartext", "prior-knowledge")
    with skirr(APP, "--limit-concurrency", "1", "--health-path", "/_health", *h2c) as s:
        with RawConn(s.port, timeout=15) as slow:
            slow.send(b"GET /sleep?secs=3&tag=slow HTTP/1.1\r\nHost: x\r\n\r\n")
            wait_until(lambda: health(s.port) == (200, "ok") and _sleeping(s.port), what="the slow request in the app")
            # One connection, two streams: the app's path is refused, the health path answered.
            with httpx.Client(base_url=s.url, http1=False, http2=True, timeout=10) as client:
                refused = client.get("/pid")
                ok = client.get("/_health")
            assert (refused.http_version, refused.status_code, refused.headers["retry-after"]) == ("HTTP/2", 503, "1")
            assert (ok.http_version, ok.status_code, ok.json()) == ("HTTP/2", 200, {"status": "ok"})
            assert slow.read_response().status == 200
        assert "/pid" not in paths(s.port)


def _sleeping(port: int) -> bool:
    """Whether the slow request reached the app (asked on the health path's
    side: ``/paths`` would need a slot of its own)."""
    with RawConn(port) as c:
        c.send(b"GET /pid HTTP/1.1\r\nHost: x\r\n\r\n")
        return c.read_response().status == 503


@pytest.mark.parametrize("loop_mode", ["dual", "single"])
def test_health_turns_503_while_the_loop_is_blocked_under_gunicorn(loop_mode):
    # single: the stand-in thread answers while the loop's thread blocks.
    env = {**HEALTH, "SKIRR_LOOP_STALL_TIMEOUT": "0.5", "SKIRR_LOOP_MODE": loop_mode}
    if loop_mode == "single":
        env["SKIRR_LOOP"] = "asyncio"
    with gunicorn(APP, "-w", "1", "--timeout", "30", env=env) as g:
        with RawConn(g.port, timeout=15) as probe, RawConn(g.port, timeout=15) as blocker:
            def ask():
                probe.send(b"GET /_health HTTP/1.1\r\nHost: x\r\n\r\n")
                r = probe.read_response()
                return r.status, json.loads(r.body)["status"]

            assert ask() == (200, "ok")
            blocker.send(b"GET /block?secs=3 HTTP/1.1\r\nHost: x\r\n\r\n")
            wait_until(lambda: ask() == (503, "loop stalled"), what="health to report the stall")
            assert blocker.read_response().body == b"blocked"
        # (The probe connection idled past Gunicorn's 2 s keep-alive meanwhile.)
        wait_until(lambda: health(g.port) == (200, "ok"), what="health back to ok")


def test_drain_delay_health_503_while_new_connections_are_still_served():
    env = {**HEALTH, "SKIRR_DRAIN_DELAY": "3"}
    with gunicorn(APP, "-w", "1", "--graceful-timeout", "10", env=env) as g:
        pid = int(request(g.port, "GET", "/pid").body)
        g.send_signal(signal.SIGTERM)
        wait_until(lambda: health(g.port) == (503, "draining"), what="health to say draining")
        for _ in range(5):
            r = request(g.port, "GET", "/pid")
            assert r.status == 200 and int(r.body) == pid
        assert g.wait(20) == 0
        assert "drain_delay" in g.logs()


def test_drain_delay_not_shorter_than_graceful_timeout_is_a_boot_error():
    with gunicorn(APP, "-w", "1", "--graceful-timeout", "5", env={"SKIRR_DRAIN_DELAY": "5"}, ready=False) as g:
        assert g.wait(30) != 0
        log = g.logs()
        assert "drain_delay (5 s) must be shorter than graceful_timeout (5 s)" in log
        assert "Worker failed to boot" in log
    out = subprocess.run(
        [PY, "-m", "skirr", APP, "--port", "0", "--drain-delay", "40"],
        capture_output=True, text=True, timeout=30, cwd=str(ROOT), env={"PYTHONPATH": str(ROOT / "tests")},
    )  # fmt: skip
    assert out.returncode != 0
    assert "drain_delay (40 s) must be shorter than graceful_timeout (30 s)" in out.stderr


def test_no_failed_request_across_sigterm_with_a_drain_delay():
    """A client that stops sending once the health path turns 503 (as a
    load balancer removing the endpoint) loses nothing across a SIGTERM."""
    env = {**HEALTH, "SKIRR_DRAIN_DELAY": "2"}
    with gunicorn(APP, "-w", "1", "--graceful-timeout", "10", env=env) as g:
        statuses: list = []
        seen_draining = threading.Event()

        def client():
            while not seen_draining.is_set():
                if health(g.port)[0] == 503:
                    seen_draining.set()
                    return
                for _ in range(5):
                    try:
                        statuses.append(request(g.port, "POST", "/echo", body=b"x" * 1024).status)
                    except Exception as e:  # noqa: BLE001 - a failed request is what is counted
                        statuses.append(repr(e))

        t = threading.Thread(target=client)
        t.start()
        wait_until(lambda: len(statuses) >= 20, what="load")
        g.send_signal(signal.SIGTERM)
        t.join(20)
        assert seen_draining.is_set()
        assert statuses and set(statuses) == {200}, statuses
        assert g.wait(20) == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--health-path", "/"], "'/' would take the app's root page"),
        (["--health-path", "/_health?full=1"], "could never match a request's path (it contains '?')"),
        (["--health-path", "/a b"], "could never match a request's path (it contains ' ')"),
        (["--health-path", "/%5Fhealth"], "could never match a request's path (it contains '%')"),
        (["--loop-stall-timeout", "0.01"], "must be 0 (off) or at least 0.25 s, got 0.01"),
    ],
)
def test_a_health_path_that_cannot_match_or_a_flapping_stall_bound_is_refused(args, message):
    out = subprocess.run(
        [PY, "-m", "skirr", APP, "--port", "0", *args],
        capture_output=True, text=True, timeout=30, cwd=str(ROOT), env={"PYTHONPATH": str(ROOT / "tests")},
    )  # fmt: skip
    assert out.returncode != 0
    assert message in out.stderr, out.stderr
