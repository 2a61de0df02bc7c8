"""``loop_mode single``: the asyncio loop and the Tokio runtime on one
thread (rust/src/server/single.rs, skirr.serve.TokioSelector). Each test
pins the mode on the command line (or for Gunicorn in the environment), so
the file means the same whatever ``SKIRR_LOOP_MODE`` the suite runs with;
the rest of the suite runs in single mode with ``SKIRR_LOOP_MODE=single``."""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time

import pytest
from harness import RawConn, gunicorn, process_gone, request, skirr, wait_until
from websockets.sync.client import connect

APP = "apps.loop_mode_app:app"
SINGLE = ("--loop-mode", "single", "--loop", "asyncio")


def get_json(port: int, path: str) -> dict:
    r = request(port, "GET", path)
    assert r.status == 200, r
    return json.loads(r.body)


@pytest.fixture(scope="module")
def single():
    with skirr(APP, *SINGLE, "--no-access-log") as s:
        yield s


def test_single_mode_runs_one_thread_with_tokio_in_the_selector(single):
    info = get_json(single.port, "/info")
    assert info["thread"] == "MainThread"
    # The stand-in only runs Tokio while the app keeps this thread away.
    assert info["thread_names"] == ["skirr-stand-in"]
    assert info["selector"] == "TokioSelector"
    assert "SelectorEventLoop" in "".join(info["loop"])
    assert info["task"] == "Task"
    assert request(single.port, "GET", "/").body == b"ok"


def test_dual_mode_is_two_threads():
    with skirr(APP, "--loop-mode", "dual", "--loop", "asyncio", "--no-access-log") as s:
        info = get_json(s.port, "/info")
        assert info["thread"] == "skirr-asyncio"
        assert info["os_threads"] == 2


def test_keep_alive_requests_and_concurrent_clients(single):
    with RawConn(single.port) as c:
        for _ in range(20):
            c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            r = c.read_response()
            assert r.status == 200 and r.body == b"ok"
    results = []

    def one():
        results.append(request(single.port, "GET", "/").body)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [b"ok"] * 16


def test_streaming_response(single):
    r = request(single.port, "GET", "/stream?20")
    assert r.status == 200
    assert r.body == b"".join(b"chunk %d\n" % i for i in range(20))


def test_websocket_echo(single):
    with connect(f"ws://127.0.0.1:{single.port}/echo", open_timeout=10, close_timeout=5) as ws:
        for i in range(50):
            ws.send(f"message {i}")
            assert ws.recv(timeout=5) == f"message {i}"
        ws.send(b"\x00\x01" * 5000)
        assert ws.recv(timeout=5) == b"\x00\x01" * 5000


