"""permessage-deflate on the wire: bytes and server CPU per message.

    python bench/ws_deflate.py                       # skirr and uvicorn, 16 and 256 connections
    python bench/ws_deflate.py --servers skirr --conns 16 --messages 200

Each connection offers what browsers offer (``permessage-deflate;
client_max_window_bits``), then echoes ``--messages`` 2 KiB JSON messages
one at a time (a chat-like load: similar documents with different values),
compressing them as a browser would (raw DEFLATE, the negotiated client
window, context kept unless the server asked otherwise). Reported per
message: bytes on the wire each way (frame headers included) and the server
process's CPU time (user + system, from /proc) — the client's own cost is
not counted. Single-process servers only; uvicorn with its default
WebSocket implementation (per-message deflate on, as in Skirr).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVERS = {
    "skirr": "{py} -m skirr bench.apps:ws_echo --port {port} --no-access-log --lifespan off",
    "skirr-takeover": "{py} -m skirr bench.apps:ws_echo --port {port} --no-access-log --lifespan off "
    "--ws-deflate-context-takeover 1",
    "uvicorn": "{py} -m uvicorn bench.apps:ws_echo --port {port} --no-access-log --lifespan off --log-level warning",
}


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def document(rng: random.Random) -> bytes:
    rows = [
        {
            "id": rng.randrange(10**6),
            "user": f"user{rng.randrange(1000)}",
            "online": rng.random() < 0.5,
            "score": round(rng.random() * 100, 2),
            "tags": rng.sample(["a", "b", "c", "d", "e", "f"], 3),
        }
        for _ in range(30)
    ]
    return json.dumps({"type": "update", "rows": rows}).encode()[:2048].ljust(2048)


async def connection(port: int, n: int, seed: int, totals: dict) -> None:
    rng = random.Random(seed)
    r, w = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    w.write(
        f"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n".encode()
    )
    head = (await r.readuntil(b"\r\n\r\n")).decode().lower()
    ext = next(
        (line.split(":", 1)[1].strip() for line in head.split("\r\n") if line.startswith("sec-websocket-extensions")),
        "",
    )
    assert ext.startswith("permessage-deflate"), head
    bits = 15
    for p in ext.split(";"):
        if p.strip().startswith("client_max_window_bits="):
            bits = int(p.split("=")[1])
    client_nct = "client_no_context_takeover" in ext
    comp = zlib.compressobj(wbits=-bits)
    dec = zlib.decompressobj(wbits=-15)
    for _ in range(n):
        msg = document(rng)
        if client_nct:
            comp = zlib.compressobj(wbits=-bits)
        z = (comp.compress(msg) + comp.flush(zlib.Z_SYNC_FLUSH))[:-4]
        mask = os.urandom(4)
        hdr = bytes([0xC1]) + (
            bytes([0x80 | len(z)]) if len(z) < 126 else bytes([0x80 | 126]) + struct.pack("!H", len(z))
        )
        w.write(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(z)))
        totals["up"] += len(hdr) + 4 + len(z)
        while True:
            b0, b1 = await r.readexactly(2)
            ln = b1 & 0x7F
            extra = 0
            if ln == 126:
                ln, extra = struct.unpack("!H", await r.readexactly(2))[0], 2
            elif ln == 127:
                ln, extra = struct.unpack("!Q", await r.readexactly(8))[0], 8
            payload = await r.readexactly(ln)
            if b0 & 0x0F < 8:
                break
            # A keepalive ping (both servers ping every 20 s): not counted.
        totals["down"] += 2 + extra + ln
        got = dec.decompress(payload + b"\x00\x00\xff\xff") if b0 & 0x40 else payload
        assert got == msg
        totals["messages"] += 1
    w.close()


async def load(port: int, conns: int, n: int) -> dict:
    totals = {"up": 0, "down": 0, "messages": 0}
    await asyncio.gather(*(connection(port, n, i, totals) for i in range(conns)))
    return totals


def run(server: str, conns: int, n: int, py: str) -> dict:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = SERVERS[server].format(py=py, port=port).split()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        asyncio.run(load(port, 4, 5))  # warm-up
        cpu0 = cpu_seconds(proc.pid)
        totals = asyncio.run(load(port, conns, n))
        cpu = cpu_seconds(proc.pid) - cpu0
    finally:
        proc.terminate()
        proc.wait(10)
    m = totals["messages"]
    return {
        "server": server,
        "conns": conns,
        "messages": m,
        "bytes_up_per_message": round(totals["up"] / m),
        "bytes_down_per_message": round(totals["down"] / m),
        "server_cpu_us_per_message": round(cpu / m * 1e6, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="skirr,uvicorn")
    p.add_argument("--conns", default="16,256")
    p.add_argument("--messages", type=int, default=100, help="messages per connection")
    p.add_argument("--python", default=sys.executable)
    a = p.parse_args()
    for c in a.conns.split(","):
        for s in a.servers.split(","):
            print(json.dumps(run(s, int(c), a.messages, a.python)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
