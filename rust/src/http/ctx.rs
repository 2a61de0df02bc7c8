//! What a connection's requests share on the Tokio side, whatever the wire
//! protocol: its scope facts ([`ConnInfo`], the ASGI side's), timers
//! ([`Activity`]), the connection limit's permit, the upgrade and interim
//! slots, and the per-request [`BusyGuard`]. Built by the drivers in
//! `proto/`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::OwnedSemaphorePermit;

use crate::asgi::conn::{ConnInfo, ListenerInfo, TlsInfo};
use crate::asgi::websocket::shared::WsShared;
use crate::http::activity::Activity;
use crate::http::interim::{InterimSlot, StreamEncoder};
use crate::worker::Worker;

/// How long a draining worker keeps an idle keep-alive connection open for
/// a request its client may already have sent (capped by the keep-alive
/// timeout). A request that arrives is served with `Connection: close`;
/// a connection still idle after this is closed. Clients sending back to
/// back get their close in a response and lose nothing, POSTs included;
/// only a client that sends its first request after a silence of this
/// long, in the very moment of the close, can still race it. HTTP/2 uses
/// it too: a draining connection with no stream open (`proto::h2::serve`).
pub(crate) const DRAIN_IDLE: Duration = Duration::from_millis(1000);

/// Per-connection data shared by its requests.
pub(crate) struct ConnCtx {
    pub(crate) shared: Arc<Worker>,
    /// What the scopes need: listener, peer, TLS facts (shared by an
    /// HTTP/2 connection's streams).
    pub(crate) info: Arc<ConnInfo>,
    pub(crate) activity: Activity,
    /// This connection's slot under the connection limit; held for as long
    /// as anything (the connection task, or a WebSocket it became) keeps
    /// the context alive.
    _permit: Option<OwnedSemaphorePermit>,
    /// The WebSocket the app accepted, set by the handshake service
    /// (`proto::ws`): once hyper has written the 101 (the 200 to an
    /// extended CONNECT), the driver takes it and hands the socket (the
    /// stream) to the WebSocket driver.
    pub(crate) upgrade: Mutex<Option<Arc<WsShared>>>,
    /// hyper's read, parked on a hidden end of stream (see
    /// [`ConnIo`](crate::http::io::ConnIo)): woken when the response ends.
    pub(crate) eof_waker: Mutex<Option<std::task::Waker>>,
    /// A duplicate of the socket, taken when a hidden end of stream is
    /// read (HTTP/1.1): `send()` peeks at it to tell a client that left
    /// (its kernel answered our next write with a reset) from one that only
    /// half-closed (see [`Exchange::gone_now`](crate::asgi::http::exchange::Exchange::gone_now)).
    pub(crate) eof_probe: Mutex<Option<Arc<std::os::fd::OwnedFd>>>,
    /// Interim (1xx) responses on their way past hyper: the connection's,
    /// shared by its HTTP/2 streams.
    pub(crate) interim: Arc<InterimSlot>,
    /// HTTP/2: the stream this context is for (see `proto::h2::io`), and
    /// the driver's encoder of interim responses on it.
    pub(crate) h2_stream: Option<(u32, StreamEncoder)>,
}

impl ConnCtx {
    /// The context of a new connection from `peer` (`None`: a Unix socket)
    /// on `listener`, holding its slot under the connection limit.
    pub(crate) fn new(
        shared: Arc<Worker>,
        listener: Arc<ListenerInfo>,
        peer: Option<SocketAddr>,
        permit: Option<OwnedSemaphorePermit>,
        tls: Option<Box<TlsInfo>>,
    ) -> Self {
        ConnCtx {
            shared,
            info: Arc::new(ConnInfo::new(listener, peer, tls)),
            activity: Activity::new(),
            _permit: permit,
            upgrade: Mutex::new(None),
            eof_waker: Mutex::new(None),
            eof_probe: Mutex::new(None),
            interim: Arc::default(),
            h2_stream: None,
        }
    }

