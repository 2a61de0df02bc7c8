//! The client's unidirectional streams, typed before h3 0.0.8 sees them.
//!
//! h3 0.0.8 drops a push stream opened by a client, and never reads the
//! client's QPACK encoder and decoder streams past their type (it decodes
//! field sections without a dynamic table). [`Guarded`] wraps the
//! `h3-quinn` connection and reads each unidirectional stream's type
//! first, so that Skirr enforces what RFC 9114 and RFC 9204 require:
//!
//! * a push stream (type 0x01) from the client is a connection error
//!   `H3_STREAM_CREATION_ERROR` (RFC 9114 §6.2.2);
//! * the QPACK encoder and decoder streams are read for their whole life
//!   ([`watch`]): the server advertises no dynamic table (capacity 0), so
//!   on the encoder stream only "Set Dynamic Table Capacity 0" is valid
//!   (anything else is `QPACK_ENCODER_STREAM_ERROR`, RFC 9204 §4.3.1,
//!   §3.2.2), and on the decoder stream only Stream Cancellation (a Section
//!   Acknowledgment or an Insert Count Increment refers to what was never
//!   sent: `QPACK_DECODER_STREAM_ERROR`, §4.4.1, §4.4.3); closing either is
//!   `H3_CLOSED_CRITICAL_STREAM` (§4.2). h3 is handed a stand-in that
//!   carries the type only, so it still counts them (a second one is its
//!   `H3_STREAM_CREATION_ERROR`);
//! * on the control stream, which h3 gets as sent, Skirr also reads the
//!   push frames h3 0.0.8 ignores ([`ControlCheck`]): a CANCEL_PUSH (Skirr
//!   never pushes, so it names a push never promised, RFC 9114 §7.2.3) and
//!   a MAX_PUSH_ID lower than the one before (§7.2.7) are `H3_ID_ERROR`.
//!
//! Every other stream (unknown types) reaches h3 unchanged, the bytes
//! read for its type replayed first. Streams whose type has not
//! arrived are held in a list bounded by QUIC's limit on the client's
//! unidirectional streams (quinn's default, 100). Request streams are
//! handed to h3 wrapped as [`GuardedBidi`], which checks their field
//! sections ([`super::head`]).

use std::future::poll_fn;
use std::task::{Context, Poll};

use ::h3::error::Code;
use ::h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId};
use bytes::{Buf, Bytes, BytesMut};

use super::frame_limit;
use super::head::GuardedBidi;

/// Unidirectional stream types (RFC 9114 §6.2.2, RFC 9204 §4.2).
const CONTROL: u64 = 0x00;
const PUSH: u64 = 0x01;
const QPACK_ENCODER: u64 = 0x02;
const QPACK_DECODER: u64 = 0x03;

/// An `h3-quinn` connection whose unidirectional streams are typed first
/// (see the module docs).
pub(crate) struct Guarded {
    inner: frame_limit::Conn,
    /// For closing the connection from a QPACK stream's [`watch`].
    qconn: quinn::Connection,
    /// Accepted streams whose type has not fully arrived.
    typing: Vec<Typing>,
}

impl Guarded {
    /// Wraps `inner`, the frame-size watch over the QUIC connection
    /// `qconn`, for h3.
    pub(crate) fn new(inner: frame_limit::Conn, qconn: quinn::Connection) -> Self {
        Guarded {
            inner,
            qconn,
            typing: Vec::new(),
        }
    }

    /// Decides what becomes of a stream whose type is `ty`: `None` if h3
    /// does not get it.
    fn classify(&self, t: Typing, ty: u64, len: usize) -> Option<GuardedRecv> {
        let id = quic::RecvStream::recv_id(&t.stream);
        match ty {
            PUSH => {
                close(
                    &self.qconn,
                    Code::H3_STREAM_CREATION_ERROR,
                    "push stream from a client",
                );
                None
            }
            QPACK_ENCODER | QPACK_DECODER => {
                let mut head = t.head.freeze();
                let rest = head.split_off(len);
                tokio::spawn(watch(
                    t.stream,
                    rest,
                    ty == QPACK_ENCODER,
                    self.qconn.clone(),
                ));
                Some(GuardedRecv {
                    id,
                    head: Some(head),
                    stream: None,
                    control: None,
                })
            }
            _ => Some(GuardedRecv {
                id,
                head: Some(t.head.freeze()),
                stream: Some(t.stream),
                control: (ty == CONTROL).then(|| (ControlCheck::new(len), self.qconn.clone())),
            }),
        }
    }
}

