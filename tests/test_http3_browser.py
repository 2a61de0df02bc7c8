"""HTTP/3 in a real browser (issue 21): headless Chromium (tests/browser.py,
with QUIC on) loads a page with 50 subresources in flight together — 20
images, 15 async scripts, 15 fetch() calls (tests/apps/h2_page.py) — from
``python -m skirr --http3`` and from Gunicorn (``skirr_http3``). Every one
must load over h3: the page's own ``performance`` entries
(``nextHopProtocol``), Chromium's ``response.protocol``, and the app's
``http_version``.

``--origin-to-force-quic-on`` makes Chromium speak QUIC to the origin from
the first request; the Alt-Svc test instead starts over TCP (h2) and
checks that a later navigation switches to h3 on the server's ``Alt-Svc``.
Chromium trusts the test certificate by its key
(``--ignore-certificate-errors-spki-list``, the SHA-256 of the leaf's
SubjectPublicKeyInfo), which it honours for QUIC as for TLS over TCP."""

from __future__ import annotations

import base64
import hashlib
import uuid

import pytest
from harness import gunicorn, skirr, tls_answers, wait_until

browser = pytest.importorskip("browser", reason="websockets is needed to drive Chromium")
if not browser.CHROMIUM:
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)
x509 = pytest.importorskip("cryptography.x509")
serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")

pytestmark = pytest.mark.timeout(120)

APP = "apps.h2_page:app"
SUBRESOURCES = 50
# Every performance entry of the page (the document and its subresources)
# as [name, nextHopProtocol, responseStatus].
ENTRIES = """Promise.resolve(window.fetched).then(() => [
  ...performance.getEntriesByType("navigation"), ...performance.getEntriesByType("resource")
].map(e => [e.name, e.nextHopProtocol, e.responseStatus]))"""


@pytest.fixture(scope="module")
def pki(pki):
    """conftest's certificate and key files, and the base64 SHA-256 of the
    leaf's SubjectPublicKeyInfo (Chromium's pin)."""
    with open(pki["cert"], "rb") as f:
        leaf = x509.load_pem_x509_certificate(f.read())
    spki = leaf.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return pki["cert"], pki["key"], base64.b64encode(hashlib.sha256(spki).digest()).decode()


@pytest.fixture(scope="module", params=["standalone", "gunicorn"])
def server(request, pki):
    cert, key, _ = pki
    # h2 as well: the Alt-Svc test starts over TCP.
    h2 = ("--http-protocols", "h2,h1")
    if request.param == "standalone":
        ctx = skirr(APP, "--no-access-log", *h2, "--ssl-certfile", cert, "--ssl-keyfile", key, "--http3", ready=False)
    else:
        tls = ("--certfile", cert, "--keyfile", key)
        ctx = gunicorn(APP, "-w", "2", *h2, *tls, env={"SKIRR_HTTP3": "1"}, ready=False)
    with ctx as s:
        # The UDP endpoint is bound before the TCP listener accepts.
        wait_until(lambda: tls_answers(s, ["h2", "http/1.1"]), what="the TLS server")
        yield s


def chromium(pki, *flags: str):
    """A headless Chromium with QUIC on that trusts the test certificate;
    ``localhost`` is 127.0.0.1 (the server's address: Chromium would try
    ``::1`` first for QUIC), every other host fails at once."""
    rules = "MAP localhost 127.0.0.1, MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
    return browser.Browser(
        f"--ignore-certificate-errors-spki-list={pki[2]}", f"--host-resolver-rules={rules}", *flags, quic=True
    )


def load(b, page, url: str) -> tuple[dict, list]:
    """Loads the page at ``url``; returns Chromium's responses by request
    id and the page's performance entries, once every subresource ran."""
    assert page.goto(url, timeout=20) == 200
    assert page.eval("[...document.images].filter(i => i.complete && i.naturalWidth === 1).length") == 20
    assert sorted(page.wait_for("window.ran.length === 15 && window.ran", what="15 scripts")) == list(range(15))
    assert page.eval("window.fetched") == ["ok"] * 15
    origin = url.split("/?")[0]
    responses = {}
    for e in b.events(page.session):
        p = e["params"]
        if e["method"] == "Network.responseReceived" and p["response"]["url"].startswith(origin):
            responses[p["requestId"]] = p["response"]
    return responses, page.eval(ENTRIES)


