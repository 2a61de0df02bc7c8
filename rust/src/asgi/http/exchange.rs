//! The state one HTTP request/response shares between the Tokio task that
//! serves its connection and the asyncio Task that runs the application.
//!
//! Both sides lock [`Exchange::st`] for a few instructions at a time; neither
//! ever waits on the other while holding it, and the Tokio side never touches
//! Python objects (the waiters are only read or replaced under the GIL).
//!
//! Capacity rules (every queue here is bounded):
//! * request body: the Tokio side stops reading from the socket once
//!   `body_bytes >= body_buffer` (backpressure to the client); chunks under
//!   [`MERGE_BELOW`] join the last queued one, so that the bound in bytes
//!   also bounds the entries;
//! * response body: `send()` queues its chunk and then waits while
//!   `out_bytes >= send_buffer` (backpressure to the app), so at most one
//!   chunk beyond the limit is ever held. A file region
//!   (`http.response.zerocopysend`) counts its unread bytes, so the queue
//!   holds at most one region's descriptor beyond the limit.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, StatusCode};
use parking_lot::{Mutex, MutexGuard};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::asgi::context::{AppContext, WakeSlot};
pub(crate) use crate::asgi::http::response::{Aborted, BodyOut, Out, ResponseHead};
use crate::bridge::queue::Wake;
use crate::bridge::waiter::Waiter;
use crate::worker::Worker;

/// Once this many interim responses wait in one exchange for the wire,
/// the app's `send()` waits until the Tokio side took them.
pub(crate) const MAX_QUEUED: usize = 16;

/// What the service waits for: interim responses come before the head.
pub(crate) enum Awaited {
    Interim(Vec<(StatusCode, HeaderMap)>),
    Head(ResponseHead),
}

/// Mutable state; see the module docs for who touches what.
#[derive(Default)]
pub(crate) struct ExchState {
    // ---- response: Python → Tokio
    pub(crate) head: Option<ResponseHead>,
    pub(crate) out: VecDeque<Out>,
    /// Body bytes queued and not yet handed to hyper (including the unread
    /// rest of a file region being read).
    pub(crate) out_bytes: usize,
    /// File regions in `out` (each holds a descriptor): `send()` waits
    /// while one is queued, so a response holds at most two (one queued,
    /// one being read) however small its regions.
    pub(crate) out_files: usize,
    pub(crate) out_end: bool,
    /// The trailer section, written after the last chunk.
    pub(crate) out_trailers: Option<HeaderMap>,
    pub(crate) out_abort: bool,
    /// Interim (1xx) responses, each written before the head
    /// (`http.response.early_hint`, `http.response.informational`).
    pub(crate) interim: Vec<(StatusCode, HeaderMap)>,
    /// When the app was called (`server_timing`).
    pub(crate) app_started: Option<std::time::Instant>,
    /// The Tokio task waiting for the head, a chunk, or room to read body.
    pub(crate) tokio_waker: Option<Waker>,
    /// asyncio futures of `send()` calls waiting for room in `out` (several
    /// tasks may send on one response).
    pub(crate) send_waiters: Vec<Py<Waiter>>,
    // ---- request body: Tokio → Python
    pub(crate) body: VecDeque<Bytes>,
    pub(crate) body_bytes: usize,
    pub(crate) body_end: bool,
    /// The app has called `receive()`: gates `100 Continue`.
    pub(crate) body_wanted: bool,
    /// asyncio futures of `receive()` calls waiting for data or a
    /// disconnect, oldest first (several tasks may receive at once, as
    /// under uvicorn: sse-starlette listens for the disconnect while the
    /// handler polls).
    pub(crate) recv_waiters: VecDeque<Py<Waiter>>,
    /// The final `http.request` (`more_body` false) was delivered.
    pub(crate) request_complete: bool,
    /// The client shut its sending side down: once the request is
    /// delivered, `receive()` reports `http.disconnect` (the response can
    /// still be written).
    pub(crate) eof: bool,
    /// With `eof`: the socket to peek at for a reset (see
    /// [`Exchange::gone_now`]).
    /// Weak: the connection owns the duplicate and closes it with the
    /// socket, so an app that runs on never holds the socket open.
    pub(crate) eof_probe: Option<std::sync::Weak<OwnedFd>>,
    // ---- lifecycle
    /// The client went away (or the connection failed) before the response
    /// was fully written.
    pub(crate) gone: bool,
    /// The app sent its final body (or a 500 was produced): `receive()`
    /// now answers `http.disconnect`.
    pub(crate) responded: bool,
    /// The server answers this request itself (a bad or too large body, a
    /// timeout): status and a one-line reason, used if the app has not
    /// started its response.
    pub(crate) rejected: Option<(StatusCode, &'static str)>,
    /// Request-body bytes read so far (for `max_body_size`).
    pub(crate) body_total: u64,
    // ---- access log: one line per response written or started
    /// The scope to log with (only when access logging is on; set by the
    /// asyncio thread when the app starts, taken when the line is written).
    pub(crate) access_scope: Option<Py<PyDict>>,
    /// The status hyper was handed (0: none yet): the app's, or the
    /// server's own answer to a rejected request.
    pub(crate) wire_status: u16,
    /// Body bytes handed to hyper so far.
    pub(crate) wire_bytes: u64,
    /// The server answered a request the app was serving (408/413/503):
    /// its line is the asyncio thread's to write.
    pub(crate) rejection_unlogged: bool,
    /// When the request head was read (access logging on): the server's
    /// own answer's line counts its time from there.
    pub(crate) received: Option<std::time::Instant>,
    /// Whether the app's trailers (ASGI trailers extension) go out.
    pub(crate) trailers: TrailersWanted,
}

/// Whether a response's trailer fields are written: only to a client that
/// sent `TE: trailers` (RFC 9110 §6.5.1, the ASGI trailers extension).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum TrailersWanted {
    /// No `TE: trailers`: the body ends without them.
    #[default]
    No,
    /// HTTP/1.1 with `TE: trailers`: the fields the `Trailer` header names.
    Named,
    /// HTTP/2 with `TE: trailers`: all of them.
    Yes,
}

