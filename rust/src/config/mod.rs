//! Server configuration as the Rust core sees it, and the data types of
//! every option group ([`tls`], [`compression`], [`http2`], [`http3`],
//! [`proxy`]): the
//! modules that act on them import them from here, and this module imports
//! only `wire/` (and errors).
//!
//! The option table is Python's (`skirr.config.OPTIONS`): names, defaults,
//! `SKIRR_*` variables, flags and the mapping from Gunicorn settings. Python
//! resolves every option and hands Rust a complete plain `dict`;
//! [`Config::from_dict`] reads it, checks types and ranges, and rejects
//! unknown keys, so a typo can never be silently ignored. Rust's own
//! defaults ([`Config::default`] and each group's) fill only keys a dict
//! lacks (Rust's tests, a `Server` built by hand); they must equal
//! Python's, which `tests/test_config_parity.py` checks through
//! [`effective_config`].

pub mod compression;
pub mod http2;
pub mod http3;
pub mod proxy;
pub mod tls;

use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

pub use self::compression::{Coding, Compression};
pub use self::http2::Http2;
pub use self::http3::Http3;
pub use self::proxy::ProxyProtocol;
pub use self::tls::{ClientAuth, TlsSettings};
use crate::wire::proxy::ProxyConfig;
use crate::wire::request::Limits;

/// How the lifespan protocol is run (ASGI Lifespan spec 2.0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LifespanMode {
    /// Run it; an app that does not support it is served anyway.
    Auto,
    /// Run it; an app that does not support it is a startup error.
    On,
    /// Never send lifespan events.
    Off,
}

