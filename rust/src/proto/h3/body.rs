//! An HTTP/3 request stream's two halves as the shared service sees them:
//! the receiving half as an `http_body::Body` ([`H3Body`]), and the
//! response written from a [`ResponseBody`] onto the sending half
//! ([`respond`]), frame by frame as QUIC flow control allows.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ::h3::server::RequestStream;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::task::AtomicWaker;
use http::{HeaderMap, HeaderValue, Response};
use http_body::{Body, Frame, SizeHint};

use crate::http::body::ResponseBody;
use crate::http::interim::{encode_h1, InterimSlot};

/// The receiving half of a request stream.
pub(crate) type RecvHalf = RequestStream<super::head::GuardedRecvHalf, Bytes>;
/// A request stream, both halves.
pub(crate) type Stream = RequestStream<super::head::GuardedBidi<Bytes>, Bytes>;
/// The sending half of a request stream.
pub(crate) type SendHalf = RequestStream<super::streams::Send<Bytes>, Bytes>;

/// Why a request body failed: the stream's own error, or a body that does
/// not match its `content-length` (a malformed request, RFC 9114 §4.1.2).
#[derive(Debug)]
pub(crate) enum BodyError {
    Stream(::h3::error::StreamError),
    Length,
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Stream(e) => write!(f, "HTTP/3 request stream: {e}"),
            BodyError::Length => f.write_str("HTTP/3 request body does not match content-length"),
        }
    }
}

impl std::error::Error for BodyError {}

/// Most request-body bytes handed to the service in one frame.
const COALESCE: usize = 64 * 1024;

/// Where the body is: DATA frames, then trailers, then done.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    Data,
    Trailers,
    Done,
}

/// What a request's body tells the request's task, in one allocation:
/// the body turned out malformed, or the client reset its sending half.
#[derive(Default)]
pub(crate) struct BodyFlags {
    /// Set when the body does not match `declared`, or its trailers carry
    /// a pseudo-header: the request is malformed, and [`respond`] resets
    /// the stream instead of answering.
    pub(crate) malformed: AtomicBool,
    /// Set when the client resets its sending half (RESET_STREAM).
    reset: AtomicBool,
    /// The request's task, woken when `reset` is set.
    waker: AtomicWaker,
}

impl BodyFlags {
    fn set_reset(&self) {
        self.reset.store(true, Ordering::Release);
        self.waker.wake();
    }

    fn is_reset(&self) -> bool {
        self.reset.load(Ordering::Acquire)
    }

