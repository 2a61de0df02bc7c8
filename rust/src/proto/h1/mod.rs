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
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::asgi::websocket::shared::WsShared;
use crate::http::activity::{clock_ms, deadline_at, Timeouts, Verdict};
use crate::http::ctx::{head_parsed, ConnCtx, DRAIN_IDLE};
use crate::http::io::{ConnIo, Readiness};
use crate::metrics::OpenGauge;
use crate::worker::connections::{Member, Order};

/// An idle keep-alive connection is parked after this long.
pub(crate) const PARK_AFTER: Duration = Duration::from_millis(250);

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

/// Why hyper stopped serving the socket.
enum Stopped {
    /// The connection is over (closed, failed, timed out, ordered to stop).
    Ended(&'static str),
    /// Idle: parked by us; the socket comes back.
    Parked,
}

/// Waits, without hyper, until the socket is readable. `Err(reason)` if the
/// connection must close instead.
pub(crate) async fn wait_readable<I: Readiness>(
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

/// How an HTTP/1.1 connection ended.
pub(crate) enum End<I> {
    /// Closed: the reason, for the debug line.
    Closed(&'static str),
    /// The app accepted a WebSocket: hyper wrote the 101 and handed the
    /// socket back, with the accepted socket's state (see
    /// [`ConnCtx::upgrade`]); the gauge keeps the connection counted as
    /// HTTP/1.1 meanwhile.
    Upgraded(ConnIo<I>, Arc<WsShared>, Option<OpenGauge>),
}

/// Serves HTTP/1.1 on a socket that has become readable, until the
/// connection ends or is upgraded; an idle connection is parked between
/// requests (see the module docs).
pub(crate) async fn serve<I>(
    mut io: ConnIo<I>,
    ctx: &Arc<ConnCtx>,
    member: &Member<'_>,
    builder: &http1::Builder,
) -> End<I>
where
    I: AsyncRead + AsyncWrite + Readiness + Unpin + Send + 'static,
{
    let shared = &ctx.shared;
    let mut svc = {
        let ctx = Arc::clone(ctx);
        // Boxed: hyper's socket hand-back (`poll_without_shutdown`) needs an
        // `Unpin` service future.
        service_fn(move |req| {
            head_parsed(&ctx);
            Box::pin(super::dispatch::handle(req, Arc::clone(&ctx)))
        })
    };
    let mut open = None;
    let why = loop {
        open.get_or_insert_with(|| shared.metrics.connection(crate::metrics::Proto::Http1));
        let stopped;
        {
            // Boxed, like the WebSocket driver: a parked connection's task
            // then holds only a pointer where an active one holds hyper's
            // state. In its own block: the emptied box and what is left of
            // `parts` (an empty read buffer still owns hyper's 8 KiB
            // allocation) are freed here, not at the end of the loop body,
            // after the parked wait below (they held ~3.7 KiB per parked
            // connection; bench/NOTES.md, entries 65 and 66).
            let mut conn = Box::new(builder.serve_connection(TokioIo::new(io), svc));
            stopped = Box::pin(drive(&mut conn, ctx, member)).await;
            let parts = conn.into_parts();
            io = parts.io.into_inner();
            svc = parts.service;
            if !parts.read_buf.is_empty() {
                io.prefix = parts.read_buf;
            }
        }
        let upgraded = ctx.upgrade.lock().take();
        if let Some(ws) = upgraded {
            return End::Upgraded(io, ws, open);
        }
        match stopped {
            Stopped::Parked => {
                shared.trim.parked();
                // Parked: no hyper state at all until the socket is readable.
                if let Err(reason) = wait_readable(&mut io, ctx, member).await {
                    break reason;
                }
            }
            Stopped::Ended(_) if io.request_line_too_long() => {
                // hyper read no complete head and wrote nothing (see
                // `LineScan`): the answer is Skirr's, then a lingering
                // close, so the client reads it rather than a reset.
                answer_uri_too_long(&mut io).await;
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
    End::Closed(why)
}

/// Writes the `414` for a request line too long to buffer, then closes
/// lingering: the client reads the answer rather than a reset.
async fn answer_uri_too_long<I>(io: &mut ConnIo<I>)
where
    I: AsyncRead + AsyncWrite + Readiness + Unpin,
{
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
}

/// Why hyper handed the socket back: an error, a park we asked for
/// (`parked`), or the connection's end.
fn stopped(ctx: &ConnCtx, res: hyper::Result<()>, parked: bool) -> Stopped {
    if let Err(e) = res {
        if e.is_parse_too_large() {
            // hyper answered 431 itself (fields, field size, head size).
            ctx.shared
                .metrics
                .refused(crate::metrics::Limit::RequestHead);
        }
        tracing::debug!("connection ended: {e}");
        return Stopped::Ended("error");
    }
    if parked {
        Stopped::Parked
    } else {
        Stopped::Ended("closed")
    }
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
            return Poll::Ready(stopped(ctx, res, parking && !draining));
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
                        // it next (see `pump::check_deadlines`).
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