/// Everything the Rust core needs to serve.
#[derive(Clone, Debug)]
pub struct Config {
    /// `scope["root_path"]`, prepended to `path` and `raw_path`. Default `""`.
    pub root_path: String,
    /// Lifespan mode. Default `auto`.
    pub lifespan: LifespanMode,
    /// Bound on `lifespan.startup` and on `lifespan.shutdown`. Default 60 s.
    pub lifespan_timeout: Duration,
    /// Run every app call in an `asyncio.Task` made by `loop.create_task()`
    /// (`tasks = asyncio`) instead of Skirr's own task type. Default false;
    /// a call that starts while the loop has a task factory always does.
    pub asyncio_tasks: bool,
    /// Idle keep-alive connections are closed after this. Default 5 s.
    pub keepalive_timeout: Duration,
    /// A client must send a complete request head within this once it has
    /// sent its first byte (slowloris guard). Default 30 s.
    pub header_read_timeout: Duration,
    /// On SIGTERM, in-flight requests get this long to finish. Default 30 s.
    /// Under Gunicorn (`parent_pid` set) the WebSocket close handshake
    /// comes out of it, see `run::drain_deadlines`.
    pub graceful_timeout: Duration,
    /// During a drain: how long a request head not complete when it began
    /// (or a new connection that sent nothing yet) gets, how long a
    /// response may stall on a client that reads nothing, and when open
    /// WebSockets get their close (1012 on a `max_requests` recycle, 1001
    /// on a signal); see `server::drain`. Zero: none of these (heads get
    /// `header_read_timeout`, stalled responses `send_timeout`, WebSockets
    /// the drain deadline). Default 2 s.
    pub drain_grace: Duration,
    /// Stop (and let the master re-fork) after this many requests; 0 = never.
    pub max_requests: u64,
    /// Most connections served at once; further ones wait in the backlog.
    /// 0 = unlimited. Default 10,000 (`worker_connections` under Gunicorn).
    pub max_connections: usize,
    /// Worker threads of the Tokio runtime; 1 = a current-thread runtime.
    pub tokio_threads: usize,
    /// `loop_mode`: `true` ("single") runs the Tokio current-thread runtime
    /// inside the asyncio loop's selector on one thread (`server::single`);
    /// `false` ("dual") runs Tokio and asyncio on two threads. Python
    /// resolves the default, "auto", to one of them (single unless the
    /// loop is uvloop).
    /// While the app keeps the loop's thread away, a stand-in thread runs
    /// Tokio (`server::single`), so the loop watchdog works in both modes.
    pub single_thread: bool,
    /// Request bodies with a `Content-Length` up to this many bytes are read
    /// before the app starts, so the first `receive()` completes at once.
    /// 0 disables. Default 64 KiB.
    pub body_prefetch: usize,
    /// Largest `body` handed to the app in one `http.request`. Default 64 KiB.
    pub body_chunk_size: usize,
    /// Request-body bytes read ahead of the app before reading pauses
    /// (backpressure to the client). Default 256 KiB.
    pub body_buffer: usize,
    /// Response-body bytes (or WebSocket message bytes) queued by `send()`
    /// before it waits for the client (backpressure to the app). Default
    /// 256 KiB.
    pub send_buffer: usize,
    /// Parent process id to watch: if it changes, the worker shuts down.
    pub parent_pid: Option<u32>,
    /// Under Gunicorn with two or more workers: a descriptor of the file
    /// the master's workers lock so that their `max_requests` recycles do
    /// not overlap (`server::recycle`). Set by `skirr.RustWorker`.
    pub recycle_lock_fd: Option<i32>,
    /// The TCP listeners are this worker's alone (Gunicorn's `reuse_port`
    /// binds them in each worker): when it stops accepting it takes what is
    /// queued on them and shuts them down (`server::listen::hand_over`).
    /// Set by `skirr.RustWorker`; default false (shared sockets must stay
    /// open for the other workers).
    pub own_listeners: bool,
    /// With a health path, accept during lifespan startup, so the path can
    /// answer `503 starting` (other requests wait for startup). Default
    /// true; `skirr.RustWorker` turns it off when other workers share the
    /// socket: a connection it took would wait for its startup while
    /// another worker could serve it at once.
    pub accept_during_startup: bool,
    /// Whether SIGINT is graceful (standalone) or quick (Gunicorn).
    pub sigint_graceful: bool,
    /// Emit one access-log line per request.
    pub access_log: bool,
    /// Largest WebSocket message accepted; larger ones close the connection
    /// with 1009. Default 16 MiB.
    pub ws_max_message_size: usize,
    /// Server pings every this long on idle WebSockets; zero disables.
    /// Default 20 s.
    pub ws_ping_interval: Duration,
    /// A ping unanswered this long closes the connection (1011). Default 20 s.
    pub ws_ping_timeout: Duration,
    /// Messages queued per direction before reading (client → app) or
    /// `send()` (app → client, also bounded by `send_buffer` bytes) waits.
    /// Default 32.
    pub ws_max_queue: usize,
    /// Accept permessage-deflate (RFC 7692) when a WebSocket client offers it;
    /// uvicorn's `ws_per_message_deflate`. Default on.
    pub ws_per_message_deflate: bool,
    /// LZ77 window (bits, 9..=15) Skirr compresses with and asks clients to
    /// use when they let it choose; smaller costs less memory per
    /// connection. Default 12 (as websockets/uvicorn).
    pub ws_deflate_window_bits: u8,
    /// Messages shorter than this (bytes) are sent uncompressed. Default 64.
    pub ws_deflate_min_size: usize,
    /// Keep a compressor per WebSocket (context takeover) when the client
    /// allows it: smaller messages on the wire, ~200 KiB more memory per
    /// compressed connection. Default off (one compressor per thread).
    pub ws_deflate_context_takeover: bool,
    /// Request line and header field size limits (414, 431); see
    /// [`Limits`]. Gunicorn's `limit_request_line` (4094) and
    /// `limit_request_field_size` (8190).
    pub limits: Limits,
    /// Most header fields in a request; more is answered 431 by hyper.
    /// Gunicorn's `limit_request_fields`, default 100.
    pub limit_request_fields: usize,
    /// Largest request head (request line and fields) in bytes; larger is
    /// answered 431. Default 64 KiB.
    pub max_head_size: usize,
    /// Largest request body in bytes; larger is answered 413 and the
    /// connection closed. 0 (the default, as in Gunicorn) = no limit.
    pub max_body_size: u64,
    /// A client that sends no request-body bytes for this long while the
    /// app waits for them is answered 408 (or cut off mid-response).
    /// Zero disables. Default 30 s.
    pub body_read_timeout: Duration,
    /// A response the client accepts no bytes of for this long is
    /// abandoned: an HTTP/2 stream whose window stays closed is reset, an
    /// HTTP/1.1 socket that takes no bytes is closed; the app sees the
    /// client gone. Zero disables. Default 60 s.
    pub send_timeout: Duration,
    /// An app that has not started its response this long after the
    /// request head arrived is answered 503 for it. Zero (the default)
    /// disables.
    pub response_start_timeout: Duration,
    /// The loop watchdog's bound: an asyncio loop that has not turned for
    /// this long counts as stalled, and the worker stops taking work (see
    /// [`watchdog`](crate::worker::watchdog)) until it turns again. Zero
    /// disables. Default 2 s (`loop_stall_timeout`).
    pub loop_stall_timeout: Duration,
    /// A path the server answers itself (see
    /// [`health`](crate::worker::health)); `None` (the default): off.
    pub health_path: Option<String>,
    /// On SIGTERM, how long the worker keeps accepting and serving, with
    /// the health path answering 503, before it drains. Must be shorter
    /// than `graceful_timeout`. Default zero.
    pub drain_delay: Duration,
    /// Most HTTP requests in progress per worker; more are answered 503
    /// (see [`concurrency`](crate::worker::concurrency)). 0 (the
    /// default): no limit.
    pub limit_concurrency: usize,
    /// Forwarding headers from trusted proxies; `None` ignores them.
    /// Default: trust 127.0.0.1 and ::1, Gunicorn's `secure_scheme_headers`.
    pub proxy: Option<ProxyConfig>,
    /// TLS termination; `None` serves plain HTTP. Set by `ssl_certfile`.
    pub tls: Option<TlsSettings>,
    /// A TLS client must finish its handshake within this of being
    /// accepted, or the connection is closed (it holds a connection slot
    /// meanwhile). Zero disables. Default 10 s.
    pub tls_handshake_timeout: Duration,
    /// Every response the app starts gets `Server-Timing: app;dur=…,
    /// total;dur=…` (milliseconds: app start to response start, request
    /// head to response start). Default off (`server_timing`).
    pub server_timing: bool,
    /// Response compression; `None` (the default) sends bodies as the app
    /// gave them (`compression`, `compression_*`).
    pub compression: Option<Compression>,
    /// PROXY protocol headers expected from trusted load balancers;
    /// `None` (the default) expects none.
    pub proxy_protocol: Option<ProxyProtocol>,
    /// HTTP/2 (see [`Http2`]); `None` (the default) serves HTTP/1.1 only.
    pub http2: Option<Http2>,
    /// HTTP/3 on UDP beside each TCP listener (see [`Http3`]); `None` (the
    /// default): off.
    pub http3: Option<Http3>,
    /// The shared metrics table (a memfd made by `skirr._skirr.metrics_table`
    /// before fork); `None` (the default) records nothing.
    pub metrics_table_fd: Option<i32>,
    /// The exposition's listening socket (`metrics_bind`, bound by the
    /// master, inherited); `None`: this worker serves no scrapes.
    pub metrics_fd: Option<i32>,
}

