"""HTTP/3 (issue 21, the first cut): QUIC on UDP beside each TCP listener,
served through the same dispatch as HTTP/2. Driven with aioquic's
``H3Connection`` (``tests/h3client.py``) over real sockets, and niquests end
to end; trustme certificates as in test_tls.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import subprocess

import pytest
from harness import PY, ROOT, _env, gunicorn, skirr, wait_until

trustme = pytest.importorskip("trustme")
pytest.importorskip("aioquic")
from h3client import REQUEST_CANCELLED, REQUEST_REJECTED, h3_connect, run  # noqa: E402


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("client@example.test")
    paths = {
        "ca": d / "ca.pem",
        "cert": d / "cert.pem",
        "key": d / "key.pem",
        "client_cert": d / "client-cert.pem",
        "client_key": d / "client-key.pem",
    }
    ca.cert_pem.write_to_path(str(paths["ca"]))
    client.cert_chain_pems[0].write_to_path(str(paths["client_cert"]))
    client.private_key_pem.write_to_path(str(paths["client_key"]))
    server.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    for blob in server.cert_chain_pems[1:]:
        blob.write_to_path(str(paths["cert"]), append=True)
    server.private_key_pem.write_to_path(str(paths["key"]))
    return {k: str(v) for k, v in paths.items()}


def tls_get(port: int, ca: str, path: str = "/") -> tuple[int, dict[str, str], bytes]:
    """An HTTP/1.1 GET over TLS: status, fields (lower-case names), body."""
    ctx = ssl.create_default_context(cafile=ca)
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    with ctx.wrap_socket(raw, server_hostname="localhost") as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), fields, body


def _tls_ready(port: int, ca: str) -> bool:
    """The server answers over TLS (any status): its UDP endpoint was
    bound before the TCP listener accepted."""
    try:
        return tls_get(port, ca)[0] > 0
    except OSError:
        return False


def h3_skirr(pki, app: str = "apps.probe:app", *args: str, env: dict | None = None):
    """A standalone server with TLS and ``--http3`` (UDP on the TCP port)."""
    return skirr(
        app, "--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"], "--http3", *args, env=env, ready=False
    )


def test_get_and_scope_facts(pki):
    with h3_skirr(pki) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                root = await c.request("GET", "/")
                scope = await c.request("GET", "/scope?x=1", headers=[("cookie", "a=1"), ("cookie", "b=2")])
                return root, scope

        root, r = run(go())
        assert root.status == 200
        assert root.header("date")
        assert r.status == 200
        scope = json.loads(r.body)
        assert scope["http_version"] == "3"
        assert scope["scheme"] == "https"
        assert scope["method"] == "GET"
        assert scope["path"] == "/scope"
        assert scope["query_string"] == {"bytes": "x=1"}
        headers = [(k["bytes"], v["bytes"]) for k, v in scope["headers"]]
        # :authority becomes the first host field; cookies are joined (RFC 9114 §4.2.1).
        assert headers[0] == ("host", "localhost")
        assert ("cookie", "a=1; b=2") in headers
        assert scope["server"] == ["127.0.0.1", s.port]
        assert scope["client"][0] == "127.0.0.1"
        tls = scope["extensions"]["tls"]
        assert tls["tls_version"] == 0x0304
        assert tls["client_cert_chain"] == []
        assert tls["server_cert"].startswith("-----BEGIN CERTIFICATE-----")
        # The access log names the version as Gunicorn and uvicorn would.
        wait_until(lambda: '"GET /scope?x=1 HTTP/3.0" 200' in s.logs(), what="access log line")


def test_post_echo_streams_a_large_body_both_ways(pki):
    body = bytes(range(256)) * 16384  # 4 MiB
    with h3_skirr(pki, "apps.probe:app", "--body-buffer", "65536") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                # Two at once on one connection: each stream on its own.
                a = c.start("POST", "/echo", headers=[("content-length", str(len(body)))], body=body)
                b = c.start("POST", "/upload-count", body=body[:100000])
                return await c.response(a, 30), await c.response(b, 30)

        echo, count = run(go(), 60)
        assert echo.status == 200
        assert echo.body == body
        # How many messages the app got depends on how fast it reads: the
        # chunks QUIC holds when the app asks are handed over as one.
        assert 1 <= int(echo.header("x-chunks")) <= len(body) // 1000
        assert count.status == 200 and json.loads(count.body)["bytes"] == 100000


def test_streamed_response_and_trailers(pki):
    with h3_skirr(pki, "apps.h3_app:app") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                return await c.request("GET", "/stream?n=48")

        r = run(go(), 60)
        assert r.status == 200
        assert len(r.body) == 48 * 65536
        assert r.body[-1:] == bytes([65 + 47 % 26])
    with h3_skirr(pki, "apps.trailers_app:app") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def trailers():
            async with h3_connect(s.port, pki["ca"]) as c:
                return await c.request("GET", "/", headers=[("te", "trailers")])

        r = run(trailers())
        assert r.body == b"hello world"
        assert ("x-checksum", "abc") in r.trailers and ("x-count", "2") in r.trailers


def test_client_certificate_compression_and_pathsend(pki, tmp_path):
    args = ["--ssl-ca-certs", pki["ca"], "--ssl-cert-reqs", "1", "--compression", "gzip"]
    with h3_skirr(pki, "apps.probe:app", *args) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            client = (pki["client_cert"], pki["client_key"])
            async with h3_connect(s.port, pki["ca"], cert=client) as c:
                return await c.request("GET", "/scope", headers=[("accept-encoding", "gzip")])

        r = run(go())
        assert r.header("content-encoding") == "gzip"
        import gzip

        tls = json.loads(gzip.decompress(r.body))["extensions"]["tls"]
        assert tls["client_cert_chain"][0].strip() == open(pki["client_cert"]).read().strip()
        assert tls["client_cert_name"]
    f = tmp_path / "file.bin"
    f.write_bytes(bytes(range(256)) * 4096)
    with h3_skirr(pki, "apps.pathsend_app:app") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def send_file():
            async with h3_connect(s.port, pki["ca"]) as c:
                return await c.request("GET", f"/?path={f}")

        r = run(send_file())
        assert r.status == 200 and r.body == f.read_bytes()


def test_a_request_reset_mid_body_is_a_disconnect(pki):
    with h3_skirr(pki) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                sid = c.start("POST", "/upload-count", body=b"x" * 20000, end=False)
                c.send_more(sid, b"y" * 20000)
                # The app has the first bytes once a second request is served
                # on the same connection after them.
                assert (await c.request("GET", "/")).status == 200
                c.reset(sid)
                for _ in range(200):
                    events = json.loads((await c.request("GET", "/events")).body)
                    if any("upload_disconnect" in e for e in events):
                        return events
                    await asyncio.sleep(0.02)
                return events

        events = run(go())
        assert any("upload_disconnect" in e for e in events), events


def test_a_reset_request_body_gets_no_answer_and_no_access_log_line(pki):
    """RESET_STREAM on the client's sending side only, mid-body: the app
    sees `http.disconnect` and returns without answering; as on HTTP/2
    (RST_STREAM), the server writes no response of its own (not a 400)
    but resets its side (H3_REQUEST_CANCELLED), and logs no access line
    for a response never sent."""
    with h3_skirr(pki) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                sid = c.start("POST", "/upload-count?tag=h3bodyreset", body=b"x" * 20000, end=False)
                # The app has the first bytes once a second request is served
                # on the same connection after them.
                assert (await c.request("GET", "/")).status == 200
                c._quic.reset_stream(sid, REQUEST_CANCELLED)
                c.transmit()
                r = await c.response(sid, timeout=5)
                for _ in range(200):
                    events = json.loads((await c.request("GET", "/events")).body)
                    if any("upload_disconnect" in e for e in events):
                        break
                    await asyncio.sleep(0.02)
                return r, events

        r, events = run(go())
    assert any("upload_disconnect" in e for e in events), events
    assert (r.status, r.body, r.reset) == (0, b"", REQUEST_CANCELLED), r
    assert "POST /upload-count" not in s.logs(), s.logs()
    assert " 400 " not in s.logs(), s.logs()


def test_stop_sending_mid_response_is_a_disconnect(pki):
    with h3_skirr(pki) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                sid = c.start("GET", "/stream-until-disconnect?tag=h3stop")
                await c.head(sid)
                # STOP_SENDING only: the client stops reading the response.
                c._quic.stop_stream(sid, REQUEST_CANCELLED)
                c.transmit()
                for _ in range(200):
                    events = json.loads((await c.request("GET", "/events")).body)
                    if any(isinstance(e, dict) and e.get("tag") == "h3stop" for e in events):
                        return events
                    await asyncio.sleep(0.02)
                return events

        events = run(go())
        assert any(isinstance(e, dict) and e.get("tag") == "h3stop" and "stream_error" in e for e in events), events


def test_alt_svc_on_http1_responses_only_while_udp_listens(pki):
    with h3_skirr(pki, "apps.h3_app:app") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        status, fields, _ = tls_get(s.port, pki["ca"], "/")
        assert status == 200
        assert fields["alt-svc"] == f'h3=":{s.port}"; ma=86400'
        # An app's own alt-svc is never overridden.
        _, fields, body = tls_get(s.port, pki["ca"], "/own-alt-svc")
        assert body == b"own" and fields["alt-svc"] == "clear"

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                return await c.request("GET", "/")

        r = run(go())
        assert r.status == 200 and r.header("alt-svc") is None
    # HTTP/2 responses carry it too.
    httpx = pytest.importorskip("httpx")
    with h3_skirr(pki, "apps.h3_app:app", "--http-protocols", "h2,h1") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=pki["ca"]), timeout=10) as c:
            r = c.get(f"https://localhost:{s.port}/")
            assert r.http_version == "HTTP/2"
            assert r.headers["alt-svc"] == f'h3=":{s.port}"; ma=86400'
    # Without --http3 no alt-svc.
    with skirr("apps.h3_app:app", "--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"], ready=False) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        assert "alt-svc" not in tls_get(s.port, pki["ca"], "/")[1]


def test_graceful_stop_sends_goaway_and_finishes_the_request(pki):
    with h3_skirr(pki) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                sid = c.start("GET", "/sleep?secs=1.5&tag=drain")
                for _ in range(200):
                    if "sleeping" in (await c.request("GET", "/events")).body.decode():
                        break
                    await asyncio.sleep(0.01)
                s.send_signal(signal.SIGTERM)
                refused = await _refused(s.port, pki["ca"])
                r = await c.response(sid)
                end = await asyncio.wait_for(asyncio.shield(c.terminated), 10)
                return r, c.goaway, end.error_code, refused

        r, goaway, code, refused = run(go())
        assert r.status == 200 and r.body == b"slept"
        assert goaway
        assert code == 0x100  # H3_NO_ERROR
        # A new connection during the drain is refused at once, not left to time out.
        assert refused
        assert s.wait(10) == 0


async def _refused(port: int, ca: str) -> bool:
    """Whether a new connection is refused (CONNECTION_REFUSED) within a
    few tries; one accepted before the drain began is closed and retried."""
    for _ in range(40):
        try:
            async with asyncio.timeout(2):
                async with h3_connect(port, ca):
                    pass
        except ConnectionError:
            return True
        await asyncio.sleep(0.02)
    return False


def test_boot_error_without_tls():
    p = subprocess.run(
        [PY, "-m", "skirr", "apps.probe:app", "--port", "0", "--http3"],
        cwd=str(ROOT),
        env=_env(None),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 1
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines == [
        "skirr: error: http3 needs TLS (QUIC is always encrypted): set --ssl-certfile and --ssl-keyfile"
    ], p.stderr
    # Under Gunicorn (SKIRR_HTTP3=1, no certfile): the worker's boot error.
    with gunicorn("apps.probe:app", env={"SKIRR_HTTP3": "1"}, ready=False) as g:
        assert g.wait(30) != 0
        assert "http3 needs TLS (QUIC is always encrypted): set certfile and keyfile" in g.logs()


def test_boot_error_on_a_unix_socket(pki, tmp_path):
    """HTTP/3 is served beside a TCP listener: a Unix socket alone is a
    one-line boot error, with or without http3_port, not a server that
    silently has no UDP socket."""
    uds = str(tmp_path / "s.sock")
    for extra in ([], ["--http3-port", "8443"]):
        p = subprocess.run(
            [PY, "-m", "skirr", "apps.probe:app", "--uds", uds, "--http3", *extra]
            + ["--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"]],
            cwd=str(ROOT),
            env=_env(None),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert p.returncode == 1
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert lines == [
            "skirr: error: http3 needs a TCP listener (HTTP/3 is served on UDP beside it): a Unix socket has none"
        ], p.stderr
        assert not os.path.exists(uds)
    # Under Gunicorn (-b unix:PATH only): the worker's boot error (3) stops the master.
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("skirr_http3 = True\n")
    args = ["-c", str(conf), "--certfile", pki["cert"], "--keyfile", pki["key"]]
    with gunicorn("apps.probe:app", *args, uds=uds, ready=False) as g:
        assert g.wait(30) == 3
        assert "skirr_http3 needs a TCP bind (HTTP/3 is served on UDP beside it)" in g.logs()


def test_startup_logs_the_udp_address(pki):
    with h3_skirr(pki) as s:
        wait_until(lambda: f"HTTP/3 served on UDP 127.0.0.1:{s.port}" in s.logs(), what="HTTP/3 log line")
        assert s.logs().count("HTTP/3 served on UDP") == 1
    with h3_skirr(pki, "apps.probe:app", "--http3-port", "0") as s:
        wait_until(lambda: "listening at" in s.logs(), what="startup")
        assert f"HTTP/3 served on UDP 127.0.0.1:{s.port}" in s.logs()


def test_gunicorn_two_workers_both_answer_over_h3(pki, tmp_path):
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("skirr_http3 = True\n")
    args = ["-c", str(conf), "-w", "2", "--certfile", pki["cert"], "--keyfile", pki["key"]]
    with gunicorn("apps.probe:app", *args, ready=False) as g:
        wait_until(lambda: _tls_ready(g.port, pki["ca"]), what="TLS server")

        async def pids():
            seen = set()
            for _ in range(60):
                # A new connection from a new source port each time: the
                # kernel's reuseport hash spreads them over the workers.
                async with h3_connect(g.port, pki["ca"]) as c:
                    r = await c.request("GET", "/pid")
                    assert r.status == 200
                    seen.add(int(r.body))
                if len(seen) == 2:
                    break
            return seen

        seen = run(pids(), 60)
        assert len(seen) == 2, seen


def test_niquests_end_to_end(pki):
    niquests = pytest.importorskip("niquests")
    with h3_skirr(pki) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        with niquests.Session(disable_http1=True, disable_http2=True, timeout=10) as sess:
            sess.quic_cache_layer.add_domain("127.0.0.1", s.port)
            r = sess.get(f"https://127.0.0.1:{s.port}/scope", verify=pki["ca"])
            assert r.status_code == 200
            assert r.http_version == 30
            assert r.json()["http_version"] == "3"
            r = sess.post(f"https://127.0.0.1:{s.port}/echo", data=b"z" * 200000, verify=pki["ca"])
            assert r.content == b"z" * 200000


def test_http3_requests_and_connections_are_labelled_http3(pki):
    from test_metrics import free_port, scrape, total

    mport = free_port()
    with h3_skirr(pki, "apps.probe:app", "--metrics-bind", f"127.0.0.1:{mport}") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        h1 = total(scrape(mport), "skirr_requests", protocol="http1")  # the readiness probes

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                statuses = [(await c.request("GET", "/")).status for _ in range(3)]
                return statuses, scrape(mport)

        statuses, fams = run(go())
        assert statuses == [200, 200, 200]
        assert total(fams, "skirr_connections_open", protocol="http3") == 1
        wait_until(lambda: total(scrape(mport), "skirr_requests", protocol="http3") == 3, what="3 h3 requests")
        fams = scrape(mport)
        assert total(fams, "skirr_requests", method="GET", status="2xx", protocol="http3") == 3
        assert total(fams, "skirr_requests", protocol="http1") == h1
        assert total(fams, "skirr_connections", "skirr_connections_total", protocol="http3") == 1
        wait_until(lambda: total(scrape(mport), "skirr_connections_open", protocol="http3") == 0, what="h3 closed")


def test_body_read_timeout_is_per_stream(pki):
    """A client that stops sending mid-body gets a 408 on that stream only;
    the connection serves the next request."""
    with h3_skirr(pki, "apps.probe:app", "--body-read-timeout", "0.5") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                sid = c.start("POST", "/echo", headers=[("content-length", "100000")], body=b"x" * 10, end=False)
                stalled = await c.response(sid, timeout=5)
                return stalled, await c.request("GET", "/")

        stalled, after = run(go())
        assert stalled.status == 408
        assert after.status == 200
        assert after.body == b"ok"


async def _stop_sending(r, timeout: float = 3.0) -> None:
    """Until the server's STOP_SENDING for `r`'s stream has come (it may
    follow RESET_STREAM in a later packet), at most `timeout` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while r.stop_sending is None and loop.time() < end:
        await asyncio.sleep(0.02)


