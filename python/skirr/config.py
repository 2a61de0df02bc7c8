"""Skirr's options: one table for the CLI, ``SKIRR_*`` variables and Gunicorn.

Every option has a default, an environment variable ``SKIRR_<NAME>``, a
command-line flag ``--<name-with-dashes>`` (standalone), and is settable from
a Gunicorn config file as ``skirr_<name>`` (see :mod:`skirr.worker`).
Precedence: command line, then environment, then Gunicorn settings, then the
default. Options marked ``rust`` are handed to the Rust core; the others are
used by the Python side.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


def _choice(*values: str) -> Callable[[str], str]:
    def parse(v: str) -> str:
        v = str(v).strip().lower()
        if v not in values:
            raise ValueError(f"must be one of {', '.join(values)}, got {v!r}")
        return v

    parse.__name__ = "|".join(values)
    return parse


def _loop(v: Any) -> str:
    kind = _choice("auto", "asyncio", "uvloop")(v)
    if kind == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise ValueError("'uvloop' is not installed (pip install uvloop), use auto or asyncio")
    return kind


_loop.__name__ = "auto|asyncio|uvloop"


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"must be a boolean (1/0, true/false), got {v!r}")


def _nonneg_int(v: Any) -> int:
    n = int(v)
    if n < 0:
        raise ValueError(f"must be >= 0, got {n}")
    return n


def _window_bits(v: Any) -> int:
    n = int(v)
    if not 9 <= n <= 15:
        raise ValueError(f"must be 9 to 15, got {n}")
    return n


def _pos_int(v: Any) -> int:
    n = int(v)
    if n < 1:
        raise ValueError(f"must be >= 1, got {n}")
    return n


def _header_map(v: Any) -> dict[str, str]:
    if isinstance(v, str):
        v = json.loads(v) if v.strip() else {}
    if not isinstance(v, Mapping) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        raise ValueError('must map header names to values, e.g. {"X-FORWARDED-PROTO": "https"}')
    return dict(v)


def _str_list(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(str(x).strip() for x in v)
    return str(v)


def _compression(v: Any) -> str:
    codings = [c.strip().lower() for c in _str_list(v).split(",") if c.strip()]
    for c in codings:
        if c not in ("gzip", "zstd", "br"):
            raise ValueError(f"unknown coding {c!r} (gzip, zstd or br)")
    return ",".join(codings)


def split_host_port(v: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9100`` for IPv6; an empty host is every IPv4
    interface, ``0.0.0.0``) as ``(host, port)``. Raises ``ValueError``."""
    host, sep, port = str(v).strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"must be HOST:PORT (e.g. 127.0.0.1:9100), got {v!r}")
    n = int(port)
    if not 0 <= n <= 65535:
        raise ValueError(f"port must be 0-65535, got {n}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"an IPv6 host goes in brackets ([::1]:{n}), got {v!r}")
    return host or "0.0.0.0", n


def _host_port(v: Any) -> str | None:
    if v is None or str(v).strip() == "":
        return None
    split_host_port(str(v))
    return str(v).strip()


def _optional_str(v: Any) -> str | None:
    return None if v is None or str(v) == "" else str(v)


#: Python ``ssl.PROTOCOL_*`` numbers and names Gunicorn accepts for ``ssl_version``.
_TLS_ANY = {"2", "17", "tls", "tls_server", "sslv23", "protocol_tls", "protocol_tls_server", "default", ""}
_TLS_12 = {"5", "tlsv1_2", "protocol_tlsv1_2", "1.2"}


def _tls_versions(v: Any) -> list[str]:
    """``ssl_version`` as the TLS versions to serve: [] (1.2 and 1.3), or ["1.2"]/["1.3"]."""
    s = str(int(v) if isinstance(v, int) else getattr(v, "name", v)).strip().lower()
    if s in _TLS_ANY:
        return []
    if s in _TLS_12:
        return ["1.2"]
    if s in ("tlsv1_3", "1.3"):
        return ["1.3"]
    raise ValueError(f"TLS version {v!r} is not supported (TLS 1.2 and 1.3 are)")


def _proxy_protocol(v: Any) -> str:
    # Gunicorn before 23 had a boolean.
    if v is True:
        return "auto"
    if v is False or v is None:
        return "off"
    return _choice("off", "v1", "v2", "auto")(v)


def _cert_reqs(v: Any) -> int:
    n = int(v)
    if n not in (0, 1, 2):
        raise ValueError(f"must be 0 (CERT_NONE), 1 (CERT_OPTIONAL) or 2 (CERT_REQUIRED), got {n}")
    return n


def _http_protocols(v: Any) -> str:
    items = v if isinstance(v, (list, tuple)) else str(v).split(",")
    out = []
    for x in items:
        x = str(x).strip().lower()
        if not x:
            continue
        if x == "http/1.1":
            x = "h1"
        if x not in ("h1", "h2"):
            raise ValueError(f"{x!r} is not a protocol (h1 or h2)")
        if x not in out:
            out.append(x)
    if not out:
        raise ValueError("names no protocol (h1, h2)")
    return ",".join(out)


def _http2_cleartext(v: Any) -> str:
    x = str(v).strip().lower()
    if x in ("false", "0", "no"):
        x = "off"
    if x == "upgrade":
        raise ValueError("upgrade (Upgrade: h2c) is not supported; use prior-knowledge")
    if x not in ("off", "prior-knowledge", "both"):
        raise ValueError(f"must be off or prior-knowledge, got {v!r}")
    return x


def _int_range(lo: int, hi: int) -> Callable[[Any], int]:
    def parse(v: Any) -> int:
        n = int(v)
        if not lo <= n <= hi:
            raise ValueError(f"must be between {lo} and {hi}, got {n}")
        return n

    return parse


def _seconds(v: Any) -> float:
    f = float(v)
    if f < 0:
        raise ValueError(f"must be >= 0 seconds, got {f}")
    return f


def _health_path(v: Any) -> str | None:
    """A path the health probe can match: it is compared with the request's
    path as sent (no query, not percent-decoded), so a value with a query,
    a fragment, an escape or a space could never match, and ``/`` would hide
    the app's root."""
    p = _optional_str(v)
    if p is None:
        return p
    if not p.startswith("/"):
        raise ValueError(f"must be a path starting with '/', got {p!r}")
    if p == "/":
        raise ValueError("'/' would take the app's root page; use a path of its own, e.g. /_health")
    bad = sorted({c for c in p if c in "?#%" or c.isspace() or not c.isprintable()})
    if bad:
        raise ValueError(f"{p!r} could never match a request's path (it contains {''.join(bad)!r})")
    return p


#: The smallest ``loop_stall_timeout``: the loop stamps every quarter of the
#: bound, and a bound near a loop turn's ordinary length would flap.
MIN_LOOP_STALL = 0.25


def _stall_seconds(v: Any) -> float:
    t = _seconds(v)
    if 0 < t < MIN_LOOP_STALL:
        raise ValueError(f"must be 0 (off) or at least {MIN_LOOP_STALL:g} s, got {t:g}")
    return t


@dataclass(frozen=True)
class Option:
    """One option: ``name``, its ``default``, a ``parse`` function
    (raises ``ValueError``), a one-line ``help``, whether the Rust core
    reads it, and the Gunicorn setting it follows when Skirr runs under
    Gunicorn (``None`` if none)."""

    name: str
    default: Any
    parse: Callable[[Any], Any]
    help: str
    rust: bool = True
    gunicorn: str | None = None

    @property
    def env(self) -> str:
        return "SKIRR_" + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


OPTIONS: tuple[Option, ...] = (
    Option(
        "loop",
        "auto",
        _loop,
        "event loop: uvloop when installed (auto), or plain asyncio",
        rust=False,
    ),
    Option(
        "loop_mode",
        "auto",
        _choice("auto", "dual", "single"),
        "auto: single unless the loop is uvloop, then dual; dual: Tokio's I/O on one thread, the asyncio loop on"
        " another; single: both on one thread (asyncio's selector loop runs Tokio, a stand-in thread runs it while"
        " the app blocks the loop; no uvloop)",
    ),
    Option(
        "lifespan",
        "auto",
        _choice("auto", "on", "off"),
        "lifespan protocol: auto serves apps without it, on requires it, off never sends it",
    ),
    Option(
        "tasks",
        "skirr",
        _choice("skirr", "asyncio"),
        "what runs each app call: skirr (Skirr's task, faster) or asyncio (asyncio.Task from"
        " loop.create_task); a task factory set on the loop always gets asyncio",
    ),
    Option("lifespan_timeout", 60.0, _seconds, "bound on lifespan startup and shutdown (seconds)"),
    Option("root_path", "", str, "ASGI root_path: the prefix the app is mounted under"),
    Option(
        "keepalive_timeout",
        5.0,
        _seconds,
        "close idle keep-alive connections after this (seconds)",
        gunicorn="keepalive",
    ),
    Option("header_read_timeout", 30.0, _seconds, "a started request head must complete within this (seconds)"),
    Option(
        "graceful_timeout",
        30.0,
        _seconds,
        "on SIGTERM, in-flight requests get this long (seconds)",
        gunicorn="graceful_timeout",
    ),
    Option(
        "drain_grace",
        2.0,
        _seconds,
        "during a drain, an incomplete request head gets this long, a response the client reads nothing of"
        " is cut after this, and WebSockets get close 1012/1001 after this (seconds; 0: off)",
    ),
    Option(
        "max_requests",
        0,
        _nonneg_int,
        "stop after this many requests (0: never): Gunicorn restarts the worker; standalone the process exits",
        gunicorn="max_requests",
    ),
    Option(
        "max_connections",
        10000,
        _nonneg_int,
        "connections served at once per worker; more wait in the backlog (0: no limit)",
        gunicorn="worker_connections",
    ),
    Option("tokio_threads", 1, _pos_int, "Tokio worker threads per process (1: the I/O runs on the main thread)"),
    Option("body_prefetch", 65536, _nonneg_int, "read request bodies up to this size before starting the app (bytes)"),
    Option("body_chunk_size", 65536, _pos_int, "largest body chunk handed to the app in one http.request (bytes)"),
    Option("body_buffer", 262144, _pos_int, "request body read ahead of the app before reading pauses (bytes)"),
    Option(
        "send_buffer",
        262144,
        _pos_int,
        "response body (or WebSocket messages) queued before send() waits for the client (bytes)",
    ),
    Option(
        "ws_max_message_size",
        16 * 1024 * 1024,
        _pos_int,
        "largest WebSocket message accepted; larger ones close with 1009 (bytes)",
    ),
    Option("ws_ping_interval", 20.0, _seconds, "server pings idle WebSockets this often (seconds; 0: never)"),
    Option("ws_ping_timeout", 20.0, _seconds, "an unanswered ping closes the WebSocket with 1011 after (seconds)"),
    Option("ws_max_queue", 32, _pos_int, "WebSocket messages queued per direction before reading or send() waits"),
    Option(
        "ws_per_message_deflate",
        True,
        _bool,
        "accept permessage-deflate (RFC 7692) compression when a WebSocket client offers it",
    ),
    Option(
        "ws_deflate_window_bits",
        12,
        _window_bits,
        "LZ77 window of WebSocket compression (bits, 9-15; smaller uses less memory per connection)",
    ),
    Option(
        "ws_deflate_min_size",
        64,
        _nonneg_int,
        "WebSocket messages shorter than this are sent uncompressed (bytes)",
    ),
    Option(
        "ws_deflate_context_takeover",
        False,
        _bool,
        "keep a compressor per WebSocket (better ratio for similar messages, ~200 KiB more per connection)",
    ),
    Option(
        "limit_request_line",
        4094,
        _nonneg_int,
        "longest request line; longer is answered 414 (bytes; 0: no limit)",
        gunicorn="limit_request_line",
    ),
    Option(
        "limit_request_fields",
        100,
        _nonneg_int,
        "most header fields in a request; more is answered 431 (0: no limit)",
        gunicorn="limit_request_fields",
    ),
    Option(
        "limit_request_field_size",
        8190,
        _nonneg_int,
        "longest header field line; longer is answered 431 (bytes; 0: no limit)",
        gunicorn="limit_request_field_size",
    ),
    Option("max_head_size", 65536, _nonneg_int, "largest request head; larger is answered 431 (bytes)"),
    Option(
        "max_body_size",
        0,
        _nonneg_int,
        "largest request body; larger is answered 413 and the connection closed (bytes; 0: no limit)",
    ),
    Option(
        "body_read_timeout",
        30.0,
        _seconds,
        "a client sending no body bytes this long while the app waits is answered 408 (seconds; 0: never)",
    ),
    Option(
        "send_timeout",
        60.0,
        _seconds,
        "a response the client accepts no bytes of for this long is abandoned: the app sees"
        " http.disconnect, the stream is reset (HTTP/2, HTTP/3) or the connection closed (seconds; 0: never)",
    ),
    Option(
        "response_start_timeout",
        0.0,
        _seconds,
        "answer 503 when the app has not started its response after this (seconds; 0: never)",
    ),
    Option(
        "loop_stall_timeout",
        2.0,
        _stall_seconds,
        "an event loop that has not turned for this long stops the worker accepting; requests not yet"
        " in the app get 503 + Retry-After until it turns again (seconds; 0: never)",
    ),
    Option(
        "health_path",
        None,
        _health_path,
        "a path (e.g. /_health) Skirr answers itself, never the app: 200 {\"status\": \"ok\"}, or 503 while"
        " starting, draining or with the loop stalled; not logged, outside every limit (default: off)",
    ),
    Option(
        "drain_delay",
        0.0,
        _seconds,
        "on SIGTERM, keep accepting and serving this long (the health path answers 503) before draining;"
        " must be shorter than graceful_timeout (seconds)",
    ),
    Option(
        "limit_concurrency",
        0,
        _nonneg_int,
        "most HTTP requests in progress per worker; more are answered 503 + Retry-After (0: no limit)",
    ),
    Option(
        "proxy_headers",
        True,
        _bool,
        "take the client address and scheme from X-Forwarded-*/Forwarded headers of trusted proxies",
    ),
    Option(
        "forwarded_allow_ips",
        "127.0.0.1,::1",
        _str_list,
        "proxies trusted for forwarding headers: addresses and networks, or * (Unix sockets always)",
        gunicorn="forwarded_allow_ips",
    ),
    Option(
        "secure_scheme_headers",
        {"X-FORWARDED-PROTOCOL": "ssl", "X-FORWARDED-PROTO": "https", "X-FORWARDED-SSL": "on"},
        _header_map,
        "headers (JSON object) whose value, from a trusted proxy, means the request came over https",
        gunicorn="secure_scheme_headers",
    ),
    Option(
        "forwarder_headers",
        "SCRIPT_NAME,PATH_INFO",
        _str_list,
        "headers a trusted proxy may set; SCRIPT_NAME sets root_path",
        gunicorn="forwarder_headers",
    ),
    Option(
        "proxy_protocol",
        "off",
        _proxy_protocol,
        "expect a PROXY protocol header (v1, v2 or auto) from proxy_allow_ips",
        gunicorn="proxy_protocol",
    ),
    Option(
        "proxy_allow_ips",
        "127.0.0.1,::1",
        _str_list,
        "load balancers whose connections start with a PROXY protocol header",
        gunicorn="proxy_allow_ips",
    ),
    Option(
        "http_protocols",
        "h1",
        _http_protocols,
        "protocols served, in order of preference (ALPN): h1, h2 or both, e.g. h2,h1",
        gunicorn="http_protocols",
    ),
    Option(
        "http2_cleartext",
        "off",
        _http2_cleartext,
        "HTTP/2 without TLS: off, or prior-knowledge (a connection opening with the HTTP/2 preface)",
        gunicorn="http2_cleartext",
    ),
    Option(
        "http2_max_concurrent_streams",
        100,
        _int_range(1, 2**31 - 1),
        "HTTP/2 streams a client may open at once on one connection",
        gunicorn="http2_max_concurrent_streams",
    ),
    Option(
        "http2_initial_window_size",
        65535,
        _int_range(0, 2**31 - 1),
        "HTTP/2 flow-control window of each stream (bytes)",
        gunicorn="http2_initial_window_size",
    ),
    Option(
        "http2_max_frame_size",
        16384,
        _int_range(16384, 16777215),
        "largest HTTP/2 frame payload accepted (bytes)",
        gunicorn="http2_max_frame_size",
    ),
    Option(
        "http2_max_header_list_size",
        65536,
        _int_range(1, 2**32 - 1),
        "largest HTTP/2 header list accepted, uncompressed (bytes)",
        gunicorn="http2_max_header_list_size",
    ),
    Option(
        "http2_websockets",
        False,
        _bool,
        "serve WebSockets over HTTP/2 (RFC 8441 extended CONNECT; sends SETTINGS_ENABLE_CONNECT_PROTOCOL)",
    ),
    Option(
        "http2_ping_interval",
        0.0,
        _seconds,
        "the server PINGs each HTTP/2 connection this often (seconds; 0: never)",
    ),
    Option(
        "http2_ping_timeout",
        20.0,
        _seconds,
        "an HTTP/2 PING unanswered for this long closes the connection (seconds)",
    ),
    Option(
        "http3",
        False,
        _bool,
        "serve HTTP/3 (QUIC) on UDP beside each TCP listener (needs TLS: ssl_certfile/ssl_keyfile)",
    ),
    Option(
        "http3_port",
        0,
        _int_range(0, 65535),
        "UDP port of HTTP/3 (0: the port of each TCP listener)",
    ),
    Option("ssl_certfile", None, _optional_str, "serve TLS with this PEM certificate chain", gunicorn="certfile"),
    Option(
        "ssl_keyfile", None, _optional_str, "the PEM private key (unencrypted) for ssl_certfile", gunicorn="keyfile"
    ),
    Option("ssl_ca_certs", None, _optional_str, "PEM CA certificates for verifying clients", gunicorn="ca_certs"),
    Option(
        "ssl_cert_reqs",
        0,
        _cert_reqs,
        "client certificates: 0 not asked, 1 optional, 2 required (mTLS)",
        gunicorn="cert_reqs",
    ),
    Option(
        "ssl_ciphers", None, _optional_str, "colon-separated cipher suite names (default: rustls's)", gunicorn="ciphers"
    ),
    Option(
        "compression",
        "",
        _compression,
        "compress responses with these codings, in order of preference: gzip, zstd, br (e.g. zstd,br,gzip)",
    ),
    Option(
        "compression_min_size",
        500,
        _int_range(0, 2**63 - 1),
        "responses known to be smaller than this are not compressed (bytes)",
    ),
    Option(
        "compression_event_stream",
        False,
        _bool,
        "compress text/event-stream responses too (each event is flushed)",
    ),
    Option(
        "server_timing",
        False,
        _bool,
        "add Server-Timing: app;dur=, total;dur= (ms) to every response the app starts",
    ),
    Option(
        "tls_handshake_timeout",
        10.0,
        _seconds,
        "close a TLS connection whose handshake is not done within this (seconds; 0: never)",
    ),
    Option(
        "metrics_bind",
        None,
        _host_port,
        "serve Prometheus metrics of every worker at http://HOST:PORT/metrics (e.g. 127.0.0.1:9100; off by default)",
        rust=False,
    ),
    Option(
        "ssl_version",
        [],
        _tls_versions,
        "TLS versions: default (1.2 and 1.3), TLSv1_2 or TLSv1_3",
        gunicorn="ssl_version",
    ),
)

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


class ConfigError(ValueError):
    """An option has an invalid value; the message names the option and its source."""


def resolve(
    explicit: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    fallback: Mapping[str, Any] | None = None,
    only: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Every option's value (or those named in ``only``): ``explicit`` (e.g.
    CLI flags; ``None`` values are ignored), then ``SKIRR_*`` in
    ``environ``, then ``fallback`` (e.g. from Gunicorn settings), then the
    default.

    Raises :class:`ConfigError` naming the option and where its value came from.
    """
    explicit = explicit or {}
    environ = os.environ if environ is None else environ
    fallback = fallback or {}
    out: dict[str, Any] = {}
    for opt in OPTIONS if only is None else [BY_NAME[n] for n in only]:
        if explicit.get(opt.name) is not None:
            raw, source = explicit[opt.name], opt.flag
        elif opt.env in environ:
            raw, source = environ[opt.env], opt.env
        elif fallback.get(opt.name) is not None:
            raw, source = fallback[opt.name], f"setting {opt.name}"
        else:
            out[opt.name] = opt.default
            continue
        try:
            out[opt.name] = opt.parse(raw)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"invalid {source}: {e}") from None
    if out.get("drain_delay") and out["drain_delay"] >= out["graceful_timeout"]:
        raise ConfigError(
            f"drain_delay ({out['drain_delay']:g} s) must be shorter than graceful_timeout"
            f" ({out['graceful_timeout']:g} s): the worker drains after the delay, within the graceful timeout"
        )
    return out


#: Flags of ``python -m skirr`` that are not options (no ``SKIRR_*``
#: variable): a user may well try the variable.
CLI_ONLY = {
    "SKIRR_" + f.upper().replace("-", "_"): "--" + f
    for f in ("host", "port", "uds", "fd", "backlog", "factory", "app-dir", "log-level", "access-log", "http2")
}


def misspelt_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per ``SKIRR_*`` variable that would be silently ignored: a
    name close to an option's (``SKIRR_SEND_TIMOUT``), or a command-line
    flag's (``SKIRR_PORT``). Other ``SKIRR_*`` names (tools' own, like the
    test suite's) are left alone."""
    environ = os.environ if environ is None else environ
    known = [o.env for o in OPTIONS]
    out = []
    for name in sorted(environ):
        flag = CLI_ONLY.get(name)
        if flag:
            out.append(f"ignoring {name}: {flag} (a python -m skirr flag) has no environment variable")
            continue
        if name.startswith("SKIRR_") and name not in known:
            # Imported here, for a SKIRR_ name no option has: every
            # worker would otherwise carry difflib (~0.16 MiB; bench/NOTES.md, entry 62).
            import difflib

            close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
            if close:
                out.append(f"ignoring {name}: no such option (did you mean {close[0]}?)")
    return out


def shown(default: Any) -> str:
    """A default as a user would pass it: a header map as the JSON object
    the option takes, an empty string as empty."""
    if isinstance(default, dict):
        return json.dumps(default)
    if default == "":
        return "empty"
    return repr(default) if isinstance(default, str) else str(default)


def rust_config(values: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """The subset of ``values`` the Rust core reads, plus ``extra`` keys."""
    d = {k: v for k, v in values.items() if BY_NAME[k].rust}
    d.update(extra)
    return d


_PEM_CERT = re.compile(rb"-----BEGIN (?:TRUSTED )?CERTIFICATE-----")
_PEM_KEY = re.compile(rb"-----BEGIN (?:RSA |EC |ENCRYPTED )?PRIVATE KEY-----")

#: How the TLS options are named to the user: standalone flags, or Gunicorn's settings.
FLAG_NAMES = {"ssl_certfile": "--ssl-certfile", "ssl_keyfile": "--ssl-keyfile", "ssl_ca_certs": "--ssl-ca-certs"}
GUNICORN_NAMES = {"ssl_certfile": "certfile", "ssl_keyfile": "keyfile", "ssl_ca_certs": "ca_certs"}


def _read_pem(name: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise ConfigError(f"{name} {path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{name} {path} is a directory, not a PEM file") from None
    except PermissionError:
        raise ConfigError(f"{name} {path} is not readable by this user (permission denied)") from None
    except OSError as e:
        raise ConfigError(f"{name} {path}: {e.strerror}") from None


def check_tls_files(values: Mapping[str, Any], names: Mapping[str, str] = FLAG_NAMES) -> None:
    """Checks the TLS files before anything is bound or announced: each
    exists, is readable and holds the PEM blocks it should, and the key
    matches the certificate. The Rust core checks again when it loads them;
    this names the right file (a certfile without a keyfile must hold the
    key itself).

    Also refuses ``http3`` without a certificate.

    Raises :class:`ConfigError` naming the option (``names``) and the file.
    """
    cert, key, ca = values.get("ssl_certfile"), values.get("ssl_keyfile"), values.get("ssl_ca_certs")
    if values.get("http3") and not cert:
        # QUIC has no cleartext mode (RFC 9001): HTTP/3 cannot start without a certificate.
        raise ConfigError(
            f"http3 needs TLS (QUIC is always encrypted): set {names['ssl_certfile']} and {names['ssl_keyfile']}"
        )
    if not cert:
        for opt in ("ssl_keyfile", "ssl_ca_certs"):
            if values.get(opt):
                raise ConfigError(f"{names[opt]} is set without {names['ssl_certfile']}")
        return
    cert_pem = _read_pem(names["ssl_certfile"], cert)
    if not _PEM_CERT.search(cert_pem):
        raise ConfigError(f"{names['ssl_certfile']} {cert}: no PEM certificate found (no BEGIN CERTIFICATE block)")
    if key:
        key_pem = _read_pem(names["ssl_keyfile"], key)
        if not _PEM_KEY.search(key_pem):
            raise ConfigError(f"{names['ssl_keyfile']} {key}: no PEM private key found (no BEGIN PRIVATE KEY block)")
    else:
        key_pem = cert_pem
        if not _PEM_KEY.search(cert_pem):
            raise ConfigError(
                f"{names['ssl_certfile']} {cert} holds no private key: set {names['ssl_keyfile']} to the key file"
            )
    if ca and not _PEM_CERT.search(_read_pem(names["ssl_ca_certs"], ca)):
        raise ConfigError(f"{names['ssl_ca_certs']} {ca}: no PEM certificate found (no BEGIN CERTIFICATE block)")
    if b"ENCRYPTED" in key_pem:
        return  # the Rust core explains that it cannot use an encrypted key
    import ssl  # only to compare key and certificate: rustls serves TLS

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key or None, password=lambda: b"")
    except ssl.SSLError as e:
        # Other failures are left to the Rust core (rustls), which has the final word.
        if getattr(e, "reason", None) == "KEY_VALUES_MISMATCH":
            where = f"{names['ssl_keyfile']} {key}" if key else f"the key in {cert}"
            raise ConfigError(f"{where} does not match the certificate in {names['ssl_certfile']} {cert}") from None
