//! Server configuration as the Rust core sees it.
//!
//! The Python side (`skirr.config`) owns the option table: names, defaults,
//! `SKIRR_*` environment variables and the mapping from Gunicorn settings.
//! It hands Rust a plain `dict`; [`Config::from_dict`] reads it and rejects
//! unknown keys, so a typo can never be silently ignored.

use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use http::HeaderName;

use crate::server::tls::{ClientAuth, TlsSettings};
use crate::wire::proxy::{parse_allow_list, ProxyConfig};
use crate::wire::proxy_protocol::Versions;
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
    /// uvicorn's
    /// `ws_per_message_deflate`. Default on.
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
    /// [`watchdog`](crate::server::watchdog)) until it turns again. Zero
    /// disables. Default 2 s (`loop_stall_timeout`).
    pub loop_stall_timeout: Duration,
    /// A path the server answers itself (see
    /// [`health`](crate::server::health)); `None` (the default): off.
    pub health_path: Option<String>,
    /// On SIGTERM, how long the worker keeps accepting and serving, with
    /// the health path answering 503, before it drains. Must be shorter
    /// than `graceful_timeout`. Default zero.
    pub drain_delay: Duration,
    /// Most HTTP requests in progress per worker; more are answered 503
    /// (see [`concurrency`](crate::server::concurrency)). 0 (the
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
    pub compression: Option<crate::http::compress::Compression>,
    /// PROXY protocol headers expected from trusted load balancers;
    /// `None` (the default) expects none.
    pub proxy_protocol: Option<ProxyProtocol>,
    /// HTTP/2 (see [`Http2`]); `None` (the default) serves HTTP/1.1 only.
    pub http2: Option<Http2>,
    /// The shared metrics table (a memfd made by `skirr._skirr.metrics_table`
    /// before fork); `None` (the default) records nothing.
    pub metrics_table_fd: Option<i32>,
    /// The exposition's listening socket (`metrics_bind`, bound by the
    /// master, inherited); `None`: this worker serves no scrapes.
    pub metrics_fd: Option<i32>,
}

/// HTTP/2 settings: Gunicorn's `http_protocols`, `http2_cleartext` and
/// `http2_*` limits.
#[derive(Clone, Debug)]
pub struct Http2 {
    /// HTTP/1.1 is served too (`h1` in `http_protocols`).
    pub http1: bool,
    /// ALPN offers `h2` before `http/1.1` (the order of `http_protocols`).
    pub h2_first: bool,
    /// Cleartext connections that open with the HTTP/2 preface are served
    /// HTTP/2 (`http2_cleartext = prior-knowledge`).
    pub prior_knowledge: bool,
    /// SETTINGS_MAX_CONCURRENT_STREAMS. Default 100.
    pub max_concurrent_streams: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE (per stream). Default 65535.
    pub initial_window_size: u32,
    /// SETTINGS_MAX_FRAME_SIZE. Default 16384.
    pub max_frame_size: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE. Default 65536.
    pub max_header_list_size: u32,
    /// WebSockets over HTTP/2 (RFC 8441): SETTINGS_ENABLE_CONNECT_PROTOCOL
    /// is sent and an extended CONNECT with `:protocol websocket` reaches
    /// the app as a WebSocket. Default off (`http2_websockets`).
    pub websockets: bool,
    /// The server PINGs a connection this often; zero (the default) sends
    /// none (`http2_ping_interval`, seconds).
    pub ping_interval: Duration,
    /// A PING unanswered for this long closes the connection. Default 20 s
    /// (`http2_ping_timeout`).
    pub ping_timeout: Duration,
}

impl Default for Http2 {
    fn default() -> Self {
        Http2 {
            http1: true,
            h2_first: true,
            prior_knowledge: false,
            max_concurrent_streams: 100,
            initial_window_size: 65535,
            max_frame_size: 16384,
            max_header_list_size: 65536,
            websockets: false,
            ping_interval: Duration::ZERO,
            ping_timeout: Duration::from_secs(20),
        }
    }
}

/// `http_protocols`: a comma-separated list of `h1` and `h2`, in order of
/// preference. Returns (h1, h2, h2 before h1).
fn parse_protocols(v: &str) -> PyResult<(bool, bool, bool)> {
    let (mut h1, mut h2, mut h2_first) = (false, false, false);
    for p in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match p.to_ascii_lowercase().as_str() {
            "h1" | "http/1.1" => h1 = true,
            "h2" => {
                h2_first = !h1;
                h2 = true;
            }
            other => {
                return Err(PyValueError::new_err(format!(
                    "option 'http_protocols': {other:?} is not a protocol (h1 or h2)"
                )))
            }
        }
    }
    if !h1 && !h2 {
        return Err(PyValueError::new_err(
            "option 'http_protocols' names no protocol (h1, h2)",
        ));
    }
    Ok((h1, h2, h2_first))
}

