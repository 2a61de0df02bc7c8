//! One client connection: hyper's HTTP/1.1 state machine, the timers hyper
//! does not have in the shape a server needs, and idle parking.
//!
//! * Timers. One timer per connection checks its [`Activity`]: idle
//!   keep-alive, a trickled head, a stalled body, an app slow to respond.
//! * Parking. hyper keeps about 10 KiB of buffers per connection. A new
//!   connection waits for its first byte before hyper is involved, and a
//!   keep-alive connection idle for [`PARK_AFTER`] is handed back by hyper
//!   (`graceful_shutdown` on an idle connection, then `into_parts`, without
//!   shutting the socket down) and waits as a bare socket until it becomes
//!   readable again. Bytes hyper had read ahead are replayed to the next
//!   reader ([`ConnIo`]).
//! * Upgrades. When the app accepts a WebSocket, hyper writes the 101 and
//!   hands the socket back the same way; the WebSocket driver then runs in
//!   this connection's task, under the same stop orders.

use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use pyo3::prelude::*;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;

use crate::http::activity::{clock_ms, deadline_at, Activity, Timeouts, Verdict};
use crate::http::interim::InterimSlot;
use crate::http::io::{ConnIo, Readiness};
use crate::http::service;
use crate::server::connections::{Member, Order};
use crate::server::tls::TlsInfo;
use crate::server::Shared;
use crate::websocket::shared::WsShared;

/// An idle keep-alive connection is parked after this long.
pub(crate) const PARK_AFTER: Duration = Duration::from_millis(250);

/// How long a draining worker keeps an idle keep-alive connection open for
/// a request its client may already have sent (capped by the keep-alive
/// timeout). A request that arrives is served with `Connection: close`;
/// a connection still idle after this is closed. Clients sending back to
/// back get their close in a response and lose nothing, POSTs included;
/// only a client that sends its first request after a silence of this
/// long, in the very moment of the close, can still race it. HTTP/2 uses
/// it too: a draining connection with no stream open (`h2conn::serve`).
pub(crate) const DRAIN_IDLE: Duration = Duration::from_millis(1000);

/// How long closing a connection may wait for its last bytes (a TLS
/// close_notify) to be taken by the client.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);
/// Most request bytes read and dropped after a `414` for a request line
/// hyper could not buffer, before the socket closes.
const LINGER_BYTES: usize = 1024 * 1024;

/// The `414` for a request line too long to buffer (see
/// [`LineScan`](crate::http::io::LineScan)): the same status and body as
/// the head checks' `414`, and `Connection: close`.
fn uri_too_long() -> Vec<u8> {
    let body = "request line too long";
    format!(
        "HTTP/1.1 414 URI Too Long\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\ndate: {}\r\n\r\n{body}",
        body.len(),
        httpdate::fmt_http_date(std::time::SystemTime::now()),
    )
    .into_bytes()
}

/// When a draining connection left idle is closed ([`clock_ms`] time).
fn drain_deadline(ctx: &ConnCtx, since: u64) -> u64 {
    since
        + DRAIN_IDLE
            .min(ctx.shared.config.keepalive_timeout)
            .as_millis() as u64
}

/// Whether `at` has come; the coarse clock may lag the timer that fired
/// for it by its resolution (a few ms).
fn passed(at: u64) -> bool {
    clock_ms() + 5 >= at
}

/// Where a listener is bound, for `scope["server"]`.
#[derive(Debug, Clone)]
pub(crate) enum LocalAddr {
    Tcp(SocketAddr),
    Unix(String),
}

/// Per-listener data shared by its connections.
pub(crate) struct ListenerInfo {
    pub(crate) local: LocalAddr,
    /// `scope["server"]`, built once on the asyncio thread.
    pub(crate) py_server: OnceLock<Py<PyAny>>,
}

