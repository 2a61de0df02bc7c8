//! The response body type handed to hyper.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body::{Body, Frame, SizeHint};

use crate::asgi::http::exchange::{Aborted, Exchange, Out};
use crate::asgi::http::zerocopy::FileRead;
use crate::http::compress::Encoder;
use crate::http::ctx::{BusyGuard, ConnCtx};
use crate::http::pump::{check_deadlines, pump_body, RequestBody};

/// What polling a body yields.
type FramePoll = Poll<Option<Result<Frame<Bytes>, Aborted>>>;

/// A streamed response body: chunks come from the app through the exchange.
/// While it is being written, the request body keeps being read for the app
/// (an app may stream its answer before it has read the whole upload);
/// `B` is the driver's request body type.
pub(crate) struct StreamBody<B> {
    exch: Arc<Exchange>,
    incoming: Option<B>,
    conn: Arc<ConnCtx>,
    expect_continue: bool,
    finished: bool,
    /// The app failed (or a file region could not be read): report the
    /// error on the next poll, after hyper has flushed what it already
    /// buffered.
    failing: bool,
    /// The `http.response.zerocopysend` region being read, if any.
    reading: Option<FileRead>,
}

impl<B: RequestBody> StreamBody<B> {
    pub(crate) fn new(
        exch: Arc<Exchange>,
        incoming: Option<B>,
        conn: Arc<ConnCtx>,
        expect_continue: bool,
    ) -> Self {
        Self {
            exch,
            incoming,
            conn,
            expect_continue,
            finished: false,
            failing: false,
            reading: None,
        }
    }

