//! The transport under hyper and tungstenite: the socket, plus bytes to
//! replay first, plus the activity tracking the connection timers need.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::http::ctx::ConnCtx;
use crate::http::headscan::HeadScan;

/// Sockets whose read readiness can be awaited, and read without waiting.
pub(crate) trait Readiness {
    /// Whether an idle connection may be parked (hyper's state dropped
    /// while the socket waits): only when readiness of the socket means
    /// bytes for the next request, which TLS's buffering breaks.
    const PARKABLE: bool = true;
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// The TCP (or Unix) socket underneath.
    fn socket_fd(&self) -> BorrowedFd<'_>;
}

/// A TLS stream is never parked: rustls may hold decrypted bytes the
/// socket's readiness knows nothing about.
impl Readiness for tokio_rustls::server::TlsStream<TcpStream> {
    const PARKABLE: bool = false;

    fn poll_read_ready(&self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn try_read(&self, _buf: &mut [u8]) -> io::Result<usize> {
        Err(io::ErrorKind::Unsupported.into())
    }

    fn socket_fd(&self) -> BorrowedFd<'_> {
        self.get_ref().0.as_fd()
    }
}

impl Readiness for TcpStream {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        TcpStream::poll_read_ready(self, cx)
    }

    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        TcpStream::try_read(self, buf)
    }

    fn socket_fd(&self) -> BorrowedFd<'_> {
        self.as_fd()
    }
}

impl Readiness for UnixStream {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        UnixStream::poll_read_ready(self, cx)
    }

    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        UnixStream::try_read(self, buf)
    }

    fn socket_fd(&self) -> BorrowedFd<'_> {
        self.as_fd()
    }
}

/// A connection's socket as hyper and tungstenite see it.
///
/// `prefix` holds bytes already read from the socket that a new reader must
/// see first (what hyper had buffered when it handed the socket back).
/// Reads report the first byte of each request head to the connection's
/// activity tracker.
pub(crate) struct ConnIo<I> {
    pub(crate) inner: I,
    pub(crate) prefix: Bytes,
    pub(crate) conn: Arc<ConnCtx>,
    /// Measures request heads' field lines as read (HTTP/1.x only; `None`
    /// when the limit is off or the connection speaks something else).
    pub(crate) scan: Option<HeadScan>,
    /// The request line being read (HTTP/1.1): see [`LineScan`].
    pub(crate) line: LineScan,
}

/// How much of a request line has arrived without its end. hyper stops
/// buffering a head at `max_buf_size` and answers `431` — also for a head
/// that is one huge request line (a 256 KiB URL). A line longer than
/// `limit_request_line` and than half that buffer is refused here instead,
/// before hyper's limit: the read fails, and the connection answers `414`
/// ([`ConnIo::request_line_too_long`]); shorter ones reach the head checks
/// (`wire::request`), which answer `414` too.
#[derive(Default)]
pub(crate) struct LineScan {
    len: usize,
    /// The line's end was seen: nothing to scan until the next request.
    done: bool,
    /// Over the limit: every read fails.
    pub(crate) over: bool,
    /// The connection no longer carries HTTP/1.1 heads (HTTP/2, a
    /// WebSocket): nothing is scanned.
    off: bool,
}

impl<I> ConnIo<I> {
    /// A request line went over the limit (see [`LineScan`]): the `414`
    /// is the connection's to write.
    pub(crate) fn request_line_too_long(&self) -> bool {
        self.line.over
    }

    /// The socket now carries HTTP/2 frames or WebSocket frames: no
    /// request lines to scan.
    pub(crate) fn stop_line_scan(&mut self) {
        self.line.off = true;
    }

    /// Scans bytes read while no request is being served for the end of
    /// the request line; true once the line is too long.
    fn scan_line(&mut self, bytes: &[u8]) -> bool {
        if self.line.off || self.line.done || bytes.is_empty() {
            return false;
        }
        // The head scanner, which has just seen these bytes, already knows
        // whether the request line ended: the same search is not done twice.
        if self.scan.as_ref().is_some_and(HeadScan::request_line_ended) || bytes.contains(&b'\n') {
            self.line.done = true;
            return false;
        }
        self.line.len += bytes.len();
        let cfg = &self.conn.shared.config;
        let limit = cfg.limits.request_line;
        if limit == 0 {
            return false;
        }
        // hyper's buffer (see `Worker::new`); 400 KiB is its default.
        let buffer = if cfg.max_head_size > 0 {
            cfg.max_head_size.max(8192)
        } else {
            400 * 1024
        };
        if self.line.len > (buffer / 2).max(limit + 2) {
            self.line.over = true;
        }
        self.line.over
    }

    /// A request is being served: the next head's line starts afresh.
    fn reset_line(&mut self) {
        if self.conn.activity.is_busy() {
            self.line.len = 0;
            self.line.done = false;
        }
    }
}

impl<I> Drop for ConnIo<I> {
    fn drop(&mut self) {
        // The socket closes now: so does its duplicate (see `eof_probe`).
        self.conn.eof_probe.lock().take();
    }
}

fn line_too_long() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "request line too long")
}