/// Per-connection data shared by its requests.
pub(crate) struct ConnCtx {
    pub(crate) shared: Arc<Shared>,
    pub(crate) listener: Arc<ListenerInfo>,
    /// The peer; `None` for Unix sockets.
    pub(crate) peer: Option<SocketAddr>,
    /// `scope["client"]`, built once on the asyncio thread.
    pub(crate) py_client: OnceLock<Py<PyAny>>,
    pub(crate) activity: Activity,
    /// This connection's slot under the connection limit; held for as long
    /// as anything (the connection task, or a WebSocket it became) keeps
    /// the context alive.
    _permit: Option<OwnedSemaphorePermit>,
    /// Set by the WebSocket service when the app accepts: once hyper has
    /// written the 101, the socket goes to the WebSocket driver.
    pub(crate) upgrade: Mutex<Option<Arc<WsShared>>>,
    /// The TLS session's facts, for the scope's `tls` extension.
    pub(crate) tls: Option<Box<TlsInfo>>,
    /// hyper's read, parked on a hidden end of stream (see
    /// [`ConnIo`](crate::http::io::ConnIo)): woken when the response ends.
    pub(crate) eof_waker: Mutex<Option<std::task::Waker>>,
    /// A duplicate of the socket, taken when a hidden end of stream is
    /// read (HTTP/1.1): `send()` peeks at it to tell a client that left
    /// (its kernel answered our next write with a reset) from one that only
    /// half-closed (see [`Exchange::gone_now`](crate::http::exchange::Exchange::gone_now)).
    pub(crate) eof_probe: Mutex<Option<Arc<std::os::fd::OwnedFd>>>,
    /// Interim (1xx) responses on their way past hyper: the connection's,
    /// shared by its HTTP/2 streams.
    pub(crate) interim: Arc<InterimSlot>,
    /// HTTP/2: the stream this context is for (see `h2io`).
    pub(crate) h2_stream: Option<u32>,
}

impl ConnCtx {
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
    /// HTTP/1.1, and on HTTP/2 streams whose id is known on a connection
    /// that has not turned them off (see `h2io`); never on HTTP/1.0.
    pub(crate) fn sends_interim(&self, version: http::Version) -> bool {
        match version {
            http::Version::HTTP_11 => true,
            http::Version::HTTP_2 => self.h2_stream.is_some() && !self.interim.is_off(),
            _ => false,
        }
    }

    /// The context of one HTTP/2 stream: the connection's facts, its own
    /// [`Activity`] (the stream's deadlines). The connection's slot under
    /// the limit stays with the connection.
    pub(crate) fn for_stream(&self, stream: Option<u32>) -> ConnCtx {
        ConnCtx {
            shared: Arc::clone(&self.shared),
            listener: Arc::clone(&self.listener),
            peer: self.peer,
            py_client: OnceLock::new(),
            activity: Activity::new(),
            _permit: None,
            upgrade: Mutex::new(None),
            tls: self.tls.clone(),
            eof_waker: Mutex::new(None),
            eof_probe: Mutex::new(None),
            interim: Arc::clone(&self.interim),
            h2_stream: stream,
        }
    }
}

/// Whether a new connection speaks HTTP/2: ALPN chose `h2` on TLS; on
/// cleartext, with prior knowledge enabled, it opens with the preface.
/// With HTTP/1.1 disabled every connection is HTTP/2.
async fn wants_h2<I: AsyncRead + Unpin>(io: &mut ConnIo<I>, ctx: &ConnCtx) -> bool {
    let Some(h2) = &ctx.shared.config.http2 else {
        return false;
    };
    if !h2.http1 {
        return true;
    }
    if let Some(tls) = &ctx.tls {
        return tls.h2;
    }
    h2.prior_knowledge
        && crate::http::h2conn::sniff_preface(io, ctx.shared.config.header_read_timeout).await
}