    /// Ends the body with an error. hyper drops its write buffer when a
    /// body fails: the first call yields once so the head and the chunks
    /// sent so far reach the client, the next fails (no terminating chunk:
    /// the response must not look complete).
    fn fail(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Aborted>>> {
        if !self.failing {
            self.failing = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.finished = true;
        Poll::Ready(Some(Err(Aborted)))
    }

    /// The next frame of the file region being read, if there is one.
    fn poll_file(&mut self, cx: &mut Context<'_>) -> Option<FramePoll> {
        let shared = &self.conn.shared;
        let read = self.reading.as_mut()?;
        match read.poll(cx) {
            Poll::Pending => Some(Poll::Pending),
            Poll::Ready(Some(Ok(data))) => {
                self.exch.consumed(data.len(), true, shared);
                Some(Poll::Ready(Some(Ok(Frame::data(data)))))
            }
            Poll::Ready(None) => {
                self.reading = None;
                None
            }
            Poll::Ready(Some(Err(e))) => {
                // The body cannot be completed: the app learns it as a
                // disconnect, the client from a closed connection.
                self.reading = None;
                self.exch.consumed(e.unread, false, shared);
                self.exch.mark_gone(shared);
                Some(self.fail(cx))
            }
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Aborted>>> {
        if self.failing {
            return self.fail(cx);
        }
        check_deadlines(&self.conn, &self.exch);
        if self.conn.activity.peer_eof() {
            let probe = self.conn.eof_probe.lock().as_ref().map(Arc::downgrade);
            self.exch.client_eof(&self.conn.shared, probe);
        }
        pump_body(
            cx,
            &self.exch,
            &mut self.incoming,
            &self.conn,
            self.expect_continue,
        );
        loop {
            if let Some(p) = self.poll_file(cx) {
                return p;
            }
            return match self.exch.poll_chunk(cx, &self.conn.shared) {
                Poll::Ready(Some(Ok(Out::File(seg)))) => {
                    self.reading = Some(FileRead::new(seg));
                    continue;
                }
                Poll::Ready(Some(Ok(Out::Data(chunk)))) => {
                    Poll::Ready(Some(Ok(Frame::data(chunk))))
                }
                Poll::Ready(Some(Err(Aborted))) => self.fail(cx),
                Poll::Ready(None) => {
                    if let Some(t) = self.exch.take_trailers() {
                        // hyper writes them as the chunked trailer section
                        // (HTTP/1.1) or a final HEADERS frame (HTTP/2).
                        return Poll::Ready(Some(Ok(Frame::trailers(t))));
                    }
                    self.finished = true;
                    Poll::Ready(None)
                }
                Poll::Pending => Poll::Pending,
            };
        }
    }
}

/// A streamed body behind [`ResponseBody`], whatever its request body type
/// (the box the stream lives in anyway holds its vtable: no allocation
/// more, and the response type stays one for every driver).
trait Frames: Send {
    fn poll(&mut self, cx: &mut Context<'_>) -> FramePoll;
}

impl<B: RequestBody> Frames for StreamBody<B> {
    fn poll(&mut self, cx: &mut Context<'_>) -> FramePoll {
        StreamBody::poll(self, cx)
    }
}

impl<B> Drop for StreamBody<B> {
    fn drop(&mut self) {
        if !self.finished && !self.exch.wire_complete() {
            // hyper dropped the body before its end: the client is gone.
            self.exch.mark_gone(&self.conn.shared);
        }
    }
}

/// Bytes read from a file per body frame (`http.response.pathsend`).
const FILE_CHUNK: usize = 256 * 1024;

/// A file sent as the body: `left` bytes still to read. Reads go through
/// Tokio's blocking pool (`tokio::fs`), so a slow disk never stalls the
/// connection task; hyper owns the socket writes, so there is no
/// `sendfile(2)`. The descriptor closes when hyper drops the body (done,
/// client gone, drain).
pub(crate) struct FileBody {
    file: tokio::fs::File,
    left: u64,
    buf: bytes::BytesMut,
}

impl FileBody {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Aborted>>> {
        use tokio::io::{AsyncRead, ReadBuf};

        if self.left == 0 {
            return Poll::Ready(None);
        }
        let want = self.left.min(FILE_CHUNK as u64) as usize;
        if self.buf.capacity() < want {
            self.buf.reserve(want - self.buf.len());
        }
        let spare = &mut self.buf.spare_capacity_mut()[..want];
        let mut rb = ReadBuf::uninit(spare);
        match Pin::new(&mut self.file).poll_read(cx, &mut rb) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) => {
                let n = rb.filled().len();
                if n == 0 {
                    // The file shrank after its length was sent: the
                    // response cannot be completed; the connection closes.
                    tracing::error!(
                        "http.response.pathsend: the file ended {} bytes early",
                        self.left
                    );
                    self.left = 0;
                    return Poll::Ready(Some(Err(Aborted)));
                }
                // SAFETY: `poll_read` initialised the first `n` bytes of
                // the spare capacity, which `rb` was built over.
                unsafe { self.buf.set_len(n) };
                self.left -= n as u64;
                Poll::Ready(Some(Ok(Frame::data(self.buf.split().freeze()))))
            }
            Poll::Ready(Err(e)) => {
                tracing::error!("http.response.pathsend: reading the file failed: {e}");
                self.left = 0;
                Poll::Ready(Some(Err(Aborted)))
            }
        }
    }
}

/// A body compressed frame by frame (see [`crate::http::compress`]): each data frame
/// is encoded and flushed, trailers pass after the coded stream's end.
struct Coder {
    enc: Option<Encoder>,
    trailers: Option<http::HeaderMap>,
}

impl Coder {
    fn poll(
        &mut self,
        inner: &mut Kind,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Aborted>>> {
        loop {
            let Some(enc) = self.enc.as_mut() else {
                return Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))));
            };
            let frame = match inner.poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(f))) => f,
                Poll::Ready(None) => {
                    return Poll::Ready(self.finish().map(|b| Ok(Frame::data(b))));
                }
            };
            match frame.into_data() {
                Ok(data) => match enc.chunk(&data) {
                    Ok(out) if out.is_empty() => continue,
                    Ok(out) => return Poll::Ready(Some(Ok(Frame::data(out)))),
                    Err(e) => {
                        tracing::error!("response compression failed: {e}");
                        return Poll::Ready(Some(Err(Aborted)));
                    }
                },
                Err(frame) => {
                    // Trailers: the coded stream ends first.
                    self.trailers = frame.into_trailers().ok();
                    if let Some(b) = self.finish() {
                        return Poll::Ready(Some(Ok(Frame::data(b))));
                    }
                }
            }
        }
    }

    /// Ends the coded stream: its last bytes, if any.
    fn finish(&mut self) -> Option<Bytes> {
        match self.enc.take()?.finish() {
            Ok(b) if b.is_empty() => None,
            Ok(b) => Some(b),
            Err(e) => {
                tracing::error!("response compression failed: {e}");
                None
            }
        }
    }
}

