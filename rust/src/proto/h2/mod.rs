//! One HTTP/2 connection: hyper's HTTP/2 state machine, with the same
//! [`service::handle`] per stream as HTTP/1.1.
//!
//! What HTTP/1.1's driver ([`h1`](crate::proto::h1)) keeps per
//! connection is per stream here:
//!
//! * Each stream gets its own [`ConnCtx`] (sharing the connection's peer,
//!   listener and TLS facts) whose [`Activity`] carries that request's
//!   body-read and response-start deadlines. hyper runs each stream in its
//!   own task ([`StreamExec`]), so the stream's future and body watch those
//!   deadlines themselves ([`Deadlines`], [`H2Body`]).
//! * The connection is idle when no stream is open: after
//!   `keepalive_timeout` of that it is closed with GOAWAY.
//! * No parking and no half-close hiding: HTTP/2 has its own end-of-stream
//!   per request.
//! * WebSockets over HTTP/2 (RFC 8441, `http2_websockets`): an accepted
//!   extended CONNECT stream is handed by hyper as an upgraded stream to
//!   the WebSocket driver, in a task of its own that joins the server's
//!   connections (so drain orders reach it) and keeps the stream counted
//!   open.
//! * Drain sends GOAWAY (NO_ERROR) and lets open streams finish;
//!   `GoingAway` closes the connection at once unless WebSockets are open
//!   (they send close 1001 and end within their close timeout); `Abort`
//!   closes it at once.
//! * `send_timeout`: hyper stops polling a response body while the
//!   stream has no send capacity (its window, or the connection's, stays
//!   closed; or the socket takes nothing), so neither the body nor the
//!   app would ever learn of the stall. Each stream's task is wrapped
//!   ([`Watched`]); a response stalled that long has its task dropped,
//!   which resets the stream (CANCEL) and tells the app the client is gone.

pub(crate) mod frame;
pub(crate) mod io;

use std::cell::RefCell;
use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio_util::task::TaskTracker;

use crate::asgi::http::exchange::Aborted;
use crate::asgi::websocket::shared::WsShared;
use crate::config::{Config, Http2};
use crate::http::activity::{clock_ms, deadline_at, Timeouts, Verdict};
use crate::http::body::ResponseBody;
use crate::http::ctx::{ConnCtx, DRAIN_IDLE};

use self::io::{self as h2io, H2Io};
use crate::http::io::{ConnIo, Readiness};
use crate::worker::connections::{Member, Order};

/// The connection preface of HTTP/2 (RFC 9113 §3.4).
pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Streams reset by the client before the server accepted them that
/// hyper tolerates at once (the Rapid Reset bound, CVE-2023-44487).
const MAX_PENDING_ACCEPT_RESETS: usize = 20;

/// Streams the server itself may reset for protocol errors before the
/// connection is closed (hyper's guard against a peer provoking resets).
const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// Runs hyper's per-stream tasks in the worker's task tracker, so a
/// stopping worker waits for them as for connections.
#[derive(Clone)]
pub(crate) struct StreamExec(TaskTracker);

impl<F> hyper::rt::Executor<F> for StreamExec
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        match NEXT_WATCH.with(|w| w.borrow_mut().take()) {
            Some(watch) => {
                self.0.spawn(Watched {
                    task: Box::pin(fut),
                    watch,
                    sleep: None,
                });
            }
            None => {
                self.0.spawn(fut);
            }
        }
    }
}

/// Response bodies are handed to hyper in pieces of at most this many
/// bytes while `send_timeout` is on, so that progress (hyper asking for
/// the next piece) shows at least once per piece the client reads, not
/// once per chunk the app sent (which may be megabytes).
const SEND_PIECE: usize = 16 * 1024;

/// Whether a stream's response is stalled on the client, for
/// `send_timeout`. Worker by the stream's body (which sees hyper take
/// data) and its task's wrapper ([`Watched`], which acts).
struct SendWatch {
    /// Since when hyper holds a piece of the body it has not sent on
    /// ([`clock_ms`], at least 1). hyper asks for the next piece as soon
    /// as the stream has send capacity, so this lasts only while the
    /// client's windows (or the socket) stay closed. 0 while the body
    /// waits for the app, which is no stall.
    stalled_since: AtomicU64,
    /// `send_timeout` in milliseconds (not 0).
    limit_ms: u64,
}

