//! Interim (1xx) responses on HTTP/1.1: `103 Early Hints` (RFC 8297) and
//! the other informational responses of RFC 9110 §15.2 an app may send
//! before its final response.
//!
//! hyper's server has no API for them, so the bytes go past hyper, straight
//! into the connection's [`ConnIo`](crate::http::io::ConnIo). They must not
//! land inside an earlier pipelined response that hyper still buffers: they
//! are written only from `poll_flush`, which hyper calls once its own write
//! buffer is empty, and the request's service waits until they are on the
//! wire before it hands hyper the final head. Nothing else reaches hyper's
//! buffer in between but its own `100 Continue`, a whole 1xx as well.
//!
//! HTTP/2 interim responses are not sent: hyper's HTTP/2 server does not
//! expose the stream (hyper PR #4114 would add this).

use std::fmt::Write as _;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use tokio::io::AsyncWrite;

/// Once this many interim responses wait in one exchange for the wire,
/// the app's `send()` waits until the Tokio side took them.
pub(crate) const MAX_QUEUED: usize = 16;

/// One connection's interim bytes on their way to the socket.
#[derive(Default)]
pub(crate) struct InterimSlot {
    /// Bytes are waiting (a lock-free check for every flush).
    pending: AtomicBool,
    st: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    /// Not yet written.
    bytes: Bytes,
    /// Part of `bytes` is on the wire: nothing of hyper's may follow until
    /// the rest is.
    started: bool,
    /// The service waiting for the bytes to be written.
    waker: Option<Waker>,
}

impl InterimSlot {
    /// Service side: ready when nothing is waiting to be written.
    pub(crate) fn poll_free(&self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.pending.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        let mut st = self.st.lock();
        if st.bytes.is_empty() {
            return Poll::Ready(());
        }
        st.waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Service side: queues `bytes` for the next flush; the caller then
    /// waits with [`poll_free`](Self::poll_free).
    pub(crate) fn load(&self, bytes: Bytes) {
        let mut st = self.st.lock();
        st.bytes = bytes;
        st.started = false;
        self.pending.store(true, Ordering::Release);
    }

    /// Whether bytes wait to be written (no lock taken).
    pub(crate) fn is_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Whether a partly written interim response must be finished before
    /// any of hyper's bytes.
    pub(crate) fn started(&self) -> bool {
        self.pending.load(Ordering::Acquire) && self.st.lock().started
    }

    /// Transport side: writes what is queued to `io`. Called from
    /// `poll_flush` (hyper's buffer is empty then) and from `poll_write`
    /// while a write is [started](Self::started).
    pub(crate) fn poll_write_to<W: AsyncWrite + Unpin>(
        &self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.pending.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        let mut st = self.st.lock();
        while !st.bytes.is_empty() {
            let n = match Pin::new(&mut *io).poll_write(cx, &st.bytes) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            st.bytes.advance(n);
            st.started = true;
        }
        st.started = false;
        self.pending.store(false, Ordering::Release);
        if let Some(w) = st.waker.take() {
            w.wake();
        }
        Poll::Ready(Ok(()))
    }
}

/// Encodes interim responses as HTTP/1.1 status lines and field sections
/// (RFC 9112 §4, §5), one after the other.
pub(crate) fn encode_h1(responses: &[(StatusCode, HeaderMap)]) -> Bytes {
    let mut out = BytesMut::new();
    for (status, headers) in responses {
        let mut line = String::with_capacity(32);
        let reason = status.canonical_reason().unwrap_or("Informational");
        let _ = write!(line, "HTTP/1.1 {} {reason}\r\n", status.as_u16());
        out.extend_from_slice(line.as_bytes());
        for (name, value) in headers {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::encode_h1;
    use http::{HeaderMap, HeaderValue, StatusCode};

    #[test]
    fn encodes_each_link_as_a_field_line() {
        let mut h = HeaderMap::new();
        h.append("link", HeaderValue::from_static("</a.css>; rel=preload"));
        h.append("link", HeaderValue::from_static("</b.js>; rel=preload"));
        let bytes = encode_h1(&[(StatusCode::EARLY_HINTS, h)]);
        assert_eq!(
            &bytes[..],
            b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\
              link: </b.js>; rel=preload\r\n\r\n"
        );
    }

    #[test]
    fn unnamed_status_gets_a_generic_reason() {
        let bytes = encode_h1(&[(StatusCode::from_u16(150).unwrap(), HeaderMap::new())]);
        assert_eq!(&bytes[..], b"HTTP/1.1 150 Informational\r\n\r\n");
    }
}