/// Marks the connection busy for the lifetime of one request/response;
/// meters the request when metrics are on, and holds its
/// `limit_concurrency` slot, if any, as long.
pub(crate) struct BusyGuard(
    Arc<ConnCtx>,
    Option<crate::metrics::RequestMeter>,
    Option<crate::server::concurrency::Slot>,
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
    pub(crate) fn hold(&mut self, slot: Option<crate::server::concurrency::Slot>) {
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
fn head_parsed(ctx: &ConnCtx) {
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

/// Why hyper stopped serving the socket.
enum Stopped {
    /// The connection is over (closed, failed, timed out, ordered to stop).
    Ended(&'static str),
    /// Idle: parked by us; the socket comes back.
    Parked,
}

/// Waits, without hyper, until the socket is readable. `Err(reason)` if the
/// connection must close instead.
async fn wait_readable<I: Readiness>(
    io: &mut ConnIo<I>,
    ctx: &ConnCtx,
    member: &Member<'_>,
) -> Result<(), &'static str> {
    let t = Timeouts::new(&ctx.shared.config);
    let next = |v: Verdict| match v {
        Verdict::Next(at) => Ok(at),
        Verdict::Close(reason) => Err(reason),
        // No request is in progress while the socket waits here.
        Verdict::Expire(_) => Ok(clock_ms() + t.keepalive.max(1)),
    };
    let mut timer = pin!(tokio::time::sleep_until(deadline_at(next(
        ctx.activity.check(&t)
    )?)));
    let mut drain_close: Option<u64> = None;
    poll_fn(|cx| {
        member.register(cx.waker());
        if member.order() != Order::Serve && ctx.activity.drain_begun() {
            // The drain's grace for a head not yet complete starts now:
            // the timer looks again at once (`Activity::check`).
            timer.as_mut().reset(deadline_at(clock_ms()));
        }
        match member.order() {
            Order::Serve => {}
            // A new connection's first request is still served, if its
            // head completes within `drain_grace`.
            Order::Drain if ctx.activity.is_fresh() => {}
            Order::Drain => {
                // Bytes already here are a request: served (with close).
                let at = *drain_close.get_or_insert_with(|| {
                    let at = drain_deadline(ctx, clock_ms());
                    timer.as_mut().reset(deadline_at(at));
                    at
                });
                if passed(at) {
                    if let Poll::Ready(r) = io.poll_readable(cx) {
                        return Poll::Ready(r.map_err(|_| "read error"));
                    }
                    return Poll::Ready(Err("server stop"));
                }
            }
            _ => return Poll::Ready(Err("server stop")),
        }
        if let Poll::Ready(r) = io.poll_readable(cx) {
            return Poll::Ready(r.map_err(|_| "read error"));
        }
        if timer.as_mut().poll(cx).is_ready() {
            match next(ctx.activity.check(&t)) {
                Ok(at) => {
                    timer
                        .as_mut()
                        .reset(deadline_at(drain_close.map_or(at, |d| d.min(at))));
                    cx.waker().wake_by_ref();
                }
                Err(reason) => return Poll::Ready(Err(reason)),
            }
        }
        Poll::Pending
    })
    .await
}

/// Serves one connection until it closes, times out, or the server orders
/// it to stop (see [`Connections::order_all`](crate::server::connections::Connections::order_all)).
pub(crate) async fn serve<I>(
    io: I,
    shared: Arc<Shared>,
    listener: Arc<ListenerInfo>,
    peer: Option<SocketAddr>,
    permit: Option<OwnedSemaphorePermit>,
    tls: Option<Box<TlsInfo>>,
) where
    I: AsyncRead + AsyncWrite + Readiness + Unpin + Send + 'static,
{
    let member = shared.connections.join();
    let ctx = Arc::new(ConnCtx {
        shared: Arc::clone(&shared),
        listener,
        peer,
        py_client: OnceLock::new(),
        activity: Activity::new(),
        _permit: permit,
        upgrade: Mutex::new(None),
        tls,
        eof_waker: Mutex::new(None),
        eof_probe: Mutex::new(None),
        interim: Arc::default(),
        h2_stream: None,
    });
    let mut io = ConnIo {
        inner: io,
        prefix: Bytes::new(),
        conn: Arc::clone(&ctx),
        scan: crate::http::headscan::HeadScan::new(shared.config.limits.field_size),
        line: Default::default(),
    };
    let mut svc = {
        let ctx = Arc::clone(&ctx);
        // Boxed: hyper's socket hand-back (`poll_without_shutdown`) needs an
        // `Unpin` service future.
        service_fn(move |req| {
            head_parsed(&ctx);
            Box::pin(service::handle(req, Arc::clone(&ctx)))
        })
    };
    let mut first = true;
    let mut open = None;
    let why = loop {
        // Parked (a new connection starts here): no hyper state at all.
        if let Err(reason) = wait_readable(&mut io, &ctx, &member).await {
            break reason;
        }
        // The HTTP/2 sniff and serve futures are boxed (and the sniff made
        // only when HTTP/2 is on): inline, they made every connection's
        // task 2.7 KiB where a parked HTTP/1.1 one needs 0.8 (bench/NOTES.md,
        // entry 42).
        if std::mem::take(&mut first)
            && shared.config.http2.is_some()
            && Box::pin(wants_h2(&mut io, &ctx)).await
        {
            if let Some(h2) = &shared.http2 {
                io.scan = None;
                let _open = shared.metrics.connection(crate::metrics::Proto::Http2);
                io.stop_line_scan();
                break Box::pin(crate::http::h2conn::serve(io, &ctx, &member, h2)).await;
            }
        }
        open.get_or_insert_with(|| shared.metrics.connection(crate::metrics::Proto::Http1));
        // Boxed, like the WebSocket driver below: a parked connection's task
        // then holds only a pointer where an active one holds hyper's state.
        let mut conn = Box::new(shared.http1.serve_connection(TokioIo::new(io), svc));
        let stopped = Box::pin(drive(&mut conn, &ctx, &member)).await;
        let parts = conn.into_parts();
        io = parts.io.into_inner();
        svc = parts.service;
        if !parts.read_buf.is_empty() {
            io.prefix = parts.read_buf;
        }
        let upgraded = ctx.upgrade.lock().take();
        if let Some(ws) = upgraded {
            io.scan = None;
            io.stop_line_scan();
            Box::pin(crate::websocket::driver::run(io, ws, &ctx, &member)).await;
            return;
        }
        match stopped {
            Stopped::Parked => {
                shared.trim.parked();
                continue;
            }
            Stopped::Ended(_) if io.request_line_too_long() => {
                // hyper read no complete head and wrote nothing (see
                // `LineScan`): the answer is Skirr's, then a lingering
                // close, so the client reads it rather than a reset.
                let answer = uri_too_long();
                let _ = tokio::time::timeout(SHUTDOWN_WAIT, async {
                    io.write_all(&answer).await?;
                    io.shutdown().await?;
                    let mut sink = vec![0u8; 16 * 1024];
                    let mut left = LINGER_BYTES;
                    while left > 0 {
                        match tokio::io::AsyncReadExt::read(&mut io.inner, &mut sink).await? {
                            0 => break,
                            n => left = left.saturating_sub(n),
                        }
                    }
                    std::io::Result::Ok(())
                })
                .await;
                break "request line too long";
            }
            Stopped::Ended(reason) => {
                // hyper left the socket open; close our side cleanly, but
                // not waiting on a client that reads nothing (TLS writes a
                // close_notify here: it would hold the connection's slot
                // for as long as the client cared to stall).
                let _ = tokio::time::timeout(SHUTDOWN_WAIT, io.shutdown()).await;
                break reason;
            }
        }
    };
    tracing::debug!("connection from {:?} done: {why}", peer);
}

/// Runs hyper on the socket until the connection ends, is parked, or is
/// upgraded (hyper then stops after writing the 101).
async fn drive<I, S>(
    conn: &mut hyper::server::conn::http1::Connection<TokioIo<ConnIo<I>>, S>,
    ctx: &ConnCtx,
    member: &Member<'_>,
) -> Stopped
where
    I: AsyncRead + AsyncWrite + Readiness + Unpin + Send + 'static,
    S: hyper::service::HttpService<
            hyper::body::Incoming,
            ResBody = crate::http::body::ResponseBody,
        > + Unpin,
    S::Future: Unpin,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let cfg = &ctx.shared.config;
    let t = Timeouts::new(cfg);
    let park_after = PARK_AFTER.min(cfg.keepalive_timeout);
    let first = clock_ms() + park_after.as_millis() as u64;
    let mut timer = pin!(tokio::time::sleep_until(deadline_at(first)));
    let mut registered = false;
    let mut draining = false;
    let mut parking = false;
    let mut timer_armed = false;
    // Drain ordered while idle: close at this time unless a request comes.
    let mut drain_close: Option<u64> = None;
    poll_fn(|cx| {
        if !registered {
            member.register(cx.waker());
            registered = true;
        }
        if member.order() != Order::Serve && ctx.activity.drain_begun() {
            // The drain's deadlines (`drain_grace`: a head not complete, a
            // client reading nothing) start now: the timer is re-armed to
            // look at once.
            timer.as_mut().reset(deadline_at(clock_ms()));
            timer_armed = false;
        }
        match member.order() {
            Order::Abort | Order::GoingAway => return Poll::Ready(Stopped::Ended("server stop")),
            _ if ctx.activity.is_abandoned() => {
                return Poll::Ready(Stopped::Ended("client gone"));
            }
            // hyper closes a connection with no request in progress at
            // once, and ends one in progress after its response, which then
            // says `Connection: close`. So it is told only once a request
            // is in progress, or once an idle connection's drain window
            // (`DRAIN_IDLE`) has passed with nothing arriving. A new
            // connection waits until its first request has started.
            Order::Drain if !draining && !ctx.activity.is_fresh() => {
                if ctx.activity.is_busy() {
                    // The response can still say `Connection: close` only
                    // if its head is not out yet: hyper adds it to a head
                    // it writes after this. A response already started
                    // (a stream) ends without it, so the connection is
                    // then kept as an idle one is (below), for a request
                    // already on its way.
                    if !ctx.activity.has_responded() {
                        draining = true;
                        Pin::new(&mut *conn).graceful_shutdown();
                    }
                } else {
                    let at = match drain_close {
                        Some(at) => at,
                        None => {
                            let at = drain_deadline(ctx, clock_ms());
                            drain_close = Some(at);
                            timer.as_mut().reset(deadline_at(at));
                            timer_armed = true;
                            // Registers the timer's wake-up.
                            let _ = timer.as_mut().poll(cx);
                            at
                        }
                    };
                    if passed(at) && ctx.activity.idle_for(Duration::ZERO) {
                        draining = true;
                        Pin::new(&mut *conn).graceful_shutdown();
                    }
                }
            }
            _ => {}
        }
        if let Poll::Ready(res) = conn.poll_without_shutdown(cx) {
            if let Err(e) = res {
                if e.is_parse_too_large() {
                    // hyper answered 431 itself (fields, field size, head size).
                    ctx.shared
                        .metrics
                        .refused(crate::metrics::Limit::RequestHead);
                }
                tracing::debug!("connection ended: {e}");
                return Poll::Ready(Stopped::Ended("error"));
            }
            return Poll::Ready(if parking && !draining {
                Stopped::Parked
            } else {
                Stopped::Ended("closed")
            });
        }
        if member.order() == Order::Drain
            && !draining
            && drain_close.is_none()
            && !ctx.activity.is_busy()
            && !ctx.activity.is_fresh()
        {
            // A response that started before the drain has just ended:
            // its idle drain window (above) starts now.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if drain_close.is_some() && !draining && ctx.activity.is_busy() {
            // A request arrived in the drain window: its response closes.
            draining = true;
            Pin::new(&mut *conn).graceful_shutdown();
        }
        // The timer is polled only to (re)arm it or once it has fired; an
        // ordinary wake costs one atomic load here.
        if !timer_armed || timer.is_elapsed() {
            if timer_armed {
                if I::PARKABLE
                    && !parking
                    && !draining
                    && drain_close.is_none()
                    && ctx.activity.idle_for(park_after)
                {
                    parking = true;
                    Pin::new(&mut *conn).graceful_shutdown();
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                let park_at = if I::PARKABLE {
                    clock_ms() + park_after.as_millis() as u64
                } else {
                    u64::MAX / 2
                };
                match ctx.activity.check(&t) {
                    Verdict::Next(next) => {
                        let drain = drain_close.filter(|&d| !passed(d)).unwrap_or(u64::MAX);
                        let at = next.min(park_at).min(drain);
                        timer.as_mut().reset(deadline_at(at));
                    }
                    Verdict::Close(reason) => return Poll::Ready(Stopped::Ended(reason)),
                    Verdict::Expire(e) => {
                        // The request's service answers it when hyper polls
                        // it next (see `service::check_deadlines`).
                        ctx.activity.expire(e);
                        timer
                            .as_mut()
                            .reset(deadline_at(clock_ms() + t.keepalive.max(1)));
                        cx.waker().wake_by_ref();
                    }
                }
            }
            timer_armed = true;
            if timer.as_mut().poll(cx).is_ready() {
                cx.waker().wake_by_ref();
            }
        }
        Poll::Pending
    })
    .await
}
