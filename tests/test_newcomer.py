"""What a newcomer meets in the first hour, each with one clear message:
an edit that breaks the import under ``--reload`` (a 500 carrying the
traceback until it is fixed), a WSGI app given to an ASGI server, an app
module that fails to import, TLS files that do not fit, a
``--uds`` path that is not a socket."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import time

import pytest
from harness import PY, ROOT, RawConn, _env, gunicorn, request, skirr, wait_until


def run_cli(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "skirr", *args], cwd=str(ROOT), env=_env(None), capture_output=True, text=True, timeout=timeout
    )


def one_error_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 1, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("skirr: error: "), p.stderr
    return lines[0]


# --- 1. --reload and an edit that breaks the import ---------------------------------------

GOOD = (
    "async def app(scope, receive, send):\n"
    "    if scope['type'] != 'http': return\n"
    "    await send({'type': 'http.response.start', 'status': 200, 'headers': []})\n"
    "    await send({'type': 'http.response.body', 'body': b'fixed'})\n"
)


def _body(port: int) -> bytes | None:
    try:
        return request(port).body
    except OSError:
        return None


def test_reload_serves_a_syntax_error_as_a_500_and_reloads_once_fixed(tmp_path):
    app = tmp_path / "editme.py"
    app.write_text("async def app(scope, receive, send):\n    await send({'type': }\n")
    with gunicorn("editme:app", "--reload", "--chdir", str(tmp_path), env={"PYTHONPATH": str(tmp_path)}) as g:
        r = request(g.port)
        assert r.status == 500
        body = r.body.decode()
        assert "SyntaxError" in body and f'File "{app}", line 2' in body, body
        assert "gunicorn" not in body, "the traceback starts at the app, not in the loader"
        logs = g.logs()
        assert "SyntaxError" in logs and "start_response" not in logs, logs
        time.sleep(1.1)  # mtime granularity of the reloader's poll
        app.write_text(GOOD)
        wait_until(lambda: _body(g.port) == b"fixed", timeout=20, what="the fixed app served after the reload")


# --- 2. a WSGI app given to an ASGI server -------------------------------------------------


def test_wsgi_app_standalone_stops_with_one_line():
    line = one_error_line(run_cli("apps.newcomer:wsgi_app", "--port", "0"))
    assert "'apps.newcomer:wsgi_app' is a WSGI application" in line
    assert "WsgiToAsgi" in line and "WSGI server" in line


def test_wsgi_app_under_gunicorn_stops_the_boot():
    with gunicorn("apps.newcomer:wsgi_app", ready=False) as g:
        assert g.wait(20) != 0, "the master halts: a restart would fail the same way"
        logs = g.logs()
    assert "[ERROR] skirr: 'apps.newcomer:wsgi_app' is a WSGI application" in logs, logs
    assert "Traceback" not in logs


@pytest.mark.parametrize(
    "app,body", [("apps.newcomer:partial_app", b"partial"), ("apps.newcomer:wrapped_app", b"wrapped")]
)
def test_asgi3_apps_that_are_not_coroutine_functions_are_served(app, body):
    with skirr(app, "--no-access-log") as s:
        assert request(s.port).body == body
        assert "Traceback" not in s.logs()


#: Builds each framework's app (those installed) and prints how Skirr sees it.
CLASSIFY = r"""
import json
from skirr.asgi import interface
from apps import newcomer, variants

found = {
    "asgi2 class": variants.ASGI2App,
    "asgi2 function": variants.asgi2_function,
    "async __call__ instance": variants.instance_app,
    "partial of async function": newcomer.partial_app,
    "sync middleware": newcomer.wrapped_app,
    "wsgi function": newcomer.wsgi_app,
}
try:
    from starlette.applications import Starlette
    from starlette.middleware.gzip import GZipMiddleware
    from fastapi import FastAPI
    found["starlette"] = Starlette()
    found["fastapi"] = FastAPI()
    found["starlette middleware"] = GZipMiddleware(FastAPI())
except ImportError:
    pass
try:
    import django
    from django.conf import settings
    settings.configure(ALLOWED_HOSTS=["*"], ROOT_URLCONF=__name__)
    urlpatterns = []
    django.setup()
    from django.core.handlers.asgi import ASGIHandler
    from django.core.handlers.wsgi import WSGIHandler
    found["django asgi"] = ASGIHandler()
    found["django wsgi"] = WSGIHandler()
except ImportError:
    pass
try:
    from litestar import Litestar
    found["litestar"] = Litestar()
except ImportError:
    pass
try:
    from quart import Quart
    found["quart"] = Quart("q")
except ImportError:
    pass
try:
    from flask import Flask
    from asgiref.wsgi import WsgiToAsgi
    found["flask"] = Flask("f")
    found["flask wrapped in WsgiToAsgi"] = WsgiToAsgi(Flask("f"))
except ImportError:
    pass
