//! One client connection: hyper's HTTP/1.1 state machine, the timers hyper
//! does not have in the shape a server needs, and idle parking.
//!
//! * Timers. hyper's own `header_read_timeout` starts whenever it waits for
//!   a request head, so it also ends idle keep-alive connections; Skirr
//!   needs two distinct limits. [`Activity`] tracks the connection's phase
//!   (idle, reading a head, busy with a request) and one timer per
//!   connection checks it lazily: the clock is read only on phase changes
//!   and when the timer fires, never per byte.
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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use pyo3::prelude::*;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;

use crate::http::io::{ConnIo, Readiness};
use crate::http::service;
use crate::server::connections::{Member, Order};
use crate::server::Shared;
use crate::websocket::shared::WsShared;

/// An idle keep-alive connection is parked after this long.
pub(crate) const PARK_AFTER: Duration = Duration::from_millis(250);

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
}

/// `CLOCK_MONOTONIC_COARSE` in milliseconds: read once per request, so the
/// cheapest clock will do (its resolution, a few ms, is far below any
/// timeout's).
fn coarse_ms() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
        .unwrap_or_else(|_| nix::sys::time::TimeSpec::new(0, 0));
    ts.tv_sec() as u64 * 1000 + ts.tv_nsec() as u64 / 1_000_000
}

fn clock_base() -> (Instant, u64) {
    static BASE: OnceLock<(Instant, u64)> = OnceLock::new();
    *BASE.get_or_init(|| (Instant::now(), coarse_ms()))
}

/// Milliseconds on a process-wide monotonic clock, for connection timers.
fn clock_ms() -> u64 {
    coarse_ms().saturating_sub(clock_base().1)
}

fn deadline_at(ms: u64) -> tokio::time::Instant {
    tokio::time::Instant::from_std(clock_base().0 + Duration::from_millis(ms))
}

/// What a connection is doing, for its timers.
#[derive(Default)]
pub(crate) struct Activity {
    /// A request is being served (from its head until its body is written).
    busy: AtomicBool,
    /// Bytes of a new request arrived while idle; the head is incomplete.
    reading_head: AtomicBool,
    /// When the current idle or head-reading phase began (`clock_ms`).
    since_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        let a = Activity::default();
        a.since_ms.store(clock_ms(), Ordering::Relaxed);
        a
    }

    pub(crate) fn on_bytes(&self) {
        if !self.busy.load(Ordering::Relaxed) && !self.reading_head.load(Ordering::Relaxed) {
            self.reading_head.store(true, Ordering::Relaxed);
            self.since_ms.store(clock_ms(), Ordering::Relaxed);
        }
    }

    pub(crate) fn start_request(&self) {
        self.busy.store(true, Ordering::Relaxed);
        self.reading_head.store(false, Ordering::Relaxed);
    }

    pub(crate) fn end_request(&self) {
        self.since_ms.store(clock_ms(), Ordering::Relaxed);
        self.busy.store(false, Ordering::Relaxed);
    }

    /// Whether the connection has been idle (no request, no partial head)
    /// for at least `d`.
    fn idle_for(&self, d: Duration) -> bool {
        !self.busy.load(Ordering::Relaxed)
            && !self.reading_head.load(Ordering::Relaxed)
            && clock_ms().saturating_sub(self.since_ms.load(Ordering::Relaxed))
                >= d.as_millis() as u64
    }

    /// `Ok(next check)` or `Err(reason)` when the connection must close.
    fn check(&self, keepalive: Duration, header: Duration) -> Result<u64, &'static str> {
        self.check_at(clock_ms(), keepalive, header)
    }

    fn check_at(
        &self,
        now: u64,
        keepalive: Duration,
        header: Duration,
    ) -> Result<u64, &'static str> {
        if self.busy.load(Ordering::Relaxed) {
            return Ok(now + keepalive.as_millis().max(1) as u64);
        }
        let since = self.since_ms.load(Ordering::Relaxed);
        let (limit, reason) = if self.reading_head.load(Ordering::Relaxed) {
            (header, "request head not received in time")
        } else {
            (keepalive, "keep-alive idle timeout")
        };
        let due = since + limit.as_millis() as u64;
        if now >= due {
            Err(reason)
        } else {
            Ok(due)
        }
    }
}

/// Marks the connection busy for the lifetime of one request/response.
pub(crate) struct BusyGuard(Arc<ConnCtx>);

