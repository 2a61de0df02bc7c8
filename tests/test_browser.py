"""The examples in a real browser: headless Chromium over the DevTools
Protocol (tests/browser.py), against ``python -m skirr`` and Gunicorn.

The chat page joins rooms by name and talks over ws:// or, served over TLS,
wss://; the FastAPI example's pages load and fetch() from them works. One
browser serves the whole module; each test gets fresh pages. On failure the
error names a screenshot of every page."""

from __future__ import annotations

import json
import socket
import ssl
import uuid

import pytest
from harness import gunicorn, skirr, wait_until

browser = pytest.importorskip("browser", reason="websockets is needed to drive Chromium")
if not browser.CHROMIUM:
    pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)
trustme = pytest.importorskip("trustme")

CHAT = "examples.chat:app"
FASTAPI = "examples.fastapi_app:app"


@pytest.fixture(scope="module")
def chromium():
    # The TLS tests use trustme's throwaway CA, which the browser does not know.
    b = browser.Browser("--ignore-certificate-errors")
    yield b
    b.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    cert = trustme.CA().issue_cert("localhost", "127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    for blob in cert.cert_chain_pems[1:]:
        blob.write_to_path(str(d / "cert.pem"), append=True)
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    return str(d / "cert.pem"), str(d / "key.pem")


def serve(kind: str, app: str, tls: tuple[str, str] | None = None):
    """The app under ``python -m skirr`` or Gunicorn (one worker: the chat's
    rooms live in one process), over TLS if ``tls`` is (cert, key)."""
    if kind == "standalone":
        args = ["--ssl-certfile", tls[0], "--ssl-keyfile", tls[1]] if tls else []
        return skirr(app, "--no-access-log", *args, ready=not tls)
    args = ["--certfile", tls[0], "--keyfile", tls[1]] if tls else []
    return gunicorn(app, "-w", "1", *args, ready=not tls)


def base_url(server, tls: bool) -> str:
    if not tls:
        return server.url
    wait_until(lambda: _tls_answers(server), what="the TLS server")
    return f"https://127.0.0.1:{server.port}"


def _tls_answers(server) -> bool:
    if server.proc.poll() is not None:
        raise RuntimeError(f"server exited ({server.proc.returncode}):\n{server.logs()}")
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=1) as raw:
            with ctx.wrap_socket(raw) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                return s.recv(12).startswith(b"HTTP/1.1")
    except OSError:
        return False


@pytest.fixture(scope="module", params=["standalone", "gunicorn"])
def chat_url(request):
    with serve(request.param, CHAT) as s:
        yield base_url(s, tls=False)


@pytest.fixture(scope="module", params=["standalone", "gunicorn"])
def chat_tls_url(request, pki):
    with serve(request.param, CHAT, tls=pki) as s:
        yield base_url(s, tls=True)


@pytest.fixture(scope="module", params=["standalone", "gunicorn"])
def fastapi_url(request):
    with serve(request.param, FASTAPI) as s:
        yield base_url(s, tls=False)


def log_of(page) -> str:
    return page.text("#log")


def join(page, url: str, name: str, room: str | None = None) -> None:
    """Open the chat page, type a name (and a room), press Enter, wait until in."""
    assert page.goto(url) == 200
    page.fill("#name", name)
    if room is not None:
        page.fill("#room", room)
    page.press_enter()
    room = room or page.eval("document.getElementById('room').value")
    page.wait_for("!document.getElementById('say').hidden", what=f"{name} to join {room}")
    sees(page, f"(in room {room} as {name})")
    sees(page, f"server: {name} joined")


def sees(page, line: str) -> None:
    """Wait until the page's chat log shows ``line``."""
    js = f"document.getElementById('log').innerText.includes({json.dumps(line)})"
    page.wait_for(js, what=f"{line!r} in the log of {page.url}")


def say(page, text: str) -> None:
    page.fill("#msg", text)
    page.press_enter()


