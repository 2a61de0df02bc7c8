"""HTTP/2 in a real browser (issue 10): headless Chromium (tests/browser.py)
loads a page over TLS (ALPN h2) with 50 subresources in flight together —
20 images, 15 async scripts, 15 fetch() calls — from ``python -m skirr`` and
from Gunicorn. Every one must load, over h2 (Chromium's own
``response.protocol`` and the app's ``http_version``), on one connection
(Chromium's ``connectionId`` and the one client port the app saw).

Chromium trusts the test certificate by its key: ``--ignore-certificate-
errors-spki-list`` with the SHA-256 of the leaf's SubjectPublicKeyInfo
(any other certificate error still fails the load)."""

from __future__ import annotations

import base64
import hashlib
import uuid

import pytest
from harness import gunicorn, skirr, tls_answers, wait_until

browser = pytest.importorskip("browser", reason="websockets is needed to drive Chromium")
if not browser.CHROMIUM:
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)
trustme = pytest.importorskip("trustme")
x509 = pytest.importorskip("cryptography.x509")
serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")

pytestmark = pytest.mark.timeout(120)

APP = "apps.h2_page:app"
SUBRESOURCES = 50


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    cert = trustme.CA().issue_cert("localhost", "127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    for blob in cert.cert_chain_pems[1:]:
        blob.write_to_path(str(d / "cert.pem"), append=True)
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    leaf = x509.load_pem_x509_certificate(cert.cert_chain_pems[0].bytes())
    spki = leaf.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return str(d / "cert.pem"), str(d / "key.pem"), base64.b64encode(hashlib.sha256(spki).digest()).decode()


@pytest.fixture(scope="module")
def chromium(pki):
    b = browser.Browser(f"--ignore-certificate-errors-spki-list={pki[2]}")
    yield b
    b.close()



@pytest.fixture(scope="module", params=["standalone", "gunicorn"])
def url(request, pki):
    cert, key, _ = pki
    if request.param == "standalone":
        ctx = skirr(
            APP,
            "--no-access-log",
            "--http-protocols",
            "h2,h1",
            "--ssl-certfile",
            cert,
            "--ssl-keyfile",
            key,
            ready=False,
        )
    else:
        ctx = gunicorn(APP, "-w", "2", "--http-protocols", "h2,h1", "--certfile", cert, "--keyfile", key, ready=False)
    with ctx as s:
        wait_until(lambda: tls_answers(s, ["h2", "http/1.1"]), what="the TLS server offering h2")
        yield f"https://127.0.0.1:{s.port}"


def test_page_with_50_subresources_over_one_h2_connection(chromium, url):
    token = uuid.uuid4().hex
    with chromium.pages(1) as (page,):
        assert page.goto(f"{url}/?t={token}", timeout=20) == 200
        # Every image decoded, every script ran, every fetch got its own answer.
        assert page.eval("[...document.images].filter(i => i.complete && i.naturalWidth === 1).length") == 20
        assert sorted(page.wait_for("window.ran.length === 15 && window.ran", what="15 scripts")) == list(range(15))
        assert page.eval("window.fetched") == ["ok"] * 15
        seen = page.eval(f"fetch('/seen?t={token}').then(r => r.json())")

        responses = {}
        for e in chromium.events(page.session):
            p = e["params"]
            if e["method"] == "Network.responseReceived" and p["response"]["url"].startswith(url):
                responses[p["requestId"]] = p["response"]
        subs = {
            r["url"] for r in responses.values() if "/img/" in r["url"] or "/js/" in r["url"] or "/data/" in r["url"]
        }
        assert len(subs) == SUBRESOURCES, sorted(subs)
        assert {r["status"] for r in responses.values()} == {200}
        assert {r["protocol"] for r in responses.values()} == {"h2"}, {
            r["url"]: r["protocol"] for r in responses.values()
        }
        # The document, the 50 and /seen: one connection.
        assert len({r["connectionId"] for r in responses.values()}) == 1, {
            r["url"]: r["connectionId"] for r in responses.values()
        }
        assert not [line for line in page.console() if "request failed" in line], page.console()

    reqs = seen["requests"]
    assert len(reqs) == SUBRESOURCES
    assert {r["http_version"] for r in reqs} == {"2"} and {r["scheme"] for r in reqs} == {"https"}
    assert len({tuple(r["client"]) for r in reqs}) == 1, {tuple(r["client"]) for r in reqs}
    # In flight together (each takes 0.3 s): multiplexed, not queued one by one.
    assert seen["max_active"] >= 25, seen["max_active"]
