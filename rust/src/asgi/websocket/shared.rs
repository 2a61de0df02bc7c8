//! The state one WebSocket shares between its Tokio side (the service, then
//! the driver) and the app's `receive`/`send` on the asyncio thread.
//!
//! Bounded both ways: the driver stops reading once `ws_max_queue` messages
//! wait for the app; `send()` waits once `ws_max_queue` messages or
//! `send_buffer` bytes wait for the client (see [`has_room`]). A waiting
//! `send()` keeps its message as the app's Python object until there is
//! room, so concurrent senders cost the worker no copies; at most
//! [`MAX_PENDING`] `send()` and [`MAX_PENDING`] `receive()` calls may wait
//! on one socket.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::HeaderMap;
use parking_lot::{Mutex, MutexGuard};
use pyo3::prelude::*;
use tungstenite::Message;

use crate::asgi::context::{AppContext, WakeSlot};
use crate::asgi::http::exchange::ResponseHead;
use crate::bridge::queue::Wake;
use crate::bridge::waiter::Waiter;
use crate::config::Config;
use crate::worker::Worker;

/// Most `receive()` (and, separately, `send()`) calls that may wait on one
/// WebSocket at once; one more raises `RuntimeError`. Cancelled calls do
/// not count.
pub(crate) const MAX_PENDING: usize = 1024;

/// Close code for an abnormal end: no close frame was exchanged (RFC 6455
/// §7.1.5). Never sent on the wire.
pub(crate) const ABNORMAL: u16 = 1006;
/// The peer's close frame carried no code (RFC 6455 §7.1.5).
pub(crate) const NO_STATUS: u16 = 1005;

/// The app's answer to the handshake.
pub(crate) enum Decision {
    /// `websocket.accept`: 101 with this subprotocol and these headers.
    Accept {
        subprotocol: Option<String>,
        headers: HeaderMap,
    },
    /// `websocket.close` before accept: 403.
    Deny,
    /// `websocket.http.response.*`, or a 500 after an app error.
    Respond(ResponseHead),
}

/// A message a waiting `send()` will queue once there is room.
pub(crate) enum Outgoing {
    /// Built already (bytes are shared with the app's object, not copied).
    Ready(Message),
    /// A `str`, validated; copied into a message only once it is queued.
    Text(Py<pyo3::types::PyString>),
}

/// A `send()` waiting for room, with its message.
pub(crate) struct PendingSend {
    pub(crate) waiter: Py<Waiter>,
    pub(crate) msg: Outgoing,
}

/// Mutable state; see the module docs.
#[derive(Default)]
pub(crate) struct WsState {
    pub(crate) decision: Option<Decision>,
    /// The Tokio side waiting for the decision or for outbound messages.
    pub(crate) tokio_waker: Option<Waker>,
    /// Client → app messages waiting for `receive()`.
    pub(crate) inbound: VecDeque<Message>,
    /// The connection is over: `(code, reason)` for `websocket.disconnect`.
    pub(crate) closed: Option<(u16, String)>,
    /// Pending `receive()` calls, oldest first: each gets the next message
    /// (several tasks may receive on one socket, as uvicorn allows); all of
    /// them get `websocket.disconnect`.
    pub(crate) recv_waiters: VecDeque<Py<Waiter>>,
    /// App → client messages (a `Close` last, if the app closes).
    pub(crate) outbound: VecDeque<Message>,
    /// Payload bytes in `outbound`.
    pub(crate) outbound_bytes: usize,
    /// A close frame from the app is queued: `send()` calls still waiting
    /// fail, nothing may follow it.
    pub(crate) closing: bool,
    /// `send()` calls waiting for room, oldest first (several tasks may
    /// send on one socket, e.g. a broadcast).
    pub(crate) send_waiters: VecDeque<PendingSend>,
    /// The driver waits for the app to be idle (inbound queue empty and
    /// `receive()` waiting) before it fails the connection: wake it then.
    pub(crate) notify_idle: bool,
    /// permessage-deflate as agreed in the handshake, for the driver.
    pub(crate) deflate: Option<crate::wire::ws_extension::Agreed>,
}

