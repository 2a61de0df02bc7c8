"""`python -m skirr`: loading apps, binding, clear errors."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile

import pytest
from harness import PY, ROOT, RawConn, _env, listening_socket, request, skirr, wait_until


def run_cli(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "skirr", *args], cwd=str(ROOT), env=_env(None), capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "app,words",
    [
        ("nosuchmodule:app", ["cannot import module", "nosuchmodule"]),
        ("tests.apps.broken_import:app", ["imports 'this_module_does_not_exist'", "not installed"]),
        ("tests.apps.variants:missing", ["has no attribute", "missing"]),
        ("tests.apps.variants:not_callable", ["not callable"]),
        ("no-colon", ["module:attribute"]),
    ],
)
def test_bad_app_prints_one_line_and_exits_nonzero(app, words):
    p = run_cli(app, "--port", "0")
    assert p.returncode == 1
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("skirr: error:")
    for w in words:
        assert w in lines[0]


def test_failing_factory_is_one_line():
    p = run_cli("tests.apps.variants:broken_factory", "--factory", "--port", "0")
    assert p.returncode == 1
    assert "factory cannot start" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_port_in_use_is_one_line():
    busy = listening_socket()
    try:
        p = run_cli("apps.probe:app", "--app-dir", "tests", "--port", str(busy.getsockname()[1]))
    finally:
        busy.close()
    assert p.returncode == 1
    assert "address already in use" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_factory():
    with skirr("tests.apps.variants:create_app", "--factory") as s:
        assert request(s.port).body == b"from factory"


def test_asgi2_class_app():
    with skirr("tests.apps.variants:ASGI2App") as s:
        assert request(s.port, "GET", "/x").body == b"asgi2 /x"


def test_asgi2_function_app():
    with skirr("tests.apps.variants:asgi2_function") as s:
        assert request(s.port).body == b"asgi2-function"


def test_asgi3_instance_app():
    with skirr("tests.apps.variants:instance_app") as s:
        assert request(s.port).body == b"instance"


def test_unix_socket():
    path = os.path.join(tempfile.mkdtemp(), "skirr.sock")
    proc = subprocess.Popen(
        [PY, "-m", "skirr", "apps.probe:app", "--app-dir", "tests", "--uds", path],
        cwd=str(ROOT),
        env=_env(None),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: os.path.exists(path), what="socket file")

        def answered():
            try:
                with RawConn(path=path, timeout=2) as c:
                    c.send(b"GET /scope HTTP/1.1\r\nHost: x\r\n\r\n")
                    return c.read_response()
            except OSError:
                return None

        r = wait_until(answered, what="unix socket answer")
        assert r.status == 200
        assert b'"client": null' in r.body
        assert f'"server": ["{path}", null]'.encode() in r.body
    finally:
        proc.terminate()
        proc.wait(10)
    assert not os.path.exists(path), "the socket file is removed at exit"


def test_host_and_port_binding():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen(
        [PY, "-m", "skirr", "apps.probe:app", "--app-dir", "tests", "--host", "127.0.0.1", "--port", str(port)],
        cwd=str(ROOT),
        env=_env(None),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def up():
            try:
                return request(port).status == 200
            except OSError:
                return False

        wait_until(up, what="server on --port")
    finally:
        proc.terminate()
        proc.wait(10)


def test_access_log_line_per_request():
    with skirr("apps.probe:app") as s:
        request(s.port, "GET", "/scope?a=1")
        wait_until(lambda: '"GET /scope?a=1 HTTP/1.1" 200' in s.logs(), what="access line")
    with skirr("apps.probe:app", "--no-access-log") as s:
        request(s.port, "GET", "/scope?a=1")
        assert '"GET /scope?a=1' not in s.logs()


def test_invalid_option_value_is_one_line():
    p = run_cli("apps.probe:app", "--app-dir", "tests", "--lifespan", "sometimes")
    assert p.returncode == 1
    assert "--lifespan" in p.stderr and "auto, on, off" in p.stderr


def test_port_out_of_range_is_one_line():
    p = run_cli("apps.probe:app", "--app-dir", "tests", "--port", "99999")
    assert p.returncode != 0
    assert "Traceback" not in p.stderr and "port must be 0-65535" in p.stderr


def test_uvloop_asked_for_but_missing_is_one_line(tmp_path):
    # uvloop is installed with the test extra: hide it (a None entry in
    # sys.modules makes it unimportable) through a sitecustomize module.
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['uvloop'] = None\n")
    env = _env(None)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    p = subprocess.run(
        [PY, "-m", "skirr", "apps.probe:app", "--app-dir", "tests", "--port", "0", "--loop", "uvloop"],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and "'uvloop' is not installed" in p.stderr, p.stderr


def test_environment_variables_set_options():
    with skirr("apps.probe:app", env={"SKIRR_ROOT_PATH": "/env"}) as s:
        assert b'"root_path": "/env"' in request(s.port, "GET", "/scope").body


def test_misspelt_environment_variable_is_named():
    env = {"SKIRR_ROOT_PAHT": "/env", "SKIRR_SOMETHING_ELSE": "1", "SKIRR_HTTP2": "1"}
    with skirr("apps.probe:app", env=env) as s:
        assert request(s.port, "GET", "/").status == 200
        logs = s.logs()
        assert "ignoring SKIRR_ROOT_PAHT: no such option (did you mean SKIRR_ROOT_PATH?)" in logs
        assert "ignoring SKIRR_HTTP2: --http2 (a python -m skirr flag) has no environment variable" in logs
        assert "SKIRR_SOMETHING_ELSE" not in logs


def test_sigint_shuts_down_gracefully():
    import signal

    with skirr("apps.probe:app") as s:
        s.send_signal(signal.SIGINT)
        assert s.wait(10) == 0
        assert "Traceback" not in s.logs()


def test_sigint_after_sigterm_forces_the_stop():
    # As under uvicorn: a SIGINT after any first stop signal closes
    # everything at once, rather than waiting out graceful_timeout (30 s)
    # for the request in flight.
    import signal
    import time

    with skirr("apps.probe:app", "--graceful-timeout", "30", "--health-path", "/_h") as s:
        with RawConn(s.port, timeout=40) as c, RawConn(s.port, timeout=5) as probe:

            def health() -> int:
                probe.send(b"GET /_h HTTP/1.1\r\nHost: x\r\n\r\n")
                return probe.read_response().status

            assert health() == 200
            c.send(b"GET /sleep?secs=60 HTTP/1.1\r\nHost: x\r\n\r\n")
            in_app = lambda: "/sleep" in request(s.port, "GET", "/paths").body.decode()  # noqa: E731
            wait_until(in_app, what="the request in the app")
            s.send_signal(signal.SIGTERM)
            wait_until(lambda: health() == 503, what="the drain")
            t0 = time.monotonic()
            s.send_signal(signal.SIGINT)
            assert s.wait(15) == 0
            assert time.monotonic() - t0 < 10, "SIGINT did not force the stop"