impl TrailersWanted {
    /// From the request's version and `TE` fields.
    pub(crate) fn of(version: http::Version, headers: &HeaderMap) -> Self {
        let asked = headers
            .get_all(http::header::TE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| {
                t.split(';')
                    .next()
                    .is_some_and(|t| t.trim().eq_ignore_ascii_case("trailers"))
            });
        match (asked, version) {
            (false, _) => Self::No,
            (true, http::Version::HTTP_2 | http::Version::HTTP_3) => Self::Yes,
            (true, _) => Self::Named,
        }
    }
}

/// Worker per-request state. See the module docs.
#[derive(Default)]
pub(crate) struct Exchange {
    st: Mutex<ExchState>,
    /// Its place in the event queue and the application context its wakes
    /// run in (see [`Exchange::attach`]).
    wake: WakeSlot,
}

impl Wake for Exchange {
    fn unqueue(&self) {
        self.wake.unqueue();
    }

    fn wake(self: Arc<Self>, py: Python<'_>) {
        if let Some(ctx) = self.wake.app() {
            crate::asgi::http::protocol::on_wake(py, ctx, &self);
        }
    }
}

/// Request-body chunks under this many bytes join the last queued chunk
/// while it stays under it too. `body_buffer` bounds the queue in bytes; a
/// client sending a byte per DATA frame (HTTP/2, HTTP/3) or per chunk
/// (HTTP/1.1) would otherwise queue an entry per byte: ~60 bytes of memory
/// each, and an `http.request` message each for the app. uvicorn hands the
/// app everything buffered as one message; this keeps chunks apart above
/// 4 KiB.
pub(crate) const MERGE_BELOW: usize = 4 * 1024;

