//! `receive` and `send` for one WebSocket (ASGI WebSocket spec 2.5 and the
//! `websocket.http.response` extension).

mod send;

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::BytesMut;
use http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::CloseFrame;
use tungstenite::Message;

use crate::asgi::context::AppContext;
use crate::asgi::http::exchange::ResponseHead;
use crate::asgi::message::{event, keys_by_identity, message_type};
use crate::asgi::websocket::shared::{
    has_room, wake_tokio, Decision, Outgoing, PendingSend, WsShared, WsState, ABNORMAL, MAX_PENDING,
};
use crate::bridge::awaitable::ready;
use crate::bridge::context::{fail_disconnected, is_done, resolve};
use crate::bridge::names::names;
use crate::bridge::waiter::Waiter;
use crate::errors::ClientDisconnected;

/// Where the app is in the WebSocket's life.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// `websocket.connect` not delivered yet.
    Connecting,
    /// Waiting for the app's accept, close or HTTP response.
    Handshake,
    /// Open.
    Accepted,
    /// `websocket.http.response.start` sent; body chunks follow.
    Responding,
    /// The app closed (or denied, or answered over HTTP).
    Closed,
}

struct ProtoState {
    phase: Phase,
    http_head: Option<(StatusCode, HeaderMap)>,
    http_body: BytesMut,
}

/// `receive` and `send` callables for one WebSocket.
#[pyclass(frozen, freelist = 64, module = "skirr._skirr")]
pub(crate) struct WebSocketProtocol {
    ws: Arc<WsShared>,
    ctx: Arc<AppContext>,
    st: Mutex<ProtoState>,
}

fn inbound_message<'py>(py: Python<'py>, m: Message) -> PyResult<Bound<'py, PyAny>> {
    let n = names(py);
    let d = event(py, &n.websocket_receive)?;
    match m {
        Message::Text(t) => d.set_item(n.text.bind(py), PyString::new(py, t.as_str()))?,
        Message::Binary(b) => d.set_item(n.bytes.bind(py), PyBytes::new(py, &b))?,
        _ => {}
    }
    Ok(d.into_any())
}

fn disconnect<'py>(py: Python<'py>, code: u16, reason: &str) -> PyResult<Bound<'py, PyAny>> {
    let n = names(py);
    let d = event(py, &n.websocket_disconnect)?;
    d.set_item(n.code.bind(py), code)?;
    d.set_item(n.reason.bind(py), reason)?;
    Ok(d.into_any())
}

