"""Option defaults have one source: Python's ``skirr.config.OPTIONS``.

Python always hands the Rust core every option, but Rust keeps defaults of
its own for keys a config dict lacks (its tests, a ``Server`` built by
hand). These tests fail when one of them disagrees with Python's: they
compare what Rust makes of a dict holding Python's default for an option
with what it makes of a dict without it (``_skirr._effective_config``, the
Rust ``Config`` as read, ``{:#?}``).
"""

from __future__ import annotations

from typing import Any

import pytest
from skirr import _skirr
from skirr.config import OPTIONS, resolve, rust_config

RUST_OPTIONS = [o for o in OPTIONS if o.rust]

#: Keys that switch a group on: HTTP/2 settings show only with h2 served,
#: TLS settings with a certfile, ``proxy_allow_ips`` with the PROXY protocol,
#: ``compression_*`` with a coding, ``http3_port`` with HTTP/3. Rust only
#: stores the certfile's path.
GROUPS_ON: dict[str, Any] = {
    "http_protocols": "h2,h1",
    "ssl_certfile": "/nonexistent/cert.pem",
    "proxy_protocol": "auto",
    "compression": "gzip",
    "http3": True,
}

#: A value other than the default, for options whose default is not a
#: number or a bool.
OTHER: dict[str, Any] = {
    "lifespan": "on",
    "loop_mode": "single",
    "tasks": "asyncio",
    "root_path": "/mounted",
    "health_path": "/_health",
    "forwarded_allow_ips": "10.0.0.0/8",
    "secure_scheme_headers": {"X-Scheme": "https"},
    "forwarder_headers": "PATH_INFO",
    "proxy_protocol": "v1",
    "proxy_allow_ips": "10.0.0.1",
    "http_protocols": "h2",
    "http2_cleartext": "prior-knowledge",
    "ssl_certfile": "/nonexistent/other.pem",
    "ssl_keyfile": "/nonexistent/key.pem",
    "ssl_ca_certs": "/nonexistent/ca.pem",
    "ssl_ciphers": "TLS13_AES_128_GCM_SHA256",
    "ssl_version": ["1.3"],
    "compression": "br",
}


def effective(d: dict[str, Any]) -> str:
    return _skirr._effective_config(d)


def other_value(name: str, default: Any) -> Any:
    if name in OTHER:
        return OTHER[name]
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default + 1.5
    raise AssertionError(f"no other value for option {name!r}: add one to OTHER")


def test_every_default_at_once():
    defaults = rust_config(resolve(environ={}))
    assert sorted(defaults) == sorted(o.name for o in RUST_OPTIONS)
    assert effective(defaults) == effective({})
    assert effective({**defaults, **GROUPS_ON}) == effective(GROUPS_ON)


@pytest.mark.parametrize("opt", RUST_OPTIONS, ids=lambda o: o.name)
def test_rust_default_is_pythons(opt):
    base = {k: v for k, v in GROUPS_ON.items() if k != opt.name}
    assert effective({**base, opt.name: opt.default}) == effective(base), (
        f"Rust's default for {opt.name!r} differs from skirr.config.OPTIONS ({opt.default!r})"
    )


@pytest.mark.parametrize("opt", RUST_OPTIONS, ids=lambda o: o.name)
def test_the_view_shows_every_option(opt):
    """Without this, an option Rust ignored or did not show would pass the
    parity test whatever its default."""
    base = {k: v for k, v in GROUPS_ON.items() if k != opt.name}
    assert effective({**base, opt.name: other_value(opt.name, opt.default)}) != effective(base)
