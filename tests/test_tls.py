"""TLS terminated in Rust (rustls), configured with Gunicorn's SSL settings
or the standalone ``--ssl-*`` options: https scheme, the ASGI ``tls``
extension, client certificates, ciphers and versions, clear boot errors."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import ssl
import subprocess
import time

import pytest
from harness import PY, ROOT, _env, gunicorn, skirr, wait_until

trustme = pytest.importorskip("trustme")


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
    server.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    for blob in server.cert_chain_pems[1:]:
        blob.write_to_path(str(paths["cert"]), append=True)
    server.private_key_pem.write_to_path(str(paths["key"]))
    client.cert_chain_pems[0].write_to_path(str(paths["client_cert"]))
    client.private_key_pem.write_to_path(str(paths["client_key"]))
    return {k: str(v) for k, v in paths.items()}


def tls_get(port: int, ca: str, path: str = "/scope", *, cert=None, version=None) -> tuple[int, bytes, ssl.SSLSocket]:
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(*cert)
    if version:
        ctx.minimum_version = ctx.maximum_version = version
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    s = ctx.wrap_socket(raw, server_hostname="localhost")
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ssl.SSLEOFError, ConnectionResetError):
            break
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body, s


def test_standalone_serves_https_with_the_tls_extension(pki):
    with skirr("apps.probe:app", "--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"], ready=False) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        status, body, sock = tls_get(s.port, pki["ca"])
        assert status == 200
        scope = json.loads(body)
        assert scope["scheme"] == "https"
        tls = scope["extensions"]["tls"]
        assert tls["tls_version"] == 0x0304
        assert tls["cipher_suite"] > 0
        assert tls["client_cert_chain"] == []
        assert tls["server_cert"].startswith("-----BEGIN CERTIFICATE-----")
        assert sock.version() == "TLSv1.3"


def _tls_ready(port: int, ca: str) -> bool:
    try:
        return tls_get(port, ca, "/")[0] == 200
    except OSError:
        return False


def test_gunicorn_certfile_keyfile_and_mtls(pki):
    args = ["--certfile", pki["cert"], "--keyfile", pki["key"], "--ca-certs", pki["ca"], "--cert-reqs", "2"]
    with gunicorn("apps.probe:app", *args, ready=False) as g:
        client = (pki["client_cert"], pki["client_key"])
        wait_until(lambda: _mtls_ready(g.port, pki["ca"], client), what="mTLS server")
        status, body, _ = tls_get(g.port, pki["ca"], cert=client)
        tls = json.loads(body)["extensions"]["tls"]
        # The leaf first (the client may append its CA).
        chain = tls["client_cert_chain"]
        assert chain and chain[0].strip() == open(pki["client_cert"]).read().strip()
        # Without a client certificate the handshake is refused.
        with pytest.raises((ssl.SSLError, ConnectionResetError, OSError)):
            status, _, _ = tls_get(g.port, pki["ca"])
            assert status != 200  # TLS 1.3 may report the refusal on the first read


def _mtls_ready(port, ca, client) -> bool:
    try:
        return tls_get(port, ca, "/", cert=client)[0] == 200
    except OSError:
        return False


def test_optional_client_certificate(pki):
    args = ["--certfile", pki["cert"], "--keyfile", pki["key"], "--ca-certs", pki["ca"], "--cert-reqs", "1"]
    with gunicorn("apps.probe:app", *args, ready=False) as g:
        wait_until(lambda: _tls_ready(g.port, pki["ca"]), what="TLS server")
        _, body, _ = tls_get(g.port, pki["ca"])
        assert json.loads(body)["extensions"]["tls"]["client_cert_chain"] == []


def _tls_extensions(port: int, ca: str, paths: list[str], cert=None) -> list[dict]:
    """The `tls` extension of each request in `paths`, all on one
    keep-alive connection."""
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(*cert)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    conn.connect()
    sock = conn.sock
    seen = []
    try:
        for path in paths:
            conn.request("GET", path, headers={"Host": "localhost"})
            resp = conn.getresponse()
            assert resp.status == 200
            seen.append(json.loads(resp.read())["extensions"]["tls"])
            assert conn.sock is sock  # one connection throughout
    finally:
        conn.close()
    return seen


def test_a_request_changing_its_tls_extension_leaves_the_next_ones_alone(pki):
    """The `tls` dict and its `client_cert_chain` list are each request's
    own: on one keep-alive connection, with and without a client
    certificate, and on the next connection (Skirr builds them once per
    connection, or once for all connections without a certificate, and
    copies them)."""
    keys = ["server_cert", "client_cert_chain", "client_cert_name", "client_cert_error", "tls_version", "cipher_suite"]
    args = ["--certfile", pki["cert"], "--keyfile", pki["key"], "--ca-certs", pki["ca"], "--cert-reqs", "1"]
    with gunicorn("apps.probe:app", *args, ready=False) as g:
        wait_until(lambda: _tls_ready(g.port, pki["ca"]), what="TLS server")
        client = (pki["client_cert"], pki["client_key"])
        paths = ["/scope", "/scope-mutate-tls", "/scope"]
        for cert in (client, None, client, None):
            first, changed, after = _tls_extensions(g.port, pki["ca"], paths, cert)
            assert bool(first["client_cert_chain"]) == bool(cert)  # the client may append its CA
            assert (first["client_cert_name"] is not None) == bool(cert)
            assert changed["client_cert_chain"] == first["client_cert_chain"] + ["changed"]
            assert changed["tls_version"] == 0 and changed["added"] is True
            assert after == first
            assert list(after) == keys
            assert first["tls_version"] == 0x0304 and first["client_cert_error"] is None


def test_ssl_version_and_ciphers(pki):
    args = [
        "--certfile",
        pki["cert"],
        "--keyfile",
        pki["key"],
        "--ssl-version",
        "TLSv1_2",
        "--ciphers",
        "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES128-GCM-SHA256",
    ]
    with gunicorn("apps.probe:app", *args, ready=False) as g:
        wait_until(lambda: _tls_ready(g.port, pki["ca"]), what="TLS server")
        _, _, sock = tls_get(g.port, pki["ca"])
        assert sock.version() == "TLSv1.2"
        assert sock.cipher()[0] in ("ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES128-GCM-SHA256")
        with pytest.raises(ssl.SSLError):
            tls_get(g.port, pki["ca"], version=ssl.TLSVersion.TLSv1_3)


def test_websocket_over_tls_has_scheme_wss(pki):
    import base64
    import os
    import struct

    with skirr("apps.ws_app:app", "--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"], ready=False) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        ctx = ssl.create_default_context(cafile=pki["ca"])
        raw = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        with ctx.wrap_socket(raw, server_hostname="localhost") as c:
            key = base64.b64encode(os.urandom(16)).decode()
            c.sendall(
                f"GET /scope HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
            )
            data = b""
            while b"\r\n\r\n" not in data:
                data += c.recv(4096)
            head, _, rest = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 101")
            while len(rest) < 4:
                rest += c.recv(4096)
            n, off = rest[1] & 0x7F, 2
            if n == 126:
                n, off = struct.unpack("!H", rest[2:4])[0], 4
            while len(rest) < off + n:
                rest += c.recv(65536)
            scope = json.loads(rest[off : off + n])
            assert scope["scheme"] == "wss"
            assert "tls" in scope["extensions"]


def _partial_client_hello() -> bytes:
    """The first half of a real ClientHello: a handshake that stalls."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    hello = outgoing.read()
    assert len(hello) > 100
    return hello[: len(hello) // 2]


def _closed_by_server(c: socket.socket, deadline: float) -> bool:
    c.settimeout(max(0.05, deadline - time.monotonic()))
    try:
        return c.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def _raise_fd_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))