def assert_all_h3(responses: dict, entries: list, token: str) -> None:
    mine = [r for r in responses.values() if f"t={token}" in r["url"]]
    assert len(mine) == 1 + SUBRESOURCES, sorted(r["url"] for r in mine)
    assert {r["status"] for r in mine} == {200}
    assert {r["protocol"] for r in mine} == {"h3"}, {r["url"]: r["protocol"] for r in mine}
    entries = [e for e in entries if f"t={token}" in e[0]]
    assert len(entries) == 1 + SUBRESOURCES, entries
    assert {(e[1], e[2]) for e in entries} == {("h3", 200)}, entries


def test_page_with_50_subresources_over_h3(pki, server):
    url = f"https://localhost:{server.port}"
    b = chromium(pki, f"--origin-to-force-quic-on=localhost:{server.port}")
    try:
        token = uuid.uuid4().hex
        with b.pages(1) as (page,):
            responses, entries = load(b, page, f"{url}/?t={token}")
            assert_all_h3(responses, entries, token)
            seen = page.eval(f"fetch('/seen?t={token}').then(r => r.json())")
            assert not [line for line in page.console() if "request failed" in line], page.console()
    finally:
        b.close()
    reqs = seen["requests"]
    assert len(reqs) == SUBRESOURCES
    assert {r["http_version"] for r in reqs} == {"3"} and {r["scheme"] for r in reqs} == {"https"}
    # In flight together (each takes 0.3 s): multiplexed on QUIC streams.
    assert seen["max_active"] >= 25, seen["max_active"]


def test_alt_svc_moves_a_later_navigation_to_h3(pki, server):
    url = f"https://localhost:{server.port}"
    # Chromium accepts a certificate from an unknown root (the test CA) over
    # QUIC only for the hosts of --origin-to-force-quic-on; forcing QUIC for
    # a port nothing listens on names localhost without forcing this origin.
    b = chromium(pki, "--origin-to-force-quic-on=localhost:1")
    try:
        with b.pages(1) as (page,):
            first = uuid.uuid4().hex
            responses, _ = load(b, page, f"{url}/?t={first}")
            doc = next(r for r in responses.values() if f"/?t={first}" in r["url"])
            assert doc["protocol"] == "h2"
            alt = {k.lower(): v for k, v in doc["headers"].items()}.get("alt-svc", "")
            assert alt == f'h3=":{server.port}"; ma=86400', doc["headers"]

            # Chromium races QUIC against its pooled h2 connection: the
            # QUIC handshake started by the first load's Alt-Svc wins from
            # some later navigation on (a few at most).
            def over_h3():
                token = uuid.uuid4().hex
                responses, entries = load(b, page, f"{url}/?t={token}")
                doc = next(r for r in responses.values() if f"/?t={token}" in r["url"])
                return doc["protocol"] == "h3" and (responses, entries, token)

            responses, entries, token = wait_until(over_h3, timeout=30, what="a navigation over h3")
            assert_all_h3(responses, entries, token)
    finally:
        b.close()


def test_preload_from_a_103_over_h3(pki):
    """Chromium acts on a 103 Early Hints that comes over HTTP/3: the
    stylesheet it preloads is fetched before the final response (the app
    holds it until then) and reused by the page (tests/apps/early_hints_app.py;
    the app pauses 50 ms before its hint, as on HTTP/2 in
    test_early_hints_browser.py)."""
    cert, key, _ = pki
    ctx = skirr("apps.early_hints_app:app", "--ssl-certfile", cert, "--ssl-keyfile", key, "--http3", ready=False)
    with ctx as s:
        wait_until(lambda: tls_answers(s), what="the TLS server")
        url = f"https://localhost:{s.port}"
        b = chromium(pki, f"--origin-to-force-quic-on=localhost:{s.port}")
        try:
            with b.pages(1) as (page,):
                assert page.goto(f"{url}/page?pause=0.05", timeout=20) == 200
                assert page.eval("getComputedStyle(document.getElementById('p')).color") == "rgb(1, 2, 3)"
                entry = page.eval(
                    "performance.getEntriesByType('resource').filter(e => e.name.endsWith('/style.css'))"
                    ".map(e => [e.initiatorType, e.nextHopProtocol])"
                )
                assert entry == [["early-hints", "h3"]], entry
                state = page.eval("fetch('/state').then(r => r.json())")
        finally:
            b.close()
        assert state["preload_first"] is True, state
        assert state["style_fetches"] == 1, state  # the page reused the preloaded stylesheet