def test_header_read_timeout_resets_a_stream_whose_headers_never_complete(pki):
    """A slowloris stream (part of a HEADERS frame, then nothing) is reset
    with H3_REQUEST_REJECTED once `header_read_timeout` passes; the
    connection's other requests, before and after, are served."""
    with h3_skirr(pki, "apps.probe:app", "--header-read-timeout", "0.5") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                loop = asyncio.get_running_loop()
                # HEADERS (type 0x01) announcing 64 bytes, 3 of them sent.
                t0 = loop.time()
                stalled = c.start_raw(b"\x01\x40\x40" + b"\x00\x00\xd1")
                # Served meanwhile: the stalled stream blocks no other.
                during = await c.request("GET", "/")
                r = await c.response(stalled, timeout=5)
                took = loop.time() - t0
                await _stop_sending(r)
                return r, took, during, await c.request("GET", "/")

        r, took, during, after = run(go())
    # Both directions carry the code (not quinn's 0 for a dropped stream),
    # and no task panicked on the way (h3-quinn's `stop_sending` did).
    assert (r.reset, r.stop_sending, r.status) == (REQUEST_REJECTED, REQUEST_REJECTED, 0)
    assert 0.4 < took < 3, took
    assert during.status == 200 and after.status == 200 and after.body == b"ok"
    assert "panicked" not in s.logs(), s.logs()


