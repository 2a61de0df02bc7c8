"""Interim responses on HTTP/3 (issue 21): ``http.response.early_hint``,
Gunicorn's ``http.response.informational`` and ``100 Continue`` as HEADERS
frames on the request stream before the final response's (RFC 9114 §4.1),
seen by aioquic's client (tests/h3client.py), which parses each 1xx
HEADERS frame as an interim response and fails the stream on one after
the final head. The app is tests/apps/early_hints_app.py, as for HTTP/1.1
and HTTP/2 in test_early_hints.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from harness import wait_until

pytest.importorskip("trustme")
pytest.importorskip("aioquic")
from h3client import h3_connect, run  # noqa: E402
from test_http3 import _tls_ready, h3_skirr  # noqa: E402
from test_http3 import pki as pki  # noqa: E402, F401  (the fixture)

pytestmark = pytest.mark.timeout(60)

APP = "apps.early_hints_app:app"
LINK_CSS = "</style.css>; rel=preload; as=style"
LINK_JS = "</app.js>; rel=preload; as=script"


@pytest.fixture(scope="module")
def server(pki):  # noqa: F811
    """The app's server: (its port, the CA file that verifies it)."""
    with h3_skirr(pki, APP) as s:
        wait_until(lambda: _tls_ready(s.port, pki["ca"]), what="TLS server")
        yield s.port, pki["ca"]


def links(interim) -> list[tuple[int, list[str]]]:
    return [(status, [v for k, v in fields if k == "link"]) for status, fields in interim]


def test_early_hints_come_first_while_the_app_still_works(server):
    async def go():
        async with h3_connect(*server) as c:
            ext = await c.request("GET", "/extensions")
            sid = c.start("GET", "/hint?hold=1")
            hints = await c.interim(sid, 2)
            assert not c.streams[sid].head.done(), "the final head came with the hints"
            # The app waits for /release: the hints were sent while it works.
            assert (await c.request("GET", "/release")).status == 200
            return json.loads(ext.body), hints, await c.response(sid)

    ext, hints, final = run(go())
    assert "http.response.early_hint" in ext
    assert links(hints) == [(103, [LINK_CSS]), (103, [LINK_JS])]
    assert (final.status, final.body) == (200, b"final")


def test_gunicorn_informational_messages(server):
    async def go():
        async with h3_connect(*server) as c:
            return await c.request("GET", "/info")

    r = run(go())
    # The app's 100 is dropped (Skirr sends its own), the 102's
    # content-length too.
    assert [(s, f) for s, f in r.interim] == [(103, [("link", "</a.css>; rel=preload")]), (102, [])]
    assert (r.status, r.body) == (200, b"done")


def test_100_continue_when_the_app_reads_the_body(server):
    async def go():
        async with h3_connect(*server) as c:
            sid = c.start(
                "POST", "/upload", headers=[("content-length", "5"), ("expect", "100-continue")], body=b"", end=False
            )
            # The app hints, then awaits receive(): a 100 without the body.
            interim = await c.interim(sid, 2)
            c.send_more(sid, b"hello", end=True)
            # Without Expect: no 100.
            plain = await c.request("POST", "/upload", headers=[("content-length", "2")], body=b"hi")
            return interim, await c.response(sid), plain

    interim, r, plain = run(go())
    # Both before the final response, in either order (as on HTTP/1.1).
    assert sorted(links(interim)) == [(100, []), (103, [LINK_CSS])]
    assert (r.status, r.body) == (200, b"got 5")
    assert links(plain.interim) == [(103, [LINK_CSS])] and plain.body == b"got 2"


def test_many_hints_on_concurrent_streams(server):
    async def go():
        async with h3_connect(*server) as c:
            sids = [c.start("GET", "/many?n=40") for _ in range(6)]
            return await asyncio.gather(*(c.response(sid) for sid in sids))

    for r in run(go()):
        assert (r.status, r.body) == (200, b"final")
        assert links(r.interim) == [(103, [f"</{i}.js>; rel=preload"]) for i in range(40)]
