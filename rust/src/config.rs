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
    /// An app that has not started its response this long after the
    /// request head arrived is answered 503 for it. Zero (the default)
    /// disables.
    pub response_start_timeout: Duration,
    /// Forwarding headers from trusted proxies; `None` ignores them.
    /// Default: trust 127.0.0.1 and ::1, Gunicorn's `secure_scheme_headers`.
    pub proxy: Option<ProxyConfig>,
    /// TLS termination; `None` serves plain HTTP. Set by `ssl_certfile`.
    pub tls: Option<TlsSettings>,
    /// A TLS client must finish its handshake within this of being
    /// accepted, or the connection is closed (it holds a connection slot
    /// meanwhile). Zero disables. Default 10 s.
    pub tls_handshake_timeout: Duration,
    /// PROXY protocol headers expected from trusted load balancers;
    /// `None` (the default) expects none.
    pub proxy_protocol: Option<ProxyProtocol>,
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
            max_requests: 0,
            max_connections: 10_000,
            tokio_threads: 1,
            body_prefetch: 64 * 1024,
            body_chunk_size: 64 * 1024,
            body_buffer: 256 * 1024,
            send_buffer: 256 * 1024,
            parent_pid: None,
            sigint_graceful: true,
            access_log: false,
            ws_max_message_size: 16 << 20,
            ws_ping_interval: Duration::from_secs(20),
            ws_ping_timeout: Duration::from_secs(20),
            ws_max_queue: 32,
            limits: Limits::default(),
            limit_request_fields: 100,
            max_head_size: 64 * 1024,
            max_body_size: 0,
            body_read_timeout: Duration::from_secs(30),
            response_start_timeout: Duration::ZERO,
            proxy: Some(default_proxy()),
            tls: None,
            tls_handshake_timeout: Duration::from_secs(10),
            proxy_protocol: None,
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
        };
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
                "max_requests" => c.max_requests = count(&v, key)?,
                "max_connections" => c.max_connections = count(&v, key)?,
                "tokio_threads" => c.tokio_threads = count::<usize>(&v, key)?.max(1),
                "body_prefetch" => c.body_prefetch = count(&v, key)?,
                "body_chunk_size" => c.body_chunk_size = count::<usize>(&v, key)?.max(1),
                "body_buffer" => c.body_buffer = count::<usize>(&v, key)?.max(1),
                "send_buffer" => c.send_buffer = count::<usize>(&v, key)?.max(1),
                "parent_pid" => c.parent_pid = v.extract()?,
                "sigint_graceful" => c.sigint_graceful = v.extract()?,
                "access_log" => c.access_log = v.extract()?,
                "ws_max_message_size" => c.ws_max_message_size = count::<usize>(&v, key)?.max(1),
                "ws_ping_interval" => c.ws_ping_interval = secs(&v, key)?,
                "ws_ping_timeout" => c.ws_ping_timeout = secs(&v, key)?,
                "ws_max_queue" => c.ws_max_queue = count::<usize>(&v, key)?.max(1),
                "limit_request_line" => c.limits.request_line = count(&v, key)?,
                "limit_request_field_size" => c.limits.field_size = count(&v, key)?,
                "limit_request_fields" => c.limit_request_fields = count(&v, key)?,
                "max_head_size" => c.max_head_size = count(&v, key)?,
                "max_body_size" => c.max_body_size = count(&v, key)?,
                "body_read_timeout" => c.body_read_timeout = secs(&v, key)?,
                "response_start_timeout" => c.response_start_timeout = secs(&v, key)?,
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
        c.proxy = proxy_on.then_some(proxy);
        if let Some(versions) = pp_versions {
            let (trust_all, trusted) = parse_allow_list(&pp_allow)
                .map_err(|e| PyValueError::new_err(format!("option 'proxy_allow_ips': {e}")))?;
            c.proxy_protocol = Some(ProxyProtocol {
                versions,
                trust_all,
                trusted,
            });
        }
        if !tls.certfile.is_empty() {
            if tls.keyfile.is_empty() {
                // As Python's `load_cert_chain`: the key may sit in the certfile.
                tls.keyfile = tls.certfile.clone();
            }
            c.tls = Some(tls);
        }
        Ok(c)
    }
}