/// Gunicorn's `proxy_protocol` and `proxy_allow_ips`.
#[derive(Clone, Debug)]
pub struct ProxyProtocol {
    pub versions: Versions,
    trust_all: bool,
    trusted: Vec<ipnet::IpNet>,
}

impl ProxyProtocol {
    /// Whether a connection from `ip` must start with a PROXY header.
    pub fn allows(&self, ip: std::net::IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.trust_all || self.trusted.iter().any(|n| n.contains(&ip))
    }
}

fn default_proxy() -> ProxyConfig {
    let (trust_all, trusted) = parse_allow_list("127.0.0.1,::1").unwrap_or_default();
    ProxyConfig {
        trust_all,
        trusted,
        secure_scheme_headers: [
            ("x-forwarded-protocol", "ssl"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-ssl", "on"),
        ]
        .into_iter()
        .map(|(k, v)| (HeaderName::from_static(k), v.to_owned()))
        .collect(),
        script_name: true,
    }
}

/// A comma-separated string or a list of strings.
fn str_list(v: &Bound<'_, PyAny>, key: &str) -> PyResult<Vec<String>> {
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
            body_prefetch: 64 * 1024,
            body_chunk_size: 64 * 1024,
            body_buffer: 256 * 1024,
            send_buffer: 256 * 1024,
            parent_pid: None,
            recycle_lock_fd: None,
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
            proxy: Some(default_proxy()),
            tls: None,
            tls_handshake_timeout: Duration::from_secs(10),
            server_timing: false,
            compression: None,
            proxy_protocol: None,
            http2: None,
            metrics_table_fd: None,
            metrics_fd: None,
        }
    }
}