@pytest.mark.parametrize("mode", ["gunicorn", "single"])
def test_header_read_timeout_reject_is_clean_under_gunicorn_and_single_loop(pki, tmp_path, mode):
    """The same reject under a Gunicorn worker and with `loop_mode`
    single: both codes on the wire, no panic in the output."""
    env = {"SKIRR_HEADER_READ_TIMEOUT": "0.5"}
    if mode == "gunicorn":
        conf = tmp_path / "gunicorn.conf.py"
        conf.write_text("skirr_http3 = True\n")
        args = ["-c", str(conf), "-w", "1", "--certfile", pki["cert"], "--keyfile", pki["key"]]
        server = gunicorn("apps.probe:app", *args, env=env, ready=False)
    else:
        server = h3_skirr(pki, "apps.probe:app", "--loop-mode", "single", env=env)
    with server as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                stalled = c.start_raw(b"\x01\x40\x40" + b"\x00\x00\xd1")
                r = await c.response(stalled, timeout=5)
                await _stop_sending(r)
                return r, await c.request("GET", "/")

        r, after = run(go())
    assert (r.reset, r.stop_sending) == (REQUEST_REJECTED, REQUEST_REJECTED)
    assert after.status == 200
    assert "panicked" not in s.logs(), s.logs()


def test_single_loop_mode_serves_http3_on_one_thread(pki):
    """`loop_mode` single: quinn's endpoint runs in the Tokio turns
    asyncio's selector makes, on the process's main thread; requests at once
    on one connection, a response streamed across timer waits."""
    with h3_skirr(pki, "apps.loop_mode_app:app", "--loop-mode", "single", "--loop", "asyncio") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                info = await c.request("GET", "/info")
                many = await asyncio.gather(*(c.request("GET", f"/?n={i}") for i in range(20)))
                stream = await c.request("GET", "/stream?3")
                return info, many, stream

        info, many, stream = run(go())
    facts = json.loads(info.body)
    # The stand-in only runs Tokio while the app keeps this thread away.
    want = ("MainThread", ["skirr-stand-in"], "TokioSelector")
    assert (facts["thread"], facts["thread_names"], facts["selector"]) == want
    assert [(r.status, r.body) for r in many] == [(200, b"ok")] * 20
    assert stream.status == 200 and stream.body == b"chunk 0\nchunk 1\nchunk 2\n"
    assert "panicked" not in s.logs(), s.logs()


