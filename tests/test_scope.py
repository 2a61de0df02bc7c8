"""The ASGI HTTP connection scope, exactly (ASGI HTTP spec 2.5)."""

from __future__ import annotations

import json

import pytest
from harness import RawConn, request, skirr


@pytest.fixture(scope="module")
def server():
    with skirr("apps.probe:app", "--no-access-log") as s:
        yield s


def scope_of(port, raw: bytes):
    with RawConn(port) as c:
        c.send(raw)
        r = c.read_response()
        assert r.status == 200, r
        return json.loads(r.body), c.sock.getsockname()


def b(s: str) -> dict:
    return {"bytes": s}


def test_full_scope_for_a_tricky_request(server):
    raw = (
        b"GET /scope/caf%C3%A9/a%20b%2Fc?x=1&y=%20&x=2 HTTP/1.1\r\n"
        b"Host: example.test\r\n"
        b"X-Multi: one\r\n"
        b"User-Agent: probe\r\n"
        b"X-Multi: two\r\n"
        b"X-UPPER-Case: Value With Spaces\r\n"
        b"\r\n"
    )
    scope, (client_host, client_port) = scope_of(server.port, raw)
    assert scope["type"] == "http"
    assert scope["asgi"] == {"version": "3.0", "spec_version": "2.5"}
    assert scope["http_version"] == "1.1"
    assert scope["method"] == "GET"
    assert scope["scheme"] == "http"
    assert scope["path"] == "/scope/café/a b/c"
    assert scope["raw_path"] == b("/scope/caf%C3%A9/a%20b%2Fc")
    assert scope["query_string"] == b("x=1&y=%20&x=2")
    assert scope["root_path"] == ""
    assert scope["client"] == [client_host, client_port]
    assert scope["server"] == ["127.0.0.1", server.port]
    assert scope["state_is_dict"] is True
    assert scope["extensions"] == {
        "http.response.early_hint": {},
        "http.response.pathsend": {},
        "http.response.zerocopysend": {},
        "http.response.trailers": {},
    }
    headers = [(k["bytes"], v["bytes"]) for k, v in scope["headers"]]
    assert ("host", "example.test") in headers
    assert ("x-upper-case", "Value With Spaces") in headers
    assert [v for k, v in headers if k == "x-multi"] == ["one", "two"]
    assert all(k == k.lower() for k, _ in headers)


def test_every_required_key_is_present(server):
    scope, _ = scope_of(server.port, b"GET /scope HTTP/1.1\r\nHost: x\r\n\r\n")
    for key in (
        "type",
        "asgi",
        "http_version",
        "method",
        "scheme",
        "path",
        "raw_path",
        "query_string",
        "root_path",
        "headers",
        "client",
        "server",
        "extensions",
    ):
        assert key in scope, key
    assert scope["query_string"] == b("")


def test_non_utf8_path_is_decoded_with_replacement(server):
    scope, _ = scope_of(server.port, b"GET /scope/%FF%FEx HTTP/1.1\r\nHost: x\r\n\r\n")
    assert scope["path"] == "/scope/\ufffd\ufffdx"
    assert scope["raw_path"] == b("/scope/%FF%FEx")


def test_http10_version_and_post_method(server):
    scope, _ = scope_of(server.port, b"POST /scope HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
    assert scope["http_version"] == "1.0"
    assert scope["method"] == "POST"


def test_uncommon_method_is_passed_through(server):
    scope, _ = scope_of(server.port, b"PROPFIND /scope HTTP/1.1\r\nHost: x\r\n\r\n")
    assert scope["method"] == "PROPFIND"


def test_absolute_form_target_gives_path_and_query(server):
    scope, _ = scope_of(server.port, b"GET http://example.test/scope/abs?q=1 HTTP/1.1\r\nHost: example.test\r\n\r\n")
    assert scope["path"] == "/scope/abs"
    assert scope["query_string"] == b("q=1")


def test_root_path_is_prefixed():
    with skirr("apps.probe:app", "--no-access-log", "--root-path", "/api") as s:
        scope, _ = scope_of(s.port, b"GET /scope/x HTTP/1.1\r\nHost: x\r\n\r\n")
        assert scope["root_path"] == "/api"
        assert scope["path"] == "/api/scope/x"
        assert scope["raw_path"] == b("/api/scope/x")


def test_state_is_a_shallow_copy_per_request(server):
    first = json.loads(request(server.port, "GET", "/state").body)
    second = json.loads(request(server.port, "GET", "/state").body)
    assert first["started"] is True
    # Mutating a shared object is visible (shallow copy) ...
    assert second["counter"] == first["counter"] + 1
    # ... but keys set on one request's copy never reach the next.
    assert first["per_request"] == 1 and second["per_request"] == 1
