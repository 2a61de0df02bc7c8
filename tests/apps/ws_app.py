"""WebSocket applications for Skirr's tests; behaviour chosen by path."""

from __future__ import annotations

import asyncio
import json
import os
from urllib.parse import parse_qs

EVENTS: list = []
#: completed send() calls per tag (see /count-sends)
SENT: dict = {}


class Key(str):
    """A key equal to a name but not the interned string itself."""


def record(e):
    EVENTS.append(e)
    path = os.environ.get("WS_EVENTS_FILE")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(e) + "\n")


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            await send({"type": m["type"] + ".complete"})
            if m["type"] == "lifespan.shutdown":
                return
    if scope["type"] == "http":
        if scope["path"] == "/events":
            body = json.dumps(EVENTS).encode()
        elif scope["path"] == "/sent":
            body = json.dumps(SENT).encode()
        else:
            body = b"ok"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})
        return
    assert scope["type"] == "websocket"
    path = scope["path"]
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    connect = await receive()
    assert connect["type"] == "websocket.connect"

    if path == "/deny":
        await send({"type": "websocket.close"})
        return
    if path == "/http-deny":
        await send(
            {
                "type": "websocket.http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"text/plain"), (b"x-why", b"token")],
            }
        )
        await send({"type": "websocket.http.response.body", "body": b"no ", "more_body": True})
        await send({"type": "websocket.http.response.body", "body": b"entry"})
        return
    if path == "/error-before-accept":
        raise RuntimeError("ws boom before accept")
    if path == "/leave-before-accept":
        m = await receive()
        record({"before_accept": m["type"], "code": m.get("code")})
        return

    subprotocol = q.get("pick")
    if subprotocol == "first":
        subprotocol = scope["subprotocols"][0] if scope["subprotocols"] else None
    headers = [(b"x-accepted", b"yes")]
    if "ext" in q:
        # An app answering Sec-WebSocket-Extensions itself (test_websocket_deflate).
        headers.append((b"sec-websocket-extensions", q["ext"].encode()))
    await send({"type": "websocket.accept", "subprotocol": subprotocol, "headers": headers})

    if path == "/scope":
        s = {k: v for k, v in scope.items() if k not in ("state",)}
        s["headers"] = [[k.decode(), v.decode()] for k, v in scope["headers"]]
        s["raw_path"] = scope["raw_path"].decode()
        s["query_string"] = scope["query_string"].decode()
        await send({"type": "websocket.send", "text": json.dumps(s)})
        await send({"type": "websocket.close", "code": 1000})
        return
    if path == "/close-with":
        await send({"type": "websocket.close", "code": int(q["code"]), "reason": q.get("reason", "")})
        m = await receive()
        record({"after_close": m["type"], "code": m.get("code")})
        try:
            await send({"type": "websocket.send", "text": "too late"})
        except OSError as e:
            record({"send_after_close": type(e).__name__})
        except RuntimeError as e:
            record({"send_after_close": "RuntimeError", "message": str(e)})
        return
    if path == "/error-after-accept":
        raise RuntimeError("ws boom after accept")
    if path == "/invalid":
        try:
            await send({"type": "websocket.send", "text": "a", "bytes": b"b"})
        except RuntimeError as e:
            await send({"type": "websocket.send", "text": f"RuntimeError: {e}"})
        try:
            await send({"type": "websocket.send", "text": b"bytes-as-text"})
        except TypeError as e:
            await send({"type": "websocket.send", "text": f"TypeError: {e}"})
        await send({"type": "websocket.close"})
        return
    if path == "/keys-built":
        # Keys equal to the names but not the interned strings, an extra
        # key, None for the other field: read as `message[key]` reads them.
        await send({"type": "websocket.send", "".join(["te", "xt"]): "a", "bytes": None})
        await send({"type": "websocket.send", Key("bytes"): b"b", "x-extra": 1})
        await send(type("Message", (dict,), {})(type="websocket.send", text="c"))
        await send({"type": "websocket.close"})
        return
    if path == "/slow-reader":
        # Never reads: the server must stop reading from the client.
        await asyncio.sleep(float(q.get("secs", "3")))
        await send({"type": "websocket.close"})
        return
    if path == "/flood":
        n = int(q.get("n", "1000"))
        size = int(q.get("size", "65536"))
        blob = b"f" * size
        for _ in range(n):
            await send({"type": "websocket.send", "bytes": blob})
        await send({"type": "websocket.close"})
        return
    if path == "/two-senders":
        blob = b"t" * 65536

        async def sender(tag):
            for _ in range(100):
                await send({"type": "websocket.send", "bytes": blob})
            record({"sender_done": tag})

        await asyncio.gather(sender("a"), sender("b"))
        await send({"type": "websocket.close"})
        return
    if path == "/two-receivers":
        # Two tasks receive concurrently (uvicorn allows it): each message
        # goes to one of them, in order; the disconnect reaches both.
        got = []

        async def receiver(tag):
            while True:
                m = await receive()
                if m["type"] == "websocket.disconnect":
                    record(
                        {"receiver_done": tag, "code": m["code"], "reason": m.get("reason", ""), "tag": q.get("tag")}
                    )
                    return
                got.append(m["text"])
                await send({"type": "websocket.send", "text": f"{len(got)}:{tag}:{m['text']}"})

        await asyncio.gather(receiver("a"), receiver("b"))
        return
    if path == "/receive-timeouts":
        # receive() cancelled by timeouts again and again must not lose messages.
        while True:
            try:
                m = await asyncio.wait_for(receive(), 0.02)
            except asyncio.TimeoutError:
                continue
            if m["type"] == "websocket.disconnect":
                return
            await send({"type": "websocket.send", "text": m["text"]})
    if path == "/send-then-close":
        # A large message, then the app's close: the client must get both,
        # and the close handshake must complete before TCP closes.
        size = int(q.get("size", "1048576"))
        await send({"type": "websocket.send", "bytes": b"m" * size})
        await send({"type": "websocket.close", "code": int(q.get("code", "1000")), "reason": q.get("reason", "")})
        while (m := await receive())["type"] != "websocket.disconnect":
            pass  # sent by the client before it saw the close
        record({"closed_by_app": m["type"], "code": m.get("code"), "tag": q.get("tag")})
        return
    if path == "/count-sends":
        # Sends fresh messages until the client leaves; /sent tells how many
        # send() calls completed so far.
        size = int(q.get("size", "1048576"))
        tag = q.get("tag", "")
        SENT[tag] = 0
        try:
            while True:
                await send({"type": "websocket.send", "bytes": bytes([SENT[tag] % 256]) * size})
                SENT[tag] += 1
        except OSError:
            return
    if path == "/many-senders":
        # n concurrent send() calls (one task each) of one str, to a client
        # that does not read: the server may not copy and queue them all.
        n, size = int(q.get("n", "1000")), int(q.get("size", "65536"))
        tag = q.get("tag", "")
        SENT[tag] = 0
        text = "t" * size

        async def one():
            await send({"type": "websocket.send", "text": text})
            SENT[tag] += 1

        try:
            await asyncio.gather(*(one() for _ in range(n)))
        except OSError:
            pass
        return
    if path == "/idle":
        while True:
            m = await receive()
            if m["type"] == "websocket.disconnect":
                record({"idle_disconnect": m.get("code"), "reason": m.get("reason")})
                return

    # Echo until the client leaves; record how it left.
    while True:
        m = await receive()
        if m["type"] == "websocket.disconnect":
            record({"disconnect": m["code"], "reason": m.get("reason", ""), "tag": q.get("tag")})
            return
        if m.get("text") is not None:
            await send({"type": "websocket.send", "text": m["text"]})
        else:
            await send({"type": "websocket.send", "bytes": m["bytes"]})