fn secs(v: &Bound<'_, PyAny>, key: &str) -> PyResult<Duration> {
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

fn count<T: for<'a, 'py> FromPyObject<'a, 'py>>(v: &Bound<'_, PyAny>, key: &str) -> PyResult<T> {
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
        let mut proxy = default_proxy();
        let mut proxy_on = true;
        let mut pp_versions = None;
        let mut pp_allow = "127.0.0.1,::1".to_owned();
        let mut tls = TlsSettings {
            certfile: String::new(),
            keyfile: String::new(),
            ca_certs: None,
            client_auth: ClientAuth::None,
            ciphers: None,
            versions: Vec::new(),
            alpn: Vec::new(),
        };
        let mut h2 = Http2::default();
        let mut compression = crate::http::compress::Compression {
            codings: Vec::new(),
            min_size: 500,
            event_stream: false,
        };
        let mut protocols = (true, false, false);
        for (k, v) in d.iter() {
            let key: String = k.extract()?;
            let key = key.as_str();
            match key {
                "root_path" => c.root_path = v.extract()?,
                "lifespan" => {
                    let mode: String = v.extract()?;
                    c.lifespan = match mode.as_str() {
                        "auto" => LifespanMode::Auto,
                        "on" => LifespanMode::On,
                        "off" => LifespanMode::Off,
                        other => {
                            return Err(PyValueError::new_err(format!(
                                "option 'lifespan' must be auto, on or off, got {other:?}"
                            )))
                        }
                    }
                }
                "lifespan_timeout" => c.lifespan_timeout = secs(&v, key)?,
                "tasks" => {
                    let mode: String = v.extract()?;
                    c.asyncio_tasks = match mode.as_str() {
                        "skirr" => false,
                        "asyncio" => true,
                        other => {
                            return Err(PyValueError::new_err(format!(
                                "option 'tasks' must be skirr or asyncio, got {other:?}"
                            )))
                        }
                    }
                }
                "keepalive_timeout" => c.keepalive_timeout = secs(&v, key)?,
                "header_read_timeout" => c.header_read_timeout = secs(&v, key)?,
                "graceful_timeout" => c.graceful_timeout = secs(&v, key)?,
                "drain_grace" => c.drain_grace = secs(&v, key)?,
                "max_requests" => c.max_requests = count(&v, key)?,
                "max_connections" => c.max_connections = count(&v, key)?,
                "tokio_threads" => c.tokio_threads = count::<usize>(&v, key)?.max(1),
                "body_prefetch" => c.body_prefetch = count(&v, key)?,
                "body_chunk_size" => c.body_chunk_size = count::<usize>(&v, key)?.max(1),
                "body_buffer" => c.body_buffer = count::<usize>(&v, key)?.max(1),
                "send_buffer" => c.send_buffer = count::<usize>(&v, key)?.max(1),
                "parent_pid" => c.parent_pid = v.extract()?,
                "recycle_lock_fd" => c.recycle_lock_fd = v.extract()?,
                "sigint_graceful" => c.sigint_graceful = v.extract()?,
                "access_log" => c.access_log = v.extract()?,
                "server_timing" => c.server_timing = v.extract()?,
                "compression" => {
                    compression.codings.clear();
                    for t in str_list(&v, key)? {
                        let coding = crate::http::compress::Coding::parse(&t).ok_or_else(|| {
                            PyValueError::new_err(format!(
                                "option 'compression': unknown coding {t:?} (gzip, zstd or br)"
                            ))
                        })?;
                        if !compression.codings.contains(&coding) {
                            compression.codings.push(coding);
                        }
                    }
                }
                "compression_min_size" => compression.min_size = count(&v, key)?,
                "compression_event_stream" => compression.event_stream = v.extract()?,
                "ws_max_message_size" => c.ws_max_message_size = count::<usize>(&v, key)?.max(1),
                "ws_ping_interval" => c.ws_ping_interval = secs(&v, key)?,
                "ws_ping_timeout" => c.ws_ping_timeout = secs(&v, key)?,
                "ws_max_queue" => c.ws_max_queue = count::<usize>(&v, key)?.max(1),
                "ws_per_message_deflate" => c.ws_per_message_deflate = v.extract()?,
                "ws_deflate_window_bits" => {
                    c.ws_deflate_window_bits = count::<u8>(&v, key)?.clamp(9, 15)
                }
                "ws_deflate_min_size" => c.ws_deflate_min_size = count(&v, key)?,
                "ws_deflate_context_takeover" => c.ws_deflate_context_takeover = v.extract()?,
                "limit_request_line" => c.limits.request_line = count(&v, key)?,
                "limit_request_field_size" => c.limits.field_size = count(&v, key)?,
                "limit_request_fields" => c.limit_request_fields = count(&v, key)?,
                "max_head_size" => c.max_head_size = count(&v, key)?,
                "max_body_size" => c.max_body_size = count(&v, key)?,
                "body_read_timeout" => c.body_read_timeout = secs(&v, key)?,
                "send_timeout" => c.send_timeout = secs(&v, key)?,
                "response_start_timeout" => c.response_start_timeout = secs(&v, key)?,
                "loop_stall_timeout" => c.loop_stall_timeout = secs(&v, key)?,
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
                "drain_delay" => c.drain_delay = secs(&v, key)?,
                "limit_concurrency" => c.limit_concurrency = count(&v, key)?,
                "proxy_headers" => proxy_on = v.extract()?,
                "forwarded_allow_ips" => {
                    let list = str_list(&v, key)?.join(",");
                    (proxy.trust_all, proxy.trusted) = parse_allow_list(&list)
                        .map_err(|e| PyValueError::new_err(format!("option {key:?}: {e}")))?;
                }
                "secure_scheme_headers" => {
                    let map: std::collections::HashMap<String, String> =
                        v.extract().map_err(|_| {
                            PyTypeError::new_err(format!(
                                "option {key:?} must map header names to values"
                            ))
                        })?;
                    proxy.secure_scheme_headers = map
                        .into_iter()
                        .map(|(k, v)| {
                            HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes())
                                .map(|h| (h, v))
                                .map_err(|_| {
                                    PyValueError::new_err(format!(
                                        "option {key:?}: invalid header name {k:?}"
                                    ))
                                })
                        })
                        .collect::<PyResult<_>>()?;
                }
                "proxy_protocol" => {
                    let mode: String = v.extract()?;
                    pp_versions = match mode.as_str() {
                        "off" => None,
                        "v1" => Some(Versions {
                            v1: true,
                            v2: false,
                        }),
                        "v2" => Some(Versions {
                            v1: false,
                            v2: true,
                        }),
                        "auto" => Some(Versions { v1: true, v2: true }),
                        other => {
                            return Err(PyValueError::new_err(format!(
                                "option 'proxy_protocol' must be off, v1, v2 or auto, got {other:?}"
                            )))
                        }
                    }
                }
                "proxy_allow_ips" => pp_allow = str_list(&v, key)?.join(","),
                "tls_handshake_timeout" => c.tls_handshake_timeout = secs(&v, key)?,
                "ssl_certfile" => tls.certfile = v.extract::<Option<String>>()?.unwrap_or_default(),
                "ssl_keyfile" => tls.keyfile = v.extract::<Option<String>>()?.unwrap_or_default(),
                "ssl_ca_certs" => tls.ca_certs = v.extract()?,
                "ssl_ciphers" => tls.ciphers = v.extract()?,
                "ssl_version" => tls.versions = str_list(&v, key)?,
                "ssl_cert_reqs" => {
                    tls.client_auth = match count::<u8>(&v, key)? {
                        0 => ClientAuth::None,
                        1 => ClientAuth::Optional,
                        2 => ClientAuth::Required,
                        n => {
                            return Err(PyValueError::new_err(format!(
                        "option {key:?} must be 0 (none), 1 (optional) or 2 (required), got {n}"
                    )))
                        }
                    }
                }
                "http_protocols" => protocols = parse_protocols(&str_list(&v, key)?.join(","))?,
                "http2_cleartext" => {
                    let mode: String = v.extract()?;
                    h2.prior_knowledge = match mode.as_str() {
                        "off" => false,
                        // Upgrade (RFC 9113 §3.1 deprecates it) is not
                        // served; `both` serves prior knowledge.
                        "prior-knowledge" | "both" => true,
                        other => {
                            return Err(PyValueError::new_err(format!(
                                "option 'http2_cleartext' must be off, prior-knowledge or both \
                                 (Upgrade: h2c is not supported), got {other:?}"
                            )))
                        }
                    }
                }
                "http2_max_concurrent_streams" => {
                    h2.max_concurrent_streams = count::<u32>(&v, key)?.max(1)
                }
                "http2_initial_window_size" => {
                    h2.initial_window_size = count(&v, key)?;
                    if h2.initial_window_size > (1 << 31) - 1 {
                        return Err(PyValueError::new_err(
                            "option 'http2_initial_window_size' must be at most 2147483647",
                        ));
                    }
                }
                "http2_max_frame_size" => {
                    h2.max_frame_size = count(&v, key)?;
                    if !(16384..=16_777_215).contains(&h2.max_frame_size) {
                        return Err(PyValueError::new_err(
                            "option 'http2_max_frame_size' must be between 16384 and 16777215",
                        ));
                    }
                }
                "http2_max_header_list_size" => {
                    h2.max_header_list_size = count::<u32>(&v, key)?.max(1)
                }
                "http2_websockets" => h2.websockets = v.extract()?,
                "metrics_table_fd" => c.metrics_table_fd = v.extract()?,
                "metrics_fd" => c.metrics_fd = v.extract()?,
                "http2_ping_interval" => h2.ping_interval = secs(&v, key)?,
                "http2_ping_timeout" => h2.ping_timeout = secs(&v, key)?,
                "forwarder_headers" => {
                    proxy.script_name = str_list(&v, key)?
                        .iter()
                        .any(|h| h == "*" || h.eq_ignore_ascii_case("SCRIPT_NAME"));
                }
                other => {
                    return Err(PyValueError::new_err(format!(
                        "unknown server option {other:?}"
                    )))
                }
            }
        }
        if !c.drain_delay.is_zero() && c.drain_delay >= c.graceful_timeout {
            return Err(PyValueError::new_err(format!(
                "drain_delay ({:?}) must be shorter than graceful_timeout ({:?}): the worker \
                 drains after the delay, within the graceful timeout",
                c.drain_delay, c.graceful_timeout
            )));
        }
        c.proxy = proxy_on.then_some(proxy);
        if !compression.codings.is_empty() {
            c.compression = Some(compression);
        }
        if let Some(versions) = pp_versions {
            let (trust_all, trusted) = parse_allow_list(&pp_allow)
                .map_err(|e| PyValueError::new_err(format!("option 'proxy_allow_ips': {e}")))?;
            c.proxy_protocol = Some(ProxyProtocol {
                versions,
                trust_all,
                trusted,
            });
        }
        let (h1_on, h2_on, h2_first) = protocols;
        if h2_on {
            h2.http1 = h1_on;
            h2.h2_first = h2_first;
            c.http2 = Some(h2);
        }
        if !tls.certfile.is_empty() {
            tls.alpn = match &c.http2 {
                None => vec![b"http/1.1".to_vec()],
                Some(h) if !h.http1 => vec![b"h2".to_vec()],
                Some(h) if h.h2_first => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
                Some(_) => vec![b"http/1.1".to_vec(), b"h2".to_vec()],
            };
            if tls.keyfile.is_empty() {
                // As Python's `load_cert_chain`: the key may sit in the certfile.
                tls.keyfile = tls.certfile.clone();
            }
            c.tls = Some(tls);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod http2_tests {
    use super::parse_protocols;

    #[test]
    fn protocols_in_order_of_preference() {
        assert_eq!(parse_protocols("h1").ok(), Some((true, false, false)));
        assert_eq!(parse_protocols("h2,h1").ok(), Some((true, true, true)));
        assert_eq!(parse_protocols("h1, h2").ok(), Some((true, true, false)));
        assert_eq!(parse_protocols("h2").ok(), Some((false, true, true)));
    }
}