    /// Resolves once the client has reset the body; one task at a time
    /// (the request's) may wait for it.
    pub(crate) async fn client_reset(&self) {
        poll_fn(|cx| {
            if self.is_reset() {
                return Poll::Ready(());
            }
            self.waker.register(cx.waker());
            // Set between the check and the registration: not woken.
            if self.is_reset() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

/// A request body read from the receiving half of its stream. An error
/// (the connection closed, a malformed body) reaches the service, which
/// tells the app `http.disconnect`. The client resetting its sending half
/// (RESET_STREAM) is told to the request's task instead ([`BodyFlags`]) and the body goes quiet:
/// the request's task then drops the service, as hyper does on HTTP/2's
/// RST_STREAM, so that no answer of the server's own (a `400`) is written
/// or access-logged for a client that left.
pub(crate) struct H3Body {
    recv: RecvHalf,
    stage: Stage,
    /// The declared `content-length`, if any.
    declared: Option<u64>,
    /// Bytes read so far.
    seen: u64,
    /// A chunk read by [`H3Body::prime`], handed out first.
    first: Option<Bytes>,
    /// An error met after data that was handed out first.
    error: Option<BodyError>,
    /// What the body tells the request's task (see [`BodyFlags`]).
    flags: Arc<BodyFlags>,
    /// `Expect: 100-continue`: the request's interim slot, where the first
    /// read (the app awaits `receive()`) queues the `100` the client waits
    /// for (RFC 9110 §10.1.1); taken then.
    continue_to: Option<Arc<InterimSlot>>,
}

impl H3Body {
    /// The body of a request whose head declared `declared` bytes;
    /// `flags`: where it tells the request's task that the body turned out
    /// malformed or the client reset it; `continue_to`: its interim slot
    /// if the client expects a `100`.
    pub(crate) fn new(
        recv: RecvHalf,
        declared: Option<u64>,
        (flags, continue_to): (Arc<BodyFlags>, Option<Arc<InterimSlot>>),
    ) -> Self {
        H3Body {
            recv,
            stage: Stage::Data,
            declared,
            seen: 0,
            first: None,
            error: None,
            flags,
            continue_to,
        }
    }

    /// The first read of a body the client holds back for a `100
    /// Continue`: queues it (not if body bytes came anyway).
    fn send_continue(&mut self) {
        if let Some(slot) = self.continue_to.take() {
            if self.seen == 0 && self.first.is_none() && self.stage == Stage::Data {
                slot.load(encode_h1(&[(http::StatusCode::CONTINUE, HeaderMap::new())]));
            }
        }
    }

    /// Polls the stream once, so that a request whose stream already ended
    /// (a GET: HEADERS and FIN in one packet) reaches the service as
    /// bodyless, with no body to pump.
    pub(crate) async fn prime(&mut self) {
        poll_fn(|cx| {
            // DATA is read even when `content-length: 0` is declared: h3
            // asks for the stream's DATA to be drained before its
            // trailers are read (it panics otherwise), and DATA there
            // makes the request malformed, not the connection.
            if self.stage == Stage::Data {
                match self.recv.poll_recv_data(cx) {
                    Poll::Ready(Ok(Some(mut buf))) => {
                        let data = buf.copy_to_bytes(buf.remaining());
                        self.seen += data.len() as u64;
                        self.first = Some(data);
                    }
                    Poll::Ready(Ok(None)) => self.stage = Stage::Trailers,
                    // Reported on the service's first poll.
                    Poll::Ready(Err(e)) => self.note_reset(&e),
                    Poll::Pending => {}
                }
                if self.length_broken() {
                    // Not one byte of a malformed body reaches the app.
                    self.first = None;
                }
            }
            if self.stage == Stage::Trailers && self.first.is_none() {
                if let Poll::Ready(Ok(None)) = self.recv.poll_recv_trailers(cx) {
                    self.stage = Stage::Done;
                }
            }
            Poll::Ready(())
        })
        .await
    }

    /// The next DATA: every chunk QUIC already holds for the stream, up to
    /// [`COALESCE`] bytes, as one frame (a QUIC packet carries ~1.2 KB:
    /// one `http.request` message each would cost the app a message per
    /// packet).
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let mut first: Option<Bytes> = None;
        let mut more: Option<BytesMut> = None;
        let mut got = 0usize;
        while got < COALESCE {
            match self.recv.poll_recv_data(cx) {
                Poll::Pending => break,
                Poll::Ready(Ok(Some(mut buf))) => {
                    let n = buf.remaining();
                    got += n;
                    match (&first, &mut more) {
                        (None, _) => first = Some(buf.copy_to_bytes(n)),
                        (Some(f), None) => {
                            let mut m = BytesMut::with_capacity(self.coalesce_room(f.len() + n));
                            m.extend_from_slice(f);
                            m.put(buf);
                            more = Some(m);
                        }
                        (Some(_), Some(m)) => m.put(buf),
                    }
                }
                Poll::Ready(Ok(None)) => {
                    self.stage = Stage::Trailers;
                    break;
                }
                Poll::Ready(Err(e)) => {
                    self.stage = Stage::Done;
                    self.error = Some(self.failed(e));
                    break;
                }
            }
        }
        self.seen += got as u64;
        self.length_broken();
        let data = match more {
            Some(m) => Some(m.freeze()),
            None => first,
        };
        if let Some(data) = data {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(e) = self.error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        match self.stage {
            Stage::Trailers => self.poll_trailers(cx),
            _ => Poll::Pending,
        }
    }

    fn poll_trailers(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.recv.poll_recv_trailers(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(t)) => {
                self.stage = Stage::Done;
                Poll::Ready(t.map(|t| Ok(Frame::trailers(t))))
            }
            Poll::Ready(Err(e)) => {
                self.stage = Stage::Done;
                Poll::Ready(Some(Err(self.failed(e))))
            }
        }
    }
}

impl Body for H3Body {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        this.send_continue();
        if let Some(data) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if this.flags.is_reset() {
            // The request's task drops the service (it was woken).
            return Poll::Pending;
        }
        if let Some(e) = this.error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        let got = match this.stage {
            Stage::Data => this.poll_data(cx),
            Stage::Trailers => this.poll_trailers(cx),
            Stage::Done => Poll::Ready(None),
        };
        match got {
            Poll::Ready(Some(Err(_))) if this.flags.is_reset() => Poll::Pending,
            got => got,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.stage == Stage::Done && self.first.is_none() && self.error.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.declared {
            Some(d) => SizeHint::with_exact(d.saturating_sub(self.seen) + self.pending()),
            None => SizeHint::default(),
        }
    }
}

impl H3Body {
    /// The body's error for the stream's `e`. A field section the stream's
    /// check found malformed (pseudo-headers in trailers: `e` is
    /// `H3_MESSAGE_ERROR`, see [`super::head`]) makes the request
    /// malformed.
    fn failed(&mut self, e: ::h3::error::StreamError) -> BodyError {
        if matches!(&e, ::h3::error::StreamError::RemoteTerminate { code, .. } if *code == MESSAGE_ERROR)
        {
            self.flags.malformed.store(true, Ordering::Relaxed);
        }
        self.note_reset(&e);
        BodyError::Stream(e)
    }

    /// Tells the request's task if `e` is the client's RESET_STREAM (any
    /// code but H3_MESSAGE_ERROR, which is Skirr's own check of the
    /// trailers, see [`super::head`]).
    fn note_reset(&self, e: &::h3::error::StreamError) {
        if matches!(e, ::h3::error::StreamError::RemoteTerminate { code, .. } if *code != MESSAGE_ERROR)
        {
            self.flags.set_reset();
        }
    }

    /// Checks the bytes read against the declared `content-length`: more
    /// than declared, or a body that ended (`Stage::Trailers`) with fewer,
    /// makes the request malformed (RFC 9114 §4.1.2), a stream error
    /// H3_MESSAGE_ERROR: the body is done with [`BodyError::Length`].
    /// `true` if so.
    fn length_broken(&mut self) -> bool {
        let Some(declared) = self.declared else {
            return false;
        };
        let over = self.seen > declared;
        let short = self.stage == Stage::Trailers && self.seen != declared;
        if !(over || short) {
            return false;
        }
        self.stage = Stage::Done;
        self.error = Some(BodyError::Length);
        self.flags.malformed.store(true, Ordering::Relaxed);
        self.recv.stop_sending(MESSAGE_ERROR);
        true
    }

    /// The room to gather a frame in, once `held` bytes of it are read:
    /// twice `held`, no more than the rest of a declared body nor
    /// [`COALESCE`] (the buffer grows if more comes). The read-ahead bound
    /// (`body_buffer`) counts bytes, not allocations, so a buffer stays
    /// within twice what it holds: sized to the declared length, a client
    /// sending 2 bytes per packet made each buffer 64 KiB. And not always
    /// [`COALESCE`]: 64 KiB is past jemalloc's thread cache, which cost a
    /// body of a few KB ~2k instructions to get and free.
    fn coalesce_room(&self, held: usize) -> usize {
        let rest = self.declared.map_or(usize::MAX, |d| {
            usize::try_from(d.saturating_sub(self.seen)).unwrap_or(usize::MAX)
        });
        held.saturating_mul(2).min(rest).min(COALESCE).max(held)
    }

    /// Bytes read by [`H3Body::prime`] and not handed out yet.
    fn pending(&self) -> u64 {
        self.first.as_ref().map_or(0, |d| d.len() as u64)
    }
}

/// Fields that name a connection's own handling, which HTTP/3 does not
/// carry (RFC 9114 §4.2): dropped from the app's response.
const CONNECTION_FIELDS: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

thread_local! {
    /// The `date` value of the last response on this thread and the Unix
    /// second it names: formatted once a second, not once a response.
    static DATE: RefCell<(u64, Option<HeaderValue>)> = const { RefCell::new((u64::MAX, None)) };
}

/// The current time as a `date` field value (RFC 9110 §6.6.1).
fn date_now() -> Option<HeaderValue> {
    let now = std::time::SystemTime::now();
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != secs || cached.1.is_none() {
            let v = HeaderValue::from_str(&httpdate::fmt_http_date(now)).ok();
            *cached = (secs, v);
        }
        cached.1.clone()
    })
}

/// The response head as HTTP/3 sends it: connection-specific fields
/// dropped, `date` added when the app sent none (as hyper does on
/// HTTP/1.1 and HTTP/2).
fn h3_head(headers: &mut HeaderMap) {
    // One pass over the (few) names the app sent, rather than a hashed
    // removal of each of the five that are almost never there.
    if headers
        .keys()
        .any(|k| CONNECTION_FIELDS.contains(&k.as_str()))
    {
        for name in CONNECTION_FIELDS {
            headers.remove(name);
        }
    }
    if !headers.contains_key(http::header::DATE) {
        if let Some(v) = date_now() {
            headers.insert(http::header::DATE, v);
        }
    }
}

const MESSAGE_ERROR: ::h3::error::Code = ::h3::error::Code::H3_MESSAGE_ERROR;

/// Resets the response stream of a request found malformed while its body
/// was read (see [`H3Body`]) in place of the answer; `true` if it did.
fn reset_if_malformed(send: &mut SendHalf, malformed: &AtomicBool) -> bool {
    let bad = malformed.load(Ordering::Relaxed);
    if bad {
        send.stop_stream(MESSAGE_ERROR);
    }
    bad
}

/// Response bodies are written in pieces of at most this many bytes while
/// `send_timeout` is on, so that a slow reader that takes each piece in
/// time is not cut (as on HTTP/2).
const SEND_PIECE: usize = 16 * 1024;

/// Runs one write of the response; `Ok(false)` if QUIC flow control held
/// it back for `limit` (the client takes nothing of the response). The
/// write is polled once first: most are taken at once, and those need no
/// timer (making one reads the clock and the runtime's thread-locals).
pub(crate) async fn within<F>(
    limit: Option<Duration>,
    mut write: Pin<&mut F>,
) -> Result<bool, ::h3::error::StreamError>
where
    F: Future<Output = Result<(), ::h3::error::StreamError>>,
{
    if let Poll::Ready(r) = poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx))).await {
        return r.map(|()| true);
    }
    match limit {
        None => write.await.map(|()| true),
        Some(d) => match tokio::time::timeout(d, write).await {
            Ok(r) => r.map(|()| true),
            Err(_) => Ok(false),
        },
    }
}

