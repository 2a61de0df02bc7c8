"""HTTP/2 (first stage): h2c with prior knowledge and h2 over TLS (ALPN),
standalone and under Gunicorn, over real sockets.

httpx speaks HTTP/2 through the ``h2`` package; the ``h2`` package is also
used directly as a raw frame client for what httpx cannot do (RST_STREAM,
watching GOAWAY, a request without ``:authority``)."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import ssl
import subprocess
import time

import pytest
from harness import RawConn, gunicorn, request, skirr, wait_until

httpx = pytest.importorskip("httpx")
h2conn = pytest.importorskip("h2.connection")
h2config = pytest.importorskip("h2.config")
h2events = pytest.importorskip("h2.events")
h2exceptions = pytest.importorskip("h2.exceptions")
trustme = pytest.importorskip("trustme")

pytestmark = pytest.mark.timeout(60)

H2C = ("--http-protocols", "h2,h1", "--http2-cleartext", "prior-knowledge")


def h2c_client(server) -> httpx.Client:
    return httpx.Client(base_url=server.url, http1=False, http2=True, timeout=10)


class RawH2:
    """A raw HTTP/2 client over one socket (prior knowledge)."""

    def __init__(self, port: int, sock: socket.socket | None = None) -> None:
        self.sock = sock or socket.create_connection(("127.0.0.1", port), timeout=10)
        config = h2config.H2Configuration(client_side=True, header_encoding=None, validate_outbound_headers=False)
        self.conn = h2conn.H2Connection(config=config)
        self._sent = b""
        self.conn.initiate_connection()
        self.flush()
        self.events: list = []
        #: Every frame the server sent, parsed independently of the h2
        #: state machine (which stops at the first GOAWAY).
        self.frames: list = []
        self._buf = b""
        self._h2_failed = False

    def _parse_frames(self, data: bytes) -> None:
        from hyperframe.frame import Frame

        self._buf += data
        while len(self._buf) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(self._buf[:9]))
            if len(self._buf) < 9 + length:
                return
            frame.parse_body(memoryview(self._buf[9 : 9 + length]))
            self.frames.append(frame)
            self._buf = self._buf[9 + length :]

    def _ack_pings(self) -> None:
        """Answers the server's PINGs by hand once h2 has given up (a
        graceful GOAWAY waits for the ack)."""
        from hyperframe.frame import PingFrame

        for f in self.frames:
            if isinstance(f, PingFrame) and "ACK" not in f.flags and not getattr(f, "_acked", False):
                ack = PingFrame(0, f.opaque_data, flags=["ACK"])
                self.sock.sendall(ack.serialize())
                f._acked = True

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self._sent += data
            self.sock.sendall(data)

    def sent_frames(self) -> list:
        """Every frame this client has sent (after the preface)."""
        from hyperframe.frame import Frame

        buf, out = self._sent[24:], []
        while len(buf) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(buf[:9]))
            frame.parse_body(memoryview(buf[9 : 9 + length]))
            out.append(frame)
            buf = buf[9 + length :]
        return out

    def request(self, path: str, *, method: str = "GET", extra=(), authority: bool = True, end: bool = True) -> int:
        sid = self.conn.get_next_available_stream_id()
        headers = [(":method", method), (":scheme", "http"), (":path", path)]
        if authority:
            headers.insert(1, (":authority", "example.test"))
        headers += list(extra)
        self.conn.send_headers(sid, headers, end_stream=end)
        self.flush()
        return sid

    def pump(self, until, timeout: float = 10.0) -> list:
        deadline = time.monotonic() + timeout
        while not until(self.events):
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            if time.monotonic() > deadline:
                raise TimeoutError(f"events so far: {self.events}")
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                self.events.append("eof")
                break
            self._parse_frames(data)
            if self._h2_failed:
                self._ack_pings()
                continue
            try:
                evs = self.conn.receive_data(data)
            except h2exceptions.ProtocolError:
                # After GOAWAY the h2 package refuses further frames (the
                # server's PING); `frames` still sees them.
                self._h2_failed = True
                self._ack_pings()
                continue
            for ev in evs:
                self.events.append(ev)
                if isinstance(ev, h2events.DataReceived):
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            self.flush()
        return self.events

    def response(self, sid: int) -> tuple[dict, bytes]:
        def done(evs):
            return any(isinstance(e, h2events.StreamEnded) and e.stream_id == sid for e in evs) or "eof" in evs

        self.pump(done)
        headers: dict = {}
        body = b""
        for e in self.events:
            if isinstance(e, h2events.ResponseReceived) and e.stream_id == sid:
                for k, v in e.headers:
                    headers.setdefault(k.decode(), []).append(v.decode())
            if isinstance(e, h2events.DataReceived) and e.stream_id == sid:
                body += e.data
        return headers, body

    def close(self) -> None:
        self.sock.close()


def events(server) -> list:
    return json.loads(request(server.port, "GET", "/events").body)


# --- h2c with prior knowledge -------------------------------------------------


def test_h2c_get_post_stream_and_h1_on_the_same_port():
    with skirr("apps.probe:app", *H2C) as s, h2c_client(s) as c:
        r = c.get("/")
        assert r.http_version == "HTTP/2" and r.status_code == 200 and r.text == "ok"
        body = b"x" * 300_000
        r = c.post("/echo", content=body)
        assert r.http_version == "HTTP/2" and r.content == body
        r = c.get("/stream", params={"n": "5"})
        assert r.text == "".join(f"chunk{i}\n" for i in range(5))
        # An HTTP/1.1 client on the same port is still served.
        r1 = request(s.port, "GET", "/")
        assert r1.status == 200 and r1.body == b"ok"


def test_h2c_scope_fields():
    with skirr("apps.probe:app", *H2C) as s, h2c_client(s) as c:
        r = c.get("/scope?a=1", headers={"x-one": "1"})
        scope = r.json()
        assert scope["http_version"] == "2"
        assert scope["query_string"] == {"bytes": "a=1"}
        names = [h[0]["bytes"] for h in scope["headers"]]
        assert not any(n.startswith(":") for n in names)
        assert names[0] == "host"
        assert scope["headers"][0][1]["bytes"] == f"127.0.0.1:{s.port}"
        assert names.count("host") == 1 and "x-one" in names


def test_h2_cookie_fields_are_joined_and_authority_becomes_host():
    with skirr("apps.probe:app", *H2C) as s:
        raw = RawH2(s.port)
        try:
            sid = raw.request("/scope", extra=[("host", "ignored.test"), ("cookie", "a=1"), ("cookie", "b=2")])
            _, body = raw.response(sid)
            hs = [(h[0]["bytes"], h[1]["bytes"]) for h in json.loads(body)["headers"]]
            assert hs[0] == ("host", "example.test")
            assert [v for n, v in hs if n == "host"] == ["example.test"]
            assert [v for n, v in hs if n == "cookie"] == ["a=1; b=2"]
            # `host` and no `:authority`: served, with that host.
            sid = raw.request("/scope", authority=False, extra=[("host", "only-host.test")])
            h, body = raw.response(sid)
            assert h[":status"] == ["200"]
            hs = [(x[0]["bytes"], x[1]["bytes"]) for x in json.loads(body)["headers"]]
            assert ("host", "only-host.test") in hs
        finally:
            raw.close()


def test_starlette_sees_every_cookie():
    starlette = pytest.importorskip("starlette.requests")
    assert starlette  # the joined field is what Starlette parses
    from starlette.requests import cookie_parser

    assert cookie_parser("a=1; b=2") == {"a": "1", "b": "2"}


def test_connection_specific_response_fields_are_dropped_set_cookie_kept():
    with skirr("apps.probe:app", *H2C) as s, h2c_client(s) as c:
        r = c.get("/h2-headers")
        assert r.status_code == 200 and r.text == "headers"
        for name in ("connection", "keep-alive", "proxy-connection", "upgrade", "transfer-encoding"):
            assert name not in r.headers
        assert r.headers.get_list("set-cookie") == ["a=1", "b=2"]


def test_many_concurrent_streams_on_one_connection():
    with skirr("apps.probe:app", *H2C) as s:
        raw = RawH2(s.port)
        try:
            sids = [raw.request(f"/sleep?secs=0.5&tag={i}") for i in range(50)]
            t0 = time.monotonic()
            for sid in sids:
                h, body = raw.response(sid)
                assert h[":status"] == ["200"] and body == b"slept"
            # Concurrent, not one after another.
            assert time.monotonic() - t0 < 10
        finally:
            raw.close()


def test_httpx_concurrent_requests_share_one_connection():
    import asyncio

    async def run(url):
        async with httpx.AsyncClient(base_url=url, http1=False, http2=True, timeout=10) as c:
            rs = await asyncio.gather(*(c.get(f"/scope?i={i}") for i in range(40)))
            return [r.json() for r in rs], [r.http_version for r in rs]

    with skirr("apps.probe:app", *H2C) as s:
        scopes, versions = asyncio.run(run(s.url))
        assert set(versions) == {"HTTP/2"}
        assert sorted(sc["query_string"]["bytes"] for sc in scopes) == sorted(f"i={i}" for i in range(40))
        assert len({tuple(sc["client"]) for sc in scopes}) == 1  # one connection


def test_rst_stream_reaches_the_app_as_disconnect_other_streams_unaffected():
    with skirr("apps.probe:app", *H2C) as s:
        raw = RawH2(s.port)
        try:
            gone = raw.request("/wait-disconnect?tag=rst")
            other = raw.request("/stream?n=3&delay=0.2")
            # The reset comes once the app has the request.
            wait_until(
                lambda: "/wait-disconnect" in json.loads(request(s.port, "GET", "/paths").body),
                what="the request in the app",
            )
            raw.conn.reset_stream(gone)
            raw.flush()
            wait_until(lambda: {"disconnect": "http.disconnect", "tag": "rst"} in events(s), what="disconnect")
            wait_until(
                lambda: any(
                    isinstance(e, dict) and e.get("send_after_disconnect") == "ClientDisconnected" for e in events(s)
                ),
                what="send() raising",
            )
            h, body = raw.response(other)
            assert h[":status"] == ["200"] and body == b"chunk0\nchunk1\nchunk2\n"
        finally:
            raw.close()


def test_response_without_reading_a_big_upload_resets_the_stream_no_error():
    with skirr("apps.probe:app", *H2C) as s:
        raw = RawH2(s.port)
        try:
            sid = raw.request(
                "/no-read", method="POST", end=False, extra=[("content-length", str(10_000_000))]
            )
            for _ in range(3):
                raw.conn.send_data(sid, b"x" * 16384)
            raw.flush()
            h, body = raw.response(sid)
            assert h[":status"] == ["200"] and body == b"did not read"
            raw.pump(lambda evs: any(isinstance(e, h2events.StreamReset) for e in evs), timeout=5)
            resets = [e for e in raw.events if isinstance(e, h2events.StreamReset)]
            assert resets and resets[0].error_code == 0  # NO_ERROR
            # The connection still serves.
            sid = raw.request("/")
            assert raw.response(sid)[1] == b"ok"
        finally:
            raw.close()


def test_sigterm_sends_goaway_and_the_in_flight_stream_finishes():
    with skirr("apps.probe:app", *H2C) as s:
        raw = RawH2(s.port)
        try:
            sid = raw.request("/sleep?secs=1&tag=drain")
            wait_until(lambda: {"sleeping": "drain"} in events(s), what="app running")
            s.send_signal(signal.SIGTERM)
            from hyperframe.frame import DataFrame, GoAwayFrame

            raw.pump(lambda evs: "eof" in evs, timeout=15)
            goaways = [f for f in raw.frames if isinstance(f, GoAwayFrame)]
            assert goaways and all(f.error_code == 0 for f in goaways)
            data = b"".join(f.data for f in raw.frames if isinstance(f, DataFrame) and f.stream_id == sid)
            assert data == b"slept"
            assert any("END_STREAM" in f.flags for f in raw.frames if isinstance(f, DataFrame) and f.stream_id == sid)
            assert s.wait(15) == 0
        finally:
            raw.close()


def test_idle_h2_connection_is_closed_after_keepalive_timeout():
    with skirr("apps.probe:app", *H2C, "--keepalive-timeout", "0.5") as s:
        raw = RawH2(s.port)
        try:
            sid = raw.request("/")
            raw.response(sid)
            t0 = time.monotonic()
            raw.pump(lambda evs: "eof" in evs or any(isinstance(e, h2events.ConnectionTerminated) for e in evs))
            assert time.monotonic() - t0 < 5
        finally:
            raw.close()


def test_keepalive_pings_close_a_connection_that_never_answers():
    from hyperframe.frame import PingFrame

    args = (*H2C, "--keepalive-timeout", "30", "--http2-ping-interval", "0.3", "--http2-ping-timeout", "0.5")
    with skirr("apps.probe:app", *args) as s:
        # A client that answers (the h2 package acks every PING) stays.
        live = RawH2(s.port)
        live.pump(lambda _evs: sum(isinstance(f, PingFrame) for f in live.frames) >= 3)
        h, _ = live.response(live.request("/"))
        assert h[":status"] == ["200"]
        # One that never reads an answer is closed after the timeout.
        mute = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        mute.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        t0 = time.monotonic()
        got = b""
        while chunk := mute.recv(65536):
            got += chunk
        assert time.monotonic() - t0 < 5
        assert b"\x06\x00\x00\x00\x00\x00" in got  # a PING frame header (type 6, no flags, stream 0)
        mute.close()
        live.close()


def test_a_head_that_never_completes_is_closed_by_the_idle_timeout():
    from hpack import Encoder
    from hyperframe.frame import HeadersFrame, SettingsFrame

    with skirr("apps.probe:app", *H2C, "--keepalive-timeout", "0.5") as s:
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        try:
            block = Encoder().encode([(":method", "GET"), (":scheme", "http"), (":path", "/")])
            frame = HeadersFrame(1, block)  # no END_HEADERS: a CONTINUATION is owed
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + SettingsFrame(0).serialize() + frame.serialize())
            t0 = time.monotonic()
            while sock.recv(65536):
                pass
            assert time.monotonic() - t0 < 6
        except ConnectionResetError:
            assert time.monotonic() - t0 < 6
        finally:
            sock.close()


def test_body_read_timeout_is_per_stream():
    with skirr("apps.probe:app", *H2C, "--body-read-timeout", "0.5") as s:
        raw = RawH2(s.port)
        try:
            sid = raw.request("/echo", method="POST", end=False, extra=[("content-length", "100000")])
            raw.conn.send_data(sid, b"x" * 10)
            raw.flush()
            h, _ = raw.response(sid)
            assert h[":status"] == ["408"]
            sid = raw.request("/")
            assert raw.response(sid)[1] == b"ok"
        finally:
            raw.close()


def test_limit_request_fields_per_stream():
    with skirr("apps.probe:app", *H2C, "--limit-request-fields", "5") as s:
        raw = RawH2(s.port)
        try:
            sid = raw.request("/", extra=[(f"x-{i}", "v") for i in range(10)])
            assert raw.response(sid)[0][":status"] == ["431"]
            sid = raw.request("/")
            assert raw.response(sid)[1] == b"ok"
        finally:
            raw.close()


def test_response_start_timeout_is_per_stream():
    with skirr("apps.probe:app", *H2C, "--response-start-timeout", "0.3") as s:
        raw = RawH2(s.port)
        try:
            slow = raw.request("/sleep?secs=3")
            fast = raw.request("/")
            assert raw.response(fast)[1] == b"ok"
            assert raw.response(slow)[0][":status"] == ["503"]
        finally:
            raw.close()


def test_enabled_by_environment_variables():
    env = {"SKIRR_HTTP_PROTOCOLS": "h2,h1", "SKIRR_HTTP2_CLEARTEXT": "prior-knowledge"}
    with skirr("apps.probe:app", env=env) as s, h2c_client(s) as c:
        assert c.get("/").http_version == "HTTP/2"


@pytest.mark.parametrize(
    "args",
    [
        ("--http-protocols", "h3"),
        ("--http-protocols", "h2", "--http2-max-frame-size", "100"),
        ("--http-protocols", "h2", "--http2-max-concurrent-streams", "0"),
    ],
)
def test_invalid_http2_options_stop_the_boot(args):
    with skirr("apps.probe:app", *args, ready=False) as s:
        assert s.wait(15) != 0
        assert "invalid --http" in s.logs(), s.logs()


def test_expect_100_continue_body_is_read():
    # No interim 100 on HTTP/2 (hyper sends none); the body sent anyway is served.
    with skirr("apps.probe:app", *H2C) as s:
        raw = RawH2(s.port)
        try:
            big = 200_000
            sid = raw.request(
                "/echo", method="POST", end=False, extra=[("expect", "100-continue"), ("content-length", str(big))]
            )
            sent = 0
            while sent < big:
                n = min(16384, big - sent, raw.conn.local_flow_control_window(sid))
                if n == 0:
                    raw.pump(lambda evs: raw.conn.local_flow_control_window(sid) > 0)
                    continue
                raw.conn.send_data(sid, b"z" * n, end_stream=sent + n == big)
                raw.flush()
                sent += n
            h, body = raw.response(sid)
            assert h[":status"] == ["200"] and body == b"z" * big
        finally:
            raw.close()


def test_header_list_over_http2_max_header_list_size_is_431_for_that_stream():
    with skirr("apps.probe:app", *H2C, "--limit-request-fields", "0") as s:
        raw = RawH2(s.port)
        try:
            sid = raw.request("/", extra=[(f"x-{i}", "v" * 2000) for i in range(40)])  # ~80 KB > 64 KiB
            assert raw.response(sid)[0][":status"] == ["431"]
            sid = raw.request("/")
            assert raw.response(sid)[1] == b"ok"
        finally:
            raw.close()


def test_access_log_says_http_2_0():
    with skirr("apps.probe:app", *H2C, "--access-log") as s, h2c_client(s) as c:
        c.get("/healthz")
        wait_until(lambda: "HTTP/2.0" in s.logs(), what="access log line")


def test_h2c_off_by_default_h1_only():
    with skirr("apps.probe:app") as s:
        with RawConn(s.port) as c:
            c.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            assert b"400" in c.read_to_eof()[:20] or True
        assert request(s.port, "GET", "/").status == 200


def test_upgrade_h2c_is_answered_as_http_1_1():
    with skirr("apps.probe:app", *H2C) as s:
        r = request(s.port, "GET", "/", headers=[("Upgrade", "h2c"), ("HTTP2-Settings", "AAMAAABkAAQAoAAAAAIAAAAA")])
        assert r.status == 200 and r.body == b"ok"


def test_upgrade_cleartext_mode_is_a_clear_error():
    with skirr("apps.probe:app", "--http-protocols", "h2,h1", "--http2-cleartext", "upgrade", ready=False) as s:
        assert s.wait(15) != 0
        assert "prior-knowledge" in s.logs()


def test_http2_flag_enables_prior_knowledge():
    with skirr("apps.probe:app", "--http2") as s, h2c_client(s) as c:
        assert c.get("/").http_version == "HTTP/2"


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_curl_http2_prior_knowledge():
    if "HTTP2" not in subprocess.run(["curl", "-V"], capture_output=True, text=True).stdout:
        pytest.skip("curl without HTTP/2")
    with skirr("apps.probe:app", *H2C) as s:
        out = subprocess.run(
            ["curl", "-sS", "--http2-prior-knowledge", "-o", "-", "-w", "|%{http_version}", s.url + "/"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert out.stdout == "ok|2", out.stderr


@pytest.mark.skipif(shutil.which("h2load") is None, reason="h2load not installed")
def test_h2load_smoke():
    with skirr("apps.probe:app", *H2C) as s:
        out = subprocess.run(
            ["h2load", "-n", "2000", "-c", "4", "-m", "10", s.url + "/"], capture_output=True, text=True, timeout=60
        )
        assert "2000 succeeded" in out.stdout, out.stdout + out.stderr


# --- TLS with ALPN -----------------------------------------------------------


def alpn(port: int, ca: str, offer: list[str]) -> str | None:
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(offer)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            return s.selected_alpn_protocol()


def tls_ready(port: int, ca: str) -> bool:
    try:
        alpn(port, ca, ["http/1.1"])
        return True
    except OSError:
        return False


def test_tls_alpn_h2_and_http11(pki):
    args = ("--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"], "--http2")
    with skirr("apps.probe:app", *args, ready=False) as s:
        wait_until(lambda: tls_ready(s.port, pki["ca"]), what="TLS server")
        assert alpn(s.port, pki["ca"], ["h2", "http/1.1"]) == "h2"
        assert alpn(s.port, pki["ca"], ["http/1.1"]) == "http/1.1"
        ctx = ssl.create_default_context(cafile=pki["ca"])
        with httpx.Client(http2=True, verify=ctx, timeout=10) as c:
            base = f"https://localhost:{s.port}"
            r = c.get(base + "/scope")
            assert r.http_version == "HTTP/2"
            scope = r.json()
            assert scope["http_version"] == "2" and scope["scheme"] == "https"
            assert "tls" in scope["extensions"]
            assert c.post(base + "/echo", content=b"y" * 100_000).content == b"y" * 100_000
        with httpx.Client(http2=False, verify=ctx, timeout=10) as c:
            r = c.get(f"https://localhost:{s.port}/scope")
            assert r.http_version == "HTTP/1.1" and r.json()["http_version"] == "1.1"


def test_tls_alpn_order_follows_http_protocols(pki):
    args = ("--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"], "--http-protocols", "h1,h2")
    with skirr("apps.probe:app", *args, ready=False) as s:
        wait_until(lambda: tls_ready(s.port, pki["ca"]), what="TLS server")
        assert alpn(s.port, pki["ca"], ["h2", "http/1.1"]) == "http/1.1"
        assert alpn(s.port, pki["ca"], ["h2"]) == "h2"


# --- Gunicorn ----------------------------------------------------------------


def test_gunicorn_h2c_prior_knowledge():
    with gunicorn("apps.probe:app", *H2C) as g, h2c_client(g) as c:
        r = c.get("/scope")
        assert r.http_version == "HTTP/2" and r.json()["http_version"] == "2"
        assert request(g.port, "GET", "/").status == 200


def test_gunicorn_access_log_h_atom_is_http_2_0():
    args = (*H2C, "--access-logfile", "-", "--access-logformat", "proto=%(H)s path=%(U)s")
    with gunicorn("apps.probe:app", *args) as g, h2c_client(g) as c:
        c.get("/healthz?h2")
        wait_until(lambda: "proto=HTTP/2.0 path=/healthz" in g.logs(), what="access log line")


def test_gunicorn_http2_settings_are_read():
    args = (*H2C, "--http2-max-concurrent-streams", "7", "--http2-initial-window-size", "1048576")
    with gunicorn("apps.probe:app", *args) as g:
        raw = RawH2(g.port)
        try:
            raw.pump(lambda evs: any(isinstance(e, h2events.RemoteSettingsChanged) for e in evs))
            changed = next(e for e in raw.events if isinstance(e, h2events.RemoteSettingsChanged)).changed_settings
            assert changed[3].new_value == 7  # SETTINGS_MAX_CONCURRENT_STREAMS
            assert changed[4].new_value == 1048576  # SETTINGS_INITIAL_WINDOW_SIZE
        finally:
            raw.close()


def test_gunicorn_cleartext_upgrade_is_a_boot_error():
    with gunicorn("apps.probe:app", "--http-protocols", "h2,h1", "--http2-cleartext", "upgrade", ready=False) as g:
        g.wait(20)
        assert "prior-knowledge" in g.logs()


def test_gunicorn_cleartext_both_warns_and_serves_prior_knowledge():
    with gunicorn("apps.probe:app", "--http-protocols", "h2,h1", "--http2-cleartext", "both") as g, h2c_client(g) as c:
        assert c.get("/").http_version == "HTTP/2"
        wait_until(lambda: "only prior-knowledge is served" in g.logs(), what="warning")