/// Queues `data` on `body` as the app will receive it: joined to the last
/// chunk when both fit in [`MERGE_BELOW`] (and `max_chunk`), else in chunks
/// of at most `max_chunk` bytes (`body_chunk_size`).
fn enqueue(body: &mut VecDeque<Bytes>, mut data: Bytes, max_chunk: usize) {
    if data.is_empty() || merge_into_last(body, &data, MERGE_BELOW.min(max_chunk)) {
        return;
    }
    while data.len() > max_chunk {
        body.push_back(data.split_to(max_chunk));
    }
    body.push_back(data);
}

/// Appends `data` to the last chunk of `body` if both fit in `limit` bytes;
/// `false` (nothing done) otherwise. The last chunk is copied once if it
/// is shared (a slice of a read buffer), into room for twice what it then
/// holds: a copy never holds more than twice its bytes.
fn merge_into_last(body: &mut VecDeque<Bytes>, data: &Bytes, limit: usize) -> bool {
    let Some(last) = body.back_mut() else {
        return false;
    };
    let len = last.len() + data.len();
    if len > limit {
        return false;
    }
    let mut joined = std::mem::take(last)
        .try_into_mut()
        .unwrap_or_else(|shared| {
            let mut m = BytesMut::with_capacity((len * 2).min(limit));
            m.extend_from_slice(&shared);
            m
        });
    joined.extend_from_slice(data);
    *last = joined.freeze();
    true
}

impl Exchange {
    /// An exchange for a request without a body.
    pub(crate) fn bodyless() -> Self {
        Self::complete(Bytes::new(), usize::MAX)
    }

    /// An exchange whose request body is already complete, queued in
    /// chunks of at most `body_chunk_size` bytes, as
    /// [`Exchange::push_body`] queues them.
    pub(crate) fn with_complete_body(body: Bytes, shared: &Worker) -> Self {
        Self::complete(body, shared.config.body_chunk_size)
    }