def test_silent_and_stalled_tls_handshakes_are_closed_at_the_deadline(pki):
    _raise_fd_limit()
    args = ["--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"], "--no-access-log"]
    with skirr("apps.probe:app", *args, "--tls-handshake-timeout", "1.5", ready=False) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        hello = _partial_client_hello()
        t0 = time.monotonic()
        silent = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(200)]
        half = []
        for _ in range(50):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            c.sendall(hello)
            half.append(c)
        try:
            # A real client is served meanwhile.
            status, body, _ = tls_get(s.port, pki["ca"])
            assert status == 200 and json.loads(body)["scheme"] == "https"
            assert time.monotonic() - t0 < 1.2, "the stalled connections were set up too slowly to test"
            # Not before the deadline...
            assert not _closed_by_server(silent[-1], t0 + 1.0)
            assert not _closed_by_server(half[-1], t0 + 1.1)
            # ...but then every one of them.
            end = t0 + 1.5 + 5
            still_open = [c for c in silent + half if not _closed_by_server(c, end)]
            assert not still_open, f"{len(still_open)} stalled handshakes still open after the deadline"
            assert tls_get(s.port, pki["ca"])[0] == 200
        finally:
            for c in silent + half:
                c.close()


def test_stalled_tls_handshakes_hold_connection_slots_until_the_deadline(pki):
    args = ["--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"], "--no-access-log"]
    with skirr("apps.probe:app", *args, "--max-connections", "20", "--tls-handshake-timeout", "1", ready=False) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        # Every slot taken (two more in the backlog, ahead of the real client,
        # absorb a slot the readiness probe may still hold).
        stalled = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(22)]
        try:
            t0 = time.monotonic()
            assert tls_get(s.port, pki["ca"])[0] == 200
            waited = time.monotonic() - t0
            # The real client waited in the backlog until the deadline freed
            # the slots, and not much longer.
            assert 0.7 < waited < 6, f"served after {waited:.2f}s"
        finally:
            for c in stalled:
                c.close()