def test_an_incomplete_head_gets_drain_grace_during_a_drain(pki):
    """Draining, a stream whose HEADERS never complete is reset after
    `drain_grace` (not `header_read_timeout`), so the worker exits soon."""
    with h3_skirr(pki, "apps.probe:app", "--drain-grace", "0.5", "--header-read-timeout", "60") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                stalled = c.start_raw(b"\x01\x40\x40" + b"\x00\x00\xd1")
                assert (await c.request("GET", "/")).status == 200
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                s.send_signal(signal.SIGTERM)
                r = await c.response(stalled, timeout=10)
                took = loop.time() - t0
                await _stop_sending(r)
                return r, took

        r, took = run(go())
        assert (r.reset, r.stop_sending) == (REQUEST_REJECTED, REQUEST_REJECTED)
        assert 0.4 < took < 5, took
        assert s.wait(10) == 0
    assert "panicked" not in s.logs(), s.logs()


def test_send_timeout_resets_the_stalled_stream_only(pki):
    """A client that stops granting the stream flow-control credit has
    that stream reset (H3_REQUEST_CANCELLED) after send_timeout; another
    request on the same connection is answered meanwhile and after."""
    with h3_skirr(pki, "apps.probe:app", "--send-timeout", "1") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                sid = c._quic.get_next_available_stream_id()
                c.withhold_credit(sid)
                assert c.start("GET", f"/bigbody?n={8 << 20}") == sid
                await c.head(sid)
                during = await c.request("GET", "/")
                t0 = asyncio.get_running_loop().time()
                stalled = await c.response(sid, timeout=8)
                waited = asyncio.get_running_loop().time() - t0
                return stalled, during, await c.request("GET", "/"), waited

        stalled, during, after, waited = run(go())
        assert stalled.reset == REQUEST_CANCELLED
        assert len(stalled.body) < 8 << 20
        assert waited < 5
        assert during.status == 200
        assert after.status == 200


