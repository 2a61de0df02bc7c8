"""A pure-ASGI application for Skirr's tests; behaviour is chosen by path.

Events the tests need to observe from outside (a disconnect seen by the app,
an error raised by send()) are recorded in ``EVENTS`` and served by
``GET /events``. Lifespan behaviour is chosen by the ``PROBE_LIFESPAN``
environment variable: ``ok`` (default), ``fail``, ``raise``, ``ignore``
(raises for non-HTTP scopes, as a bare app would), ``slow-startup``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from urllib.parse import parse_qs

EVENTS: list = []
IMPORT_PID = os.getpid()
RELEASE: dict[str, asyncio.Event] = {}
LEAKED: list = []
#: The path of every HTTP request the app was called for (``GET /paths``).
PATHS: list = []


def jsonable(v):
    if isinstance(v, bytes):
        return {"bytes": v.decode("latin-1")}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    return v


async def respond(send, status=200, body=b"", headers=None, content_type=b"text/plain"):
    hs = [(b"content-type", content_type)] + list(headers or [])
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": body})


async def respond_json(send, obj, status=200):
    await respond(send, status, json.dumps(obj).encode(), content_type=b"application/json")


async def read_body(receive, log=None):
    chunks = []
    while True:
        m = await receive()
        if m["type"] == "http.disconnect":
            return None, chunks
        chunks.append(m)
        if log:
            EVENTS.append({"body_message": len(m.get("body", b"")), "log": log})
        if not m.get("more_body"):
            return b"".join(c["body"] for c in chunks), chunks


async def lifespan(scope, receive, send):
    mode = os.environ.get("PROBE_LIFESPAN", "ok")
    if mode == "ignore":
        raise RuntimeError("this app only speaks HTTP")
    m = await receive()
    assert m["type"] == "lifespan.startup"
    if mode == "raise":
        raise RuntimeError("startup exploded")
    if mode == "fail":
        await send({"type": "lifespan.startup.failed", "message": "database unreachable"})
        return
    if mode == "slow-startup":
        await asyncio.sleep(float(os.environ.get("PROBE_STARTUP_DELAY", "1")))
    scope["state"]["started_at"] = time.time()
    scope["state"]["counter"] = [0]
    EVENTS.append("startup")
    await send({"type": "lifespan.startup.complete"})
    m = await receive()
    assert m["type"] == "lifespan.shutdown"
    marker = os.environ.get("PROBE_SHUTDOWN_FILE")
    if marker:
        with open(marker, "w") as f:
            f.write("shutdown")
    await send({"type": "lifespan.shutdown.complete"})


async def invalid(case, send):
    start = {"type": "http.response.start", "status": 200, "headers": []}
    body = {"type": "http.response.body", "body": b"x"}
    cases = {
        "status_str": [{**start, "status": "200"}],
        "status_range": [{**start, "status": 1000}],
        "status_bool": [{**start, "status": True}],
        "status_1xx": [{**start, "status": 101}],
        "content_length_bad": [{**start, "headers": [(b"content-length", b"12abc")]}],
        "content_length_conflict": [{**start, "headers": [(b"content-length", b"1"), (b"content-length", b"2")]}],
        "status_missing": [{"type": "http.response.start"}],
        "header_str": [{**start, "headers": [("content-type", "text/plain")]}],
        "header_value_int": [{**start, "headers": [(b"x-n", 5)]}],
        "header_crlf": [{**start, "headers": [(b"x-a", b"a\r\nx-b: b")]}],
        "header_bad_name": [{**start, "headers": [(b"bad name", b"v")]}],
        "header_not_pair": [{**start, "headers": [(b"a", b"b", b"c")]}],
        "body_before_start": [body],
        "double_start": [start, start],
        "unknown_type": [{"type": "http.response.nope"}],
        "no_type": [{"status": 200}],
        "not_dict": [["http.response.start"]],
        "body_str": [start, {"type": "http.response.body", "body": "text"}],
    }
    started = False
    try:
        for m in cases[case]:
            await send(m)
            started = started or m.get("type") == "http.response.start"
    except Exception as e:  # noqa: BLE001 - reported to the test
        report = json.dumps({"error": type(e).__name__, "message": str(e)}).encode()
        if started:
            await send({"type": "http.response.body", "body": report})
        else:
            await respond(send, body=report, content_type=b"application/json")
        return
    await respond_json(send, {"error": None})


class Key(str):
    """A key equal to a name but not the interned string itself."""


async def keys_built(send):
    """Messages whose keys are equal to the names, not identical to them:
    built at run time, a ``str`` subclass, an extra key, a dict subclass."""
    status, more = "".join(["sta", "tus"]), "".join(["more_", "body"])
    start = {"type": "http.response.start", status: 201, Key("headers"): [(b"x-k", b"1")], "x-extra": 1}
    await send(start)
    await send({"type": "http.response.body", "body": b"a", more: True})
    await send({"type": "http.response.body", Key("body"): b"b", Key("more_body"): True})
    await send(type("Message", (dict,), {})(type="http.response.body", body=b"c"))


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        return await lifespan(scope, receive, send)
    assert scope["type"] == "http"
    path = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]  # route on the path below the mount point, as Starlette does
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    PATHS.append(path)

    if path == "/paths":
        return await respond_json(send, PATHS)
    if path == "/" or path == "/healthz":
        return await respond(send, body=b"ok")
    if path == "/scope-mutate-tls":
        # Changes its own request's `tls` extension; the next request on
        # the connection must not see it.
        tls = scope["extensions"]["tls"]
        tls["client_cert_chain"].append("changed")
        tls["tls_version"] = 0
        tls["added"] = True
    if path.startswith("/scope"):
        s = {k: v for k, v in scope.items() if k != "state"}
        s["state_keys"] = sorted(scope.get("state", {}))
        s["state_is_dict"] = isinstance(scope.get("state"), dict)
        return await respond_json(send, jsonable(s))
    if path == "/events":
        return await respond_json(send, EVENTS)
    if path == "/pid":
        return await respond(send, body=str(os.getpid()).encode())
    if path == "/import-pid":
        return await respond(send, body=str(IMPORT_PID).encode())
    if path == "/env":
        return await respond(send, body=os.environ.get(q["name"], "").encode())
    if path == "/print":
        print("printed by the app", flush=True)
        return await respond(send, body=b"printed")
    if path == "/crash":
        raise RuntimeError("the app crashed (for the error log)")
    if path == "/echo":
        # ?log=TAG: each body message's size goes to EVENTS as it arrives.
        body, chunks = await read_body(receive, log=q.get("log"))
        headers = [(b"x-chunks", str(len(chunks)).encode())]
        return await respond(send, body=body or b"", headers=headers, content_type=b"application/octet-stream")
    if path == "/upload-count":
        total = n = biggest = 0
        while True:
            m = await receive()
            if m["type"] == "http.disconnect":
                EVENTS.append({"upload_disconnect": total})
                return
            total += len(m["body"])
            n += 1
            biggest = max(biggest, len(m["body"]))
            if q.get("slow"):
                await asyncio.sleep(float(q["slow"]))
            if not m.get("more_body"):
                break
        return await respond_json(send, {"bytes": total, "chunks": n, "max_chunk": biggest})
    if path == "/h2-headers":
        # Connection-specific fields (dropped on HTTP/2) and two set-cookie fields.
        hs = [
            (b"set-cookie", b"a=1"),
            (b"set-cookie", b"b=2"),
            (b"connection", b"close"),
            (b"keep-alive", b"timeout=5"),
            (b"proxy-connection", b"keep-alive"),
            (b"upgrade", b"foo"),
        ]
        return await respond(send, body=b"headers", headers=hs)
    if path == "/no-read":
        return await respond(send, body=b"did not read")
    if path == "/state":
        st = scope["state"]
        st["counter"][0] += 1
        st["per_request"] = st.get("per_request", 0) + 1  # must not leak between requests
        return await respond_json(
            send, {"counter": st["counter"][0], "per_request": st["per_request"], "started": "started_at" in st}
        )
    if path == "/stream":
        n = int(q.get("n", "3"))
        delay = float(q.get("delay", "0"))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for i in range(n):
            await send({"type": "http.response.body", "body": f"chunk{i}\n".encode(), "more_body": True})
            if delay:
                await asyncio.sleep(delay)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    if path == "/gated-stream":
        key = q["key"]
        ev = RELEASE.setdefault(key, asyncio.Event())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first;", "more_body": True})
        await ev.wait()
        await send({"type": "http.response.body", "body": b"second", "more_body": False})
        return
    if path == "/release":
        RELEASE.setdefault(q["key"], asyncio.Event()).set()
        return await respond(send, body=b"released")
    if path == "/start-then-wait":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-early", b"1")]})
        await asyncio.sleep(float(q.get("delay", "0.5")))
        await send({"type": "http.response.body", "body": b"late"})
        return
    if path == "/wait-disconnect":
        # Answers nothing: waits for the client to leave.
        body, _ = await read_body(receive)
        m = await receive()
        EVENTS.append({"disconnect": m["type"], "tag": q.get("tag")})
        try:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        except OSError as e:
            EVENTS.append(
                {"send_after_disconnect": type(e).__name__, "is_oserror": isinstance(e, OSError), "tag": q.get("tag")}
            )
        return
    if path == "/stream-until-disconnect":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        sent = 0
        try:
            while True:
                await send({"type": "http.response.body", "body": b"x" * 1024, "more_body": True})
                sent += 1
                await asyncio.sleep(0.01)
        except OSError as e:
            EVENTS.append({"stream_error": type(e).__name__, "tag": q.get("tag"), "sent": sent})
            if q.get("reraise"):
                # Starlette's StreamingResponse: `except OSError: raise ClientDisconnect()`.
                raise LookupError("client went away")  # noqa: B904
        return
    if path == "/listen-disconnect":
        # Starlette's pattern: stream while a second task waits on receive().
        await send({"type": "http.response.start", "status": 200, "headers": []})

        async def listen():
            while True:
                m = await receive()
                if m["type"] == "http.disconnect":
                    return m

        waiter = asyncio.ensure_future(listen())
        while not waiter.done():
            try:
                await send({"type": "http.response.body", "body": b"tick\n", "more_body": True})
            except OSError:
                break
            await asyncio.sleep(0.02)
        m = await waiter
        EVENTS.append({"listen": m["type"], "tag": q.get("tag")})
        return
    if path == "/after-complete":
        await respond(send, body=b"done")
        try:
            await send({"type": "http.response.body", "body": b"more"})
        except OSError as e:
            EVENTS.append({"after_complete": type(e).__name__, "message": str(e)})
        m = await receive()
        EVENTS.append({"receive_after_complete": m["type"]})
        return
    if path == "/invalid":
        return await invalid(q["case"], send)
    if path == "/keys-built":
        return await keys_built(send)
    if path == "/error-before":
        raise RuntimeError("boom before start (secret-token-123)")
    if path == "/error-after":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise RuntimeError("boom after start")
    if path == "/no-response":
        return
    if path == "/start-only":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        return
    if path == "/sleep":
        if q.get("tag"):
            EVENTS.append({"sleeping": q["tag"]})
        await asyncio.sleep(float(q.get("secs", "1")))
        return await respond(send, body=b"slept")
    if path == "/block":
        time.sleep(float(q.get("secs", "1")))
        return await respond(send, body=b"blocked")
    if path == "/bigbody":
        n = int(q.get("n", "1048576"))
        return await respond(send, body=b"b" * n)
    if path == "/head":
        return await respond(send, body=b"0123456789", headers=[(b"content-length", b"10"), (b"x-head", b"kept")])
    if path == "/cl-short":
        # Declares 10 bytes, sends 5: the server must close, not pad or hang.
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})
        await send({"type": "http.response.body", "body": b"12345"})
        return
    if path == "/cl-long":
        # Declares 5 bytes, tries to send 7: send() must refuse the overflow.
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        await send({"type": "http.response.body", "body": b"123", "more_body": True})
        try:
            await send({"type": "http.response.body", "body": b"4567", "more_body": True})
        except RuntimeError as e:
            EVENTS.append({"cl_long": str(e)})
        await send({"type": "http.response.body", "body": b"45"})
        return
    if path == "/status-body":
        status = int(q.get("status", "204"))
        await send({"type": "http.response.start", "status": status, "headers": []})
        try:
            await send({"type": "http.response.body", "body": b"not allowed"})
        except RuntimeError as e:
            EVENTS.append({"status_body": str(e)})
            await send({"type": "http.response.body", "body": b""})
        return
    if path == "/leak-tasks":
        marker = q.get("marker")

        async def forever(i):
            try:
                await asyncio.sleep(3600)
            finally:
                if marker and i == 0:
                    with open(marker, "w") as f:
                        f.write("cancelled")

        LEAKED.extend(asyncio.ensure_future(forever(i)) for i in range(int(q.get("n", "10"))))
        return await respond(send, body=str(len(LEAKED)).encode())
    if path == "/slow-start":
        await asyncio.sleep(float(q.get("secs", "5")))
        try:
            await respond(send, body=b"late")
        except OSError as e:
            EVENTS.append({"slow_start": type(e).__name__})
        return
    return await respond(send, status=404, body=b"not found")
