"""Property-based: an app sending arbitrary valid and invalid ASGI messages
gets only clear errors (``TypeError``/``RuntimeError``, or ``OSError`` once
the response is over), and the client always sees a well-framed response or
a clean close. The server keeps serving throughout."""

from __future__ import annotations

import json

import pytest

hypothesis = pytest.importorskip("hypothesis")
from harness import ConnectionClosed, RawConn, request, skirr  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ALLOWED = ("ok", "TypeError:", "RuntimeError:", "ClientDisconnected:")


def b(s: bytes) -> dict:
    return {"__bytes__": s.decode("latin-1")}


raw_bytes = st.binary(max_size=40) | st.sampled_from([b"", b"x", b"a\r\nb", b"\x00", b"content-length", b"12"])
byteish = raw_bytes.map(b) | st.text(max_size=10) | st.integers(-5, 2**70) | st.none()
status = st.integers(-1, 1000) | st.sampled_from([200, 204, 304, 101, 2**70]) | st.text(max_size=4) | st.none()
header = st.lists(byteish, min_size=0, max_size=3) | st.tuples(byteish, byteish).map(list)
headers = st.lists(header, max_size=4) | byteish
start = st.fixed_dictionaries(
    {"type": st.just("http.response.start")},
    optional={"status": status, "headers": headers, "trailers": st.booleans()},
)
body = st.fixed_dictionaries(
    {"type": st.just("http.response.body")},
    optional={"body": byteish, "more_body": st.booleans() | st.integers(0, 2) | st.none() | st.text(max_size=2)},
)
other = st.fixed_dictionaries({"type": st.sampled_from(["http.response.trailers", "websocket.send", "", "x"])})
message = start | body | other | byteish | st.lists(byteish, max_size=2)
# Mostly plausible sequences: a start, some bodies, with noise mixed in.
sequence = st.lists(message, max_size=6) | st.tuples(start, st.lists(body | message, max_size=4)).map(
    lambda t: [t[0], *t[1]]
)


@pytest.fixture(scope="module")
def server():
    with skirr("apps.replay:app", "--no-access-log", "--lifespan", "off") as s:
        yield s


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=sequence)
def test_random_messages_get_clear_errors_and_a_well_framed_wire(server, messages):
    payload = json.dumps(messages).encode()
    with RawConn(server.port) as c:
        c.send(
            b"POST /replay HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(payload)
            + payload
        )
        try:
            r = c.read_response()
        except ConnectionClosed:
            r = None  # the app failed after its response started: a close
        if r is not None:
            assert 200 <= r.status <= 599
    outcomes = json.loads(request(server.port, "GET", "/last").body)
    assert len(outcomes) == len(messages)
    for o in outcomes:
        assert o.startswith(ALLOWED), o
