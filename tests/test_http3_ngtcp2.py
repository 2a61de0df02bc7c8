"""HTTP/3 end to end with another QUIC stack (issue 21): ngtcp2's example
client ``gtlsclient`` (Debian's ngtcp2-client: ngtcp2 + nghttp3 + GnuTLS)
against the FastAPI example (examples/fastapi_app.py) served with
``--http3``, standalone and under a Gunicorn master with two workers
(``skirr_http3``). The client prints each response's fields and a hex dump
of its body, which is parsed back here."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from harness import gunicorn, skirr, tls_answers, wait_until

GTLSCLIENT = shutil.which("gtlsclient")
if not GTLSCLIENT:
    pytest.skip("gtlsclient is not installed (apt-get install ngtcp2-client)", allow_module_level=True)

pytestmark = pytest.mark.timeout(90)

APP = "examples.fastapi_app:app"
STREAM = re.compile(r"^http: stream (0x[0-9a-f]+) (.*)$")
DUMP = re.compile(r"^[0-9a-f]{8}  ((?:[0-9a-f]{2} {1,2})+)")


@pytest.fixture(scope="module", params=["standalone", "gunicorn"])
def server(request, pki):
    cert, key = pki["cert"], pki["key"]
    if request.param == "standalone":
        ctx = skirr(APP, "--ssl-certfile", cert, "--ssl-keyfile", key, "--http3", ready=False)
    else:
        ctx = gunicorn(APP, "-w", "2", "--certfile", cert, "--keyfile", key, env={"SKIRR_HTTP3": "1"}, ready=False)
    with ctx as s:
        # The UDP endpoint is bound before the TCP listener accepts.
        wait_until(lambda: tls_answers(s), what="the TLS server")
        yield s


def gtls(port: int, *paths: str, args: tuple[str, ...] = ()) -> dict[str, dict]:
    """Runs gtlsclient for ``paths`` (one connection, one stream each, in
    order); returns each stream's ``status`` (the final one; ``statuses``:
    interim ones first), ``fields`` and ``body`` by path. The client exits
    once every stream closed (an idle QUIC timeout of 5 s and the process
    timeout bound a server that never answers)."""
    uris = [f"https://localhost:{port}{p}" for p in paths]
    cmd = [GTLSCLIENT, "--exit-on-all-streams-close", "--no-quic-dump", "--timeout=5s", *args, "127.0.0.1"]
    run = subprocess.run([*cmd, str(port), *uris], capture_output=True, text=True, timeout=20)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "Negotiated ALPN is h3" in out, out[-3000:]
    streams: dict[str, dict] = {}
    current = None
    for line in out.splitlines():
        if m := STREAM.match(line):
            s = streams.setdefault(m[1], {"status": None, "statuses": [], "fields": {}, "body": b""})
            current = None
            if f := re.fullmatch(r"\[(:?[^:]+): (.*)\]", m[2]):
                if f[1] == ":status":
                    s["status"] = int(f[2])
                    s["statuses"].append(int(f[2]))
                else:
                    s["fields"][f[1]] = f[2]
            elif m[2].startswith("body "):
                current = s
        elif current is not None and (d := DUMP.match(line)):
            current["body"] += bytes.fromhex(d[1])
    # Client-initiated bidirectional streams are 0, 4, 8, ... in URI order.
    return {p: streams[hex(4 * i)] for i, p in enumerate(paths)}


def test_get_json_path_query_and_404(server):
    r = gtls(server.port, "/", "/items/1?q=x", "/items/9")
    assert r["/"]["status"] == 200 and json.loads(r["/"]["body"]) == {"message": "Hello, world!"}
    item = r["/items/1?q=x"]
    assert item["status"] == 200 and item["fields"]["content-type"] == "application/json"
    assert json.loads(item["body"]) == {"item_id": 1, "name": "apple", "q": "x"}
    assert r["/items/9"]["status"] == 404 and json.loads(r["/items/9"]["body"]) == {"detail": "item not found"}


def test_streamed_response(server):
    r = gtls(server.port, "/stream?n=20&delay=0.01")["/stream?n=20&delay=0.01"]
    assert r["status"] == 200
    assert r["body"] == b"".join(f"chunk {i}\n".encode() for i in range(20))


def test_post_bodies(server, tmp_path):
    # A 300 KB upload read as a stream (several QUIC flow control windows).
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * 1200)
    r = gtls(server.port, "/upload-size", args=("-m", "POST", "-d", str(big)))["/upload-size"]
    assert r["status"] == 200 and json.loads(r["body"]) == {"size": 256 * 1200}
    # gtlsclient sends no content-type: FastAPI reads the JSON body as a
    # string and answers 422 quoting it, so the bytes arrived intact.
    doc = tmp_path / "item.json"
    doc.write_text('{"name": "pen", "price": 2.5}')
    r = gtls(server.port, "/items", args=("-m", "POST", "-d", str(doc)))["/items"]
    assert r["status"] == 422
    assert json.loads(r["body"])["detail"][0]["input"] == doc.read_text()


def test_early_hints_reach_nghttp3_before_the_response(pki):
    cert, key = pki["cert"], pki["key"]
    with skirr("apps.early_hints_app:app", "--ssl-certfile", cert, "--ssl-keyfile", key, "--http3", ready=False) as s:
        wait_until(lambda: tls_answers(s), what="the TLS server")
        r = gtls(s.port, "/hint")["/hint"]
    assert r["statuses"] == [103, 103, 200] and r["body"] == b"final"