def test_tls_handshake_timeout_from_a_gunicorn_config_file(pki, tmp_path):
    conf = tmp_path / "conf.py"
    conf.write_text("skirr_tls_handshake_timeout = 0.5\n")
    args = ["-c", str(conf), "--certfile", pki["cert"], "--keyfile", pki["key"]]
    with gunicorn("apps.probe:app", *args, ready=False) as g:
        wait_until(lambda: _tls_ready(g.port, pki["ca"]), what="TLS server")
        with socket.create_connection(("127.0.0.1", g.port), timeout=10) as c:
            t0 = time.monotonic()
            assert _closed_by_server(c, t0 + 5)
            assert 0.3 < time.monotonic() - t0 < 3


@pytest.mark.parametrize(
    "problem,args,words",
    [
        ("not a certificate", ["--certfile", "EMPTY", "--keyfile", "EMPTY"], ["certfile", "no PEM certificate"]),
        ("unknown cipher", ["--ciphers", "HIGH:!aNULL"], ["ciphers", "HIGH"]),
        ("old version", ["--ssl-version", "TLSv1"], ["TLS version", "not supported"]),
        ("mtls without ca", ["--cert-reqs", "2"], ["ca_certs"]),
    ],
)
def test_unusable_tls_settings_stop_the_boot_with_one_line(pki, tmp_path, problem, args, words):
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    args = [str(empty) if a == "EMPTY" else a for a in args]
    base = [] if "certificate" in problem else ["--certfile", pki["cert"], "--keyfile", pki["key"]]
    with gunicorn("apps.probe:app", *base, *args, ready=False) as g:
        assert g.wait(20) != 0, "the master halts when a worker cannot boot"
        logs = g.logs()
    line = next((ln for ln in logs.splitlines() if "[ERROR] skirr:" in ln), "")
    assert line, logs
    for w in words:
        assert w in line, (w, line)
    assert "Traceback" not in logs


def test_standalone_tls_errors_are_one_line(pki):
    p = subprocess.run(
        [PY, "-m", "skirr", "apps.probe:app", "--app-dir", "tests", "--port", "0"]
        + ["--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"], "--ssl-ciphers", "HIGH"],
        cwd=str(ROOT),
        env=_env(None),
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert p.returncode == 1
    assert "Traceback" not in p.stderr
    line = [ln for ln in p.stderr.splitlines() if ln.startswith("skirr: error:")]
    assert line and "HIGH" in line[0], p.stderr
    assert "listening at" not in p.stderr, "settings are checked before the server is announced"


def test_encrypted_key_is_refused_clearly(pki, tmp_path):
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(open(pki["key"], "rb").read(), password=None)
    enc = tmp_path / "enc.pem"
    enc.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with gunicorn("apps.probe:app", "--certfile", pki["cert"], "--keyfile", str(enc), ready=False) as g:
        assert g.wait(20) != 0
        assert "encrypted with a passphrase" in g.logs()


