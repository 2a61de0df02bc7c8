"""Starting real Skirr servers and talking to them over real sockets.

Ports are never guessed: the test binds a listening socket on port 0 and
the server inherits it (``--fd N`` standalone, ``-b fd://N`` under
Gunicorn). Every socket operation has a timeout; readiness is polled, never
slept for.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
_LOOP_MODE = os.environ.get("SKIRR_LOOP_MODE", "").strip().lower() or "auto"
_LOOP = os.environ.get("SKIRR_LOOP", "").strip().lower() or "auto"
#: Servers started here run loop_mode single: asked for
#: (``SKIRR_LOOP_MODE=single``, which they inherit), or ``auto`` (the
#: default) on asyncio's loop (``SKIRR_LOOP=asyncio``, or uvloop missing).
SINGLE_MODE = _LOOP_MODE == "single" or (
    _LOOP_MODE == "auto" and (_LOOP == "asyncio" or (_LOOP == "auto" and importlib.util.find_spec("uvloop") is None))
)

TIMEOUT = 10.0


def listening_socket(family: int = socket.AF_INET, path: str | None = None) -> socket.socket:
    """A listening socket on 127.0.0.1:0 (or a Unix socket at ``path``),
    inheritable by a child process."""
    if family == socket.AF_UNIX:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
    else:
        s = _tcp_with_free_udp_twin(family)
    s.listen(1024)
    s.set_inheritable(True)
    return s


def _udp_port_free(family: int, addr: tuple) -> bool:
    u = socket.socket(family, socket.SOCK_DGRAM)
    try:
        u.bind(addr)
        return True
    except OSError:
        return False
    finally:
        u.close()


def _tcp_with_free_udp_twin(family: int) -> socket.socket:
    """A TCP socket on a kernel-chosen port whose UDP port of the same
    number is free too: ``--http3`` binds it, and the kernel picks TCP and
    UDP ephemeral ports independently (a client's UDP socket, e.g. an
    aioquic client's, can hold the number a new TCP listener gets)."""
    host = "127.0.0.1" if family == socket.AF_INET else "::1"
    for _ in range(50):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        if _udp_port_free(family, s.getsockname()[:2]):
            return s
        s.close()
    raise OSError("no port with both TCP and UDP free")


@dataclass
class Response:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    version: str = "HTTP/1.1"

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


class ConnectionClosed(Exception):
    """The server closed the connection before a complete response."""


class RawConn:
    """One client connection speaking raw HTTP/1.1 bytes."""

    def __init__(self, port: int | None = None, *, path: str | None = None, timeout: float = TIMEOUT) -> None:
        if path:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(path)
        else:
            self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionClosed(self.buf)
        self.buf += chunk

    def read_until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            self._fill()
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_head(self) -> Response:
        head = self.read_until(b"\r\n\r\n").decode("latin-1")
        lines = head.split("\r\n")
        version, status, *reason = lines[0].split(" ", 2)
        headers = []
        for line in lines[1:]:
            if line:
                k, v = line.split(":", 1)
                headers.append((k, v.strip()))
        return Response(int(status), reason[0] if reason else "", headers, b"", version)

    def read_response(self, head_request: bool = False) -> Response:
        r = self.read_head()
        while 100 <= r.status < 200 and r.status != 101:
            r = self.read_head()
        if head_request or r.status in (204, 304):
            return r
        te = (r.header("transfer-encoding") or "").lower()
        cl = r.header("content-length")
        if "chunked" in te:
            body = b""
            while True:
                size = int(self.read_until(b"\r\n").split(b";")[0].strip(), 16)
                if size == 0:
                    self.read_until(b"\r\n")
                    break
                body += self.read_exact(size)
                self.read_exact(2)
            r.body = body
        elif cl is not None:
            r.body = self.read_exact(int(cl))
        else:
            r.body = self.read_to_eof()
        return r

    def read_to_eof(self) -> bytes:
        while True:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            self.buf += chunk
        out, self.buf = self.buf, b""
        return out

    def is_closed(self, timeout: float = 2.0) -> bool:
        """True if the server closes the connection within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1)
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
        finally:
            self.sock.settimeout(TIMEOUT)
        if data:
            self.buf += data
            return False
        return True

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConn:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def request(
    port: int, method: str = "GET", target: str = "/", headers=(), body: bytes = b"", version: str = "HTTP/1.1"
) -> Response:
    """One request on a new connection (``Connection: close``)."""
    hs = [("Host", "127.0.0.1"), ("Connection", "close"), *headers]
    if body and not any(k.lower() in ("content-length", "transfer-encoding") for k, _ in hs):
        hs.append(("Content-Length", str(len(body))))
    head = f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hs)
    with RawConn(port) as c:
        c.send(head.encode("latin-1") + b"\r\n" + body)
        return c.read_response(head_request=(method == "HEAD"))


def tls_answers(server, alpn: list[str] | None = None) -> bool:
    """Whether a TLS handshake with ``server`` completes (and, given
    ``alpn``, selects its first protocol); raises if the server exited."""
    if server.proc.poll() is not None:
        raise RuntimeError(f"server exited ({server.proc.returncode}):\n{server.logs()}")
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=1) as raw:
            with ctx.wrap_socket(raw) as s:
                return not alpn or s.selected_alpn_protocol() == alpn[0]
    except OSError:
        return False


def accept_queue(port: int) -> int:
    """Connections waiting in the accept queue of the IPv4 listener on
    ``port`` (the ``rx_queue`` of its LISTEN line in /proc/net/tcp)."""
    hexport = f":{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[1].endswith(hexport) and f[3] == "0A":
            return int(f[4].split(":")[1], 16)
    raise RuntimeError(f"no listener on port {port}")


def wait_accepted(port: int, timeout: float = TIMEOUT) -> None:
    """Waits until the server has accepted every connection made to
    ``port`` so far: one still queued when a drain begins is never served
    (the test keeps the listening socket open)."""
    wait_until(lambda: accept_queue(port) == 0, timeout, what=f"the connections to port {port} accepted")


def wait_until(predicate, timeout: float = TIMEOUT, interval: float = 0.02, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(interval)


class _Probe:
    """The readiness probe: one ``GET /healthz`` on one connection, awaited
    for as long as readiness may take. A listening socket the test bound
    accepts the connection before the server runs; a probe that gave up
    and tried again would leave its request queued there, and the server
    would serve it later: one more request than the test counts (its
    ``max_requests``, an app's or a metric's counts)."""

    def __init__(self, port: int | None, uds: str | None) -> None:
        self.port, self.uds = port, uds
        self.conn: RawConn | None = None

    def answered(self) -> bool:
        """True once the server answered; False meanwhile (the next call
        keeps waiting on the same connection, or connects again if the
        connection was refused or closed unanswered)."""
        try:
            if self.conn is None:
                self.conn = RawConn(self.port, path=self.uds, timeout=1.0)
                self.conn.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            self.conn.sock.settimeout(0.2)
            if not self.conn.buf:
                self.conn._fill()  # raises TimeoutError while the server is not answering yet
            self.conn.sock.settimeout(TIMEOUT)
            self.conn.read_response()
            self.close()
            return True
        except TimeoutError:
            return False
        except (OSError, ConnectionClosed, ValueError):
            self.close()
            return False

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@dataclass
class Server:
    proc: subprocess.Popen
    port: int | None
    uds: str | None
    log_path: Path
    sockets: list = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 20.0) -> Server:
        probe = _Probe(self.port, self.uds)

        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.logs()}")
            return probe.answered()

        try:
            wait_until(ready, timeout, 0.05, "server readiness")
        finally:
            probe.close()
        return self

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = TIMEOUT) -> int:
        return self.proc.wait(timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = TIMEOUT) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for s in self.sockets:
            s.close()
        return self.proc.returncode


def _env(extra: dict | None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(extra or {})
    return env


def start(
    cmd: list[str],
    *,
    sock: socket.socket | None,
    port: int | None,
    uds: str | None,
    env: dict | None = None,
    ready: bool = True,
) -> Server:
    log = Path(tempfile.mkstemp(prefix="skirr-test-", suffix=".log")[1])
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=str(ROOT),
            env=_env(env),
            pass_fds=[sock.fileno()] if sock else (),
            start_new_session=True,
        )
    server = Server(proc, port, uds, log, [sock] if sock else [])
    if ready:
        server.wait_ready()
    return server


@contextmanager
def skirr(app: str, *args: str, env: dict | None = None, ready: bool = True, family: int = socket.AF_INET):
    """``python -m skirr APP --fd N ARGS`` on a fresh listening socket."""
    sock = listening_socket(family)
    port = sock.getsockname()[1]
    cmd = [PY, "-m", "skirr", app, "--fd", str(sock.fileno()), *args]
    server = start(cmd, sock=sock, port=port, uds=None, env=env, ready=ready)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def gunicorn(app: str, *args: str, env: dict | None = None, ready: bool = True, uds: str | None = None):
    """``gunicorn -k skirr.RustWorker -b fd://N ARGS APP`` (or ``-b unix:PATH``)."""
    if uds:
        sock, port, bind = None, None, f"unix:{uds}"
    else:
        sock = listening_socket()
        port = sock.getsockname()[1]
        bind = f"fd://{sock.fileno()}"
    cmd = [PY, "-m", "gunicorn", "-k", "skirr.RustWorker", "-b", bind, "--graceful-timeout", "5", *args, app]
    server = start(cmd, sock=sock, port=port, uds=uds, env=env, ready=ready)
    try:
        yield server
    finally:
        server.stop(timeout=15)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now, for a server that
    binds it itself (a Gunicorn master's `-b HOST:PORT`, `reuse_port`
    sockets bound in each worker, a metrics listener)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_pids(master_pid: int) -> list[int]:
    """Child pids of a Gunicorn master."""
    out = subprocess.run(["pgrep", "-P", str(master_pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def process_gone(pid: int) -> bool:
    """`pid` has exited; a zombie (not yet reaped by init) counts. The state
    follows the command name, which may hold spaces and ")"."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:  # reaped between the two looks
        return True


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")
