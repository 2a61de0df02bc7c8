"""Early hints in a real browser (issue 11): headless Chromium navigates to
a page whose app first sends ``http.response.early_hint`` with a
``rel=preload`` link for its stylesheet, then holds the final response until
the stylesheet was fetched (at most 5 s). The preload must happen before the
final response — the app records it — and Chromium must say the stylesheet
came from the hint (``initiatorType`` "early-hints").

Chromium honours a 103 only for a secure top-level navigation (TLS here),
by default on HTTP/2 and later, and on HTTP/1.1 with its
``EnableEarlyHintsOnHttp11`` feature: both are tested, each standalone and
under Gunicorn.

On HTTP/2 the app pauses 50 ms before its hint. Chromium (156 here) drops
a 103 that reaches it over HTTP/2 within about a millisecond of
its request — on loopback, 2 to 4 navigations in 8, with the 103 on the wire
at once each time (nghttp shows it whole, before the 200) — and takes every
one that comes 50 ms later; an app that looks something up before it
hints, and any real network, leaves that much time."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import ssl

import pytest
from harness import gunicorn, skirr, tls_answers, wait_until

browser = pytest.importorskip("browser", reason="websockets is needed to drive Chromium")
if not browser.CHROMIUM:
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)
x509 = pytest.importorskip("cryptography.x509")
serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")

pytestmark = pytest.mark.timeout(120)

APP = "apps.early_hints_app:app"


@pytest.fixture(scope="module")
def chromium(pki):
    with open(pki["cert"], "rb") as f:
        leaf = x509.load_pem_x509_certificate(f.read())
    spki = leaf.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    pin = base64.b64encode(hashlib.sha256(spki).digest()).decode()
    b = browser.Browser(f"--ignore-certificate-errors-spki-list={pin}", "--enable-features=EnableEarlyHintsOnHttp11")
    yield b
    b.close()



def _state(port: int, pki) -> dict:
    ctx = ssl.create_default_context(cafile=pki["ca"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(b"GET /state HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    return json.loads(data.partition(b"\r\n\r\n")[2])


@pytest.mark.parametrize("protocol", ["http/1.1", "h2"])
@pytest.mark.parametrize("form", ["standalone", "gunicorn"])
def test_preload_from_103_happens_before_the_final_response(chromium, pki, form, protocol):
    tls = ("--ssl-certfile", pki["cert"], "--ssl-keyfile", pki["key"])
    # ALPN offers h2 first when it is on; Chromium takes it.
    h2 = ("--http-protocols", "h2,h1") if protocol == "h2" else ()
    if form == "standalone":
        ctx = skirr(APP, "--no-access-log", *tls, *h2, ready=False)
    else:
        ctx = gunicorn(APP, "-w", "1", "--certfile", pki["cert"], "--keyfile", pki["key"], *h2, ready=False)
    with ctx as s:
        wait_until(lambda: tls_answers(s), what="the TLS server")
        url = f"https://localhost:{s.port}"
        with chromium.pages(1) as (page,):
            pause = "?pause=0.05" if protocol == "h2" else ""
            assert page.goto(f"{url}/page{pause}", timeout=20) == 200
            assert page.eval("getComputedStyle(document.getElementById('p')).color") == "rgb(1, 2, 3)"
            entry = page.eval(
                "performance.getEntriesByType('resource').filter(e => e.name.endsWith('/style.css'))"
                ".map(e => e.initiatorType)"
            )
            assert entry == ["early-hints"], entry
            responses = [
                e["params"]["response"]
                for e in chromium.events(page.session)
                if e["method"] == "Network.responseReceived" and e["params"]["response"]["url"].startswith(url)
            ]
            assert {r["protocol"] for r in responses} == {protocol}, responses
        state = _state(s.port, pki)
        assert state["preload_first"] is True, state
        assert state["style_fetches"] == 1, state  # the page reused the preloaded stylesheet
