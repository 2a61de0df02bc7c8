"""Hand-made WebSocket frames over a raw socket (RFC 6455 §5), for tests
that need exact bytes: masking, reserved bits, fragmentation, close codes."""

from __future__ import annotations

import base64
import os
import struct

from harness import RawConn

TEXT, BINARY, CLOSE, PING, PONG, CONT = 0x1, 0x2, 0x8, 0x9, 0xA, 0x0


def frame(opcode: int, payload: bytes = b"", *, fin: bool = True, mask: bool = True, rsv: int = 0) -> bytes:
    head = bytes([(0x80 if fin else 0) | (rsv << 4) | opcode])
    n = len(payload)
    m = 0x80 if mask else 0
    if n < 126:
        head += bytes([m | n])
    elif n < 65536:
        head += bytes([m | 126]) + struct.pack("!H", n)
    else:
        head += bytes([m | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def close_payload(code: int, reason: str = "") -> bytes:
    return struct.pack("!H", code) + reason.encode()


class WsConn(RawConn):
    """A client connection after a successful handshake."""

    def handshake(self, path: str = "/echo", protocols: list[str] | None = None, extra: str = ""):
        key = base64.b64encode(os.urandom(16)).decode()
        req = (
            f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        )
        for p in protocols or []:
            req += f"Sec-WebSocket-Protocol: {p}\r\n"
        self.send((req + extra + "\r\n").encode())
        return self.read_head()

    def read_frame(self) -> tuple[int, bool, bytes]:
        """(opcode, fin, payload) of the next server frame (never masked)."""
        b0, b1 = self.read_exact(2)
        assert not b1 & 0x80, "server frames must not be masked"
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self.read_exact(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self.read_exact(8))[0]
        return b0 & 0x0F, bool(b0 & 0x80), self.read_exact(n)

    def read_close(self) -> tuple[int | None, str]:
        """Reads frames until a close frame; its (code, reason)."""
        while True:
            op, _, payload = self.read_frame()
            if op == CLOSE:
                if len(payload) >= 2:
                    return struct.unpack("!H", payload[:2])[0], payload[2:].decode()
                return None, ""