SUBJECTS = [
    # name attributes in certificate order (the RFC 4514 string is reversed)
    [[("C", "DE")], [("O", "Acme, Inc.")], [("OU", "R+D; <lab>")], [("CN", "#lead and trail ")]],
    [[("DC", "test")], [("DC", "example")], [("UID", "jdoe"), ("CN", "Jane \"J\" Doe")]],
    [[("CN", "Grüße 東京")], [("emailAddress", "jane@example.test")], [("L", "back\\slash")]],
]


def _client_pki(d, subject):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    oids = {
        "C": NameOID.COUNTRY_NAME,
        "O": NameOID.ORGANIZATION_NAME,
        "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
        "CN": NameOID.COMMON_NAME,
        "DC": NameOID.DOMAIN_COMPONENT,
        "UID": NameOID.USER_ID,
        "L": NameOID.LOCALITY_NAME,
        "emailAddress": NameOID.EMAIL_ADDRESS,
    }
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "client CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    name = x509.Name(
        [x509.RelativeDistinguishedName([x509.NameAttribute(oids[k], v) for k, v in rdn]) for rdn in subject]
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (d / "client-ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (d / "c.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "c.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(d / "client-ca.pem"), (str(d / "c.pem"), str(d / "c.key")), cert.subject.rfc4514_string()


@pytest.mark.parametrize("subject", SUBJECTS, ids=["escapes", "multi-valued", "non-ascii-and-oid"])
def test_client_cert_name_is_the_subject_as_cryptography_writes_it(pki, tmp_path, subject):
    client_ca, client, want = _client_pki(tmp_path, subject)
    args = ["--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"], "--ssl-ca-certs", client_ca]
    with skirr("apps.probe:app", *args, "--ssl-cert-reqs", "1", ready=False) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        _, body, _ = tls_get(s.port, pki["ca"], cert=client)
        tls = json.loads(body)["extensions"]["tls"]
        assert tls["client_cert_name"] == want
        assert tls["client_cert_error"] is None
        # Without a certificate: None.
        _, body, _ = tls_get(s.port, pki["ca"])
        assert json.loads(body)["extensions"]["tls"]["client_cert_name"] is None


def test_a_refused_client_certificate_is_logged_with_the_reason(pki, tmp_path):
    # An X.509 v1 certificate (what `openssl x509 -req` makes by default)
    # from the trusted CA, and a v3 one from an unknown CA: rustls refuses
    # both; each refusal is one line naming why (c47abb2 logged nothing).
    if not shutil.which("openssl"):
        pytest.skip("no openssl command")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    ca.private_key_pem.write_to_path(str(tmp_path / "ca-key.pem"))
    server = ca.issue_cert("localhost", "127.0.0.1")
    server.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    run = lambda *a: subprocess.run(a, cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", "v1-key.pem",
        "-subj", "/CN=v1client", "-out", "v1.csr")  # fmt: skip
    run("openssl", "x509", "-req", "-in", "v1.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
        "-CAcreateserial", "-out", "v1.pem", "-days", "2")  # fmt: skip
    assert b"Version: 1 (0x0)" in run("openssl", "x509", "-in", "v1.pem", "-noout", "-text").stdout
    other = trustme.CA().issue_cert("stranger@example.test")
    other.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "stranger.pem"))
    args = ["--ssl-certfile", str(tmp_path / "server.pem"), "--ssl-ca-certs", str(tmp_path / "ca.pem"),
            "--ssl-cert-reqs", "2"]  # fmt: skip
    with skirr("apps.probe:app", *args, ready=False) as s:
        good = ca.issue_cert("client@example.test")
        good.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "good.pem"))
        wait_until(lambda: _mtls_ready(s.port, str(tmp_path / "ca.pem"), (str(tmp_path / "good.pem"),)),
                   what="mTLS server")  # fmt: skip
        for cert in [(str(tmp_path / "v1.pem"), str(tmp_path / "v1-key.pem")), (str(tmp_path / "stranger.pem"),)]:
            with pytest.raises((ssl.SSLError, ConnectionResetError, OSError)):
                status, _, _ = tls_get(s.port, str(tmp_path / "ca.pem"), cert=cert)
                assert status != 200
        refused = lambda: [ln for ln in s.logs().splitlines() if "client certificate refused" in ln]  # noqa: E731
        lines = wait_until(lambda: len(refused()) >= 2 and refused(), what="two refusal lines")
        assert len(lines) == 2, lines
        assert "X.509 v1" in lines[0], lines
        assert "UnknownIssuer" in lines[1], lines