/// [`within`] for a write that borrows `send` (the future is pinned here
/// and dropped before `send` is used again).
macro_rules! write_within {
    ($limit:expr, $write:expr) => {{
        let write = std::pin::pin!($write);
        $crate::proto::h3::body::within($limit, write).await
    }};
}
pub(crate) use write_within;

/// Writes `resp` on `send`: HEADERS, then each DATA frame as QUIC flow
/// control lets it go (the body is polled only when the previous frame
/// was taken: backpressure reaches the app through the exchange), then
/// trailers, if any, and the end of the stream. A body that fails (the
/// app raised mid-stream) resets the stream, so the response cannot look
/// complete. With `send_timeout` (`Some`), a write held back that long
/// resets the stream (H3_REQUEST_CANCELLED, HTTP/2's CANCEL); returning
/// drops the body, which tells the app `http.disconnect`. A request found
/// malformed while its body was read (`malformed`, see [`H3Body`]) gets a
/// stream reset (H3_MESSAGE_ERROR) in place of the response, or of its
/// rest.
///
/// Errors: the stream's, when the client stopped reading it
/// (STOP_SENDING) or the connection closed; dropping `resp`'s body then
/// tells the app `http.disconnect`.
pub(crate) async fn respond(
    send: &mut SendHalf,
    resp: Response<ResponseBody>,
    send_timeout: Option<Duration>,
    malformed: &AtomicBool,
) -> Result<(), ::h3::error::StreamError> {
    if reset_if_malformed(send, malformed) {
        return Ok(());
    }
    let (mut parts, mut body) = resp.into_parts();
    h3_head(&mut parts.headers);
    let head = Response::from_parts(parts, ());
    if !write_within!(send_timeout, send.send_response(head))? {
        return cancel(send);
    }
    loop {
        let frame = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            None => break,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(mut data) => {
                    if reset_if_malformed(send, malformed) {
                        return Ok(());
                    }
                    while !data.is_empty() {
                        let piece = match send_timeout {
                            Some(_) if data.len() > SEND_PIECE => data.split_to(SEND_PIECE),
                            _ => std::mem::take(&mut data),
                        };
                        if !write_within!(send_timeout, send.send_data(piece))? {
                            return cancel(send);
                        }
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        if !write_within!(send_timeout, send.send_trailers(trailers))? {
                            return cancel(send);
                        }
                        break;
                    }
                }
            },
            Some(Err(_)) => {
                send.stop_stream(::h3::error::Code::H3_INTERNAL_ERROR);
                return Ok(());
            }
        }
    }
    if !write_within!(send_timeout, send.finish())? {
        return cancel(send);
    }
    Ok(())
}

/// Resets a response stream stalled past `send_timeout`.
pub(crate) fn cancel(send: &mut SendHalf) -> Result<(), ::h3::error::StreamError> {
    tracing::debug!("HTTP/3 response not accepted in time: stream reset");
    send.stop_stream(::h3::error::Code::H3_REQUEST_CANCELLED);
    Ok(())
}
