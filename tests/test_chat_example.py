"""The WebSocket chat example (FastAPI), with the `websockets` client library."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets
from harness import skirr


@pytest.fixture(scope="module")
def url():
    with skirr("examples.chat:app", "--no-access-log") as s:
        yield f"ws://127.0.0.1:{s.port}"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_messages_are_broadcast_to_the_room(url):
    async def go():
        async with websockets.connect(f"{url}/ws/r1?name=ada", subprotocols=["chat.v1"]) as a:
            assert a.subprotocol == "chat.v1"
            assert json.loads(await a.recv()) == {"from": "server", "text": "ada joined"}
            async with websockets.connect(f"{url}/ws/r1?name=bob") as b:
                assert json.loads(await a.recv())["text"] == "bob joined"
                assert json.loads(await b.recv())["text"] == "bob joined"
                await b.send("hi ada")
                assert json.loads(await a.recv()) == {"from": "bob", "text": "hi ada"}
                assert json.loads(await b.recv()) == {"from": "bob", "text": "hi ada"}
            assert json.loads(await a.recv()) == {"from": "server", "text": "bob left"}

    run(go())


def test_rooms_are_separate(url):
    async def go():
        async with websockets.connect(f"{url}/ws/r2?name=x") as x, websockets.connect(f"{url}/ws/r3?name=y") as y:
            await x.recv()
            await y.recv()
            await x.send("only r2")
            assert json.loads(await x.recv())["text"] == "only r2"
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(y.recv(), 0.3)

    run(go())


def test_close_before_accept_is_refused_with_403(url):
    async def go():
        with pytest.raises(websockets.exceptions.InvalidStatus) as e:
            async with websockets.connect(f"{url}/ws/r4?name=banned"):
                pass
        return e.value.response.status_code

    assert run(go()) == 403


def test_many_clients(url):
    async def client(i):
        # Unbounded queue: after its echo a client stops reading, and with the
        # default 16-frame queue full it would not see the server's close frame
        # until close_timeout (10 s) ran out.
        async with websockets.connect(f"{url}/ws/big?name=c{i}", max_queue=None) as ws:
            await ws.send(f"msg {i}")
            while True:
                m = json.loads(await ws.recv())
                if m == {"from": f"c{i}", "text": f"msg {i}"}:
                    return True

    async def go():
        return await asyncio.gather(*(client(i) for i in range(50)))

    assert all(run(go()))
