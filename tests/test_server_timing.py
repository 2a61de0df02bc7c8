"""``server_timing``: a ``Server-Timing`` header with the app's and the
server's time on every response, over HTTP/1.1 and HTTP/2; off by default."""

from __future__ import annotations

import re

import pytest
from harness import request, skirr

pytestmark = pytest.mark.timeout(60)

TIMING = re.compile(r"^app;dur=(\d+\.\d{3}), total;dur=(\d+\.\d{3})$")


def test_off_by_default():
    with skirr("apps.probe:app") as s:
        assert request(s.port, "GET", "/").header("server-timing") is None


def test_app_and_total_durations_in_milliseconds():
    with skirr("apps.probe:app", "--server-timing", "true") as s:
        r = request(s.port, "GET", "/sleep?secs=0.2")
        m = TIMING.match(r.header("server-timing") or "")
        assert m, r.headers
        app, total = float(m[1]), float(m[2])
        # The loop's timer and the server's clock are read on different
        # threads (and, on a VM, possibly different vCPUs): allow a few ms of
        # skew below the 200 ms sleep; a unit error (s or µs) is still caught.
        assert 190 <= app <= total < 5000
        # A streamed response: the header is in the head, sent before the body.
        r = request(s.port, "GET", "/stream?n=2&delay=0.1")
        assert TIMING.match(r.header("server-timing") or "")
        assert r.body == b"chunk0\nchunk1\n"


def test_server_answers_get_total_only():
    with skirr("apps.probe:app", "--server-timing", "true", "--limit-request-line", "50") as s:
        r = request(s.port, "GET", "/" + "x" * 100)
        assert r.status == 414
        assert re.match(r"^total;dur=\d+\.\d{3}$", r.header("server-timing") or "")


def test_over_http2():
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("h2")
    with (
        skirr("apps.probe:app", "--http2", "--server-timing", "true") as s,
        httpx.Client(base_url=s.url, http1=False, http2=True, timeout=10) as c,
    ):
        r = c.get("/")
        assert r.http_version == "HTTP/2"
        assert TIMING.match(r.headers["server-timing"])