fn close(qconn: &quinn::Connection, code: Code, why: &str) {
    tracing::debug!("HTTP/3 connection error {code}: {why}");
    qconn.close(
        quinn::VarInt::from_u64(code.value()).unwrap_or_default(),
        why.as_bytes(),
    );
}

/// A unidirectional stream being read for its type.
struct Typing {
    stream: frame_limit::Recv,
    head: BytesMut,
}

impl Typing {
    /// The stream's type and its length in bytes once read; `None` if the
    /// stream ended or failed first (tolerated, RFC 9114 §6.2).
    fn poll_type(&mut self, cx: &mut Context<'_>) -> Poll<Option<(u64, usize)>> {
        loop {
            if let Some(t) = varint(&self.head) {
                return Poll::Ready(Some(t));
            }
            match quic::RecvStream::poll_data(&mut self.stream, cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(Some(b))) => self.head.extend_from_slice(&b),
                Poll::Ready(Ok(None) | Err(_)) => return Poll::Ready(None),
            }
        }
    }
}

/// A QUIC variable-length integer at the start of `b` (RFC 9000 §16) and
/// its length, if all of it is there.
pub(crate) fn varint(b: &[u8]) -> Option<(u64, usize)> {
    let first = *b.first()?;
    let len = 1usize << (first >> 6);
    let bytes = b.get(..len)?;
    let v = bytes[1..]
        .iter()
        .fold(u64::from(first & 0x3f), |v, &x| (v << 8) | u64::from(x));
    Some((v, len))
}

/// What a QPACK stream may carry to a side with no dynamic table.
#[derive(Default)]
struct Instructions {
    encoder: bool,
    /// Inside a Stream Cancellation's multi-byte stream id.
    more: bool,
}

impl Instructions {
    /// Checks the next bytes of the stream; the connection error if they
    /// are not allowed.
    fn feed(&mut self, bytes: &[u8]) -> Result<(), Code> {
        for &b in bytes {
            if self.more {
                self.more = b & 0x80 != 0;
            } else if self.encoder {
                // 0x20: Set Dynamic Table Capacity 0, the only instruction
                // a table of capacity 0 allows (an insert or duplicate, or
                // any other capacity, is an error).
                if b != 0x20 {
                    return Err(Code::QPACK_ENCODER_STREAM_ERROR);
                }
            } else if b >> 6 == 0b01 {
                // Stream Cancellation, a 6-bit prefix integer.
                self.more = b & 0x3f == 0x3f;
            } else {
                return Err(Code::QPACK_DECODER_STREAM_ERROR);
            }
        }
        Ok(())
    }
}

/// Reads the client's QPACK encoder (`encoder`) or decoder stream until
/// the connection ends, closing it on an instruction not allowed or on the
/// stream's end (see the module docs). `rest`: bytes read after its type.
async fn watch(
    mut stream: frame_limit::Recv,
    rest: Bytes,
    encoder: bool,
    qconn: quinn::Connection,
) {
    let mut check = Instructions {
        encoder,
        more: false,
    };
    let mut next = rest;
    loop {
        if let Err(code) = check.feed(&next) {
            close(
                &qconn,
                code,
                "QPACK instruction not allowed without a dynamic table",
            );
            return;
        }
        next = match poll_fn(|cx| quic::RecvStream::poll_data(&mut stream, cx)).await {
            Ok(Some(b)) => b,
            Ok(None) | Err(StreamErrorIncoming::StreamTerminated { .. }) => {
                close(
                    &qconn,
                    Code::H3_CLOSED_CRITICAL_STREAM,
                    "QPACK stream closed",
                );
                return;
            }
            // The connection is gone.
            Err(_) => return,
        };
    }
}

/// Frame types of the push frames on the control stream (RFC 9114 §7.2).
const CANCEL_PUSH: u64 = 0x03;
const MAX_PUSH_ID: u64 = 0x0d;