thread_local! {
    /// The watch of the stream whose service hyper has just called: hyper
    /// spawns that stream's task right after, in the same poll on this
    /// thread (`Serving::poll_server`), which is how the task's wrapper
    /// finds it ([`StreamExec`]).
    static NEXT_WATCH: RefCell<Option<Arc<SendWatch>>> = const { RefCell::new(None) };
}

/// hyper's task for one stream, abandoned once its response has been
/// stalled for `send_timeout` (see [`SendWatch`]). Dropping the task drops
/// the stream's `SendStream`, on which h2 resets the stream (CANCEL) and
/// discards what it buffered for it; dropping the body marks the exchange
/// gone, so the app's `send()` raises `ClientDisconnected`. Other streams
/// are untouched.
struct Watched<F> {
    task: Pin<Box<F>>,
    watch: Arc<SendWatch>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<F: Future<Output = ()>> Future for Watched<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        if this.task.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        let since = this.watch.stalled_since.load(Ordering::Relaxed);
        if since == 0 {
            // Not stalled; an armed timer firing later costs one poll.
            return Poll::Pending;
        }
        let due = deadline_at(since + this.watch.limit_ms);
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        if sleep.deadline() != due {
            sleep.as_mut().reset(due);
        }
        if sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        tracing::debug!(
            "an HTTP/2 response made no progress for {} ms: stream reset",
            this.watch.limit_ms
        );
        Poll::Ready(())
    }
}

/// hyper's HTTP/2 builder from the settings.
pub(crate) fn builder(h: &Http2, cfg: &Config, tracker: TaskTracker) -> http2::Builder<StreamExec> {
    let mut b = http2::Builder::new(StreamExec(tracker));
    b.timer(TokioTimer::new())
        .max_concurrent_streams(h.max_concurrent_streams)
        .initial_stream_window_size(h.initial_window_size)
        // The connection window allows every stream its window at once,
        // within reason.
        .initial_connection_window_size(
            h.initial_window_size
                .saturating_mul(h.max_concurrent_streams.min(16))
                .clamp(65535, (1 << 31) - 1),
        )
        .max_frame_size(h.max_frame_size)
        // The stream-id field `h2io` adds to each request is not the
        // client's to pay for.
        .max_header_list_size(
            h.max_header_list_size
                .saturating_add(h2io::STREAM_FIELD_COST),
        )
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESETS)
        .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESETS)
        // Per stream; the exchange's send buffer bounds what the app queues.
        .max_send_buf_size(cfg.send_buffer.clamp(16 * 1024, 1 << 20))
        .keep_alive_interval((!h.ping_interval.is_zero()).then_some(h.ping_interval))
        .keep_alive_timeout(h.ping_timeout.max(Duration::from_millis(1)));
    if h.websockets {
        // RFC 8441 §3: SETTINGS_ENABLE_CONNECT_PROTOCOL = 1.
        b.enable_connect_protocol();
    }
    b
}

/// Whether a new cleartext connection opens with the HTTP/2 preface.
/// Reads until the preface is complete or ruled out, within the
/// header-read timeout; what was read stays in `io.prefix`.
pub(crate) async fn sniff_preface<I>(io: &mut ConnIo<I>, header_timeout: Duration) -> bool
where
    I: AsyncRead + Unpin,
{
    let read = async {
        while io.prefix.len() < PREFACE.len() {
            if !PREFACE.starts_with(&io.prefix) {
                return false;
            }
            let mut buf = [0u8; 1024];
            match io.inner.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => {
                    let mut b = BytesMut::with_capacity(io.prefix.len() + n);
                    b.extend_from_slice(&io.prefix);
                    b.extend_from_slice(&buf[..n]);
                    io.prefix = b.freeze();
                }
            }
        }
        io.prefix.starts_with(PREFACE)
    };
    if header_timeout.is_zero() {
        return read.await;
    }
    tokio::time::timeout(header_timeout, read)
        .await
        .unwrap_or(false)
}

/// Open streams of one connection, for its idle timeout.
#[derive(Default)]
struct Streams {
    open: AtomicUsize,
    /// Of those, WebSockets (RFC 8441) running.
    websockets: AtomicUsize,
    /// When the last stream closed ([`clock_ms`]).
    since_ms: AtomicU64,
    /// Runs the WebSocket driver on an accepted RFC 8441 stream.
    ws_start: Option<WsStart>,
}