def chat_in_rooms(chromium, url: str, scheme: str) -> None:
    room, other = f"r-{uuid.uuid4().hex[:8]}", f"o-{uuid.uuid4().hex[:8]}"
    with chromium.pages(3) as (ada, bob, cy):
        join(ada, f"{url}/", "ada", room)  # the room typed in
        join(bob, f"{url}/?room={room}", "bob")  # the room from ?room=
        join(cy, f"{url}/?room={other}", "cy")
        for page in (ada, bob, cy):
            assert page.eval("ws.url").startswith(f"{scheme}://"), page.eval("ws.url")
        sees(ada, "server: bob joined")

        say(ada, "hello bob")
        sees(bob, "ada: hello bob")
        sees(ada, "ada: hello bob")
        # cy's own message comes back on the same socket after anything sent to it before.
        say(cy, "anyone?")
        sees(cy, "cy: anyone?")
        assert "hello bob" not in log_of(cy), log_of(cy)
        assert "anyone?" not in log_of(ada) + log_of(bob)
        assert "bob joined" not in log_of(cy)
        for page in (ada, bob, cy):
            assert "undefined" not in log_of(page), log_of(page)
            problems = [line for line in page.console() if not line.endswith("/favicon.ico")]  # the app has none
            assert problems == [], problems

        # permessage-deflate (RFC 7692): Chromium offers it, Skirr accepts;
        # a long line goes compressed both ways (Chromium compresses what it
        # sends once agreed; Skirr what is over ws_deflate_min_size).
        for page in (ada, bob, cy):
            assert negotiated_extensions(chromium, page) == [
                "permessage-deflate; server_no_context_takeover; client_max_window_bits=12"
            ]
        long_line = "compress me " * 100
        say(ada, long_line)
        sees(bob, f"ada: {long_line.strip()}")

        bob.eval("ws.close()")
        sees(ada, "server: bob left")


def negotiated_extensions(chromium, page) -> list[str]:
    """The Sec-WebSocket-Extensions answers the page's WebSockets got, from
    the DevTools Network events."""
    out = []
    for e in chromium.events(page.session):
        if e["method"] == "Network.webSocketHandshakeResponseReceived":
            headers = {k.lower(): v for k, v in e["params"]["response"]["headers"].items()}
            out.append(headers.get("sec-websocket-extensions"))
    return out


def test_chat_rooms_in_the_browser(chromium, chat_url):
    chat_in_rooms(chromium, chat_url, "ws")


def test_chat_over_tls_uses_wss(chromium, chat_tls_url):
    chat_in_rooms(chromium, chat_tls_url, "wss")


def test_chat_rejoining_another_room(chromium, chat_url):
    first, second = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    with chromium.pages(2) as (ada, bob):
        join(bob, f"{chat_url}/?room={second}", "bob")
        join(ada, f"{chat_url}/?room={first}", "ada")
        ada.fill("#room", second)
        ada.press_enter()  # in the room field: submits the join form again
        sees(ada, f"(in room {second} as ada)")  # the new socket is open
        sees(bob, "server: ada joined")
        say(ada, "moved")
        sees(bob, "ada: moved")
        assert "disconnected" not in log_of(ada), log_of(ada)


def test_fastapi_pages_and_fetch(chromium, fastapi_url):
    with chromium.pages(1) as (page,):
        assert page.goto(f"{fastapi_url}/") == 200
        assert json.loads(page.text()) == {"message": "Hello, world!"}

        got = page.eval("""(async () => {
            const get = async (path, init) => { const r = await fetch(path, init); return [r.status, await r.text()]; };
            return {
                item: await get("/items/2?q=ripe"),
                missing: await get("/items/99"),
                bad: await get("/items/zero"),
                created: await get("/items", {method: "POST", headers: {"content-type": "application/json"},
                                              body: JSON.stringify({name: "fig", price: 2.5, tags: ["x"]})}),
                login: await get("/login", {method: "POST",
                                            body: new URLSearchParams({username: "ada", password: "pw"})}),
                upload: await get("/upload-size", {method: "POST", body: new Blob([new Uint8Array(300000)])}),
                stream: await get("/stream?n=3"),
                sync: await get("/sync"),
            };
        })()""")
        body = {k: (status, json.loads(text) if k != "stream" else text) for k, (status, text) in got.items()}
        assert body["item"] == (200, {"item_id": 2, "name": "pear", "q": "ripe"})
        assert body["missing"] == (404, {"detail": "item not found"})
        assert body["bad"][0] == 422 and body["bad"][1]["detail"][0]["loc"] == ["path", "item_id"]
        assert body["created"] == (200, {"created": {"name": "fig", "price": 2.5, "tags": ["x"]}, "total": 3.0})
        assert body["login"] == (200, {"username": "ada", "password_length": 2})
        assert body["upload"] == (200, {"size": 300000})
        assert body["stream"] == (200, "chunk 0\nchunk 1\nchunk 2\n")
        assert body["sync"] == (200, {"sync": True})

        # Swagger UI's page is served; its assets are on a CDN, which is unreachable here.
        assert page.goto(f"{fastapi_url}/docs") == 200
        assert page.eval("document.title") == "Skirr example - Swagger UI"
        spec = page.eval("fetch('/openapi.json').then(r => r.json())")
        assert spec["info"]["title"] == "Skirr example"
        assert {"/", "/items/{item_id}", "/items", "/login", "/stream"} <= set(spec["paths"])