def test_send_timeout_tells_the_app_the_client_is_gone(pki):
    """A streaming app whose client grants no more credit: after
    send_timeout its send() raises (the ASGI disconnect)."""
    with h3_skirr(pki, "apps.probe:app", "--send-timeout", "1") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"], max_stream_data=64 * 1024) as c:
                sid = c._quic.get_next_available_stream_id()
                c.withhold_credit(sid)
                assert c.start("GET", "/stream-until-disconnect?tag=h3slow") == sid
                stalled = await c.response(sid, timeout=8)
                for _ in range(200):
                    events = json.loads((await c.request("GET", "/events")).body)
                    if any(isinstance(e, dict) and e.get("tag") == "h3slow" for e in events):
                        return stalled, events
                    await asyncio.sleep(0.02)
                return stalled, events

        stalled, events = run(go())
        assert stalled.reset == REQUEST_CANCELLED
        assert any(isinstance(e, dict) and e.get("tag") == "h3slow" and "stream_error" in e for e in events), events


def test_response_start_timeout_is_per_stream(pki):
    with h3_skirr(pki, "apps.probe:app", "--response-start-timeout", "0.3") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                late = c.start("GET", "/slow-start?secs=3")
                assert (await c.request("GET", "/")).status == 200
                return await c.response(late, timeout=5), await c.request("GET", "/")

        late, after = run(go())
        assert late.status == 503
        assert after.status == 200