/// A comma-separated string or a list of strings, each trimmed, empty
/// items dropped.
///
/// Errors: `TypeError` naming `key` for anything else.
pub(super) fn str_list(v: &Bound<'_, PyAny>, key: &str) -> PyResult<Vec<String>> {
    if let Ok(s) = v.extract::<String>() {
        return Ok(s
            .split(',')
            .map(|x| x.trim().to_owned())
            .filter(|x| !x.is_empty())
            .collect());
    }
    v.extract::<Vec<String>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "option {key:?} must be a string or a list of strings"
        ))
    })
}

impl Default for Config {
    fn default() -> Self {
        Self {
            root_path: String::new(),
            lifespan: LifespanMode::Auto,
            lifespan_timeout: Duration::from_secs(60),
            asyncio_tasks: false,
            keepalive_timeout: Duration::from_secs(5),
            header_read_timeout: Duration::from_secs(30),
            graceful_timeout: Duration::from_secs(30),
            drain_grace: Duration::from_secs(2),
            max_requests: 0,
            max_connections: 10_000,
            tokio_threads: 1,
            single_thread: false,
            body_prefetch: 64 * 1024,
            body_chunk_size: 64 * 1024,
            body_buffer: 256 * 1024,
            send_buffer: 256 * 1024,
            parent_pid: None,
            recycle_lock_fd: None,
            own_listeners: false,
            accept_during_startup: true,
            sigint_graceful: true,
            access_log: false,
            ws_max_message_size: 16 << 20,
            ws_ping_interval: Duration::from_secs(20),
            ws_ping_timeout: Duration::from_secs(20),
            ws_max_queue: 32,
            ws_per_message_deflate: true,
            ws_deflate_window_bits: 12,
            ws_deflate_min_size: 64,
            ws_deflate_context_takeover: false,
            limits: Limits::default(),
            limit_request_fields: 100,
            max_head_size: 64 * 1024,
            max_body_size: 0,
            body_read_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(60),
            response_start_timeout: Duration::ZERO,
            loop_stall_timeout: Duration::from_secs(2),
            health_path: None,
            drain_delay: Duration::ZERO,
            limit_concurrency: 0,
            proxy: Some(proxy::default_proxy()),
            tls: None,
            tls_handshake_timeout: Duration::from_secs(10),
            server_timing: false,
            compression: None,
            proxy_protocol: None,
            http2: None,
            http3: None,
            metrics_table_fd: None,
            metrics_fd: None,
        }
    }
}