fn plain_500() -> ResponseHead {
    ResponseHead::plain(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error")
}

/// Close codes an endpoint may send (RFC 6455 §7.4; 1004-1006 and 1015 are
/// reserved, 1016-2999 are for future protocol use).
fn sendable_code(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// The next message `receive()` can deliver now, if any (after connect).
fn next_message<'py>(
    py: Python<'py>,
    ws: &mut WsState,
    ctx: &AppContext,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if let Some(m) = ws.inbound.pop_front() {
        if ws.inbound.len() + 1 == ctx.shared.config.ws_max_queue {
            // The reader paused at the limit: let it resume.
            wake_tokio(ws, &ctx.shared);
        }
        return inbound_message(py, m).map(Some);
    }
    if let Some((code, reason)) = &ws.closed {
        return disconnect(py, *code, reason).map(Some);
    }
    Ok(None)
}

/// Handles a `WsWake` event (asyncio thread): completes what can complete.
pub(crate) fn on_wake(py: Python<'_>, ctx: &AppContext, ws: &Arc<WsShared>) {
    deliver_received(py, ctx, ws);
    admit_sends(py, ctx, ws);
}

/// Drops cancelled waiters from the front of `q` (returned, to be dropped
/// once the lock is released: a waiter's last reference may run Python).
fn pop_cancelled(py: Python<'_>, q: &mut VecDeque<Py<Waiter>>) -> Vec<Py<Waiter>> {
    let mut stale = Vec::new();
    while q.front().is_some_and(|w| is_done(w.bind(py))) {
        stale.extend(q.pop_front());
    }
    stale
}

/// Keeps the entries of `q` that are `live`; returns the others (to be
/// dropped once the lock is released).
fn prune<T>(q: &mut VecDeque<T>, live: impl Fn(&T) -> bool) -> Vec<T> {
    let (keep, dead): (VecDeque<T>, VecDeque<T>) = std::mem::take(q).into_iter().partition(live);
    *q = keep;
    dead.into()
}

/// Hands messages, then the disconnect, to the pending `receive()` calls,
/// oldest first. One at a time, without the lock: completing a waiter may
/// step its task at once (see `bridge::waiter`), and that task may call
/// `receive()` again (it queues behind the others). At most as many as
/// waited when this began: a call queued meanwhile is served on the next
/// wake, so tasks that keep receiving cannot hold the loop here.
fn deliver_received(py: Python<'_>, ctx: &AppContext, ws: &Arc<WsShared>) {
    let mut budget = ws.lock().recv_waiters.len();
    while budget > 0 {
        budget -= 1;
        let mut st = ws.lock();
        let stale = pop_cancelled(py, &mut st.recv_waiters);
        let next = match st.recv_waiters.is_empty() {
            true => Ok(None),
            false => next_message(py, &mut st, ctx),
        };
        let w = match &next {
            Ok(Some(_)) => st.recv_waiters.pop_front(),
            _ => None,
        };
        drop(st);
        drop(stale);
        match (next, w) {
            (Ok(Some(m)), Some(w)) => {
                resolve(w.bind(py), m);
            }
            (Err(e), _) => {
                ctx.log_error(py, "could not build a websocket message", Some(&e));
                return;
            }
            _ => return,
        }
    }
    let st = ws.lock();
    let more = !st.recv_waiters.is_empty() && (!st.inbound.is_empty() || st.closed.is_some());
    drop(st);
    if more {
        ws.needs_python(&ctx.shared);
    }
}

/// The message a waiting `send()` queues now.
fn outgoing_message(py: Python<'_>, m: Outgoing) -> PyResult<Message> {
    match m {
        Outgoing::Ready(m) => Ok(m),
        Outgoing::Text(s) => Ok(Message::Text(s.bind(py).to_str()?.to_owned().into())),
    }
}

/// Queues the messages of waiting `send()` calls while there is room, and
/// completes those calls; fails them all once the socket is closed (or the
/// app's close is queued: nothing may follow it).
fn admit_sends(py: Python<'_>, ctx: &AppContext, ws: &WsShared) {
    let shared = &ctx.shared;
    let mut st = ws.lock();
    if st.send_waiters.is_empty() {
        return;
    }
    let mut done = Vec::new();
    let mut failed = Vec::new();
    if st.closed.is_some() || st.closing {
        failed.extend(st.send_waiters.drain(..).map(|p| p.waiter));
    } else {
        let mut queued = false;
        while has_room(&st, &shared.config) {
            let Some(p) = st.send_waiters.pop_front() else {
                break;
            };
            if is_done(p.waiter.bind(py)) {
                // Cancelled while it waited: its message is not sent.
                done.push((p.waiter, None));
                continue;
            }
            match outgoing_message(py, p.msg) {
                Ok(m) => {
                    st.push_outbound(m);
                    queued = true;
                    done.push((p.waiter, Some(Ok(()))));
                }
                Err(e) => done.push((p.waiter, Some(Err(e)))),
            }
        }
        if queued {
            wake_tokio(&mut st, shared);
        }
    }
    drop(st);
    for (w, outcome) in done {
        match outcome {
            Some(Ok(())) => {
                resolve(w.bind(py), py.None().into_bound(py));
            }
            Some(Err(e)) => {
                Waiter::complete(w.bind(py), Err(e));
            }
            None => {}
        }
    }
    for w in failed {
        fail_disconnected(w.bind(py), "the WebSocket is closed");
    }
}

impl WebSocketProtocol {
    pub(crate) fn new(ws: Arc<WsShared>, ctx: Arc<AppContext>) -> Self {
        Self {
            ws,
            ctx,
            st: Mutex::new(ProtoState {
                phase: Phase::Connecting,
                http_head: None,
                http_body: BytesMut::new(),
            }),
        }
    }

    fn client_left(&self) -> bool {
        self.ws.lock().closed.is_some()
    }

    /// Ends the exchange after an app failure or return: a 500 before the
    /// handshake was answered, a close with `code` once open.
    fn finish(&self, st: &mut ProtoState, code: u16) {
        let shared = &self.ctx.shared;
        match st.phase {
            Phase::Connecting | Phase::Handshake | Phase::Responding => {
                if !self.client_left() {
                    self.ws.decide(Decision::Respond(plain_500()), shared);
                }
                let mut ws = self.ws.lock();
                ws.closed.get_or_insert((ABNORMAL, String::new()));
            }
            Phase::Accepted => {
                let mut ws = self.ws.lock();
                if ws.closed.is_none() {
                    // Ahead of any send() still waiting (a task the app
                    // left behind): those fail, see `admit_sends`.
                    ws.push_outbound(Message::Close(Some(CloseFrame {
                        code: CloseCode::from(code),
                        reason: "".into(),
                    })));
                    wake_tokio(&mut ws, shared);
                    let waiting = !ws.send_waiters.is_empty();
                    drop(ws);
                    if waiting {
                        self.ws.needs_python(shared);
                    }
                }
            }
            Phase::Closed => {}
        }
        st.phase = Phase::Closed;
    }

    /// The app returned.
    pub(crate) fn on_return(&self, py: Python<'_>) {
        let mut st = self.st.lock();
        match st.phase {
            Phase::Connecting | Phase::Handshake if !self.client_left() => {
                self.ctx
                    .log_error(py, "ASGI callable returned without sending handshake", None);
            }
            Phase::Responding => {
                self.ctx.log_error(
                    py,
                    "ASGI callable returned without completing websocket.http.response",
                    None,
                );
            }
            _ => {}
        }
        // An app that returns while open closes normally (1000).
        self.finish(&mut st, 1000);
    }

    /// The app raised.
    pub(crate) fn on_error(&self, py: Python<'_>, err: PyErr) {
        let mut st = self.st.lock();
        if err.is_instance_of::<ClientDisconnected>(py) && self.client_left() {
            self.ctx.log(
                py,
                10,
                "ASGI WebSocket callable stopped: client disconnected",
            );
        } else {
            self.ctx
                .log_error(py, "Exception in ASGI application", Some(&err));
        }
        // 1011: the server met an unexpected condition (RFC 6455 §7.4.1).
        self.finish(&mut st, 1011);
    }

    /// The app's task was cancelled (shutdown): going away (1001).
    pub(crate) fn on_cancel(&self, _py: Python<'_>) {
        let mut st = self.st.lock();
        self.finish(&mut st, 1001);
    }

    /// Queues `msg` for the client now if there is room and no earlier
    /// `send()` waits; otherwise returns a waiter that completes once it is
    /// queued (see `admit_sends`).
    fn queue_or_wait<'py>(&self, py: Python<'py>, msg: Outgoing) -> PyResult<Bound<'py, PyAny>> {
        let shared = &self.ctx.shared;
        {
            let mut ws = self.ws.lock();
            if ws.closed.is_some() {
                return Err(ClientDisconnected::new_err("the WebSocket is closed"));
            }
            if ws.send_waiters.is_empty() && has_room(&ws, &shared.config) {
                ws.push_outbound(outgoing_message(py, msg)?);
                wake_tokio(&mut ws, shared);
                drop(ws);
                return self.ctx.done(py);
            }
        }
        // Created without the lock: allocating may run Python (the GC).
        let fut = self.ctx.waiter(py)?;
        let mut ws = self.ws.lock();
        if ws.closed.is_some() {
            return Err(ClientDisconnected::new_err("the WebSocket is closed"));
        }
        let mut stale = Vec::new();
        if ws.send_waiters.len() >= MAX_PENDING {
            stale = prune(&mut ws.send_waiters, |p| !is_done(p.waiter.bind(py)));
            if ws.send_waiters.len() >= MAX_PENDING {
                drop(ws);
                drop(stale);
                return Err(PyRuntimeError::new_err(format!(
                    "more than {MAX_PENDING} send() calls wait on one WebSocket \
                     (the client is not reading)"
                )));
            }
        }
        ws.send_waiters.push_back(PendingSend {
            waiter: fut.clone().unbind(),
            msg,
        });
        // Room may have appeared while the lock was released, with nobody
        // waiting then to be told.
        let room = has_room(&ws, &shared.config);
        drop(ws);
        drop(stale);
        if room {
            self.ws.needs_python(shared);
        }
        Ok(fut.into_any())
    }
}