#: The HTTP/3 stream error for a malformed message (RFC 9114 §8.1).
H3_MESSAGE_ERROR = 0x10E


def test_malformed_requests_are_stream_errors_and_the_app_is_not_called(pki):
    # RFC 9114 §4.2, §4.1.2: as HTTP/2 answers RST_STREAM PROTOCOL_ERROR.
    bad = [
        [("connection", "keep-alive")],
        [("transfer-encoding", "chunked")],
        [("keep-alive", "5")],
        [("proxy-connection", "x")],
        [("upgrade", "websocket")],
        [("te", "gzip")],
        [("content-length", "abc")],
        [("content-length", "5"), ("content-length", "6")],
    ]
    with h3_skirr(pki) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                resets = []
                for i, fields in enumerate(bad):
                    sid = c.start("POST", f"/malformed-{i}", headers=fields, body=b"hello")
                    resets.append((await c.response(sid)).reset)
                # The connection goes on; `te: trailers` and equal lengths are fine.
                fine = [("te", "trailers"), ("content-length", "5")]
                ok = await c.request("POST", "/echo", headers=fine, body=b"hello")
                return resets, ok

        resets, ok = run(go())
        assert resets == [H3_MESSAGE_ERROR] * len(bad)
        assert ok.status == 200 and ok.body == b"hello"
        wait_until(lambda: '"POST /echo HTTP/3.0" 200' in s.logs(), what="access log line")
        assert "/malformed-" not in s.logs()


