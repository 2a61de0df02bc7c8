"""HTTP/2 end to end (issue 10): under a real Gunicorn master, h2 over TLS
(ALPN) and h2c (prior knowledge), SIGTERM draining with a stream in flight,
and the FastAPI example through curl and httpx on both transports."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import ssl
import subprocess
import time

import pytest
from h2follow import MAX_ID, FrameClient
from harness import gunicorn, request, skirr, wait_until

httpx = pytest.importorskip("httpx")
pytest.importorskip("h2")
trustme = pytest.importorskip("trustme")

pytestmark = pytest.mark.timeout(90)

PROBE = "apps.probe:app"
FASTAPI = "examples.fastapi_app:app"
H2C = ("--http-protocols", "h2,h1", "--http2-cleartext", "prior-knowledge")


def tls_socket(port: int, ca: str, alpn=("h2",)) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(list(alpn))
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def tls_ready(server, ca: str) -> bool:
    if server.proc.poll() is not None:
        raise RuntimeError(f"server exited ({server.proc.returncode}):\n{server.logs()}")
    try:
        tls_socket(server.port, ca, ["http/1.1"]).close()
        return True
    except OSError:
        return False


def serve(kind: str, app: str, transport: str, pki, *extra: str):
    """``app`` under Gunicorn or ``python -m skirr``, h2c or TLS (h2 and
    http/1.1 by ALPN); ready to serve when the block starts."""
    if transport == "tls":
        names = ("--certfile", "--keyfile") if kind == "gunicorn" else ("--ssl-certfile", "--ssl-keyfile")
        args = ("--http-protocols", "h2,h1", names[0], pki["cert"], names[1], pki["key"])
    else:
        args = H2C
    if kind == "gunicorn":
        return gunicorn(app, "-w", "2", *args, *extra, ready=transport != "tls")
    return skirr(app, "--no-access-log", *args, *extra, ready=transport != "tls")


def base(server, transport: str, pki) -> str:
    if transport == "tls":
        wait_until(lambda: tls_ready(server, pki["ca"]), what="the TLS server")
        return f"https://localhost:{server.port}"
    return server.url


def client(url: str, pki) -> httpx.Client:
    if url.startswith("https"):
        return httpx.Client(base_url=url, http2=True, verify=ssl.create_default_context(cafile=pki["ca"]), timeout=10)
    return httpx.Client(base_url=url, http1=False, http2=True, timeout=10)


# --- Gunicorn: both transports --------------------------------------------------


@pytest.mark.parametrize("transport", ["h2c", "tls"])
def test_gunicorn_serves_h2_and_http11(transport, pki):
    with serve("gunicorn", PROBE, transport, pki) as g:
        url = base(g, transport, pki)
        with client(url, pki) as c:
            r = c.get("/scope")
            assert r.http_version == "HTTP/2"
            scope = r.json()
            assert scope["http_version"] == "2"
            assert scope["scheme"] == ("https" if transport == "tls" else "http")
            assert c.post("/echo", content=b"q" * 200_000).content == b"q" * 200_000
        # HTTP/1.1 on the same port (no ALPN h2 / no preface).
        verify = ssl.create_default_context(cafile=pki["ca"])
        with httpx.Client(base_url=url, verify=verify, timeout=10) as c:
            r = c.get("/scope")
            assert r.http_version == "HTTP/1.1" and r.json()["http_version"] == "1.1"


@pytest.mark.parametrize("transport", ["h2c", "tls"])
def test_gunicorn_sigterm_drains_h2_stream_in_flight(transport, pki):
    """SIGTERM to the master while a slow streamed response is half sent
    and an upload is half received: the client gets GOAWAY (NO_ERROR), the
    response finishes, the rest of the upload is read and echoed, a stream sent
    after the final GOAWAY (as if it crossed it) gets no frame and never
    reaches the app, the connection closes and the master exits 0."""
    log = ("--access-logfile", "-", "--access-logformat", "served %(U)s?%(q)s")
    # Under Gunicorn the drain gets graceful_timeout less the WebSockets'
    # close grace (2 s): 13 s here, for a response that needs 3.
    with serve("gunicorn", PROBE, transport, pki, *log, "--graceful-timeout", "15") as g:
        base(g, transport, pki)
        if transport == "tls":
            sock = tls_socket(g.port, pki["ca"])
            assert sock.selected_alpn_protocol() == "h2"
            c = FrameClient(sock, scheme="https")
        else:
            c = FrameClient.connect(g.port)
        try:
            slow = c.request("GET", "/stream?n=15&delay=0.2&tag=slow")
            upload = c.request("POST", "/echo?tag=upload", b"u" * 100_000, end=False)
            c.pump(lambda: b"chunk0" in slow.body, what="the first chunk")
            assert slow.outcome is None and upload.outcome is None  # both in flight
            g.send_signal(signal.SIGTERM)
            c.pump(lambda: any(x.last_stream_id < MAX_ID for x in c.goaways), what="the final GOAWAY")
            assert not c.eof, f"closed before the stream finished: {slow.body!r}"
            assert slow.outcome is None, "the final GOAWAY came after the stream ended: nothing tested"
            assert [x.error_code for x in c.goaways] and all(x.error_code == 0 for x in c.goaways)
            assert min(x.last_stream_id for x in c.goaways) == upload.sid
            late = c.request("GET", "/?tag=late")
            assert late.outcome == "refused"
            # The rest of the upload, after the final GOAWAY (its stream is below it).
            c.send_data(upload, b"v" * 100_000, end=True)
            c.read_to_eof(timeout=15)
            assert upload.outcome == "ok", upload.why
            assert upload.status == 200 and upload.body == b"u" * 100_000 + b"v" * 100_000
            assert slow.outcome == "ok", slow.why
            assert slow.status == 200 and slow.body == b"".join(b"chunk%d\n" % i for i in range(15))
            assert late.frames_after_refusal == 0 and late.status is None
        finally:
            c.close()
        assert g.wait(15) == 0
        logs = g.logs()
        assert "served /stream?n=15&delay=0.2&tag=slow" in logs, logs
        assert "served /echo?tag=upload" in logs, logs
        assert "tag=late" not in logs, logs


# --- the FastAPI example: curl and httpx ---------------------------------------


@pytest.fixture(
    scope="module",
    params=[("standalone", "h2c"), ("standalone", "tls"), ("gunicorn", "h2c"), ("gunicorn", "tls")],
    ids="-".join,
)
def fastapi_url(request, pki):
    kind, transport = request.param
    with serve(kind, FASTAPI, transport, pki) as s:
        yield base(s, transport, pki)


def curl(url: str, pki, *args: str) -> tuple[str, int, str]:
    """``curl`` with HTTP/2 (prior knowledge on http://, ALPN h2 on https://,
    trusting the test CA); returns (body, status, the HTTP version used)."""
    mode = ["--http2", "--cacert", pki["ca"]] if url.startswith("https") else ["--http2-prior-knowledge"]
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "10", *mode, "-o", "-", "-w", "\n%{http_code} %{http_version}", *args, url],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert out.returncode == 0, out.stderr
    body, _, tail = out.stdout.rpartition("\n")
    status, version = tail.split()
    return body, int(status), version


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_fastapi_with_curl_over_http2(fastapi_url, pki):
    if "HTTP2" not in subprocess.run(["curl", "-V"], capture_output=True, text=True).stdout:
        pytest.skip("curl without HTTP/2")
    body, status, version = curl(fastapi_url + "/items/2?q=ripe", pki)
    assert (status, version) == (200, "2") and json.loads(body) == {"item_id": 2, "name": "pear", "q": "ripe"}
    item = json.dumps({"name": "fig", "price": 2.5, "tags": ["x"]})
    body, status, version = curl(fastapi_url + "/items", pki, "-H", "content-type: application/json", "--data", item)
    assert (status, version) == (200, "2") and json.loads(body)["total"] == 3.0
    body, status, version = curl(fastapi_url + "/stream?n=3", pki)
    assert (status, version) == (200, "2") and body == "chunk 0\nchunk 1\nchunk 2\n"
    body, status, version = curl(fastapi_url + "/items/99", pki)
    assert (status, version) == (404, "2") and json.loads(body) == {"detail": "item not found"}


def test_fastapi_with_httpx_over_http2(fastapi_url, pki):
    with client(fastapi_url, pki) as c:
        r = c.get("/items/2", params={"q": "ripe"})
        assert r.http_version == "HTTP/2" and r.json() == {"item_id": 2, "name": "pear", "q": "ripe"}
        r = c.post("/items", json={"name": "lamp", "price": 10.0, "tags": ["a"]})
        assert r.http_version == "HTTP/2" and r.json()["total"] == 12.0
        r = c.post("/login", data={"username": "ada", "password": "pw"})
        assert r.json() == {"username": "ada", "password_length": 2}
        r = c.post("/upload-size", content=b"u" * 300_000)
        assert r.json() == {"size": 300_000}
        assert c.get("/items/zero").status_code == 422
        with c.stream("GET", "/stream", params={"n": "4"}) as s:
            assert s.http_version == "HTTP/2"
            assert b"".join(s.iter_bytes()) == b"chunk 0\nchunk 1\nchunk 2\nchunk 3\n"
        assert c.get("/sync").json() == {"sync": True}
        assert c.get("/healthz").json() == {"status": "ok", "started": True}


@pytest.mark.parametrize("in_flight", [False, True], ids=["idle", "stream-then-idle"])
@pytest.mark.parametrize("kind", ["standalone", "gunicorn"])
def test_an_idle_h2_client_that_does_not_read_does_not_hold_the_drain(kind, in_flight, pki):
    """A pooled connection whose client is not reading (httpx between
    requests) never acks the PING of the graceful GOAWAY: with no stream
    open, the draining worker closes it about a second after the drain
    began or its last stream ended, as it does an idle HTTP/1.1
    connection, instead of waiting for graceful_timeout. ``in_flight``: a
    1.5 s request is open at SIGTERM (its response is written into the
    socket unread)."""
    workers = ("-w", "1") if kind == "gunicorn" else ()  # one app process: its /events is the one
    with serve(kind, PROBE, "h2c", pki, "--graceful-timeout", "20", *workers) as s:
        c = FrameClient.connect(s.port)
        try:
            st = c.request("GET", "/")
            c.wait([st])
            assert st.outcome == "ok" and st.body == b"ok"
            slow = c.request("GET", "/sleep?secs=1.5&tag=idle-drain") if in_flight else None
            if slow:
                wait_until(lambda: b"idle-drain" in request(s.port, "GET", "/events").body, what="the app sleeping")
            t0 = time.monotonic()
            s.send_signal(signal.SIGTERM)  # and the client reads nothing until the server is gone
            assert s.wait(15) == 0
            took = time.monotonic() - t0
            # Idle: ~1 s. In flight: 1.5 s, then ~1 s (it was up to keepalive_timeout later).
            assert took < (3.5 if in_flight else 3), (took, s.logs())
            assert "graceful timeout" not in s.logs(), s.logs()
            c.read_to_eof(timeout=5)
            assert c.goaways and all(g.error_code == 0 for g in c.goaways)
            if slow:
                assert slow.outcome == "ok" and slow.body == b"slept", slow.why
        finally:
            c.close()
