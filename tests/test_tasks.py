"""The task that runs each request behaves like asyncio.Task for apps and
libraries (current_task, contextvars, anyio, asyncio.timeout, TaskGroup)."""

from __future__ import annotations

import json
import signal
import sys
import threading

import pytest
from harness import RawConn, request, skirr, wait_until

APP = "apps.tasks_app:app"


@pytest.fixture(scope="module")
def server():
    with skirr(APP, "--no-access-log") as s:
        yield s


def get(server, path):
    r = request(server.port, "GET", path)
    assert r.status == 200, r
    return json.loads(r.body)


def test_current_task_is_stable_across_steps(server):
    got = get(server, "/current-task")
    assert got == {
        "same": True,
        "not_none": True,
        "name": "skirr-request",
        "done": False,
        "coro_is_coroutine": True,
        "loop_ok": True,
    }


def test_context_variables_are_isolated_per_request(server):
    results = {}

    def one(i):
        results[i] = json.loads(request(server.port, "GET", f"/contextvar?{i}").body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for i, r in results.items():
        assert r == {"before": None, "after": str(i), "rid": str(i)}


def test_anyio_cancel_scopes(server):
    assert get(server, "/anyio-cancel-scope") == {"timed_out": True, "cancelled": True}


def test_anyio_task_groups(server):
    got = get(server, "/anyio-task-group")
    assert got["results"] == [0, 1, 2]
    assert got["err"] in ("ExceptionGroup", "ValueError", "BaseExceptionGroup")


def test_asyncio_timeout_taskgroup_wait_for_shield(server):
    got = get(server, "/asyncio-timeout")
    assert got["wait_for"] is True and got["shield"] == "shielded"
    if sys.version_info >= (3, 11):
        assert got["timeout"] is True
        assert got["cancelling_after"] == 0
        assert got["taskgroup"] == 3


def test_gather(server):
    assert get(server, "/gather") == {"gather": [0, 2, 4, 6, 8]}


def test_cancel_and_uncancel_own_task(server):
    assert get(server, "/self-cancel") == {"caught": True, "cancelling": 0}


def test_shutdown_cancels_suspended_requests_and_runs_finally(tmp_path):
    marker = tmp_path / "marker"
    with skirr(APP, "--graceful-timeout", "0.5", env={"TASKS_SHUTDOWN_FILE": str(marker)}) as s:
        c = RawConn(s.port)
        c.send(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_until(lambda: marker.exists() and "request-started" in marker.read_text(), what="request in app")
        s.send_signal(signal.SIGTERM)
        assert s.wait(20) == 0
        c.close()
    lines = marker.read_text().splitlines()
    assert "request-finally" in lines
    assert "lifespan-shutdown" in lines