def test_a_body_its_first_read_finds_at_odds_with_its_length_is_a_stream_error(pki):
    # RFC 9114 §4.1.2, when the first read sees it all: a length declared
    # with the end of the stream on HEADERS (the app was called, with an
    # empty body), and `content-length: 0` followed by DATA (the connection
    # was closed, H3_FRAME_UNEXPECTED, and h3 panicked a task). Another
    # request on the connection, mid-body, goes on.
    with h3_skirr(pki) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as c:
                waiting = c.start("POST", "/echo", headers=[("content-length", "4")], body=b"ab", end=False)
                no_body = c.start("POST", "/declared-5", headers=[("content-length", "5")], body=b"")
                zero = c.start("POST", "/declared-0", headers=[("content-length", "0")], body=b"hello")
                got = [await c.response(no_body), await c.response(zero)]
                c.send_more(waiting, b"cd", end=True)
                return got, await c.response(waiting)

        (no_body, zero), ok = run(go())
        assert no_body.reset == H3_MESSAGE_ERROR and no_body.status == 0
        assert zero.reset == H3_MESSAGE_ERROR and zero.status == 0
        assert ok.status == 200 and ok.body == b"abcd"
        wait_until(lambda: '"POST /echo HTTP/3.0" 200' in s.logs(), what="access log line")
        # The app never answered them (the server's own 400 is logged, the
        # stream reset in its place).
        assert '/declared-5 HTTP/3.0" 200' not in s.logs()
        assert "panicked" not in s.logs()


def test_boot_error_when_the_udp_port_is_taken(pki, tmp_path):
    # A plain socket without SO_REUSEPORT holds the UDP port: no one else
    # can bind it. Its TCP twin must be free (on a busy machine a client
    # connection may hold it, and the TCP bind would fail first).
    for _ in range(50):
        held = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        try:
            with socket.socket() as tcp:
                tcp.bind(("127.0.0.1", port))
            break
        except OSError:
            held.close()
    try:
        p = subprocess.run(
            [PY, "-m", "skirr", "apps.probe:app", "--port", str(port), "--http3"]
            + ["--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"]],
            cwd=str(ROOT),
            env=_env(None),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert p.returncode == 1
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, p.stderr
        assert lines[0].startswith(f"skirr: error: HTTP/3: cannot bind UDP 127.0.0.1:{port}: Address already in use")
        # Under Gunicorn: the worker's boot error (3) stops the master, no respawn loop.
        conf = tmp_path / "gunicorn.conf.py"
        conf.write_text(f"skirr_http3 = True\nskirr_http3_port = {port}\n")
        args = ["-c", str(conf), "--certfile", pki["cert"], "--keyfile", pki["key"]]
        with gunicorn("apps.probe:app", *args, ready=False) as g:
            assert g.wait(30) == 3
            logs = g.logs()
            assert logs.count(f"cannot bind UDP 127.0.0.1:{port}") == 1, logs
            assert "Address already in use" in logs
    finally:
        held.close()


def test_max_connections_counts_quic_connections_exactly(pki):
    with h3_skirr(pki, "apps.probe:app", "--max-connections", "2") as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")

        async def go():
            async with h3_connect(s.port, pki["ca"]) as a, h3_connect(s.port, pki["ca"]) as b:
                ra, rb = await a.request("GET", "/"), await b.request("GET", "/")
                try:
                    async with h3_connect(s.port, pki["ca"]) as c:
                        third = (await c.request("GET", "/")).status
                except (ConnectionError, TimeoutError) as e:
                    third = repr(e)
                return ra.status, rb.status, third

        a, b, third = run(go())
        assert (a, b) == (200, 200)
        assert not isinstance(third, int), "a third connection was served"
