//! What a connection tells the scopes of its requests, whatever the wire
//! protocol: the listener it came in on, the peer, the TLS session's facts,
//! and the scope tuples built from them (cached on first use). The
//! drivers' own per-connection state (timers, the connection limit's
//! permit, the upgrade and interim slots) is `http::ctx::ConnCtx`, which
//! holds one of these.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::asgi::context::AppContext;

/// Where a listener is bound, for `scope["server"]`.
#[derive(Debug, Clone)]
pub(crate) enum LocalAddr {
    Tcp(SocketAddr),
    Unix(String),
}

/// The `tls` extension's per-connection facts.
#[derive(Debug, Clone)]
pub struct TlsInfo {
    /// e.g. `0x0304` for TLS 1.3.
    pub version: u16,
    /// The negotiated suite's IANA number (`None`: not known, as on
    /// HTTP/3, where quinn does not report it).
    pub cipher_suite: Option<u16>,
    /// The client's certificate chain as PEM, leaf first (empty without
    /// client authentication).
    pub client_cert_chain: Vec<String>,
    /// The leaf's subject as an RFC 4514 string (`None` without a client
    /// certificate).
    pub client_cert_name: Option<String>,
    /// ALPN selected `h2`.
    pub h2: bool,
}

/// Per-listener data shared by its connections.
pub(crate) struct ListenerInfo {
    pub(crate) local: LocalAddr,
    /// The application context the connections' requests run in.
    pub(crate) app: Arc<AppContext>,
    /// `scope["server"]`, built once on the asyncio thread.
    pub(crate) py_server: OnceLock<Py<PyAny>>,
    /// A TCP listener's HTTP/3 twin on UDP, announced in its responses;
    /// `None` without HTTP/3 (and on the UDP listener itself).
    pub(crate) alt_svc: Option<Arc<AltSvc>>,
}

/// The `Alt-Svc` field (RFC 7838) a TCP listener adds to its responses
/// while its HTTP/3 endpoint accepts connections.
pub(crate) struct AltSvc {
    value: http::HeaderValue,
    on: AtomicBool,
}

impl AltSvc {
    /// `h3=":PORT"; ma=86400`, off until [`AltSvc::set`].
    pub(crate) fn new(port: u16) -> Self {
        let value = http::HeaderValue::from_str(&format!("h3=\":{port}\"; ma=86400"))
            .unwrap_or_else(|_| http::HeaderValue::from_static("clear"));
        AltSvc {
            value,
            on: AtomicBool::new(false),
        }
    }

    /// The UDP endpoint accepts (true) or no longer does (false).
    pub(crate) fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// Adds the field to a response's `headers` while HTTP/3 is on, unless
    /// the app sent its own `alt-svc`.
    pub(crate) fn add_to(&self, headers: &mut http::HeaderMap) {
        if self.on.load(Ordering::Relaxed) && !headers.contains_key(http::header::ALT_SVC) {
            headers.insert(http::header::ALT_SVC, self.value.clone());
        }
    }
}

/// A connection's scope facts, shared by its requests (and, on HTTP/2,
/// by its streams).
pub(crate) struct ConnInfo {
    pub(crate) listener: Arc<ListenerInfo>,
    /// The peer; `None` for Unix sockets.
    pub(crate) peer: Option<SocketAddr>,
    /// `scope["client"]`, built once on the asyncio thread.
    pub(crate) py_client: OnceLock<Py<PyAny>>,
    /// The TLS session's facts, for the scope's `tls` extension.
    pub(crate) tls: Option<Box<TlsInfo>>,
    /// The `tls` extension dict of a connection with a client
    /// certificate, built on the asyncio thread at its first request; each
    /// request gets a copy (see `scope::tls_dict`). Connections without one
    /// share `AppContext::tls_templates` instead.
    pub(crate) py_tls: OnceLock<Py<PyDict>>,
}

impl ConnInfo {
    /// The facts of a connection from `peer` (`None`: a Unix socket) on
    /// `listener`.
    pub(crate) fn new(
        listener: Arc<ListenerInfo>,
        peer: Option<SocketAddr>,
        tls: Option<Box<TlsInfo>>,
    ) -> Self {
        ConnInfo {
            listener,
            peer,
            py_client: OnceLock::new(),
            tls,
            py_tls: OnceLock::new(),
        }
    }

    /// The application context this connection's requests run in.
    pub(crate) fn app(&self) -> &Arc<AppContext> {
        &self.listener.app
    }
}