impl<I: Readiness> ConnIo<I> {
    /// Ready when bytes have arrived (kept in `prefix` for the next reader)
    /// or the peer closed. Readiness alone is not trusted: Tokio reports a
    /// newly accepted socket as readable, so a read is attempted, and a
    /// `WouldBlock` clears that readiness.
    pub(crate) fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() || !I::PARKABLE {
            return Poll::Ready(Ok(()));
        }
        let mut buf = [0u8; 2048];
        loop {
            match self.inner.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
            match self.inner.try_read(&mut buf) {
                Ok(n) => {
                    // n == 0 is end of stream: hyper will see it too.
                    self.conn.shared.metrics.bytes_in(n);
                    self.prefix = Bytes::copy_from_slice(&buf[..n]);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl<I> ConnIo<I> {
    /// Passes bytes read to the head scanner; its verdict goes to the
    /// connection's activity, for the service.
    fn scan(&mut self, bytes: &[u8]) {
        if let Some(scan) = &mut self.scan {
            let activity = &self.conn.activity;
            let r = scan.feed(bytes, !activity.is_busy());
            if r.started || r.too_long {
                activity.set_field_too_long(r.too_long);
            }
        }
    }
}

impl<I: AsyncRead + Readiness + Unpin> AsyncRead for ConnIo<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.line.over {
            return Poll::Ready(Err(line_too_long()));
        }
        self.reset_line();
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            let this = &mut *self;
            this.prefix.advance(n);
            if this.prefix.is_empty() {
                // An emptied `Bytes` still owns its allocation: a parked
                // connection would keep its first read's bytes.
                this.prefix = Bytes::new();
            }
            this.conn.activity.on_bytes();
            let filled = buf.filled();
            this.scan(&filled[filled.len() - n..]);
            if !this.conn.activity.is_busy()
                && this.scan_line(&buf.filled()[buf.filled().len() - n..])
            {
                return Poll::Ready(Err(line_too_long()));
            }
            return Poll::Ready(Ok(()));
        }
        if self.conn.activity.peer_eof() {
            if self.conn.activity.awaits_response() {
                *self.conn.eof_waker.lock() = Some(cx.waker().clone());
                return Poll::Pending;
            }
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let room = buf.remaining() > 0;
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(res, Poll::Ready(Ok(()))) {
            let activity = Arc::clone(&self.conn);
            let activity = &activity.activity;
            if buf.filled().len() > before {
                self.conn
                    .shared
                    .metrics
                    .bytes_in(buf.filled().len() - before);
                activity.on_bytes();
                if self.scan.is_some() {
                    let this = &mut *self;
                    this.scan(&buf.filled()[before..]);
                }
                if !activity.is_busy() && self.scan_line(&buf.filled()[before..]) {
                    return Poll::Ready(Err(line_too_long()));
                }
            } else if room {
                activity.on_eof();
                if activity.awaits_response() {
                    // Kept so `send()` can tell a client that left from a
                    // half close (`Exchange::gone_now`); a failed dup only
                    // leaves the write errors to tell.
                    if let Ok(fd) = self.inner.socket_fd().try_clone_to_owned() {
                        *self.conn.eof_probe.lock() = Some(Arc::new(fd));
                    }
                    // A half close after a complete request: hidden from
                    // hyper (which would drop the request) until the
                    // response is written; the app's receive() learns it
                    // (`Exchange::client_eof`), polled once more now.
                    *self.conn.eof_waker.lock() = Some(cx.waker().clone());
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            }
        }
        res
    }
}

impl<I> ConnIo<I> {
    /// Tells the activity tracker whether the socket takes bytes, for
    /// `send_timeout` (HTTP/1.1; on HTTP/2 each stream is watched itself).
    fn note_write<T>(&self, res: &Poll<io::Result<T>>) {
        match res {
            Poll::Pending => self.conn.activity.write_blocked(),
            Poll::Ready(Ok(_)) => self.conn.activity.write_ok(),
            Poll::Ready(Err(_)) => {}
        }
    }
}

impl<I: AsyncWrite + Unpin> ConnIo<I> {
    /// An interim response partly on the wire is finished before any of
    /// hyper's bytes follow it.
    fn finish_interim(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.conn.interim.started() {
            return Poll::Ready(Ok(()));
        }
        let res = self.conn.interim.poll_write_to(&mut self.inner, cx);
        self.note_write(&res);
        res
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for ConnIo<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.finish_interim(cx))?;
        let res = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note_write(&res);
        if let Poll::Ready(Ok(n)) = res {
            self.conn.shared.metrics.bytes_out(n);
        }
        res
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.finish_interim(cx))?;
        let res = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note_write(&res);
        if let Poll::Ready(Ok(n)) = res {
            self.conn.shared.metrics.bytes_out(n);
        }
        res
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // hyper flushes its transport only once its own buffer is empty:
        // the one point where an interim response cannot split one of its
        // messages (see `interim`).
        let this = &mut *self;
        if this.conn.interim.is_pending() {
            let res = this.conn.interim.poll_write_to(&mut this.inner, cx);
            this.note_write(&res);
            std::task::ready!(res)?;
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