/// An RFC 8441 stream handed over by hyper, as the WebSocket driver reads it.
pub(crate) type Upgraded = TokioIo<hyper::upgrade::Upgraded>;

/// The WebSocket driver's run over an [`Upgraded`] stream.
pub(crate) type WsRun = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Starts the WebSocket driver (given by `proto`, so that this driver
/// does not name another).
pub(crate) type WsStart = fn(Upgraded, Arc<WsShared>, Arc<ConnCtx>) -> WsRun;

/// Counts a stream open from its head until its response is written or
/// dropped.
struct StreamGuard(Arc<Streams>);

impl StreamGuard {
    fn new(s: &Arc<Streams>) -> Self {
        s.open.fetch_add(1, Ordering::Relaxed);
        StreamGuard(Arc::clone(s))
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.since_ms.store(clock_ms(), Ordering::Relaxed);
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream's deadline timer: records a passed deadline in the stream's
/// activity (answered by the service, see `pump::check_deadlines`).
/// With `send_timeout` on, it also carries the stream's [`SendWatch`] and
/// the rest of a body chunk being handed to hyper in pieces.
struct StreamTimer {
    ctx: Arc<ConnCtx>,
    t: Timeouts,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    at: u64,
    watch: Option<Arc<SendWatch>>,
    /// What is left of the chunk being handed over in [`SEND_PIECE`]s.
    rest: Bytes,
}

impl StreamTimer {
    /// Created as hyper calls the service for a new stream: the send
    /// watch is left for [`StreamExec`] to pick up (see [`NEXT_WATCH`]).
    fn new(ctx: Arc<ConnCtx>) -> Self {
        let t = Timeouts::new(&ctx.shared.config);
        let watch = (t.send > 0).then(|| {
            let w = Arc::new(SendWatch {
                stalled_since: AtomicU64::new(0),
                limit_ms: t.send,
            });
            NEXT_WATCH.with(|n| *n.borrow_mut() = Some(Arc::clone(&w)));
            w
        });
        StreamTimer {
            ctx,
            t,
            sleep: None,
            at: 0,
            watch,
            rest: Bytes::new(),
        }
    }

    /// The body handed hyper a piece: it is stalled until hyper asks for
    /// the next (which it does at once if the stream can send).
    fn gave(&mut self, mut data: Bytes) -> Bytes {
        let Some(w) = &self.watch else {
            return data;
        };
        w.stalled_since.store(clock_ms().max(1), Ordering::Relaxed);
        if data.len() > SEND_PIECE {
            self.rest = data.split_off(SEND_PIECE);
        }
        data
    }

    /// The next piece of a chunk already taken from the body, if any.
    fn next_piece(&mut self) -> Option<Bytes> {
        if self.rest.is_empty() {
            return None;
        }
        let n = self.rest.len().min(SEND_PIECE);
        let piece = self.rest.split_to(n);
        if let Some(w) = &self.watch {
            w.stalled_since.store(clock_ms().max(1), Ordering::Relaxed);
        }
        Some(piece)
    }

    /// The body waits for the app: no stall on the client.
    fn waiting(&self) {
        if let Some(w) = &self.watch {
            w.stalled_since.store(0, Ordering::Relaxed);
        }
    }

    /// Called when the stream's work is pending: arms the timer for the
    /// next deadline; `true` if a deadline passed (poll the work again).
    fn poll(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            match self.ctx.activity.check(&self.t) {
                Verdict::Expire(e) => {
                    self.ctx.activity.expire(e);
                    return true;
                }
                // Not returned for a stream (a stream's activity never
                // sees socket writes, the only busy-time close).
                Verdict::Close(_) => return false,
                Verdict::Next(at) => {
                    let sleep = self
                        .sleep
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline_at(at))));
                    if self.at != at {
                        sleep.as_mut().reset(deadline_at(at));
                        self.at = at;
                    }
                    if sleep.as_mut().poll(cx).is_pending() {
                        return false;
                    }
                }
            }
        }
    }
}

