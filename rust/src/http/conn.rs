//! One client connection: hyper's HTTP/1.1 state machine plus the timers
//! hyper does not have in the shape a server needs.
//!
//! hyper's own `header_read_timeout` starts whenever it waits for a request
//! head, so it also ends idle keep-alive connections; Skirr needs two
//! distinct limits. [`Activity`] tracks the connection's phase (idle,
//! reading a head, busy with a request) and one timer per connection checks
//! it lazily: the clock is read only on phase changes and when the timer
//! fires, never per byte.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use pyo3::prelude::*;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;

use crate::http::service;
use crate::server::Shared;

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

    fn on_bytes(&self) {
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

/// Transport wrapper that reports the first byte of each request head.
struct TrackedIo<I> {
    inner: I,
    conn: Arc<ConnCtx>,
}

impl<I: AsyncRead + Unpin> AsyncRead for TrackedIo<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(res, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.activity.on_bytes();
        }
        res
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for TrackedIo<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What the server asks of a connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub(crate) enum Order {
    Serve = 0,
    /// Finish the in-flight response, then close. Open WebSockets carry on.
    Drain = 1,
    /// The drain deadline passed: WebSockets send close 1001 ("going
    /// away"); HTTP connections close at once.
    GoingAway = 2,
    /// Close at once.
    Abort = 3,
}

/// A connection's stop signal: an atomic the connection reads when polled
/// (one load per wake, instead of polling cancellation futures), plus its
/// task's waker so the server can wake it when the order changes.
#[derive(Default)]
struct ConnSignal {
    order: AtomicU8,
    waker: Mutex<Option<Waker>>,
}

impl ConnSignal {
    fn order(&self) -> Order {
        match self.order.load(Ordering::Acquire) {
            0 => Order::Serve,
            1 => Order::Drain,
            2 => Order::GoingAway,
            _ => Order::Abort,
        }
    }
}

#[derive(Default)]
struct Registry {
    next: u64,
    order: u8,
    live: HashMap<u64, Arc<ConnSignal>>,
}

/// Every live connection of a worker, so that a drain or an abort reaches
/// each of them. Touched once when a connection opens and once when it
/// closes; never per request.
#[derive(Default)]
pub(crate) struct Connections {
    inner: Mutex<Registry>,
}

/// A connection's membership in [`Connections`]; leaves on drop.
pub(crate) struct Member<'a> {
    conns: &'a Connections,
    id: u64,
    signal: Arc<ConnSignal>,
}

impl Member<'_> {
    /// The current order for this connection.
    pub(crate) fn order(&self) -> Order {
        self.signal.order()
    }

    /// Stores the task's waker so an order can wake it (call once: a Tokio
    /// task's waker stays valid for the task's life).
    pub(crate) fn register(&self, waker: &Waker) {
        *self.signal.waker.lock() = Some(waker.clone());
    }
}

impl Drop for Member<'_> {
    fn drop(&mut self) {
        self.conns.inner.lock().live.remove(&self.id);
    }
}

impl Connections {
    /// Registers a connection (HTTP or WebSocket) for the server's orders.
    pub(crate) fn join(&self) -> Member<'_> {
        let mut r = self.inner.lock();
        r.next += 1;
        let id = r.next;
        let signal = Arc::new(ConnSignal {
            order: AtomicU8::new(r.order),
            waker: Mutex::new(None),
        });
        r.live.insert(id, Arc::clone(&signal));
        Member {
            conns: self,
            id,
            signal,
        }
    }

    /// Sends an order to every connection, current and future.
    pub(crate) fn order_all(&self, order: Order) {
        let mut r = self.inner.lock();
        r.order = r.order.max(order as u8);
        for signal in r.live.values() {
            signal.order.fetch_max(order as u8, Ordering::AcqRel);
            // Wake by reference: a later order must be able to wake it too.
            if let Some(w) = signal.waker.lock().as_ref() {
                w.wake_by_ref();
            }
        }
    }

    /// How many connections are open.
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().live.len()
    }
}

/// Serves one connection until it closes, times out, or the server orders
/// it to stop (see [`Connections::order_all`]).
pub(crate) async fn serve<I>(
    io: I,
    shared: Arc<Shared>,
    listener: Arc<ListenerInfo>,
    peer: Option<SocketAddr>,
    permit: Option<OwnedSemaphorePermit>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let member = shared.connections.join();
    let ctx = Arc::new(ConnCtx {
        shared: Arc::clone(&shared),
        listener,
        peer,
        py_client: OnceLock::new(),
        activity: Activity::new(),
        _permit: permit,
    });
    let svc = {
        let ctx = Arc::clone(&ctx);
        service_fn(move |req| service::handle(req, Arc::clone(&ctx)))
    };
    let io = TokioIo::new(TrackedIo {
        inner: io,
        conn: Arc::clone(&ctx),
    });
    let mut conn = pin!(shared.http1.serve_connection(io, svc).with_upgrades());
    let keepalive = shared.config.keepalive_timeout;
    let header = shared.config.header_read_timeout;
    let first = clock_ms() + header.min(keepalive).as_millis() as u64;
    let mut timer = pin!(tokio::time::sleep_until(deadline_at(first)));
    let mut registered = false;
    let mut draining = false;
    let mut timer_armed = false;
    let end = poll_fn(|cx| {
        if !registered {
            member.register(cx.waker());
            registered = true;
        }
        match member.order() {
            Order::Abort | Order::GoingAway => return Poll::Ready("server stop"),
            Order::Drain if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
            _ => {}
        }
        if let Poll::Ready(res) = conn.as_mut().poll(cx) {
            if let Err(e) = res {
                tracing::debug!("connection from {:?} ended: {e}", peer);
            }
            return Poll::Ready("closed");
        }
        // The timer is polled only to (re)arm it or once it has fired; an
        // ordinary wake costs one atomic load here.
        if !timer_armed || timer.is_elapsed() {
            if timer_armed {
                match ctx.activity.check(keepalive, header) {
                    Ok(next) => timer.as_mut().reset(deadline_at(next)),
                    Err(reason) => return Poll::Ready(reason),
                }
            }
            timer_armed = true;
            if timer.as_mut().poll(cx).is_ready() {
                cx.waker().wake_by_ref();
            }
        }
        Poll::Pending
    })
    .await;
    tracing::debug!("connection from {:?} done: {end}", peer);
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
    fn every_order_wakes_the_connection() {
        use std::sync::atomic::AtomicUsize;
        use std::task::Wake;

        struct Counter(AtomicUsize);
        impl Wake for Counter {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&counter));
        let conns = Connections::default();
        let m = conns.join();
        m.register(&waker);
        conns.order_all(Order::Drain);
        assert_eq!(m.order(), Order::Drain);
        conns.order_all(Order::GoingAway);
        assert_eq!(m.order(), Order::GoingAway);
        assert_eq!(
            counter.0.load(Ordering::SeqCst),
            2,
            "the second order must wake too"
        );
        let late = conns.join();
        assert_eq!(
            late.order(),
            Order::GoingAway,
            "a later connection gets the order"
        );
        drop(m);
        drop(late);
        assert_eq!(conns.len(), 0);
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