enum Kind {
    Full(Option<Bytes>),
    Stream(Box<dyn Frames>),
    File(Box<FileBody>),
}

impl Kind {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Aborted>>> {
        match self {
            Kind::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Kind::Stream(s) => s.poll(cx),
            Kind::File(f) => f.poll(cx),
        }
    }
}

/// A response body: whole, or streamed from the app.
///
/// It holds the connection's busy guard, so the keep-alive idle timer starts
/// only once hyper has written (or dropped) the whole body.
pub(crate) struct ResponseBody {
    kind: Kind,
    /// Compression applied to what `kind` yields.
    coder: Option<Box<Coder>>,
    _busy: BusyGuard,
}

impl ResponseBody {
    pub(crate) fn full(data: Bytes, busy: BusyGuard) -> Self {
        Self {
            kind: Kind::Full(Some(data)),
            coder: None,
            _busy: busy,
        }
    }

    /// The first `len` bytes of `file` (opened and measured by the caller).
    pub(crate) fn file(file: std::fs::File, len: u64, busy: BusyGuard) -> Self {
        Self {
            kind: Kind::File(Box::new(FileBody {
                file: tokio::fs::File::from_std(file),
                left: len,
                buf: bytes::BytesMut::new(),
            })),
            coder: None,
            _busy: busy,
        }
    }

    /// This body, compressed frame by frame with `enc`.
    pub(crate) fn coded(mut self, enc: Encoder) -> Self {
        self.coder = Some(Box::new(Coder {
            enc: Some(enc),
            trailers: None,
        }));
        self
    }

    pub(crate) fn stream<B: RequestBody>(body: StreamBody<B>, busy: BusyGuard) -> Self {
        Self {
            kind: Kind::Stream(Box::new(body)),
            coder: None,
            _busy: busy,
        }
    }

    /// A plain-text answer from the server itself (`reason` is the body)
    /// that closes the connection.
    pub(crate) fn plain(
        status: StatusCode,
        reason: &'static str,
        mut busy: BusyGuard,
    ) -> Response<Self> {
        busy.responded(status);
        let mut resp = Response::new(Self::full(Bytes::from_static(reason.as_bytes()), busy));
        *resp.status_mut() = status;
        crate::wire::response::plain_text_fields(resp.headers_mut());
        resp
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Aborted;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Aborted>>> {
        let this = self.get_mut();
        match &mut this.coder {
            Some(c) => c.poll(&mut this.kind, cx),
            None => this.kind.poll(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        if let Some(c) = &self.coder {
            return c.enc.is_none() && c.trailers.is_none();
        }
        match &self.kind {
            Kind::Full(d) => d.as_ref().is_none_or(Bytes::is_empty),
            Kind::Stream(_) => false,
            Kind::File(f) => f.left == 0,
        }
    }

    fn size_hint(&self) -> SizeHint {
        if self.coder.is_some() {
            return SizeHint::default();
        }
        match &self.kind {
            Kind::Full(d) => SizeHint::with_exact(d.as_ref().map_or(0, |d| d.len() as u64)),
            Kind::Stream(_) => SizeHint::default(),
            Kind::File(f) => SizeHint::with_exact(f.left),
        }
    }
}