/// The stream's service future with its deadlines watched.
struct Deadlines<F> {
    inner: Pin<Box<F>>,
    timer: Option<StreamTimer>,
    guard: Option<StreamGuard>,
    /// An extended CONNECT's upgrade, for a WebSocket the app accepts.
    upgrade: Option<OnUpgrade>,
    stream: Arc<ConnCtx>,
    streams: Arc<Streams>,
}

/// Runs a WebSocket accepted on an HTTP/2 stream (RFC 8441) once hyper has
/// sent the 200 and handed the stream over.
fn start_websocket(
    upgrade: OnUpgrade,
    ws: Arc<WsShared>,
    stream: Arc<ConnCtx>,
    streams: &Arc<Streams>,
) {
    let Some(run) = streams.ws_start else {
        return;
    };
    let guard = StreamGuard::new(streams);
    let streams = Arc::clone(streams);
    let shared = Arc::clone(&stream.shared);
    shared.tracker.clone().spawn(async move {
        streams.websockets.fetch_add(1, Ordering::Relaxed);
        match upgrade.await {
            Ok(up) => run(TokioIo::new(up), ws, stream).await,
            Err(e) => {
                tracing::debug!("HTTP/2 WebSocket stream ended before it started: {e}");
                ws.close(
                    crate::asgi::websocket::shared::ABNORMAL,
                    String::new(),
                    &shared,
                );
            }
        }
        streams.websockets.fetch_sub(1, Ordering::Relaxed);
        drop(guard);
    });
}

impl<F> Future for Deadlines<F>
where
    F: Future<Output = Result<hyper::Response<ResponseBody>, Infallible>>,
{
    type Output = Result<hyper::Response<H2Body>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            if let Poll::Ready(Ok(resp)) = this.inner.as_mut().poll(cx) {
                let accepted = this.stream.upgrade.lock().take();
                if let (Some(ws), Some(up)) = (accepted, this.upgrade.take()) {
                    start_websocket(up, ws, Arc::clone(&this.stream), &this.streams);
                }
                let (parts, body) = resp.into_parts();
                let body = H2Body {
                    inner: body,
                    timer: this.timer.take(),
                    _guard: this.guard.take(),
                };
                return Poll::Ready(Ok(hyper::Response::from_parts(parts, body)));
            }
            if !this.timer.as_mut().is_some_and(|t| t.poll(cx)) {
                return Poll::Pending;
            }
        }
    }
}