#[pymethods]
impl WebSocketProtocol {
    /// `await receive()`: `websocket.connect` first, then `websocket.receive`
    /// messages, then `websocket.disconnect` with the peer's close code and
    /// reason (1005 if its close frame had none, 1006 if the connection
    /// dropped without one).
    ///
    /// Several tasks may wait in `receive()` at once (as uvicorn allows):
    /// each message goes to the longest-waiting one, and the disconnect to
    /// all of them. Raises `RuntimeError` beyond `MAX_PENDING` (1024)
    /// pending calls.
    fn receive<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        {
            let mut st = self.st.lock();
            if st.phase == Phase::Connecting {
                st.phase = Phase::Handshake;
                return ready(py, event(py, &names(py).websocket_connect)?.into_any());
            }
        }
        let shared = &self.ctx.shared;
        {
            let mut ws = self.ws.lock();
            let stale = pop_cancelled(py, &mut ws.recv_waiters);
            // Earlier callers come first.
            let m = match ws.recv_waiters.is_empty() {
                true => next_message(py, &mut ws, &self.ctx)?,
                false => None,
            };
            drop(ws);
            drop(stale);
            if let Some(m) = m {
                return ready(py, m);
            }
        }
        // Created without the lock: allocating may run Python (the GC).
        let fut = self.ctx.waiter(py)?;
        let mut ws = self.ws.lock();
        let mut stale = Vec::new();
        if ws.recv_waiters.len() >= MAX_PENDING {
            stale = prune(&mut ws.recv_waiters, |w| !is_done(w.bind(py)));
            if ws.recv_waiters.len() >= MAX_PENDING {
                drop(ws);
                drop(stale);
                return Err(PyRuntimeError::new_err(format!(
                    "more than {MAX_PENDING} receive() calls wait on one WebSocket"
                )));
            }
        }
        ws.recv_waiters.push_back(fut.clone().unbind());
        if ws.notify_idle {
            // The driver holds a close until the app has caught up: it has.
            wake_tokio(&mut ws, shared);
        }
        // A message (or the close) that arrived while the lock was
        // released, or one older waiters are about to get: deliver in order.
        let deliverable = !ws.inbound.is_empty() || ws.closed.is_some();
        drop(ws);
        drop(stale);
        if deliverable {
            self.ws.needs_python(shared);
        }
        Ok(fut.into_any())
    }

    /// `await send(message)`: `websocket.accept`, `websocket.send`,
    /// `websocket.close`, or `websocket.http.response.start`/`.body`.
    ///
    /// Raises `TypeError`/`RuntimeError` naming the field for an invalid
    /// message or one out of order, and `ClientDisconnected` (an `OSError`)
    /// once the connection is closed.
    fn send<'py>(
        &self,
        py: Python<'py>,
        message: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let n = names(py);
        // Every message of an open WebSocket: its keys read in one pass.
        if let Some([Some(t), bytes, text]) = message
            .cast::<PyDict>()
            .ok()
            .and_then(|d| keys_by_identity(d, [&n.type_, &n.bytes, &n.text]))
        {
            if t.cast::<PyString>().ok().and_then(|t| t.to_str().ok()) == Some("websocket.send") {
                let absent = |v: Option<Bound<'py, PyAny>>| v.filter(|v| !v.is_none());
                return self.send_message(py, absent(bytes), absent(text), self.st.lock());
            }
        }
        let (d, t) = message_type(message)?;
        let kind = t.to_str().unwrap_or("");
        if kind == "websocket.send" {
            // Read before the lock: a key's `__eq__` may be Python code.
            let (bytes, text) = (send::get(&d, &n.bytes)?, send::get(&d, &n.text)?);
            return self.send_message(py, bytes, text, self.st.lock());
        }
        let st = self.st.lock();
        match kind {
            "websocket.accept" => self.accept(py, &d, st),
            "websocket.close" => self.close(py, &d, st),
            "websocket.http.response.start" => self.response_start(py, &d, st),
            "websocket.http.response.body" => self.response_body(py, &d, st),
            other => Err(PyRuntimeError::new_err(format!(
                "unexpected ASGI message type {other:?} on a WebSocket connection"
            ))),
        }
    }
}

impl crate::bridge::owner::TaskOwner for WebSocketProtocol {
    fn on_return(&self, py: Python<'_>) {
        WebSocketProtocol::on_return(self, py);
    }

    fn on_error(&self, py: Python<'_>, err: PyErr) {
        WebSocketProtocol::on_error(self, py, err);
    }

    fn on_cancel(&self, py: Python<'_>) {
        WebSocketProtocol::on_cancel(self, py);
    }
}
