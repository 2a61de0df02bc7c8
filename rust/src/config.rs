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
    /// Idle keep-alive connections are closed after this. Default 5 s.
    pub keepalive_timeout: Duration,
    /// A client must send a complete request head within this once it has
    /// sent its first byte (slowloris guard). Default 30 s.
    pub header_read_timeout: Duration,
    /// On SIGTERM, in-flight requests get this long to finish. Default 30 s.
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
    /// Response-body bytes queued by `send()` before it waits for the client
    /// (backpressure to the app). Default 256 KiB.
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
    /// `send()` (app → client) waits. Default 32.
    pub ws_max_queue: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            root_path: String::new(),
            lifespan: LifespanMode::Auto,
            lifespan_timeout: Duration::from_secs(60),
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
                other => {
                    return Err(PyValueError::new_err(format!(
                        "unknown server option {other:?}"
                    )))
                }
            }
        }
        Ok(c)
    }
}