/// A number of seconds, 0 to 1e9 (a guard: far beyond any sensible
/// timeout, and below `Duration`'s range).
///
/// Errors: `TypeError` for a non-number, `ValueError` out of range; both
/// name `key`.
pub(super) fn secs(v: &Bound<'_, PyAny>, key: &str) -> PyResult<Duration> {
    let s: f64 = v
        .extract()
        .map_err(|_| PyTypeError::new_err(format!("option {key:?} must be a number of seconds")))?;
    if !(0.0..=1e9).contains(&s) {
        return Err(PyValueError::new_err(format!(
            "option {key:?} must be between 0 and 1e9 seconds, got {s}"
        )));
    }
    Ok(Duration::from_secs_f64(s))
}

/// A non-negative integer that fits `T`.
///
/// Errors: `ValueError` naming `key` for anything else.
pub(super) fn count<T: for<'a, 'py> FromPyObject<'a, 'py>>(
    v: &Bound<'_, PyAny>,
    key: &str,
) -> PyResult<T> {
    v.extract::<T>().map_err(|_| {
        PyValueError::new_err(format!("option {key:?} must be a non-negative integer"))
    })
}

impl Config {
    /// Reads a config dict. Missing keys keep their defaults.
    ///
    /// Errors: `ValueError` for an unknown key or a value out of range,
    /// `TypeError` for a value of the wrong type; each names the key.
    pub fn from_dict(d: &Bound<'_, PyDict>) -> PyResult<Self> {
        let mut c = Config::default();
        let mut proxy = proxy::Options::default();
        let mut tls = tls::Options::default();
        let mut h2 = http2::Options::default();
        let mut h3 = http3::Options::default();
        let mut compression = compression::Options::default();
        for (k, v) in d.iter() {
            let key: String = k.extract()?;
            let key = key.as_str();
            let known = c.set(key, &v)?
                || proxy.set(key, &v)?
                || tls.set(key, &v)?
                || h2.set(key, &v)?
                || h3.set(key, &v)?
                || compression.set(key, &v)?;
            if !known {
                return Err(PyValueError::new_err(format!(
                    "unknown server option {key:?}"
                )));
            }
        }
        if c.single_thread {
            // One Tokio thread: the loop's own (or the stand-in's, while
            // the loop is blocked).
            c.tokio_threads = 1;
        }
        if !c.drain_delay.is_zero() && c.drain_delay >= c.graceful_timeout {
            return Err(PyValueError::new_err(format!(
                "drain_delay ({:?}) must be shorter than graceful_timeout ({:?}): the worker \
                 drains after the delay, within the graceful timeout",
                c.drain_delay, c.graceful_timeout
            )));
        }
        c.compression = compression.finish();
        (c.proxy, c.proxy_protocol) = proxy.finish()?;
        c.http3 = h3.finish(h2.limits());
        c.http2 = h2.finish();
        c.tls = tls.finish(c.http2.as_ref());
        Ok(c)
    }