impl BusyGuard {
    pub(crate) fn new(conn: &Arc<ConnCtx>) -> Self {
        conn.activity.start_request();
        BusyGuard(Arc::clone(conn))
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.activity.end_request();
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
    let cfg = &ctx.shared.config;
    let (keepalive, header) = (cfg.keepalive_timeout, cfg.header_read_timeout);
    let mut timer = pin!(tokio::time::sleep_until(deadline_at(
        ctx.activity.check(keepalive, header)?
    )));
    poll_fn(|cx| {
        member.register(cx.waker());
        if member.order() != Order::Serve {
            return Poll::Ready(Err("server stop"));
        }
        if let Poll::Ready(r) = io.poll_readable(cx) {
            return Poll::Ready(r.map_err(|_| "read error"));
        }
        if timer.as_mut().poll(cx).is_ready() {
            match ctx.activity.check(keepalive, header) {
                Ok(next) => {
                    timer.as_mut().reset(deadline_at(next));
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
    });
    let mut io = ConnIo {
        inner: io,
        prefix: Bytes::new(),
        conn: Arc::clone(&ctx),
    };
    let mut svc = {
        let ctx = Arc::clone(&ctx);
        // Boxed: hyper's socket hand-back (`poll_without_shutdown`) needs an
        // `Unpin` service future.
        service_fn(move |req| Box::pin(service::handle(req, Arc::clone(&ctx))))
    };
    let why = loop {
        // Parked (a new connection starts here): no hyper state at all.
        if let Err(reason) = wait_readable(&mut io, &ctx, &member).await {
            break reason;
        }
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
            Box::pin(crate::websocket::driver::run(io, ws, &ctx, &member)).await;
            return;
        }
        match stopped {
            Stopped::Parked => {
                shared.trim.parked();
                continue;
            }
            Stopped::Ended(reason) => {
                // hyper left the socket open; close our side cleanly.
                let _ = io.shutdown().await;
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
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::HttpService<
            hyper::body::Incoming,
            ResBody = crate::http::body::ResponseBody,
        > + Unpin,
    S::Future: Unpin,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let cfg = &ctx.shared.config;
    let (keepalive, header) = (cfg.keepalive_timeout, cfg.header_read_timeout);
    let park_after = PARK_AFTER.min(keepalive);
    let first = clock_ms() + park_after.as_millis() as u64;
    let mut timer = pin!(tokio::time::sleep_until(deadline_at(first)));
    let mut registered = false;
    let mut draining = false;
    let mut parking = false;
    let mut timer_armed = false;
    poll_fn(|cx| {
        if !registered {
            member.register(cx.waker());
            registered = true;
        }
        match member.order() {
            Order::Abort | Order::GoingAway => return Poll::Ready(Stopped::Ended("server stop")),
            Order::Drain if !draining => {
                draining = true;
                Pin::new(&mut *conn).graceful_shutdown();
            }
            _ => {}
        }
        if let Poll::Ready(res) = conn.poll_without_shutdown(cx) {
            if let Err(e) = res {
                tracing::debug!("connection ended: {e}");
                return Poll::Ready(Stopped::Ended("error"));
            }
            return Poll::Ready(if parking && !draining {
                Stopped::Parked
            } else {
                Stopped::Ended("closed")
            });
        }
        // The timer is polled only to (re)arm it or once it has fired; an
        // ordinary wake costs one atomic load here.
        if !timer_armed || timer.is_elapsed() {
            if timer_armed {
                if !parking && !draining && ctx.activity.idle_for(park_after) {
                    parking = true;
                    Pin::new(&mut *conn).graceful_shutdown();
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                match ctx.activity.check(keepalive, header) {
                    Ok(next) => {
                        let park_at = clock_ms() + park_after.as_millis() as u64;
                        timer.as_mut().reset(deadline_at(next.min(park_at)))
                    }
                    Err(reason) => return Poll::Ready(Stopped::Ended(reason)),
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

#[cfg(test)]
mod tests {
    use super::*;

    const KA: Duration = Duration::from_millis(1000);
    const HEAD: Duration = Duration::from_millis(5000);

    fn since(a: &Activity) -> u64 {
        a.since_ms.load(Ordering::Relaxed)
    }

    #[test]
    fn idle_connection_times_out_after_keepalive() {
        let a = Activity::new();
        assert!(a.check_at(since(&a) + 500, KA, HEAD).is_ok());
        assert_eq!(
            a.check_at(since(&a) + 1000, KA, HEAD),
            Err("keep-alive idle timeout")
        );
    }

    #[test]
    fn a_started_head_gets_the_header_timeout_instead() {
        let a = Activity::new();
        a.on_bytes();
        let t0 = since(&a);
        assert!(
            a.check_at(t0 + 2000, KA, HEAD).is_ok(),
            "2 s into a head is within 5 s"
        );
        assert_eq!(
            a.check_at(t0 + 6000, KA, HEAD),
            Err("request head not received in time")
        );
    }

    #[test]
    fn a_busy_connection_never_times_out() {
        let a = Activity::new();
        a.start_request();
        assert!(a.check_at(since(&a) + 60_000, KA, HEAD).is_ok());
        a.end_request();
        assert!(
            a.check_at(since(&a) + 10, KA, HEAD).is_ok(),
            "idle time restarts"
        );
    }
}