/// Reads the frames of the client's control stream as they pass to h3,
/// for the push frames h3 0.0.8 ignores (see the module docs). Holds at
/// most one frame header and one push frame's payload (a varint): the
/// other frames' payloads are counted off, not kept.
struct ControlCheck {
    /// Bytes still to pass over: the stream type, then a frame's payload.
    skip: u64,
    /// A frame header, or a push frame, read so far (at most 24 bytes).
    pending: Vec<u8>,
    /// The largest push ID a MAX_PUSH_ID allowed.
    max_push_id: Option<u64>,
}

impl ControlCheck {
    /// The check of a control stream whose type took `type_len` bytes.
    fn new(type_len: usize) -> Self {
        ControlCheck {
            skip: type_len as u64,
            pending: Vec::new(),
            max_push_id: None,
        }
    }

    /// Checks the stream's next bytes; why the connection must close
    /// (H3_ID_ERROR), if it must.
    fn feed(&mut self, bytes: &[u8]) -> Result<(), &'static str> {
        let mut i = 0;
        while i < bytes.len() {
            if self.skip > 0 {
                let n = (bytes.len() - i).min(usize::try_from(self.skip).unwrap_or(usize::MAX));
                self.skip -= n as u64;
                i += n;
                continue;
            }
            self.pending.push(bytes[i]);
            i += 1;
            let Some((ty, a)) = varint(&self.pending) else {
                continue;
            };
            let Some((len, b)) = varint(&self.pending[a..]) else {
                continue;
            };
            // A push frame's payload is one varint; a longer one is h3's
            // H3_FRAME_ERROR, and passed over here.
            if (ty == CANCEL_PUSH || ty == MAX_PUSH_ID) && len <= 8 {
                let end = a + b + len as usize;
                if self.pending.len() < end {
                    continue;
                }
                let payload = &self.pending[a + b..end];
                if let Some((id, n)) = varint(payload) {
                    if n == payload.len() {
                        self.push_frame(ty, id)?;
                    }
                }
            } else {
                self.skip = len;
            }
            self.pending.clear();
        }
        Ok(())
    }

    fn push_frame(&mut self, ty: u64, id: u64) -> Result<(), &'static str> {
        if ty == CANCEL_PUSH {
            return Err("CANCEL_PUSH for a push never promised");
        }
        if self.max_push_id.is_some_and(|m| id < m) {
            return Err("MAX_PUSH_ID lower than before");
        }
        self.max_push_id = Some(id);
        Ok(())
    }
}

/// A unidirectional stream as h3 gets it: the bytes read for its type,
/// then the rest of the stream, or nothing more for a QPACK stream that
/// [`watch`] reads. A control stream's frames are checked on the way
/// ([`ControlCheck`]; the connection to close).
pub(crate) struct GuardedRecv {
    id: StreamId,
    head: Option<Bytes>,
    stream: Option<frame_limit::Recv>,
    control: Option<(ControlCheck, quinn::Connection)>,
}

impl quic::RecvStream for GuardedRecv {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let got = match (self.head.take(), &mut self.stream) {
            (Some(head), _) => Poll::Ready(Ok(Some(head))),
            (None, Some(s)) => s.poll_data(cx),
            // h3 reads no further than the type of a QPACK stream.
            (None, None) => Poll::Pending,
        };
        if let (Poll::Ready(Ok(Some(b))), Some((check, qconn))) = (&got, &mut self.control) {
            if let Err(why) = check.feed(b) {
                close(qconn, Code::H3_ID_ERROR, why);
            }
        }
        got
    }

    fn stop_sending(&mut self, error_code: u64) {
        if let Some(s) = &mut self.stream {
            s.stop_sending(error_code);
        }
    }

    fn recv_id(&self) -> StreamId {
        self.id
    }
}