    #[inline]
    fn complete(body: Bytes, max_chunk: usize) -> Self {
        // Built in place: no lock taken on a state nobody else sees yet.
        let mut st = ExchState {
            body_end: true,
            ..ExchState::default()
        };
        st.body_bytes = body.len();
        enqueue(&mut st.body, body, max_chunk);
        Exchange {
            st: Mutex::new(st),
            wake: WakeSlot::default(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, ExchState> {
        self.st.lock()
    }

    /// Asks the asyncio thread to look at this exchange's waiters, unless it
    /// is already queued.
    pub(crate) fn needs_python(self: &Arc<Self>, shared: &Worker) {
        self.wake.queue(self, shared);
    }

    /// Ties the exchange to the application context its wakes run in (once,
    /// before its request is queued).
    pub(crate) fn attach(&self, app: &Arc<AppContext>) {
        self.wake.attach(app);
    }

    // ------------------------------------------------------------ Tokio side

    /// Waits for the response head (the app's, or the server's own answer
    /// once the request was [rejected](Self::reject)); interim responses
    /// the app sent before it come first.
    pub(crate) fn poll_head(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        shared: &Worker,
    ) -> Poll<Awaited> {
        let mut st = self.st.lock();
        if !st.interim.is_empty() {
            let list = std::mem::take(&mut st.interim);
            if !st.send_waiters.is_empty() {
                // A send() waits for room among the interim responses.
                drop(st);
                self.needs_python(shared);
            }
            return Poll::Ready(Awaited::Interim(list));
        }
        if let Some(head) = st.head.take() {
            st.wire_status = head.status.as_u16();
            match &head.body {
                BodyOut::Full(b) => st.wire_bytes = b.len() as u64,
                BodyOut::File { len, .. } => st.wire_bytes = *len,
                BodyOut::Stream => {}
            }
            return Poll::Ready(Awaited::Head(head));
        }
        if let Some((status, reason)) = st.rejected {
            st.wire_status = status.as_u16();
            st.wire_bytes = reason.len() as u64;
            if st.access_scope.is_some() {
                st.rejection_unlogged = true;
                drop(st);
                self.needs_python(shared);
            }
            let mut head = ResponseHead::plain(status, reason);
            crate::worker::watchdog::mark_refusal(reason, &mut head.headers);
            return Poll::Ready(Awaited::Head(head));
        }
        register(&mut st.tokio_waker, cx);
        Poll::Pending
    }

    /// Next response piece: `Some(Ok)` data or a file region (whose bytes
    /// are [`consumed`](Self::consumed) as they are read), `None` the end,
    /// `Some(Err)` when the app failed mid-stream.
    pub(crate) fn poll_chunk(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        shared: &Worker,
    ) -> Poll<Option<Result<Out, Aborted>>> {
        let mut st = self.st.lock();
        if let Some(chunk) = st.out.pop_front() {
            let wake = match &chunk {
                Out::Data(b) => take_out(&mut st, b.len(), true, shared),
                Out::File(_) => {
                    st.out_files -= 1;
                    st.out_files == 0
                        && st.out_bytes < shared.config.send_buffer
                        && !st.send_waiters.is_empty()
                }
            };
            if wake {
                drop(st);
                self.needs_python(shared);
            }
            return Poll::Ready(Some(Ok(chunk)));
        }
        if st.out_abort || (st.gone && !st.out_end) {
            // A failed app, or a client whose request failed mid-body: the
            // response must not look complete.
            return Poll::Ready(Some(Err(Aborted)));
        }
        if st.out_end {
            return Poll::Ready(None);
        }
        register(&mut st.tokio_waker, cx);
        Poll::Pending
    }

    /// `n` queued body bytes left the queue: handed to hyper (`wired`), or
    /// dropped (a file region that could not be read). Wakes `send()`
    /// callers waiting for room.
    pub(crate) fn consumed(self: &Arc<Self>, n: usize, wired: bool, shared: &Worker) {
        let mut st = self.st.lock();
        if take_out(&mut st, n, wired, shared) {
            drop(st);
            self.needs_python(shared);
        }
    }

    /// Every byte of the response was handed to hyper: a body hyper drops
    /// now (it stops polling once a `Content-Length` is reached) was
    /// written whole, not cut off by the client.
    pub(crate) fn wire_complete(&self) -> bool {
        let st = self.st.lock();
        st.out_end && st.out.is_empty() && st.out_bytes == 0 && !st.out_abort
    }

    /// The client is gone (or counts as gone: see `next_message`).
    pub(crate) fn is_gone(&self) -> bool {
        self.st.lock().gone
    }

    /// Whether the Tokio side should read more request body now.
    pub(crate) fn wants_body(&self, shared: &Worker, expect_continue: bool) -> bool {
        let st = self.st.lock();
        !st.gone
            && !st.body_end
            && st.body_bytes < shared.config.body_buffer
            && (st.body_wanted || !expect_continue)
    }

    /// Queues request-body data, split into chunks the app may receive.
    /// A body growing past `max_body_size` rejects the request (413).
    pub(crate) fn push_body(self: &Arc<Self>, data: Bytes, shared: &Worker) {
        let max = shared.config.body_chunk_size;
        let mut st = self.st.lock();
        st.body_total += data.len() as u64;
        let limit = shared.config.max_body_size;
        if limit > 0 && st.body_total > limit {
            drop(st);
            self.reject(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body too large",
                shared,
            );
            return;
        }
        st.body_bytes += data.len();
        enqueue(&mut st.body, data, max);
        let wake = !st.recv_waiters.is_empty();
        drop(st);
        if wake {
            self.needs_python(shared);
        }
    }

    /// The request body is complete.
    pub(crate) fn end_body(self: &Arc<Self>, shared: &Worker) {
        let mut st = self.st.lock();
        st.body_end = true;
        let wake = !st.recv_waiters.is_empty();
        drop(st);
        if wake {
            self.needs_python(shared);
        }
    }

    /// The client shut its sending side down (maybe only that: a half
    /// close). Wakes a `receive()` waiting past the request's end.
    pub(crate) fn client_eof(
        self: &Arc<Self>,
        shared: &Worker,
        probe: Option<std::sync::Weak<OwnedFd>>,
    ) {
        let mut st = self.st.lock();
        if st.eof {
            return;
        }
        st.eof = true;
        st.eof_probe = probe;
        let wake = !st.recv_waiters.is_empty();
        drop(st);
        if wake {
            self.needs_python(shared);
        }
    }

    /// The client went away (or its connection failed) before the response
    /// was written: wake whatever the app is waiting on.
    pub(crate) fn mark_gone(self: &Arc<Self>, shared: &Worker) {
        let mut st = self.st.lock();
        if st.gone {
            return;
        }
        st.gone = true;
        st.body_end = true;
        let wake = !st.recv_waiters.is_empty() || !st.send_waiters.is_empty();
        drop(st);
        if wake {
            self.needs_python(shared);
        }
    }

    /// Whether the client is gone, as `send()` must know it: marked gone
    /// already, or it sent an end of stream and its socket has since
    /// reported a reset. A client's kernel answers data sent after it
    /// closed with a reset, while a half-closed client (RFC 9112 §9.6)
    /// takes the data, so the first write after the end of stream tells
    /// them apart; the peek (`MSG_PEEK | MSG_DONTWAIT`, one syscall, only
    /// after an end of stream) reads that answer, so the app's next
    /// `send()` raises, as uvicorn's does (it treats any end of stream as
    /// the client leaving). Python side.
    pub(crate) fn gone_now(&self, shared: &Worker) -> bool {
        let mut st = self.st.lock();
        if st.gone {
            return true;
        }
        let Some(fd) = st.eof_probe.as_ref().and_then(std::sync::Weak::upgrade) else {
            // No end of stream, or the connection is over (its end marked
            // the exchange gone if the response was not complete).
            return false;
        };
        if !peer_reset(&fd) {
            return false;
        }
        st.gone = true;
        st.body_end = true;
        // The response body waiting for a chunk ends (aborted), so hyper
        // closes the connection now rather than at a timeout.
        wake_tokio(&mut st, shared);
        true
    }

    /// The server answers this request itself: the app sees
    /// `http.disconnect`, and the client gets `status` (with `Connection:
    /// close`) unless the app's response has started, in which case the
    /// connection is closed.
    pub(crate) fn reject(
        self: &Arc<Self>,
        status: StatusCode,
        reason: &'static str,
        shared: &Worker,
    ) {
        // Tokio side: the waker is woken directly (never through the
        // asyncio-side batch, which needs the GIL: taking it while holding
        // this lock could deadlock with `receive()`).
        let waker = {
            let mut st = self.st.lock();
            if st.rejected.is_none() {
                st.rejected = Some((status, reason));
                shared.metrics.refused_answer(status, reason);
            }
            st.tokio_waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        self.mark_gone(shared);
    }

    // ----------------------------------------------------------- Python side

    /// Hands the response head to the Tokio side.
    pub(crate) fn respond(&self, head: ResponseHead, shared: &Worker) {
        let mut st = self.st.lock();
        st.head = Some(head);
        wake_tokio(&mut st, shared);
    }

    /// Queues an interim response for the wire, before the head. Returns
    /// false when [`MAX_QUEUED`] now wait: `send()` must wait too.
    pub(crate) fn push_interim(
        &self,
        status: StatusCode,
        headers: HeaderMap,
        shared: &Worker,
    ) -> bool {
        let mut st = self.st.lock();
        st.interim.push((status, headers));
        wake_tokio(&mut st, shared);
        st.interim.len() < MAX_QUEUED
    }

    /// Queues a response chunk (`end` marks the last one). Returns whether
    /// the queue is now at or above its limit, i.e. `send()` must wait.
    pub(crate) fn push_out(&self, chunk: impl Into<Out>, end: bool, shared: &Worker) -> bool {
        let chunk = chunk.into();
        let mut st = self.st.lock();
        if !chunk.is_empty() {
            st.out_bytes += chunk.len();
            st.out_files += matches!(chunk, Out::File(_)) as usize;
            st.out.push_back(chunk);
        }
        st.out_end |= end;
        let full = !st.has_room(shared.config.send_buffer) && !end;
        wake_tokio(&mut st, shared);
        full
    }

    /// Ends the response with a trailer section.
    pub(crate) fn push_trailers(&self, trailers: HeaderMap, shared: &Worker) {
        let mut st = self.st.lock();
        st.out_trailers = Some(trailers);
        st.out_end = true;
        wake_tokio(&mut st, shared);
    }

    /// The trailer section, once the chunks are out (taken once).
    pub(crate) fn take_trailers(&self) -> Option<HeaderMap> {
        self.st.lock().out_trailers.take()
    }

    /// The app failed mid-stream: the connection will be closed.
    pub(crate) fn abort(&self, shared: &Worker) {
        let mut st = self.st.lock();
        st.out_abort = true;
        wake_tokio(&mut st, shared);
    }

    /// Room freed in the request-body buffer, or the app started reading:
    /// let the Tokio side read more.
    pub(crate) fn resume_body(&self, st: &mut ExchState, shared: &Worker) {
        wake_tokio(st, shared);
    }
}

/// Accounts for `n` bytes leaving the response queue; returns whether
/// `send()` callers waiting for room must be woken.
fn take_out(st: &mut ExchState, n: usize, wired: bool, shared: &Worker) -> bool {
    let was_full = st.out_bytes >= shared.config.send_buffer;
    st.out_bytes = st.out_bytes.saturating_sub(n);
    if wired {
        st.wire_bytes += n as u64;
    }
    was_full && st.has_room(shared.config.send_buffer) && !st.send_waiters.is_empty()
}

impl ExchState {
    /// Whether `send()` may queue more: under `send_buffer` bytes, no file
    /// region and fewer than `MAX_QUEUED` interim responses waiting.
    pub(crate) fn has_room(&self, send_buffer: usize) -> bool {
        self.out_bytes < send_buffer && self.out_files == 0 && self.interim.len() < MAX_QUEUED
    }
}

fn register(slot: &mut Option<Waker>, cx: &mut Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

/// Asyncio side only (see [`Wakeups::wake`](crate::bridge::wake::Wakeups::wake)).
/// Whether the connection under `fd` is dead: the client's kernel reset
/// it (it closed, and our data reached it). A half-closed client's TCP
/// connection stays in CLOSE_WAIT; a reset moves it to CLOSE (read with
/// `TCP_INFO`, which changes nothing; a `recv` peek cannot tell: after an
/// end of stream it returns 0 before any pending error). A Unix socket has
/// no state to read: a pending error (`SO_ERROR`) tells instead.
fn peer_reset(fd: &OwnedFd) -> bool {
    /// Linux's `TCP_CLOSE` (`include/net/tcp_states.h`; not in `libc`).
    const TCP_CLOSE: u8 = 7;
    let mut info = std::mem::MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `fd` is an open descriptor we own; `info` is a writable
    // buffer of `len` bytes, which the kernel fills at most.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc == 0 && len >= 1 {
        // SAFETY: zero-initialised, and the kernel wrote `len` >= 1 bytes;
        // every field is a plain integer.
        let info = unsafe { info.assume_init() };
        return info.tcpi_state == TCP_CLOSE;
    }
    use nix::sys::socket::{getsockopt, sockopt::SocketError};
    matches!(getsockopt(fd, SocketError), Ok(e) if e != 0)
}

fn wake_tokio(st: &mut ExchState, shared: &Worker) {
    if let Some(w) = st.tokio_waker.take() {
        shared.wakeups.wake(w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::task::Waker;

    fn shared(body_chunk_size: usize, body_buffer: usize, send_buffer: usize) -> Worker {
        Worker::new(
            Config {
                body_chunk_size,
                body_buffer,
                send_buffer,
                ..Config::default()
            },
            None,
        )
        .unwrap()
    }

    #[test]
    fn request_body_is_split_into_bounded_chunks() {
        let s = shared(4, 100, 100);
        let ex = Arc::new(Exchange::default());
        ex.push_body(Bytes::from_static(b"0123456789"), &s);
        let st = ex.lock();
        let sizes: Vec<usize> = st.body.iter().map(Bytes::len).collect();
        assert_eq!(sizes, vec![4, 4, 2]);
        assert_eq!(st.body_bytes, 10);
    }

    #[test]
    fn a_complete_body_is_split_into_bounded_chunks_too() {
        let s = shared(4, 100, 100);
        let ex = Exchange::with_complete_body(Bytes::from_static(b"0123456789"), &s);
        let st = ex.lock();
        let sizes: Vec<usize> = st.body.iter().map(Bytes::len).collect();
        assert_eq!(sizes, vec![4, 4, 2]);
        assert_eq!(st.body_bytes, 10);
        assert!(st.body_end);
    }

    #[test]
    fn tiny_chunks_join_the_last_one_up_to_the_merge_limit() {
        let s = shared(64 * 1024, 1 << 20, 100);
        let ex = Arc::new(Exchange::default());
        for _ in 0..5000 {
            ex.push_body(Bytes::from_static(b"x"), &s);
        }
        ex.push_body(Bytes::from(vec![b'y'; 10_000]), &s);
        ex.push_body(Bytes::from_static(b"z"), &s);
        let st = ex.lock();
        let sizes: Vec<usize> = st.body.iter().map(Bytes::len).collect();
        assert_eq!(sizes, vec![MERGE_BELOW, 5000 - MERGE_BELOW, 10_000, 1]);
        assert_eq!(st.body_bytes, 15_001);
        let all: Vec<u8> = st.body.iter().flat_map(|b| b.to_vec()).collect();
        assert!(
            all[..5000].iter().all(|&b| b == b'x') && all[5000..15_000].iter().all(|&b| b == b'y')
        );
        assert_eq!(all[15_000], b'z');
    }

    #[test]
    fn reading_pauses_when_the_body_buffer_is_full() {
        let s = shared(64, 8, 100);
        let ex = Arc::new(Exchange::default());
        assert!(ex.wants_body(&s, false));
        ex.push_body(Bytes::from_static(b"12345678"), &s);
        assert!(
            !ex.wants_body(&s, false),
            "full buffer: stop reading the socket"
        );
    }

    #[test]
    fn expect_continue_waits_for_the_app_to_ask() {
        let s = shared(64, 100, 100);
        let ex = Arc::new(Exchange::default());
        assert!(!ex.wants_body(&s, true));
        ex.lock().body_wanted = true;
        assert!(ex.wants_body(&s, true));
    }

    #[test]
    fn response_chunks_then_end() {
        let s = shared(64, 100, 100);
        let ex = Arc::new(Exchange::default());
        let mut cx = Context::from_waker(Waker::noop());
        assert!(ex.poll_chunk(&mut cx, &s).is_pending());
        assert!(!ex.push_out(Bytes::from_static(b"ab"), false, &s));
        assert!(!ex.push_out(Bytes::from_static(b""), true, &s));
        match ex.poll_chunk(&mut cx, &s) {
            Poll::Ready(Some(Ok(Out::Data(b)))) => assert_eq!(&b[..], b"ab"),
            _ => panic!("expected the chunk"),
        }
        assert!(matches!(ex.poll_chunk(&mut cx, &s), Poll::Ready(None)));
    }

    #[test]
    fn send_buffer_limit_reports_full() {
        let s = shared(64, 100, 4);
        let ex = Arc::new(Exchange::default());
        assert!(ex.push_out(Bytes::from_static(b"12345"), false, &s));
    }

    #[test]
    fn abort_is_reported_after_queued_chunks() {
        let s = shared(64, 100, 100);
        let ex = Arc::new(Exchange::default());
        let mut cx = Context::from_waker(Waker::noop());
        ex.push_out(Bytes::from_static(b"x"), false, &s);
        ex.abort(&s);
        assert!(matches!(
            ex.poll_chunk(&mut cx, &s),
            Poll::Ready(Some(Ok(_)))
        ));
        assert!(matches!(
            ex.poll_chunk(&mut cx, &s),
            Poll::Ready(Some(Err(Aborted)))
        ));
    }

    #[test]
    fn gone_ends_the_request_body() {
        let s = shared(64, 100, 100);
        let ex = Arc::new(Exchange::default());
        ex.mark_gone(&s);
        let st = ex.lock();
        assert!(st.gone && st.body_end);
    }
}
