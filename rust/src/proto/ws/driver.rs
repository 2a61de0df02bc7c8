//! One open WebSocket: [`framed`](super::framed) frames it (fragmentation,
//! control frames between fragments, automatic pong, the close handshake,
//! size limits, permessage-deflate);
//! this task moves messages between it and the app's queues, pings idle
//! peers, and turns protocol failures into the right close code:
//!
//! | what happened                                  | close code |
//! |------------------------------------------------|-----------:|
//! | protocol violation (unmasked frame, reserved bits or opcode, bad control frame, bad close frame) | 1002 |
//! | a text message that is not valid UTF-8 (as soon as a prefix is invalid) | 1007 |
//! | a message above `ws_max_message_size` (after inflation) | 1009 |
//! | a ping unanswered within `ws_ping_timeout`      | 1011 |
//! | the server shuts down (after the drain deadline)| 1001 |
//! | the connection dropped without a close frame    | (1006 to the app) |
//!
//! A peer that ends its side without a close frame still gets the app's
//! replies to what it sent, until the app has caught up (or 2 s).

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{sleep, Instant, Sleep};
use tungstenite::error::ProtocolError;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::CloseFrame;
use tungstenite::{Error, Message};

use crate::asgi::websocket::shared::{has_room, register, WsShared, ABNORMAL, NO_STATUS};
use crate::http::ctx::ConnCtx;
use crate::proto::ws::framed::{Deflate, Framed};
use crate::worker::connections::{Member, Order};

/// The socket after the 101, with any bytes hyper had read ahead replayed.
trait Socket: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Socket for T {}

/// The socket as tungstenite sees it: an end of stream is hidden (reads
/// stay pending) and reported through `eof` instead. tungstenite refuses
/// to write once it has read an end of stream without a close frame, but
/// a peer that only shut its sending side down still reads: the app's
/// replies to what it sent must reach it (see `Driver::read_closed`).
struct EofShield<I> {
    inner: I,
    eof: Arc<AtomicBool>,
}