print(json.dumps({name: interface(app) for name, app in found.items()}))
"""

EXPECTED = {
    "asgi2 class": "asgi2",
    "asgi2 function": "asgi2",
    "async __call__ instance": "asgi3",
    "partial of async function": "asgi3",
    "sync middleware": "asgi3",
    "wsgi function": "wsgi",
    "starlette": "asgi3",
    "fastapi": "asgi3",
    "starlette middleware": "asgi3",
    "django asgi": "asgi3",
    "django wsgi": "wsgi",
    "litestar": "asgi3",
    "quart": "asgi3",
    "flask": "wsgi",
    "flask wrapped in WsgiToAsgi": "asgi3",
}


def test_frameworks_apps_are_told_apart():
    # In a child process: Django's settings are process-wide.
    p = subprocess.run([PY, "-c", CLASSIFY], cwd=str(ROOT), env=_env(None), capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    seen = json.loads(p.stdout.splitlines()[-1])
    assert {k: EXPECTED[k] for k in seen} == seen
    assert {"starlette", "fastapi"} <= seen.keys()


# --- 3. an app module that fails to import (standalone) -----------------------------------


def test_import_error_names_the_file_and_line():
    line = one_error_line(run_cli("tests.apps.keyerror_at_import:app", "--port", "0"))
    assert "KeyError: 'SECRET_KEY'" in line
    assert os.path.join("tests", "apps", "keyerror_at_import.py") + ", line 4" in line, line
    assert "--log-level debug" in line


def test_import_error_traceback_at_debug_starts_at_the_app():
    p = run_cli("tests.apps.keyerror_at_import:app", "--port", "0", "--log-level", "debug")
    assert p.returncode == 1
    assert "Traceback (most recent call last):" in p.stderr
    assert 'keyerror_at_import.py", line 4, in <module>' in p.stderr
    assert "importlib" not in p.stderr and "skirr/asgi.py" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("skirr: error: ")


def test_missing_dependency_is_not_reported_as_a_wrong_app_path():
    line = one_error_line(run_cli("nonexistent_dep_app:app", "--app-dir", "tests/apps", "--port", "0"))
    assert "the app module 'nonexistent_dep_app' imports 'nonexistent_dep', which is not installed" in line, line
    assert "nonexistent_dep_app.py, line 4" in line
    assert "cannot import module" not in line


def test_wrong_app_path_says_where_it_looked():
    line = one_error_line(run_cli("tests.apps.no_such_app:app", "--port", "0"))
    assert "cannot import module 'tests.apps.no_such_app'" in line
    assert str(ROOT) in line and "--app-dir" in line


# --- 4. standalone TLS: the files are checked before anything is announced ---------------


@pytest.fixture(scope="module")
def pem(tmp_path_factory):
    trustme = pytest.importorskip("trustme")
    d = tmp_path_factory.mktemp("pem")
    ca = trustme.CA()
    cert, other = ca.issue_cert("localhost"), ca.issue_cert("other.test")
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    other.private_key_pem.write_to_path(str(d / "other-key.pem"))
    (d / "combined.pem").write_bytes(cert.cert_chain_pems[0].bytes() + cert.private_key_pem.bytes())
    return {p.stem: str(p) for p in d.iterdir()}


def tls_cli(*tls: str) -> subprocess.CompletedProcess:
    return run_cli("apps.probe:app", "--app-dir", "tests", "--port", "0", *tls)


def test_certfile_without_key_names_the_certfile(pem):
    line = one_error_line(tls_cli("--ssl-certfile", pem["cert"]))
    assert f"--ssl-certfile {pem['cert']} holds no private key" in line and "--ssl-keyfile" in line


def test_missing_certfile_is_one_line_before_listening(pem, tmp_path):
    missing = str(tmp_path / "nope.pem")
    line = one_error_line(tls_cli("--ssl-certfile", missing, "--ssl-keyfile", pem["key"]))
    assert f"--ssl-certfile {missing}: no such file" in line


def test_key_that_does_not_match_the_certificate(pem):
    line = one_error_line(tls_cli("--ssl-certfile", pem["cert"], "--ssl-keyfile", pem["other-key"]))
    assert f"--ssl-keyfile {pem['other-key']} does not match the certificate" in line


def test_keyfile_without_certfile(pem):
    line = one_error_line(tls_cli("--ssl-keyfile", pem["key"]))
    assert "--ssl-keyfile is set without --ssl-certfile" in line


def test_key_inside_the_certfile_is_served(pem):
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # only the key's whereabouts are under test
    with skirr("apps.probe:app", "--ssl-certfile", pem["combined"], ready=False) as s:
        wait_until(lambda: "listening at" in s.logs(), what="listening line")
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", s.port), timeout=10)) as c:
            c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert c.recv(12) == b"HTTP/1.1 200"


def test_gunicorn_certfile_without_key_names_the_certfile(pem):
    with gunicorn("apps.probe:app", "--certfile", pem["cert"], ready=False) as g:
        assert g.wait(20) != 0
        logs = g.logs()
    assert f"[ERROR] skirr: certfile {pem['cert']} holds no private key: set keyfile" in logs, logs


# --- 5. --uds on a path that is not a socket ----------------------------------------------


def test_uds_on_a_regular_file_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("keep me")
    line = one_error_line(run_cli("apps.probe:app", "--app-dir", "tests", "--uds", str(path)))
    assert f"unix:{path}: it is a regular file, which Skirr will not replace" in line
    assert "already in use" not in line
    assert path.read_text() == "keep me"


def test_uds_replaces_a_stale_socket_file(tmp_path):
    path = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()  # the file stays: what a killed server leaves behind
    proc = subprocess.Popen(
        [PY, "-m", "skirr", "apps.probe:app", "--app-dir", "tests", "--uds", path],
        cwd=str(ROOT),
        env=_env(None),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def answered():
            try:
                with RawConn(path=path, timeout=2) as c:
                    c.send(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    return c.read_response()
            except OSError:
                assert proc.poll() is None, proc.stderr.read()
                return None

        assert wait_until(answered, what="answer on the replaced socket").status == 200
    finally:
        proc.terminate()
        proc.wait(10)