    /// Takes `key` if it is one of the options outside the groups (returns
    /// whether it was).
    fn set(&mut self, key: &str, v: &Bound<'_, PyAny>) -> PyResult<bool> {
        let c = self;
        match key {
            "root_path" => c.root_path = v.extract()?,
            "lifespan" => {
                c.lifespan = match choice(v, key, &["auto", "on", "off"])? {
                    "auto" => LifespanMode::Auto,
                    "on" => LifespanMode::On,
                    _ => LifespanMode::Off,
                }
            }
            "lifespan_timeout" => c.lifespan_timeout = secs(v, key)?,
            "tasks" => c.asyncio_tasks = choice(v, key, &["skirr", "asyncio"])? == "asyncio",
            "keepalive_timeout" => c.keepalive_timeout = secs(v, key)?,
            "header_read_timeout" => c.header_read_timeout = secs(v, key)?,
            "graceful_timeout" => c.graceful_timeout = secs(v, key)?,
            "drain_grace" => c.drain_grace = secs(v, key)?,
            "max_requests" => c.max_requests = count(v, key)?,
            "max_connections" => c.max_connections = count(v, key)?,
            "tokio_threads" => c.tokio_threads = count::<usize>(v, key)?.max(1),
            "loop_mode" => {
                // Python resolves "auto" (single unless the loop is uvloop)
                // before the server is built.
                c.single_thread = choice(v, key, &["auto", "dual", "single"])? == "single"
            }
            "body_prefetch" => c.body_prefetch = count(v, key)?,
            "body_chunk_size" => c.body_chunk_size = count::<usize>(v, key)?.max(1),
            "body_buffer" => c.body_buffer = count::<usize>(v, key)?.max(1),
            "send_buffer" => c.send_buffer = count::<usize>(v, key)?.max(1),
            "parent_pid" => c.parent_pid = v.extract()?,
            "recycle_lock_fd" => c.recycle_lock_fd = v.extract()?,
            "own_listeners" => c.own_listeners = v.extract()?,
            "accept_during_startup" => c.accept_during_startup = v.extract()?,
            "sigint_graceful" => c.sigint_graceful = v.extract()?,
            "access_log" => c.access_log = v.extract()?,
            "server_timing" => c.server_timing = v.extract()?,
            "ws_max_message_size" => c.ws_max_message_size = count::<usize>(v, key)?.max(1),
            "ws_ping_interval" => c.ws_ping_interval = secs(v, key)?,
            "ws_ping_timeout" => c.ws_ping_timeout = secs(v, key)?,
            "ws_max_queue" => c.ws_max_queue = count::<usize>(v, key)?.max(1),
            "ws_per_message_deflate" => c.ws_per_message_deflate = v.extract()?,
            "ws_deflate_window_bits" => {
                c.ws_deflate_window_bits = count::<u8>(v, key)?.clamp(9, 15)
            }
            "ws_deflate_min_size" => c.ws_deflate_min_size = count(v, key)?,
            "ws_deflate_context_takeover" => c.ws_deflate_context_takeover = v.extract()?,
            "limit_request_line" => c.limits.request_line = count(v, key)?,
            "limit_request_field_size" => c.limits.field_size = count(v, key)?,
            "limit_request_fields" => c.limit_request_fields = count(v, key)?,
            "max_head_size" => c.max_head_size = count(v, key)?,
            "max_body_size" => c.max_body_size = count(v, key)?,
            "body_read_timeout" => c.body_read_timeout = secs(v, key)?,
            "send_timeout" => c.send_timeout = secs(v, key)?,
            "response_start_timeout" => c.response_start_timeout = secs(v, key)?,
            "loop_stall_timeout" => c.loop_stall_timeout = secs(v, key)?,
            "health_path" => {
                c.health_path = v.extract::<Option<String>>()?.filter(|p| !p.is_empty());
                if let Some(p) = &c.health_path {
                    if !p.starts_with('/') {
                        return Err(PyValueError::new_err(format!(
                            "option 'health_path' must start with '/', got {p:?}"
                        )));
                    }
                }
            }
            "drain_delay" => c.drain_delay = secs(v, key)?,
            "limit_concurrency" => c.limit_concurrency = count(v, key)?,
            "tls_handshake_timeout" => c.tls_handshake_timeout = secs(v, key)?,
            "metrics_table_fd" => c.metrics_table_fd = v.extract()?,
            "metrics_fd" => c.metrics_fd = v.extract()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// One of `choices` (a guard: Python's parser already normalised it).
///
/// Errors: `ValueError` naming the choices, `TypeError` if not a string.
fn choice<'a>(v: &Bound<'_, PyAny>, key: &str, choices: &[&'a str]) -> PyResult<&'a str> {
    let got: String = v.extract()?;
    choices.iter().find(|c| **c == got).copied().ok_or_else(|| {
        let names = match choices.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => choices.join(""),
        };
        PyValueError::new_err(format!("option {key:?} must be {names}, got {got:?}"))
    })
}

/// The configuration `d` makes, as Rust reads it (`{:#?}` of [`Config`]),
/// for tests that compare Python's defaults with Rust's (see the module
/// docs). Not part of the API.
///
/// Errors: as [`Config::from_dict`].
#[pyfunction]
#[pyo3(name = "_effective_config")]
pub fn effective_config(d: &Bound<'_, PyDict>) -> PyResult<String> {
    Ok(format!("{:#?}", Config::from_dict(d)?))
}