impl<I: AsyncRead + Unpin> AsyncRead for EofShield<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.eof.load(Ordering::Relaxed) {
            return Poll::Pending;
        }
        let before = buf.filled().len();
        let room = buf.remaining() > 0;
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(res, Poll::Ready(Ok(()))) && room && buf.filled().len() == before {
            self.eof.store(true, Ordering::Relaxed);
            // The driver's next poll sees the flag.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        res
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for EofShield<I> {
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
type Ws<'a> = Framed<&'a mut dyn Socket>;

/// How long the peer gets to answer our close frame before the TCP
/// connection is closed anyway.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// After a protocol error, how long the app gets to finish the messages
/// that arrived before the bad frame (their replies go out first).
const FAIL_GRACE: Duration = Duration::from_secs(2);

/// The close code for a read error, or `None` if the peer simply vanished.
fn close_code_for(e: &Error) -> Option<CloseCode> {
    match e {
        Error::Utf8(_) => Some(CloseCode::Invalid),
        Error::Capacity(_) => Some(CloseCode::Size),
        Error::Protocol(ProtocolError::ResetWithoutClosingHandshake) => None,
        Error::Protocol(_) => Some(CloseCode::Protocol),
        Error::ConnectionClosed | Error::AlreadyClosed | Error::Io(_) => None,
        _ => Some(CloseCode::Error),
    }
}

enum Ping {
    /// Next ping due at the timer.
    Idle,
    /// Ping sent; a pong is due by the timer.
    Waiting,
}

struct Driver {
    ws: Arc<WsShared>,
    conn: Arc<ConnCtx>,
    /// We sent a close frame (the app's, or ours after an error).
    close_sent: bool,
    /// The close frame we sent was the app's `websocket.close`.
    app_closed: bool,
    /// The code and reason the app will see in `websocket.disconnect`.
    outcome: Option<(u16, String)>,
    /// Deadline for the peer's close reply, once we sent ours.
    close_timer: Option<Pin<Box<Sleep>>>,
    ping: Ping,
    ping_timer: Option<Pin<Box<Sleep>>>,
    waker_registered: bool,
    /// A read failed: the close code to send once the app has caught up.
    failing: Option<(CloseCode, Pin<Box<Sleep>>)>,
    /// The peer sent its close frame: nothing more may be sent but our
    /// reply, which tungstenite queues.
    peer_closed: bool,
    /// Done: flushing what is buffered (a close reply among it) before the
    /// socket is dropped, bounded by `CLOSE_TIMEOUT`.
    finishing: Option<Pin<Box<Sleep>>>,
    /// The worker drains: our close (1012 or 1001) goes out when this
    /// fires (`drain_grace`, see `server::drain`).
    drain_timer: Option<Pin<Box<Sleep>>>,
    /// The peer shut its sending side down without a close frame: reading
    /// is over, but the app may still answer what it sent (uvicorn writes
    /// those replies too); the connection ends once the app has caught up,
    /// or at this deadline (`FAIL_GRACE`), with 1006 for the app.
    read_closed: Option<Pin<Box<Sleep>>>,
    /// Set by [`EofShield`] when the peer's end of stream is read.
    eof: Arc<AtomicBool>,
}

impl Driver {
    fn send_close(&mut self, code: CloseCode, reason: &str, ws: &mut Ws, cx: &mut Context<'_>) {
        if self.close_sent {
            return;
        }
        self.close_sent = true;
        self.outcome.get_or_insert((code.into(), reason.to_owned()));
        let frame = CloseFrame {
            code,
            reason: reason.to_owned().into(),
        };
        if let Poll::Ready(Ok(())) = Pin::new(&mut *ws).poll_ready(cx) {
            let _ = Pin::new(&mut *ws).start_send(Message::Close(Some(frame)));
        }
        let _ = Pin::new(&mut *ws).poll_flush(cx);
        self.close_timer = Some(Box::pin(sleep(CLOSE_TIMEOUT)));
    }

    /// Writes what the app queued. `Err` ends the connection.
    fn write(&mut self, ws: &mut Ws, cx: &mut Context<'_>) -> Result<(), ()> {
        let shared = &*self.conn.shared;
        loop {
            let msg = {
                let mut st = self.ws.lock();
                register(&mut st.tokio_waker, cx);
                if st.outbound.is_empty() {
                    break;
                }
                if self.close_sent || self.peer_closed {
                    // Nothing may follow a close frame.
                    st.clear_outbound();
                    break;
                }
                // tungstenite holds one message at a time: the next is taken
                // only once the previous one is flushed to the socket.
                match Pin::new(&mut *ws).poll_ready(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(_)) => return Err(()),
                    Poll::Pending => break,
                }
                let msg = st.pop_outbound();
                let wake_app = !st.send_waiters.is_empty() && has_room(&st, &shared.config);
                drop(st);
                if wake_app {
                    self.ws.needs_python(shared);
                }
                msg
            };
            let Some(msg) = msg else { break };
            if let Message::Close(frame) = &msg {
                self.close_sent = true;
                self.app_closed = true;
                let (code, reason) = frame
                    .as_ref()
                    .map(|f| (u16::from(f.code), f.reason.to_string()))
                    .unwrap_or((1000, String::new()));
                self.outcome.get_or_insert((code, reason));
                self.close_timer = Some(Box::pin(sleep(CLOSE_TIMEOUT)));
            }
            if matches!(msg, Message::Text(_) | Message::Binary(_)) {
                shared.metrics.ws_message(false);
            }
            if Pin::new(&mut *ws).start_send(msg).is_err() {
                return Err(());
            }
        }
        match Pin::new(&mut *ws).poll_flush(cx) {
            Poll::Ready(Err(Error::ConnectionClosed)) => Ok(()),
            Poll::Ready(Err(_)) => Err(()),
            _ => Ok(()),
        }
    }

    /// Reads while the app has room. `Ready` when the connection is over.
    fn read(&mut self, ws: &mut Ws, cx: &mut Context<'_>) -> Poll<()> {
        let shared = Arc::clone(&self.conn.shared);
        let limit = shared.config.ws_max_queue;
        loop {
            // Backpressure: stop reading until the app catches up; but once
            // our close frame is out, read on to the peer's (so the socket
            // closes cleanly, never with unread data, which is a reset).
            if !self.close_sent && self.ws.lock().inbound.len() >= limit {
                return Poll::Pending;
            }
            match Pin::new(&mut *ws).poll_next(cx) {
                Poll::Ready(Some(Ok(msg))) => match msg {
                    Message::Text(_) | Message::Binary(_) => {
                        shared.metrics.ws_message(true);
                        let mut st = self.ws.lock();
                        if self.app_closed || st.inbound.len() >= limit {
                            // After our close: the app closed (it reads no
                            // more, as in uvicorn), or it is not keeping up.
                            continue;
                        }
                        st.inbound.push_back(msg);
                        let wake = !st.recv_waiters.is_empty();
                        drop(st);
                        if wake {
                            self.ws.needs_python(&shared);
                        }
                    }
                    Message::Pong(_) => {
                        if let Ping::Waiting = self.ping {
                            self.ping = Ping::Idle;
                            self.reset_ping_timer();
                        }
                    }
                    Message::Close(frame) => {
                        // tungstenite queues the reply; it is flushed below.
                        let (code, reason) = frame
                            .map(|f| (u16::from(f.code), f.reason.to_string()))
                            .unwrap_or((NO_STATUS, String::new()));
                        if !self.close_sent {
                            self.outcome = Some((code, reason.clone()));
                        }
                        self.peer_closed = true;
                        // The app may stop sending now, before our reply is
                        // flushed (a slow peer could take CLOSE_TIMEOUT).
                        let (code, reason) = self.outcome.clone().unwrap_or((code, reason));
                        self.ws.close(code, reason, &shared);
                        let _ = Pin::new(&mut *ws).poll_flush(cx);
                    }
                    Message::Ping(_) | Message::Frame(_) => {
                        // The pong is queued by tungstenite; flush it.
                        let _ = Pin::new(&mut *ws).poll_flush(cx);
                    }
                },
                Poll::Ready(Some(Err(e))) => {
                    match close_code_for(&e) {
                        Some(code) if !self.close_sent => {
                            // Fail the connection, but only once the app has
                            // answered what arrived before the bad frame.
                            tracing::debug!("WebSocket protocol error: {e}; closing with {code}");
                            self.failing = Some((code, Box::pin(sleep(FAIL_GRACE))));
                            self.ws.lock().notify_idle = true;
                            // Poll again at once: the app may already be idle.
                            cx.waker().wake_by_ref();
                            return Poll::Pending;
                        }
                        _ => {
                            if !matches!(e, Error::ConnectionClosed | Error::AlreadyClosed) {
                                self.outcome.get_or_insert((ABNORMAL, String::new()));
                            }
                            return Poll::Ready(());
                        }
                    }
                }
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn reset_ping_timer(&mut self) {
        let cfg = &self.conn.shared.config;
        let after = match self.ping {
            Ping::Idle => cfg.ws_ping_interval,
            Ping::Waiting => cfg.ws_ping_timeout,
        };
        if let Some(t) = self.ping_timer.as_mut() {
            t.as_mut().reset(Instant::now() + after);
        }
    }

    /// Starts (or continues) the final flush; `Ready` once the socket may
    /// be dropped.
    fn finish(&mut self, ws: &mut Ws, cx: &mut Context<'_>) -> Poll<()> {
        let timer = self
            .finishing
            .get_or_insert_with(|| Box::pin(sleep(CLOSE_TIMEOUT)));
        match Pin::new(&mut *ws).poll_flush(cx) {
            Poll::Pending if timer.as_mut().poll(cx).is_pending() => Poll::Pending,
            _ => Poll::Ready(()),
        }
    }

    fn poll(&mut self, ws: &mut Ws, cx: &mut Context<'_>, member: &Member<'_>) -> Poll<()> {
        if !self.waker_registered {
            member.register(cx.waker());
            self.waker_registered = true;
        }
        if self.finishing.is_some() {
            if member.order() == Order::Abort {
                return Poll::Ready(());
            }
            return self.finish(ws, cx);
        }
        match member.order() {
            Order::Abort => {
                self.outcome.get_or_insert((ABNORMAL, String::new()));
                return Poll::Ready(());
            }
            Order::GoingAway if !self.close_sent => {
                self.send_close(CloseCode::Away, "server shutting down", ws, cx);
            }
            Order::Drain if self.drain_timer.is_none() => {
                let grace = self.conn.shared.config.drain_grace;
                if !grace.is_zero() {
                    self.drain_timer = Some(Box::pin(sleep(grace)));
                }
            }
            _ => {}
        }
        if let Some(t) = self.drain_timer.as_mut() {
            if !self.close_sent && t.as_mut().poll(cx).is_ready() {
                // The WebSocket would hold the drain until its deadline:
                // the client is told now, with a code that says whether
                // to reconnect (see `server::drain`).
                let (code, reason) = self.conn.shared.drain.websocket_close();
                self.send_close(code, reason, ws, cx);
            }
        }
        if self.write(ws, cx).is_err() {
            self.outcome.get_or_insert((ABNORMAL, String::new()));
            return Poll::Ready(());
        }
        if let Some((code, timer)) = self.failing.as_mut() {
            let code = *code;
            let idle = {
                let st = self.ws.lock();
                st.inbound.is_empty() && st.outbound.is_empty() && !st.recv_waiters.is_empty()
            };
            if idle || timer.as_mut().poll(cx).is_ready() {
                self.failing = None;
                self.send_close(code, "", ws, cx);
                self.outcome = Some((code.into(), String::new()));
                // The socket closes once our close frame is flushed.
                return self.finish(ws, cx);
            }
            return Poll::Pending;
        }
        if self.read_closed.is_none() && self.eof.load(Ordering::Relaxed) {
            if self.close_sent || self.peer_closed {
                // The close handshake is over, or the peer vanished
                // during ours.
                if !self.peer_closed {
                    self.outcome.get_or_insert((ABNORMAL, String::new()));
                }
                return self.finish(ws, cx);
            }
            self.read_closed = Some(Box::pin(sleep(FAIL_GRACE)));
            self.ws.lock().notify_idle = true;
        }
        if let Some(timer) = self.read_closed.as_mut() {
            let idle = {
                let st = self.ws.lock();
                st.inbound.is_empty() && st.outbound.is_empty() && !st.recv_waiters.is_empty()
            };
            if idle || timer.as_mut().poll(cx).is_ready() {
                self.read_closed = None;
                self.outcome.get_or_insert((ABNORMAL, String::new()));
                return self.finish(ws, cx);
            }
            return Poll::Pending;
        }
        if self.read(ws, cx).is_ready() {
            // Flush what is buffered (a close reply among it) first.
            return self.finish(ws, cx);
        }
        if let Some(t) = self.close_timer.as_mut() {
            if t.as_mut().poll(cx).is_ready() {
                // The peer never answered our close frame.
                return Poll::Ready(());
            }
        }
        if let Some(t) = self.ping_timer.as_mut() {
            if t.as_mut().poll(cx).is_ready() {
                match self.ping {
                    Ping::Idle => {
                        if let Poll::Ready(Ok(())) = Pin::new(&mut *ws).poll_ready(cx) {
                            let _ =
                                Pin::new(&mut *ws).start_send(Message::Ping(Default::default()));
                            let _ = Pin::new(&mut *ws).poll_flush(cx);
                        }
                        self.ping = Ping::Waiting;
                        self.reset_ping_timer();
                    }
                    Ping::Waiting => {
                        tracing::debug!("WebSocket ping timeout; closing");
                        self.ping_timer = None;
                        self.send_close(CloseCode::Error, "keepalive ping timeout", ws, cx);
                    }
                }
                cx.waker().wake_by_ref();
            }
        }
        Poll::Pending
    }
}

/// Runs an accepted WebSocket until it closes; see the module docs. On
/// HTTP/1.1 it runs in the task of the connection it upgraded, on the socket
/// hyper handed back; on HTTP/2 in a task of its own, on the upgraded
/// stream (`io` is then hyper's stream, its shutdown the END_STREAM).
pub(crate) async fn run<I>(io: I, ws: Arc<WsShared>, conn: &Arc<ConnCtx>, member: &Member<'_>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send,
{
    // Never retired for a newcomer (`server::admission`).
    member.mark_websocket();
    let shared = Arc::clone(&conn.shared);
    let _open = shared.metrics.websocket();
    let cfg = &shared.config;
    // permessage-deflate, if the handshake agreed on it (`service`).
    let deflate = ws.lock().deflate.take().map(|agreed| Deflate {
        agreed,
        window_bits: cfg.ws_deflate_window_bits,
        min_size: cfg.ws_deflate_min_size,
    });
    let eof = Arc::new(AtomicBool::new(false));
    let mut shielded = EofShield {
        inner: io,
        eof: Arc::clone(&eof),
    };
    let socket: &mut dyn Socket = &mut shielded;
    let mut stream = Framed::new(socket, cfg.ws_max_message_size, deflate);
    let ping_timer =
        (!cfg.ws_ping_interval.is_zero()).then(|| Box::pin(sleep(cfg.ws_ping_interval)));
    let mut driver = Driver {
        ws: Arc::clone(&ws),
        conn: Arc::clone(conn),
        close_sent: false,
        app_closed: false,
        outcome: None,
        close_timer: None,
        ping: Ping::Idle,
        ping_timer,
        waker_registered: false,
        failing: None,
        peer_closed: false,
        finishing: None,
        drain_timer: None,
        read_closed: None,
        eof,
    };
    poll_fn(|cx| driver.poll(&mut stream, cx, member)).await;
    let (code, reason) = driver.outcome.take().unwrap_or((ABNORMAL, String::new()));
    ws.close(code, reason, &shared);
}
