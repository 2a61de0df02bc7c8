"""Signals: ``loop.add_signal_handler()`` works on Skirr's loop (which runs
in a thread) for the signals Skirr does not use itself, standalone and under
Gunicorn; Skirr's own signals are refused with a clear error."""

from __future__ import annotations

import json
import os
import signal

import pytest
from frameworks.servers import uvicorn
from harness import SINGLE_MODE, gunicorn, request, skirr, wait_until, worker_pids

APP = "apps.signals_app:app"

#: The loop's thread: its own in loop_mode dual, the main thread in single.
LOOP = "MainThread" if SINGLE_MODE else "skirr-asyncio"


def state(port: int) -> dict:
    return json.loads(request(port, "GET", "/signals").body)


def usr2_runs_the_apps_handler(port: int, pid: int) -> None:
    os.kill(pid, signal.SIGUSR2)
    wait_until(lambda: len(state(port)["got"]) == 1, what="the SIGUSR2 handler")
    os.kill(pid, signal.SIGUSR2)
    got = wait_until(lambda: (lambda g: g if len(g) == 2 else None)(state(port)["got"]), what="a second run")
    # On the loop's thread, with the registration's arguments.
    assert got == [f"usr2@{LOOP}"] * 2


def test_standalone_app_handles_sigusr2_and_cannot_take_skirrs_signals():
    with skirr(APP, "--no-access-log", "--lifespan", "on") as s:
        results = state(s.port)["results"]
        for name in ("SIGTERM", "SIGUSR1"):
            assert results[name].startswith("RuntimeError: "), results
            assert name in results[name] and "Skirr" in results[name], results[name]
        assert results["SIGHUP"] == "ok", "standalone, HUP is the app's to take"
        assert results["SIGKILL"] == "RuntimeError: sig 9 cannot be caught"
        usr2_runs_the_apps_handler(s.port, s.proc.pid)
        os.kill(s.proc.pid, signal.SIGHUP)
        wait_until(lambda: f"hup@{LOOP}" in state(s.port)["got"], what="the SIGHUP handler")
        # Removed: the signal is ignored from then on (the worker lives on).
        assert json.loads(request(s.port, "GET", "/remove").body) is True
        os.kill(s.proc.pid, signal.SIGUSR2)
        assert state(s.port)["got"].count(f"usr2@{LOOP}") == 2
        assert s.proc.poll() is None
        # Skirr's own signals still do their work.
        assert s.stop(signal.SIGTERM) == 0


def test_gunicorn_worker_app_handles_sigusr2_and_gunicorns_signals_are_refused():
    with gunicorn(APP, "-w", "1", env={"SKIRR_LIFESPAN": "on"}) as g:
        results = state(g.port)["results"]
        assert "SIGTERM" in results["SIGTERM"] and "Skirr" in results["SIGTERM"]
        assert results["SIGHUP"].startswith("RuntimeError: SIGHUP is Skirr's (Gunicorn's reload")
        (worker,) = wait_until(lambda: worker_pids(g.proc.pid), what="the worker")
        usr2_runs_the_apps_handler(g.port, worker)
        assert worker_pids(g.proc.pid) == [worker], "the worker was not replaced"


@pytest.mark.parametrize("server", ["skirr-single", "uvicorn"])
def test_signal_signal_in_single_mode_replaces_the_stop_handler_as_under_uvicorn(server):
    # In single mode the app runs on the main thread, as under uvicorn: its
    # signal.signal(SIGTERM, ...) replaces the server's handler there too.
    # SIGTERM then runs the app's handler and the server keeps serving;
    # SIGINT still stops it.
    app = "apps.signal_signal_app:app"
    if server == "uvicorn":
        serving = uvicorn(app)
    else:
        serving = skirr(app, "--loop-mode", "single", "--loop", "asyncio", "--no-access-log")
    with serving as s:
        assert json.loads(request(s.port, "GET", "/take").body) == []
        s.proc.send_signal(signal.SIGTERM)
        got = wait_until(lambda: json.loads(request(s.port, "GET", "/got").body), what="the app's handler")
        assert got == ["SIGTERM@MainThread"]
        assert s.proc.poll() is None
        assert s.stop(signal.SIGINT) == 0