/// A response body on HTTP/2: the protocol-independent body, with the
/// stream's body-read deadline and send progress watched and the stream
/// counted open.
pub(crate) struct H2Body {
    inner: ResponseBody,
    timer: Option<StreamTimer>,
    _guard: Option<StreamGuard>,
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = Aborted;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Aborted>>> {
        let this = self.get_mut();
        if let Some(piece) = this.timer.as_mut().and_then(StreamTimer::next_piece) {
            return Poll::Ready(Some(Ok(Frame::data(piece))));
        }
        loop {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => {
                    if let Some(t) = &this.timer {
                        t.waiting();
                    }
                    if !this.timer.as_mut().is_some_and(|t| t.poll(cx)) {
                        return Poll::Pending;
                    }
                }
                Poll::Ready(Some(Ok(frame))) => {
                    let frame = match (frame.into_data(), this.timer.as_mut()) {
                        (Ok(data), Some(t)) => Frame::data(t.gave(data)),
                        (Ok(data), None) => Frame::data(data),
                        (Err(other), _) => other,
                    };
                    return Poll::Ready(Some(Ok(frame)));
                }
                ready => return ready,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream() && self.timer.as_ref().is_none_or(|t| t.rest.is_empty())
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.timer.as_ref().map_or(0, |t| t.rest.len() as u64);
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + rest);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

/// Serves one HTTP/2 connection until it closes, idles out, or the server
/// orders it to stop. Returns why it ended.
pub(crate) async fn serve<I>(
    io: ConnIo<I>,
    ctx: &Arc<ConnCtx>,
    member: &Member<'_>,
    builder: &http2::Builder<StreamExec>,
    ws_start: WsStart,
) -> &'static str
where
    I: AsyncRead + AsyncWrite + Readiness + Unpin + Send + 'static,
{
    let streams = Arc::new(Streams {
        ws_start: Some(ws_start),
        ..Streams::default()
    });
    streams.since_ms.store(clock_ms(), Ordering::Relaxed);
    // Marks the stream-id fields of this connection's requests (see `h2io`).
    let token = h2io::new_token();
    let svc = {
        let ctx = Arc::clone(ctx);
        let streams = Arc::clone(&streams);
        service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            let id = h2io::take_stream_id(req.headers_mut(), token);
            let stream = Arc::new(ctx.for_stream(id, frame::encode_h2));
            stream.activity.start_request();
            let guard = StreamGuard::new(&streams);
            let upgrade =
                (req.method() == hyper::Method::CONNECT).then(|| hyper::upgrade::on(&mut req));
            Deadlines {
                inner: Box::pin(super::dispatch::handle(req, Arc::clone(&stream))),
                timer: Some(StreamTimer::new(Arc::clone(&stream))),
                guard: Some(guard),
                upgrade,
                stream,
                streams: Arc::clone(&streams),
            }
        })
    };
    let mut conn = pin!(builder.serve_connection(TokioIo::new(H2Io::new(io, token)), svc));
    let keepalive = ctx.shared.config.keepalive_timeout.as_millis() as u64;
    // While streams are open the idle timer only looks in this often (a
    // stream closing does not wake the connection task).
    let idle_check = keepalive.max(1000);
    let mut timer = pin!(tokio::time::sleep_until(deadline_at(
        clock_ms() + idle_check
    )));
    let mut registered = false;
    let mut closing = false;
    // An idle close whose GOAWAY the client leaves unanswered ends here.
    let mut give_up = u64::MAX;
    // Drain: hyper's graceful shutdown (GOAWAY 2^31-1, PING, then the final
    // GOAWAY) waits for the PING's ack, which a client not reading its
    // socket (an idle pooled connection: httpx between requests) never
    // sends; that held the worker until graceful_timeout. So, as HTTP/1.1
    // does with an idle connection, a draining connection with no stream
    // open for DRAIN_IDLE (capped by keepalive) after the drain began or
    // its last stream closed is closed. Set when the drain begins.
    let drain_idle = DRAIN_IDLE
        .min(ctx.shared.config.keepalive_timeout)
        .as_millis() as u64;
    let mut drain_idle_from: Option<u64> = None;
    poll_fn(|cx| {
        if !registered {
            member.register(cx.waker());
            registered = true;
        }
        match member.order() {
            Order::Serve => {}
            Order::Drain => {
                if !closing {
                    // GOAWAY (NO_ERROR); open streams finish.
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
                if drain_idle_from.is_none() {
                    // The drain-idle check (see `drain_idle`) starts now.
                    let now = clock_ms();
                    drain_idle_from = Some(now);
                    timer.as_mut().reset(deadline_at(now + drain_idle));
                }
            }
            // WebSockets send close 1001 on this order; the connection
            // carries their frames until they end (their close timeout).
            Order::GoingAway if streams.websockets.load(Ordering::Relaxed) > 0 => {
                if !closing {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
            _ => return Poll::Ready("server stop"),
        }
        if let Poll::Ready(res) = conn.as_mut().poll(cx) {
            return Poll::Ready(match res {
                Ok(()) => "closed",
                Err(e) => {
                    tracing::debug!("HTTP/2 connection ended: {e}");
                    "error"
                }
            });
        }
        while timer.as_mut().poll(cx).is_ready() {
            let now = clock_ms();
            let mut next = now + idle_check;
            if now >= give_up {
                return Poll::Ready("keep-alive idle timeout");
            }
            if let Some(from) = drain_idle_from {
                if streams.open.load(Ordering::Relaxed) == 0 {
                    let since = streams.since_ms.load(Ordering::Relaxed).max(from);
                    if now + 5 >= since + drain_idle {
                        return Poll::Ready("drain: idle");
                    }
                    next = next.min(since + drain_idle);
                } else {
                    // Look again soon: a stream ending does not wake this task.
                    next = next.min(now + drain_idle.max(100));
                }
            }
            if !closing && streams.open.load(Ordering::Relaxed) == 0 {
                let due = streams.since_ms.load(Ordering::Relaxed) + keepalive;
                if now + 5 >= due {
                    closing = true;
                    give_up = now + idle_check;
                    conn.as_mut().graceful_shutdown();
                    cx.waker().wake_by_ref();
                } else {
                    next = due;
                }
            }
            timer.as_mut().reset(deadline_at(next));
        }
        Poll::Pending
    })
    .await
}
