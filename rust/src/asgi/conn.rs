//! What a connection tells the scopes of its requests, whatever the wire
//! protocol: the listener it came in on, the peer, the TLS session's facts,
//! and the scope tuples built from them (cached on first use). The
//! drivers' own per-connection state (timers, the connection limit's
//! permit, the upgrade and interim slots) is `http::ctx::ConnCtx`, which
//! holds one of these.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use pyo3::prelude::*;

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
    /// The negotiated suite's IANA number.
    pub cipher_suite: u16,
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
        }
    }

    /// The application context this connection's requests run in.
    pub(crate) fn app(&self) -> &Arc<AppContext> {
        &self.listener.app
    }
}
