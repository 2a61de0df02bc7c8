"""The README's example: a real FastAPI app served by Skirr, talked to with httpx."""

from __future__ import annotations

import httpx
import pytest
from harness import gunicorn, skirr

APP = "examples.fastapi_app:app"


@pytest.fixture(scope="module", params=["standalone", "gunicorn"])
def base_url(request):
    if request.param == "standalone":
        ctx = skirr(APP, "--no-access-log")
    else:
        ctx = gunicorn(APP, "-w", "2")
    with ctx as s:
        yield s.url


@pytest.fixture
def client(base_url):
    with httpx.Client(base_url=base_url, timeout=10) as c:
        yield c


def test_json(client):
    r = client.get("/")
    assert r.status_code == 200 and r.json() == {"message": "Hello, world!"}
    assert r.headers["content-type"] == "application/json"


def test_healthz_sees_lifespan_state(client):
    assert client.get("/healthz").json() == {"status": "ok", "started": True}


def test_path_and_query_params(client):
    assert client.get("/items/2", params={"q": "ripe"}).json() == {"item_id": 2, "name": "pear", "q": "ripe"}


def test_404_and_422(client):
    assert client.get("/items/99").status_code == 404
    assert client.get("/nowhere").status_code == 404
    r = client.get("/items/not-a-number")
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["path", "item_id"]


def test_json_upload(client):
    r = client.post("/items", json={"name": "lamp", "price": 10.0, "tags": ["a"]})
    assert r.status_code == 200
    assert r.json() == {"created": {"name": "lamp", "price": 10.0, "tags": ["a"]}, "total": 12.0}


def test_invalid_json_upload_is_422(client):
    assert client.post("/items", json={"name": "lamp"}).status_code == 422


def test_form_upload(client):
    r = client.post("/login", data={"username": "ada", "password": "hunter22"})
    assert r.json() == {"username": "ada", "password_length": 8}


def test_streamed_upload(client):
    def gen():
        for _ in range(64):
            yield b"x" * 65536

    assert client.post("/upload-size", content=gen()).json() == {"size": 64 * 65536}


def test_streaming_response(client):
    with client.stream("GET", "/stream", params={"n": 4, "delay": 0.01}) as r:
        chunks = list(r.iter_text())
    assert "".join(chunks) == "".join(f"chunk {i}\n" for i in range(4))


def test_sync_endpoint_in_threadpool(client):
    assert client.get("/sync").json() == {"sync": True}