impl<B: Buf> quic::Connection<B> for Guarded {
    type RecvStream = GuardedRecv;
    type OpenStreams = Opener;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<GuardedRecv, ConnectionErrorIncoming>> {
        loop {
            match quic::Connection::<B>::poll_accept_recv(&mut self.inner, cx) {
                Poll::Ready(Ok(stream)) => self.typing.push(Typing {
                    stream,
                    head: BytesMut::new(),
                }),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => break,
            }
        }
        let mut i = 0;
        while i < self.typing.len() {
            match self.typing[i].poll_type(cx) {
                Poll::Pending => i += 1,
                Poll::Ready(typed) => {
                    let t = self.typing.swap_remove(i);
                    if let Some(r) = typed.and_then(|(ty, len)| self.classify(t, ty, len)) {
                        return Poll::Ready(Ok(r));
                    }
                }
            }
        }
        Poll::Pending
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<GuardedBidi<B>, ConnectionErrorIncoming>> {
        quic::Connection::<B>::poll_accept_bidi(&mut self.inner, cx).map_ok(GuardedBidi::new)
    }

    fn opener(&self) -> Opener {
        Opener(quic::Connection::<B>::opener(&self.inner))
    }
}

/// The connection's stream opener for h3 (its bidirectional streams
/// wrapped as accepted ones are; the server opens none).
pub(crate) struct Opener(frame_limit::Opener);

impl<B: Buf> quic::OpenStreams<B> for Opener {
    type BidiStream = GuardedBidi<B>;
    type SendStream = h3_quinn::SendStream<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<GuardedBidi<B>, StreamErrorIncoming>> {
        quic::OpenStreams::<B>::poll_open_bidi(&mut self.0, cx).map_ok(GuardedBidi::new)
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        quic::OpenStreams::<B>::poll_open_send(&mut self.0, cx)
    }

    fn close(&mut self, code: Code, reason: &[u8]) {
        quic::OpenStreams::<B>::close(&mut self.0, code, reason)
    }
}

impl<B: Buf> quic::OpenStreams<B> for Guarded {
    type BidiStream = GuardedBidi<B>;
    type SendStream = h3_quinn::SendStream<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, StreamErrorIncoming>> {
        quic::OpenStreams::<B>::poll_open_bidi(&mut self.inner, cx).map_ok(GuardedBidi::new)
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        quic::OpenStreams::<B>::poll_open_send(&mut self.inner, cx)
    }

    fn close(&mut self, code: Code, reason: &[u8]) {
        quic::OpenStreams::<B>::close(&mut self.inner, code, reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_needs_all_its_bytes() {
        assert_eq!(varint(&[0x02]), Some((2, 1)));
        assert_eq!(varint(&[0x40, 0x21]), Some((0x21, 2)));
        assert_eq!(varint(&[0x40]), None);
        assert_eq!(varint(&[]), None);
    }

    #[test]
    fn control_frames_are_followed_across_chunks() {
        let mut c = ControlCheck::new(1);
        // Stream type, SETTINGS (2 bytes of payload), a grease frame of 3.
        assert_eq!(c.feed(&[0x00, 0x04, 0x02, 0x06]), Ok(()));
        assert_eq!(c.feed(&[0x01, 0x21, 0x03, 0x0d, 0x0d, 0x0d]), Ok(()));
        // MAX_PUSH_ID 5, split; then 300 (two-byte varint); then 300 again.
        assert_eq!(c.feed(&[0x0d, 0x01]), Ok(()));
        assert_eq!(c.feed(&[0x05, 0x0d, 0x02, 0x41]), Ok(()));
        assert_eq!(c.feed(&[0x2c, 0x0d, 0x02, 0x41, 0x2c]), Ok(()));
        assert_eq!(c.max_push_id, Some(300));
        assert!(c.feed(&[0x0d, 0x01, 0x04]).is_err());
        assert!(ControlCheck::new(1)
            .feed(&[0x00, 0x03, 0x01, 0x00])
            .is_err());
    }

    #[test]
    fn without_a_dynamic_table_only_capacity_0_and_cancellations_pass() {
        let enc = || Instructions {
            encoder: true,
            more: false,
        };
        assert_eq!(enc().feed(&[0x20, 0x20]), Ok(()));
        // Capacity 4096, an insert with a static name reference, a duplicate.
        for bad in [&[0x3f, 0xe1, 0x1f][..], &[0xc0, 0x01, b'v'], &[0x00]] {
            assert_eq!(enc().feed(bad), Err(Code::QPACK_ENCODER_STREAM_ERROR));
        }
        let mut dec = Instructions::default();
        // Stream Cancellation of stream 4, then of stream 200 (multi-byte).
        assert_eq!(dec.feed(&[0x44, 0x7f, 0x89]), Ok(()));
        assert_eq!(dec.feed(&[0x01, 0x40]), Ok(()));
        // A Section Acknowledgment, an Insert Count Increment.
        for bad in [0x84u8, 0x01] {
            assert_eq!(
                Instructions::default().feed(&[bad]),
                Err(Code::QPACK_DECODER_STREAM_ERROR)
            );
        }
    }
}