    /// The request in progress is a WebSocket handshake: an end of stream
    /// is the client leaving, not a half close to hide; one already hidden
    /// is shown to hyper now.
    pub(crate) fn not_plain_http(&self) {
        self.activity.set_plain_http(false);
        if self.activity.peer_eof() {
            if let Some(w) = self.eof_waker.lock().take() {
                w.wake();
            }
        }
    }

    /// Whether an interim response can reach this request's client: on
    /// HTTP/1.1, on HTTP/2 streams whose id is known on a connection that
    /// has not turned them off (see `proto::h2::io`), and on HTTP/3; never
    /// on HTTP/1.0.
    pub(crate) fn sends_interim(&self, version: http::Version) -> bool {
        match version {
            http::Version::HTTP_11 => true,
            http::Version::HTTP_2 => self.h2_stream.is_some() && !self.interim.is_off(),
            // Only `proto::h3` makes HTTP/3 requests, and it sends them.
            http::Version::HTTP_3 => true,
            _ => false,
        }
    }

    /// The context of one HTTP/3 request stream (`proto::h3`): the
    /// connection's facts (shared), its own [`Activity`] and interim slot
    /// (the stream's driver sends what the service queues there); no slot
    /// under the connection limit (the connection holds it).
    pub(crate) fn for_request(&self) -> ConnCtx {
        ConnCtx {
            interim: Arc::default(),
            ..self.per_stream(None)
        }
    }

    /// The context of one HTTP/2 stream: the connection's facts (shared),
    /// its own [`Activity`] (the stream's deadlines). The connection's slot
    /// under the limit stays with the connection.
    pub(crate) fn for_stream(&self, stream: Option<u32>, encode: StreamEncoder) -> ConnCtx {
        self.per_stream(stream.map(|id| (id, encode)))
    }

    /// A stream's context under this connection's: the shared facts and
    /// interim sink, a fresh [`Activity`], no slot of its own.
    fn per_stream(&self, h2_stream: Option<(u32, StreamEncoder)>) -> ConnCtx {
        ConnCtx {
            shared: Arc::clone(&self.shared),
            info: Arc::clone(&self.info),
            activity: Activity::new(),
            _permit: None,
            upgrade: Mutex::new(None),
            eof_waker: Mutex::new(None),
            eof_probe: Mutex::new(None),
            interim: Arc::clone(&self.interim),
            h2_stream,
        }
    }
}

/// Marks the connection busy for the lifetime of one request/response;
/// meters the request when metrics are on, and holds its
/// `limit_concurrency` slot, if any, as long.
pub(crate) struct BusyGuard(
    Arc<ConnCtx>,
    Option<crate::metrics::RequestMeter>,
    Option<crate::worker::concurrency::Slot>,
);

impl BusyGuard {
    /// Takes over the request that [`head_parsed`] started, unmetered
    /// (the health path's requests stay out of the metrics).
    pub(crate) fn new(conn: &Arc<ConnCtx>) -> Self {
        BusyGuard(Arc::clone(conn), None, None)
    }

    /// Meters this request (when metrics are on).
    pub(crate) fn meter(&mut self, method: &http::Method, version: http::Version) {
        self.1 = self.0.shared.metrics.request(method, version);
    }

    /// Keeps `slot` until the response is written (or dropped).
    pub(crate) fn hold(&mut self, slot: Option<crate::worker::concurrency::Slot>) {
        self.2 = slot;
    }

    /// The response's status, for the metrics.
    #[inline]
    pub(crate) fn responded(&mut self, status: http::StatusCode) {
        if let Some(m) = &mut self.1 {
            m.set_status(status);
        }
    }
}

/// A request head was parsed: the request is in progress from now (hyper
/// reads on before it first polls the service, and an end of stream it
/// reads then is a half close to hide, not an idle connection's end).
pub(crate) fn head_parsed(ctx: &ConnCtx) {
    ctx.activity.start_request();
    ctx.activity.set_plain_http(true);
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.activity.end_request();
        if self.0.activity.peer_eof() {
            // hyper may now read the end of stream it was not shown.
            if let Some(w) = self.0.eof_waker.lock().take() {
                w.wake();
            }
        }
    }
}