def test_contextvars_are_isolated_per_request(single):
    results = {}

    def one(i):
        results[i] = get_json(single.port, f"/contextvar?{i}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == {i: {"before": None, "after": str(i)} for i in range(10)}


def test_task_factory_is_used():
    with skirr(APP, *SINGLE, "--no-access-log") as s:
        before = int(request(s.port, "GET", "/factory?on").body)
        assert get_json(s.port, "/info")["task"] == "Task"
        after = int(request(s.port, "GET", "/factory?off").body)
        assert after >= before + 2, (before, after)


def test_thread_pool_work_and_its_wakeup(single):
    # The executor thread needs the GIL while the loop waits in a turn, and
    # its result reaches the loop through call_soon_threadsafe's self-pipe.
    r = request(single.port, "GET", "/executor")
    assert r.status == 200 and r.body.startswith(b"asyncio_")


def test_sigterm_stops_the_server_cleanly():
    with skirr(APP, *SINGLE) as s:
        assert request(s.port, "GET", "/").status == 200
        assert s.stop() == 0
        assert "Shut down" in s.logs()


def test_auto_runs_single_on_asyncios_loop():
    # loop_mode auto (the default): asyncio's loop runs single mode.
    with skirr(APP, "--loop", "asyncio", "--no-access-log") as s:
        info = get_json(s.port, "/info")
        assert (info["thread"], info["selector"], info["thread_names"]) == (
            "MainThread",
            "TokioSelector",
            ["skirr-stand-in"],
        )
        assert "loop_mode" not in s.logs()  # no warning


def test_auto_runs_dual_on_uvloop():
    # With uvloop installed, loop auto picks it (as uvicorn does), and
    # uvloop has no selector to run Tokio from: dual, without a warning.
    pytest.importorskip("uvloop")
    with skirr(APP, "--no-access-log") as s:
        info = get_json(s.port, "/info")
        assert info["thread"] == "skirr-asyncio"
        assert "uvloop" in info["loop_modules"], info
        assert "loop_mode" not in s.logs()


def test_auto_with_tokio_threads_runs_dual_and_says_so():
    # Several Tokio threads need a runtime of their own: dual, with one
    # info line naming why (not a warning: nothing asked for is refused).
    env = {"SKIRR_TOKIO_THREADS": "2"}
    with skirr(APP, "--loop", "asyncio", "--no-access-log", env=env) as s:
        info = get_json(s.port, "/info")
        assert info["thread"] == "skirr-asyncio"
        assert info["thread_names"].count("skirr-tokio") == 2, info
        lines = [line for line in s.logs().splitlines() if "loop_mode" in line]
        assert len(lines) == 1 and "[INFO]" in lines[0], lines
        assert "tokio_threads 2" in lines[0] and "running loop_mode dual" in lines[0], lines


def test_auto_under_gunicorn_runs_single_on_asyncios_loop():
    with gunicorn(APP, "-w", "1", env={"SKIRR_LOOP": "asyncio"}) as g:
        info = get_json(g.port, "/info")
        assert (info["thread"], info["selector"]) == ("MainThread", "TokioSelector")


def test_uvloop_asked_for_falls_back_to_dual_with_a_warning():
    pytest.importorskip("uvloop")
    with skirr(APP, "--loop-mode", "single", "--loop", "uvloop", "--no-access-log") as s:
        info = get_json(s.port, "/info")
        assert info["os_threads"] == 2
        assert "running loop_mode dual" in s.logs()


def test_stand_in_serves_while_the_app_blocks_the_loop():
    # The loop's thread sleeps in the app for 4 s; meanwhile the stand-in
    # thread runs Tokio: the health path is answered on an open connection
    # (new ones wait: a stalled worker leaves a shared socket to the other
    # workers), and once the loop has not turned for loop_stall_timeout it
    # says so; a request read but not started gets the watchdog's 503; the
    # blocked request still ends.
    args = (*SINGLE, "--health-path", "/_health", "--loop-stall-timeout", "0.5")
    with skirr(APP, *args) as s:
        with RawConn(s.port, timeout=15) as blocker, RawConn(s.port, timeout=5) as probe, RawConn(s.port) as queued:

            def health() -> tuple:
                probe.send(b"GET /_health HTTP/1.1\r\nHost: x\r\n\r\n")
                r = probe.read_response()
                return r.status, json.loads(r.body)["status"]

            assert health() == (200, "ok")
            blocker.send(b"GET /block?4 HTTP/1.1\r\nHost: x\r\n\r\n")
            wait_until(lambda: health() == (503, "loop stalled"), timeout=3, what="health to see the stall")
            queued.send(b"GET /pid HTTP/1.1\r\nHost: x\r\n\r\n")
            r = queued.read_response()
            assert (r.status, r.header("retry-after")) == (503, "1")
            # All of that was answered while the app still blocked.
            ready, _, _ = select.select([blocker.sock], [], [], 0)
            assert not ready, "the blocked request ended too soon for this test"
            assert blocker.read_response().body == b"blocked"
        wait_until(lambda: request(s.port, "GET", "/_health").status == 200, what="health back to ok")
        assert request(s.port, "GET", "/pid").status == 200
        assert s.stop() == 0
        assert "the stand-in thread ran Tokio" in s.logs()


def start_blocking(s, target: str) -> RawConn:
    """Sends a request for `target`, whose app call blocks the loop's
    thread; returns its connection once the health path, asked on a
    connection opened before (a stalled worker accepts no new ones), says
    the loop is stalled."""
    with RawConn(s.port, timeout=5) as probe:
        probe.send(b"GET /_health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert probe.read_response().status == 200
        blocker = RawConn(s.port, timeout=70)
        blocker.send(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % target.encode())

        def stalled() -> bool:
            probe.send(b"GET /_health HTTP/1.1\r\nHost: x\r\n\r\n")
            return probe.read_response().status == 503

        wait_until(stalled, timeout=5, interval=0.1, what="the loop to stall")
    return blocker


@pytest.mark.parametrize(
    ("mode", "sig", "target"),
    [
        ("single", signal.SIGTERM, "/block?60"),
        ("single", signal.SIGINT, "/spin?60"),
        ("single", signal.SIGQUIT, "/regex"),
        ("dual", signal.SIGTERM, "/block?60"),
        ("dual", signal.SIGQUIT, "/spin?60"),
        ("dual", signal.SIGTERM, "/regex"),
    ],
)
def test_a_stop_with_the_loop_blocked_for_good_exits_after_five_seconds(mode, sig, target):
    # The app keeps the loop's thread for good: a blocking sleep, a
    # pure-Python busy loop, or a C call that holds the GIL. A stop signal
    # drains on Tokio's side (the stand-in in single mode):
    # graceful_timeout 1 s for the blocked request, lifespan_timeout 1 s
    # for lifespan shutdown (TERM and INT; QUIT is quick). Then the loop
    # cannot stop: 5 s later the worker writes its last lines and exits
    # with status 0 (rust/src/server/give_up.rs) — not an abort from an
    # interpreter shutdown under a thread still in the app.
    args = ("--loop-mode", mode, "--loop", "asyncio", "--health-path", "/_health")
    args += ("--loop-stall-timeout", "0.3", "--graceful-timeout", "1", "--lifespan-timeout", "1")
    with skirr(APP, *args) as s:
        with start_blocking(s, target) as blocker:
            t0 = time.monotonic()
            s.proc.send_signal(sig)
            assert blocker.is_closed(timeout=10), "the drain must close the blocked request's connection"
            assert s.proc.wait(timeout=25) == 0
            # Not before the loop had its 5 s to come back.
            assert time.monotonic() - t0 > 5
        logs = s.logs()
        assert "the event loop did not stop within 5s of the server's end (the app blocks its thread): exiting" in logs
        if target != "/regex":
            # Lines queued before it are written too, through Python's
            # logging (with the GIL held for good, only the last line
            # gets out, on stderr).
            assert "the event loop has not run for" in logs, logs


def test_a_worker_blocked_for_good_exits_when_the_master_dies():
    # Gunicorn's master is killed while its worker's app blocks the loop:
    # the orphan's parent check stops the server on the stand-in, and the
    # process exits 5 s later instead of outliving the master for 60 s.
    env = {
        "SKIRR_LOOP_MODE": "single",
        "SKIRR_LOOP": "asyncio",
        "SKIRR_HEALTH_PATH": "/_health",
        "SKIRR_LOOP_STALL_TIMEOUT": "0.3",
    }
    with gunicorn(APP, "-w", "1", "--timeout", "120", env=env) as g:
        worker = int(request(g.port, "GET", "/pid").body)
        with start_blocking(g, "/block?60"):
            os.kill(g.proc.pid, signal.SIGKILL)
            g.wait(5)
            wait_until(lambda: process_gone(worker), timeout=15, what="the orphaned worker to exit")
        assert "the event loop did not stop within 5s" in g.logs()


def test_gunicorn_heartbeat_keeps_a_long_request_alive():
    with gunicorn(APP, "-w", "1", "--timeout", "2", env={"SKIRR_LOOP_MODE": "single", "SKIRR_LOOP": "asyncio"}) as g:
        before = int(request(g.port, "GET", "/pid").body)
        assert get_json(g.port, "/info")["thread_names"] == ["skirr-stand-in"]
        r = request(g.port, "GET", "/sleep?4")
        assert r.status == 200 and r.body == b"slept"
        assert int(request(g.port, "GET", "/pid").body) == before


ABORT_HOOK = """
import os
def worker_abort(worker):
    with open(os.environ["HOOK_LOG"], "a") as f:
        f.write(f"worker_abort {worker.pid}\\n")
"""


def test_gunicorn_timeout_replaces_a_worker_whose_loop_blocks(tmp_path):
    # Gunicorn's SIGABRT reaches both Python's handler (the blocked thread)
    # and Tokio's (on the stand-in): worker_abort runs once.
    conf, log = tmp_path / "conf.py", tmp_path / "hooks.log"
    conf.write_text(ABORT_HOOK)
    env = {"SKIRR_LOOP_MODE": "single", "SKIRR_LOOP": "asyncio", "HOOK_LOG": str(log)}
    with gunicorn(APP, "-w", "1", "--timeout", "2", "-c", str(conf), env=env) as g:
        before = int(request(g.port, "GET", "/pid").body)
        with RawConn(g.port, timeout=15) as c:
            c.send(b"GET /block?30 HTTP/1.1\r\nHost: x\r\n\r\n")
            assert c.is_closed(timeout=14), "the stuck worker must be killed"
        after = wait_until(lambda: int(request(g.port, "GET", "/pid").body), timeout=15, what="a new worker")
        assert after != before
        assert "WORKER TIMEOUT" in g.logs()
        assert log.read_text().splitlines() == [f"worker_abort {before}"]
