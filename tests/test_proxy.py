"""Behind a reverse proxy: forwarding headers honoured only from trusted
peers (``forwarded_allow_ips``, ``secure_scheme_headers``,
``forwarder_headers``), and the PROXY protocol (v1, v2)."""

from __future__ import annotations

import json
import struct

import pytest
from harness import RawConn, gunicorn, skirr


def scope_via(port: int, headers: str, prefix: bytes = b"") -> dict:
    with RawConn(port) as c:
        c.send(prefix + f"GET /scope HTTP/1.1\r\nHost: a\r\nConnection: close\r\n{headers}\r\n".encode())
        r = c.read_response()
        assert r.status == 200, (r.status, r.body)
        return json.loads(r.body)


@pytest.fixture(scope="module")
def trusted():
    with skirr("apps.probe:app", "--no-access-log") as s:  # default: 127.0.0.1 is trusted
        yield s


def test_x_forwarded_headers_from_a_trusted_peer(trusted):
    scope = scope_via(trusted.port, "X-Forwarded-For: 203.0.113.9, 127.0.0.1\r\nX-Forwarded-Proto: https\r\n")
    assert scope["client"] == ["203.0.113.9", 0]
    assert scope["scheme"] == "https"


def test_forwarded_header(trusted):
    scope = scope_via(trusted.port, 'Forwarded: for="[2001:db8::7]:4711";proto=https\r\n')
    assert scope["client"] == ["2001:db8::7", 4711]
    assert scope["scheme"] == "https"


def test_contradictory_scheme_headers_are_400(trusted):
    with RawConn(trusted.port) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Ssl: off\r\n\r\n")
        r = c.read_response()
        assert (r.status, r.body) == (400, b"contradictory scheme headers")


def test_script_name_from_a_trusted_proxy_sets_root_path(trusted):
    scope = scope_via(trusted.port, "SCRIPT_NAME: /api\r\n")
    assert scope["root_path"] == "/api"
    assert scope["path"] == "/api/scope"


def test_untrusted_peer_headers_are_ignored():
    with skirr("apps.probe:app", "--no-access-log", "--forwarded-allow-ips", "192.0.2.1") as s:
        scope = scope_via(s.port, "X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\nSCRIPT_NAME: /x\r\n")
        assert scope["client"][0] == "127.0.0.1"
        assert scope["scheme"] == "http"
        assert scope["root_path"] == ""


def test_proxy_headers_can_be_turned_off():
    with skirr("apps.probe:app", "--no-access-log", "--proxy-headers", "0") as s:
        scope = scope_via(s.port, "X-Forwarded-For: 203.0.113.9\r\n")
        assert scope["client"][0] == "127.0.0.1"


def test_gunicorn_forwarded_allow_ips_and_secure_scheme_headers(tmp_path):
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text('forwarded_allow_ips = "127.0.0.0/8"\nsecure_scheme_headers = {"X-SCHEME": "secure"}\n')
    with gunicorn("apps.probe:app", "-c", str(conf)) as g:
        scope = scope_via(g.port, "X-Scheme: secure\r\nX-Forwarded-For: 198.51.100.4\r\n")
        assert scope["scheme"] == "https"
        assert scope["client"][0] == "198.51.100.4"
        # X-Forwarded-Proto is not among this configuration's scheme headers.
        assert scope_via(g.port, "X-Forwarded-Proto: https\r\n")["scheme"] == "http"


V2_SIG = b"\r\n\r\n\x00\r\nQUIT\n"


def v2_header(src: str, sport: int, dst: str = "10.0.0.1", dport: int = 443) -> bytes:
    addrs = bytes(map(int, src.split("."))) + bytes(map(int, dst.split("."))) + struct.pack("!HH", sport, dport)
    return V2_SIG + bytes([0x21, 0x11]) + struct.pack("!H", len(addrs)) + addrs


def test_proxy_protocol_v1_and_v2_under_gunicorn():
    with gunicorn("apps.probe:app", "--proxy-protocol", "auto", ready=False) as g:
        from harness import wait_until

        def ready():
            try:
                return scope_via(g.port, "", b"PROXY TCP4 192.0.2.10 10.0.0.1 5555 443\r\n")
            except Exception:  # noqa: BLE001
                return None

        scope = wait_until(ready, what="server")
        assert scope["client"] == ["192.0.2.10", 5555]
        scope = scope_via(g.port, "", v2_header("198.51.100.20", 6666))
        assert scope["client"] == ["198.51.100.20", 6666]
        # A trusted peer must send the header: plain HTTP is refused (closed).
        with RawConn(g.port) as c:
            c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            assert c.is_closed(timeout=5)


def test_proxy_protocol_version_is_enforced():
    with skirr("apps.probe:app", "--proxy-protocol", "v2", ready=False) as s:
        from harness import wait_until

        wait_until(lambda: _v2_ok(s.port), what="server")
        with RawConn(s.port) as c:
            c.send(b"PROXY TCP4 192.0.2.10 10.0.0.1 5555 443\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n")
            assert c.is_closed(timeout=5)


def _v2_ok(port: int):
    try:
        return scope_via(port, "", v2_header("192.0.2.1", 1234))["client"] == ["192.0.2.1", 1234]
    except Exception:  # noqa: BLE001
        return False
