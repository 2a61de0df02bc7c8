//! Interim (1xx) responses: `103 Early Hints` (RFC 8297) and the other
//! informational responses of RFC 9110 §15.2 an app may send before its
//! final response, on HTTP/1.1, HTTP/2 and HTTP/3.
//!
//! hyper's server has no API for them, so the bytes go past hyper, straight
//! into the connection's [`ConnIo`](crate::http::io::ConnIo). They must not
//! land inside a message hyper is still writing: they are written only from
//! `poll_flush`, which hyper calls once its own write buffer is empty —
//! on HTTP/1.1 between responses (nothing else reaches hyper's buffer
//! before the final head but its own `100 Continue`, a whole 1xx as well),
//! on HTTP/2 between whole frames (h2 flushes its transport only after the
//! last CONTINUATION of a header block). The request's service waits until
//! they are on the wire before it hands hyper the final head, so they
//! always precede it.
//!
//! On HTTP/2 each interim response is a HEADERS frame (RFC 9113 §8.1) on
//! the request's stream, whose id [`h2io`](crate::proto::h2::io) learns; its
//! field block uses only HPACK literals without indexing (RFC 7541 §6.2.2),
//! which leave the connection's compression state as h2 keeps it. The
//! HTTP/2 encoder is the driver's (`proto::h2::frame`); this module
//! keeps the slot the bytes wait in and the HTTP/1.1 encoder.
//!
//! On HTTP/3 each request stream has a slot of its own, holding HTTP/1.1
//! bytes: the driver (`proto::h3::interim`) [takes](InterimSlot::poll_take)
//! them while the service runs, sends each response as a HEADERS frame on
//! the stream (RFC 9114 §4.1) and reports them [sent](InterimSlot::sent).

use std::fmt::Write as _;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use tokio::io::AsyncWrite;

/// Interim bytes a connection holds for a client that does not read them:
/// past this, new ones are dropped (RFC 8297 lets a server send none). A
/// single load is always taken into an empty slot.
pub(crate) const MAX_SLOT_BYTES: usize = 64 * 1024;

/// One connection's interim bytes on their way to the socket (shared by
/// the streams of an HTTP/2 connection).
#[derive(Default)]
pub(crate) struct InterimSlot {
    /// Bytes are waiting (a lock-free check for every flush).
    pending: AtomicBool,
    /// HTTP/2: the client shrank its HPACK dynamic table (see
    /// [`h2io`](crate::proto::h2::io)); interim responses are dropped on
    /// this connection from then on.
    off: AtomicBool,
    st: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    /// Not yet written: whole interim responses (HTTP/2: whole frames),
    /// one after the other.
    bytes: Bytes,
    /// Part of `bytes` is on the wire: nothing of hyper's may follow until
    /// the rest is.
    started: bool,
    /// Bytes ever queued, and ever written (or dropped): a load's end is a
    /// position in that sequence, which its service waits for.
    queued: u64,
    written: u64,
    /// The services waiting for their bytes, with the position each waits
    /// for (on HTTP/2, one per stream that queued some).
    waiters: Vec<(u64, Waker)>,
    /// HTTP/2: the connection's task, whose next poll flushes (its streams'
    /// services run in tasks of their own).
    flusher: Option<Waker>,
}

impl InterimSlot {
    /// Service side: ready once everything up to position `upto` (what
    /// [`load`](Self::load) returned; 0: nothing queued) is on the wire. A
    /// stream that queued nothing never waits for another's.
    pub(crate) fn poll_written(&self, upto: u64, cx: &mut Context<'_>) -> Poll<()> {
        if upto == 0 || !self.pending.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        let mut st = self.st.lock();
        if st.written >= upto {
            return Poll::Ready(());
        }
        match st.waiters.iter_mut().find(|(_, w)| w.will_wake(cx.waker())) {
            Some(entry) => entry.0 = upto,
            None => st.waiters.push((upto, cx.waker().clone())),
        }
        Poll::Pending
    }

