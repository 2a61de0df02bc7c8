"""How Gunicorn's settings map onto Skirr's worker.

* Settings Skirr honours are read into its options (:func:`fallback`):
  each option's ``gunicorn`` name in :mod:`skirr.config`, plus Skirr's own
  options written ``skirr_<name> = ...`` in the Gunicorn config file.
* Settings that have no meaning for an ASGI worker built on hyper produce
  one warning each at boot when set (:data:`NOT_APPLICABLE`).
* Values Skirr cannot honour stop the boot with a clear message (exit 3).

Everything else (bind, workers, backlog, reuse_port, timeout, preload_app,
reload, user/group/umask, chdir, raw_env, proc_name, logging, statsd, the
master's hooks) is Gunicorn's own doing and works as with any worker.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, field
from typing import Any

from skirr import config

#: Settings with no meaning for Skirr's worker, and why.
NOT_APPLICABLE: dict[str, str] = {
    "threads": "each worker runs one asyncio loop; use more workers (-w) for more CPUs",
    "sendfile": "response bodies come from the app through send()",
    "tmp_upload_dir": "request bodies are streamed to the app, never spooled to disk",
    "spew": "Python line tracing is not available inside the Rust runtime",
    "http_parser": "hyper parses HTTP",
    "asgi_disconnect_grace_period": "the app sees http.disconnect as soon as the client leaves",
    "permit_obsolete_folding": "obs-fold is always rejected with 400 (RFC 9112 §5.2)",
    "strip_header_spaces": "whitespace before a header colon is always rejected with 400",
    "permit_unconventional_http_method": "any valid token method is passed to the app",
    "permit_unconventional_http_version": "only HTTP/1.0, HTTP/1.1 and (with http_protocols) HTTP/2 are served",
    "casefold_http_method": "methods are passed to the app as sent",
    "header_map": "ASGI headers keep their names; nothing is mapped to environ keys",
    "uwsgi_allow_ips": "the uwsgi protocol is not served",
    "suppress_ragged_eofs": "rustls reports a truncated TLS stream as a closed connection",
    "do_handshake_on_connect": "the TLS handshake always completes before HTTP is read",
}

#: Gunicorn 27's ASGI settings, read as Skirr options of another name.
RENAMED = {
    "asgi_loop": "loop",
    "asgi_lifespan": "lifespan",
    "websocket_max_message_size": "ws_max_message_size",
    "root_path": "root_path",
}


@dataclass
class Problems:
    inapplicable: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _setting(cfg: Any, name: str):
    return cfg.settings.get(name)


def _is_set(cfg: Any, name: str) -> bool:
    """Whether the setting differs from its default (compared after
    Gunicorn's validator, which turns e.g. "a,b" into a list)."""
    s = _setting(cfg, name)
    if s is None:
        return False
    default = s.default
    validator = getattr(s, "validator", None)
    if validator is not None:
        try:
            default = validator(default)
        except Exception:  # noqa: BLE001 - a default the validator rejects: compare raw
            pass
    return s.value != default


def _hook_is_set(cfg: Any, name: str) -> bool:
    s = _setting(cfg, name)
    return (
        s is not None
        and s.value is not s.default
        and getattr(s.value, "__code__", None) is not getattr(s.default, "__code__", None)
    )


def has_request_hooks(cfg: Any) -> bool:
    """Whether ``pre_request`` or ``post_request`` is customised."""
    return _hook_is_set(cfg, "pre_request") or _hook_is_set(cfg, "post_request")


def access_log_wanted(log: Any, cfg: Any) -> bool:
    """Whether per-request access calls are needed: an access log is
    configured, or statsd wants request metrics."""
    return bool(getattr(log, "access_log_enabled", True) or getattr(cfg, "statsd_host", None))


def config_module(cfg: Any) -> Any:
    """The Gunicorn config file's module, if one was loaded (Gunicorn keeps
    it in ``sys.modules``)."""
    location = getattr(cfg, "config", None) or ""
    if location.startswith("python:"):
        return sys.modules.get(location[len("python:") :])
    return sys.modules.get("__config__")


def fallback(cfg: Any, max_requests: int) -> dict[str, Any]:
    """Skirr option values from the Gunicorn configuration (lower precedence
    than ``SKIRR_*`` variables)."""
    out: dict[str, Any] = {}
    for o in config.OPTIONS:
        if o.gunicorn and _setting(cfg, o.gunicorn) is not None:
            out[o.name] = getattr(cfg, o.gunicorn)
    for gname, name in RENAMED.items():
        if _is_set(cfg, gname):
            out[name] = getattr(cfg, gname)
    # Gunicorn has already applied --max-requests-jitter to this worker.
    out["max_requests"] = max_requests if max_requests < sys.maxsize else 0
    if out.get("ssl_certfile") is None:
        for k in ("ssl_keyfile", "ssl_ca_certs"):
            out.pop(k, None)
    mod = config_module(cfg)
    if mod is not None:
        for name in config.BY_NAME:
            v = getattr(mod, "skirr_" + name, None)
            if v is not None:
                out[name] = v
    return out


def check(cfg: Any) -> Problems:
    """Settings that do not apply (warned) and values that cannot be
    honoured (boot errors)."""
    p = Problems()
    for name, why in NOT_APPLICABLE.items():
        if _is_set(cfg, name):
            p.inapplicable.append((name, why))
    if _is_set(cfg, "protocol") and str(cfg.protocol).lower() != "http":
        p.errors.append(f"protocol {cfg.protocol!r} is not supported (only http)")
    protocols = _setting(cfg, "http_protocols")
    if protocols is not None:
        try:
            config.BY_NAME["http_protocols"].parse(protocols.value)
        except ValueError as e:
            p.errors.append(f"http_protocols: {e}")
    cleartext = str(getattr(cfg, "http2_cleartext", "off") or "off").lower()
    if cleartext == "upgrade":
        p.errors.append(
            "http2_cleartext upgrade is not supported (Upgrade: h2c, deprecated by RFC 9113 §3.1): "
            "use prior-knowledge"
        )
    elif cleartext == "both":
        p.inapplicable.append(
            (
                "http2_cleartext",
                "Upgrade: h2c is not supported: only prior-knowledge is served (upgrade is answered as HTTP/1.1)",
            )
        )
    if _hook_is_set(cfg, "ssl_context"):
        p.errors.append(
            "the ssl_context hook builds a Python SSLContext, but Skirr terminates TLS in Rust (rustls): "
            "use certfile, keyfile, ca_certs, cert_reqs, ciphers and ssl_version instead"
        )
    if getattr(cfg, "keyfile", None) and not getattr(cfg, "certfile", None):
        p.errors.append("keyfile is set without certfile")
    mod = config_module(cfg)
    for attr in sorted(vars(mod)) if mod is not None else ():
        if attr.startswith("skirr_") and attr[len("skirr_") :] not in config.BY_NAME:
            close = difflib.get_close_matches(attr[len("skirr_") :], config.BY_NAME, n=1)
            hint = f" (did you mean skirr_{close[0]}?)" if close else ""
            p.inapplicable.append((attr, f"not a Skirr option{hint}"))
    return p