/// Worker per-WebSocket state.
#[derive(Default)]
pub(crate) struct WsShared {
    st: Mutex<WsState>,
    /// Its place in the event queue and the application context its wakes
    /// run in (see [`WsShared::attach`]).
    wake: WakeSlot,
}

impl Wake for WsShared {
    fn unqueue(&self) {
        self.wake.unqueue();
    }

    fn wake(self: Arc<Self>, py: Python<'_>) {
        if let Some(ctx) = self.wake.app() {
            crate::asgi::websocket::protocol::on_wake(py, ctx, &self);
        }
    }
}

impl WsShared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, WsState> {
        self.st.lock()
    }

    /// Asks the asyncio thread to look at this socket's waiters.
    pub(crate) fn needs_python(self: &Arc<Self>, shared: &Worker) {
        self.wake.queue(self, shared);
    }

    /// Ties the socket to the application context its wakes run in (once,
    /// before its handshake is queued).
    pub(crate) fn attach(&self, app: &Arc<AppContext>) {
        self.wake.attach(app);
    }

    /// Tokio side: waits for the app's handshake decision.
    pub(crate) fn poll_decision(&self, cx: &mut Context<'_>) -> Poll<Decision> {
        let mut st = self.st.lock();
        if let Some(d) = st.decision.take() {
            return Poll::Ready(d);
        }
        register(&mut st.tokio_waker, cx);
        Poll::Pending
    }

    /// Tokio side: the connection ended with `(code, reason)`; wake the app.
    pub(crate) fn close(self: &Arc<Self>, code: u16, reason: String, shared: &Worker) {
        let mut st = self.st.lock();
        if st.closed.is_some() {
            return;
        }
        st.closed = Some((code, reason));
        let wake = !st.recv_waiters.is_empty() || !st.send_waiters.is_empty();
        drop(st);
        if wake {
            self.needs_python(shared);
        }
    }

    /// Python side: hands the decision to the Tokio side.
    pub(crate) fn decide(&self, decision: Decision, shared: &Worker) {
        let mut st = self.st.lock();
        st.decision = Some(decision);
        wake_tokio(&mut st, shared);
    }
}

/// Whether one more app → client message may be queued now: fewer than
/// `ws_max_queue` messages and fewer than `send_buffer` bytes wait (so a
/// message larger than `send_buffer` still goes, alone).
pub(crate) fn has_room(st: &WsState, cfg: &Config) -> bool {
    st.outbound.len() < cfg.ws_max_queue && st.outbound_bytes < cfg.send_buffer
}

/// Payload size of a message, for `outbound_bytes`.
pub(crate) fn payload_len(m: &Message) -> usize {
    match m {
        Message::Text(t) => t.len(),
        Message::Binary(b) => b.len(),
        _ => 0,
    }
}

impl WsState {
    /// Queues an app → client message (room already checked).
    pub(crate) fn push_outbound(&mut self, m: Message) {
        self.closing |= matches!(m, Message::Close(_));
        self.outbound_bytes += payload_len(&m);
        self.outbound.push_back(m);
    }

    /// Takes the next app → client message.
    pub(crate) fn pop_outbound(&mut self) -> Option<Message> {
        let m = self.outbound.pop_front()?;
        self.outbound_bytes = self.outbound_bytes.saturating_sub(payload_len(&m));
        Some(m)
    }

    /// Drops every queued app → client message (nothing may follow a close).
    pub(crate) fn clear_outbound(&mut self) {
        self.outbound.clear();
        self.outbound_bytes = 0;
    }
}

pub(crate) fn register(slot: &mut Option<Waker>, cx: &mut Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

/// Python side: wakes the Tokio task waiting on this socket (batched).
pub(crate) fn wake_tokio(st: &mut WsState, shared: &Worker) {
    if let Some(w) = st.tokio_waker.take() {
        shared.wakeups.wake(w);
    }
}