    /// Service side: queues `bytes` (whole interim responses) behind any
    /// already waiting, and wakes the connection's task to flush them.
    /// Returns the position to wait for with
    /// [`poll_written`](Self::poll_written), or `None` when the slot
    /// already holds [`MAX_SLOT_BYTES`] for a client that is not reading
    /// (the bytes are dropped).
    pub(crate) fn load(&self, bytes: Bytes) -> Option<u64> {
        let len = bytes.len() as u64;
        let mut st = self.st.lock();
        if st.bytes.is_empty() {
            st.bytes = bytes;
            st.started = false;
        } else if st.bytes.len() + bytes.len() > MAX_SLOT_BYTES {
            tracing::debug!("interim responses dropped: the client is not reading earlier ones");
            return None;
        } else {
            let mut b = BytesMut::with_capacity(st.bytes.len() + bytes.len());
            b.extend_from_slice(&st.bytes);
            b.extend_from_slice(&bytes);
            st.bytes = b.freeze();
        }
        st.queued += len;
        let end = st.queued;
        self.pending.store(true, Ordering::Release);
        if let Some(w) = &st.flusher {
            w.wake_by_ref();
        }
        Some(end)
    }

    /// HTTP/2 transport side: the connection's task, to wake when bytes
    /// are loaded (registered whenever its read of the socket waits).
    pub(crate) fn set_flusher(&self, waker: &Waker) {
        let mut st = self.st.lock();
        if !st.flusher.as_ref().is_some_and(|w| w.will_wake(waker)) {
            st.flusher = Some(waker.clone());
        }
    }

    /// HTTP/2: no interim response is sent on this connection any more.
    pub(crate) fn turn_off(&self) {
        self.off.store(true, Ordering::Relaxed);
    }

    /// Whether interim responses are dropped on this connection.
    pub(crate) fn is_off(&self) -> bool {
        self.off.load(Ordering::Relaxed)
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

    /// HTTP/3 driver side (a request stream's own slot): ready with the
    /// bytes queued and not yet taken, and the position they end at;
    /// takes them. Registers the task to wake when more are loaded.
    pub(crate) fn poll_take(&self, cx: &mut Context<'_>) -> Poll<(Bytes, u64)> {
        let mut st = self.st.lock();
        if st.bytes.is_empty() {
            if !st.flusher.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                st.flusher = Some(cx.waker().clone());
            }
            return Poll::Pending;
        }
        let end = st.queued;
        Poll::Ready((std::mem::take(&mut st.bytes), end))
    }

    /// HTTP/3 driver side: everything up to position `end` (what
    /// [`poll_take`](Self::poll_take) returned) is on the wire or dropped;
    /// wakes the services waiting for it.
    pub(crate) fn sent(&self, end: u64) {
        let mut st = self.st.lock();
        st.written = st.written.max(end);
        if st.written >= st.queued {
            self.pending.store(false, Ordering::Release);
        }
        let written = st.written;
        st.waiters.retain(|(upto, w)| {
            let done = *upto <= written;
            if done {
                w.wake_by_ref();
            }
            !done
        });
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
        if self.is_off() && !st.started {
            // HTTP/2, the client shrank its HPACK table since these were
            // queued: they are whole frames, dropped whole (see `proto::h2::io`).
            st.bytes = Bytes::new();
        }
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
        st.written = st.queued;
        self.pending.store(false, Ordering::Release);
        for (_, w) in st.waiters.drain(..) {
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

/// Encodes interim responses as the HTTP/2 frames of one stream (given
/// by the HTTP/2 driver, `proto::h2::frame::encode_h2`, so that this
/// module never names a wire-protocol driver).
pub(crate) type StreamEncoder = fn(u32, &[(StatusCode, HeaderMap)]) -> Bytes;

#[cfg(test)]
mod tests {
    use super::{encode_h1, InterimSlot, MAX_SLOT_BYTES};
    use bytes::Bytes;
    use http::{HeaderMap, HeaderValue, StatusCode};
    use std::task::{Context, Poll, Waker};

    #[test]
    fn each_load_waits_for_its_own_bytes_and_a_full_slot_drops() {
        let slot = InterimSlot::default();
        let mut cx = Context::from_waker(Waker::noop());
        let a = slot.load(Bytes::from_static(b"aaa")).unwrap();
        let b = slot.load(Bytes::from_static(b"bb")).unwrap();
        assert_eq!((a, b), (3, 5));
        // A stream that queued nothing does not wait for the others.
        assert!(slot.poll_written(0, &mut cx).is_ready());
        assert!(slot.poll_written(a, &mut cx).is_pending());
        let mut wire = Vec::new();
        assert!(matches!(
            slot.poll_write_to(&mut wire, &mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(wire, b"aaabb");
        assert!(slot.poll_written(b, &mut cx).is_ready());
        // A client that reads nothing: one big load is taken, then no more.
        let big = Bytes::from(vec![b'x'; MAX_SLOT_BYTES + 1]);
        assert!(slot.load(big).is_some());
        assert!(slot.load(Bytes::from_static(b"c")).is_none());
    }

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
