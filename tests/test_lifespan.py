"""The lifespan protocol (ASGI Lifespan spec 2.0)."""

from __future__ import annotations

import json
import signal
import time

from harness import request, skirr, wait_until


def test_startup_runs_before_the_first_request_and_state_reaches_scopes():
    with skirr("apps.probe:app", "--no-access-log") as s:
        events = json.loads(request(s.port, "GET", "/events").body)
        assert events[0] == "startup"
        st = json.loads(request(s.port, "GET", "/state").body)
        assert st["started"] is True


def test_no_connection_is_served_before_startup_completes():
    env = {"PROBE_LIFESPAN": "slow-startup", "PROBE_STARTUP_DELAY": "1.0"}
    with skirr("apps.probe:app", "--no-access-log", env=env, ready=False) as s:
        t0 = time.monotonic()
        r = request(s.port, "GET", "/events")  # connects at once, answered after startup
        assert time.monotonic() - t0 > 0.7
        assert json.loads(r.body)[0] == "startup"


def test_startup_failed_exits_3_with_the_apps_message():
    with skirr("apps.probe:app", env={"PROBE_LIFESPAN": "fail"}, ready=False) as s:
        assert s.wait(15) == 3
        assert "database unreachable" in s.logs()


def test_listening_is_announced_only_after_startup_succeeded():
    # A reader of the log must not see "listening at" from a server whose
    # startup then fails (c47abb2 printed it first).
    with skirr("apps.probe:app", env={"PROBE_LIFESPAN": "fail"}, ready=False) as s:
        assert s.wait(15) == 3
        assert "database unreachable" in s.logs()
        assert "listening at" not in s.logs()
    env = {"PROBE_LIFESPAN": "slow-startup", "PROBE_STARTUP_DELAY": "0.5"}
    with skirr("apps.probe:app", env=env) as s:
        wait_until(lambda: "listening at" in s.logs(), what="the listening line")


def test_startup_exception_in_on_mode_exits_3_with_traceback():
    with skirr("apps.probe:app", "--lifespan", "on", env={"PROBE_LIFESPAN": "raise"}, ready=False) as s:
        assert s.wait(15) == 3
        log = s.logs()
        assert "startup exploded" in log and "Traceback" in log
        # The app speaks lifespan and raised: not "does not support".
        assert "exception in the lifespan protocol" in log


def test_auto_mode_serves_an_app_without_lifespan_support():
    with skirr("apps.probe:app", env={"PROBE_LIFESPAN": "ignore"}) as s:
        assert request(s.port).status == 200
        assert "lifespan' protocol appears unsupported" in s.logs()


def test_on_mode_refuses_an_app_without_lifespan_support():
    with skirr("apps.probe:app", "--lifespan", "on", env={"PROBE_LIFESPAN": "ignore"}, ready=False) as s:
        assert s.wait(15) == 3


def test_off_mode_sends_no_lifespan_events():
    with skirr("apps.probe:app", "--lifespan", "off") as s:
        assert json.loads(request(s.port, "GET", "/events").body) == []


def test_shutdown_runs_after_sigterm(tmp_path):
    marker = tmp_path / "shutdown"
    with skirr("apps.probe:app", env={"PROBE_SHUTDOWN_FILE": str(marker)}) as s:
        assert request(s.port).status == 200
        s.send_signal(signal.SIGTERM)
        assert s.wait(15) == 0
    assert marker.read_text() == "shutdown"


def test_shutdown_is_bounded_in_time():
    # The probe's shutdown handler never runs for "slow-startup"... so use an
    # app whose lifespan never answers shutdown: startup only.
    with skirr("tests.apps.stuck:app", "--lifespan-timeout", "1") as s:
        assert request(s.port).status == 200
        t0 = time.monotonic()
        s.send_signal(signal.SIGTERM)
        assert s.wait(15) == 0
        assert time.monotonic() - t0 < 5
        assert "lifespan shutdown did not complete" in s.logs()
