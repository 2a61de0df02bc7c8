//! A bound on the HTTP/3 frames h3 0.0.8 buffers whole: the QUIC
//! connection ([`streams`]) with the receiving half of every request stream and of the
//! client's control stream watched by a [`Scanner`].
//!
//! h3 reads a frame other than DATA (HEADERS, SETTINGS, GOAWAY, a reserved
//! or unknown type) into memory until all of it has arrived, whatever
//! length it declares (RFC 9114 §7.1), and checks the field section size
//! only then; a client declaring a 1 GiB frame and sending its payload
//! would be buffered until it stopped. The scanner follows the frame
//! headers as the bytes go by (it copies nothing) and, when a non-DATA
//! frame declares more than the limit, the connection is closed with
//! `H3_EXCESSIVE_LOAD` (RFC 9114 §8.1, §10.5) before h3 reads any of it.
//! DATA frames stream and are never buffered whole, so their length is
//! free.

use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId};

use super::streams;

/// H3_EXCESSIVE_LOAD (RFC 9114 §8.1).
pub(crate) const EXCESSIVE_LOAD: u32 = 0x107;

/// The frame-size limit for a connection whose SETTINGS_MAX_FIELD_SECTION_SIZE
/// is `max_field_section_size`: 4 times it (a HEADERS frame a little over
/// it still gets h3's `431`, as on HTTP/2), at least 64 KiB.
pub(crate) fn limit(max_field_section_size: u64) -> u64 {
    max_field_section_size.saturating_mul(4).max(64 * 1024)
}

/// What the next bytes of a stream are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    /// The stream type of a unidirectional stream (RFC 9114 §6.2).
    StreamType,
    FrameType,
    FrameLen {
        ty: u64,
    },
    Payload {
        left: u64,
    },
    /// Not frames (a unidirectional stream other than control), or past a
    /// frame that is not followed by a length: not watched.
    Off,
}

/// Follows the frame headers (type and length, RFC 9114 §7.1) of one
/// stream's bytes, across chunk boundaries.
#[derive(Debug)]
pub(crate) struct Scanner {
    at: At,
    /// The variable-length integer being read (RFC 9000 §16), its length
    /// in bytes (0: its first byte is next) and the bytes read.
    var: u64,
    var_len: u8,
    var_read: u8,
    limit: u64,
}

/// The frame type of DATA, which streams.
const DATA: u64 = 0x0;
/// WEBTRANSPORT_STREAM: no length follows; h3 refuses it without
/// WebTransport, the scanner stops watching.
const WEBTRANSPORT_STREAM: u64 = 0x41;
/// The control stream's type (RFC 9114 §6.2.1).
const CONTROL: u64 = 0x0;

impl Scanner {
    /// For a request (bidirectional) stream: frames from the start.
    pub(crate) fn request(limit: u64) -> Self {
        Self::at(At::FrameType, limit)
    }

    /// For a unidirectional stream: its type first; frames if control.
    pub(crate) fn unidirectional(limit: u64) -> Self {
        Self::at(At::StreamType, limit)
    }

    fn at(at: At, limit: u64) -> Self {
        Scanner {
            at,
            var: 0,
            var_len: 0,
            var_read: 0,
            limit,
        }
    }

    /// Takes the next bytes of the stream. Errors with the declared length
    /// of a non-DATA frame over the limit.
    pub(crate) fn feed(&mut self, mut chunk: &[u8]) -> Result<(), u64> {
        while let Some(&b) = chunk.first() {
            match self.at {
                At::Off => return Ok(()),
                At::Payload { left } => {
                    let n = left.min(chunk.len() as u64);
                    chunk = &chunk[n as usize..];
                    self.at = match left - n {
                        0 => At::FrameType,
                        left => At::Payload { left },
                    };
                }
                _ => {
                    chunk = &chunk[1..];
                    if self.var_len == 0 {
                        self.var_len = 1 << (b >> 6);
                        self.var = u64::from(b & 0x3f);
                    } else {
                        self.var = self.var << 8 | u64::from(b);
                    }
                    self.var_read += 1;
                    if self.var_read == self.var_len {
                        let v = self.var;
                        (self.var_len, self.var_read) = (0, 0);
                        self.at = self.next(v)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Where a complete integer `v` leads.
    fn next(&self, v: u64) -> Result<At, u64> {
        Ok(match self.at {
            At::StreamType if v == CONTROL => At::FrameType,
            At::FrameType if v == WEBTRANSPORT_STREAM => At::Off,
            At::FrameType => At::FrameLen { ty: v },
            At::FrameLen { ty } if ty != DATA && v > self.limit => return Err(v),
            At::FrameLen { .. } if v == 0 => At::FrameType,
            At::FrameLen { .. } => At::Payload { left: v },
            _ => At::Off,
        })
    }
}

/// The client's streams of a connection ([`streams`]), their receiving
/// halves watched; the server's own streams are `h3-quinn`'s.
pub(crate) struct Conn {
    inner: h3_quinn::Connection,
    accept: streams::Acceptor,
    watch: Watch,
}

/// What a watched stream needs: the connection to close, the limit.
#[derive(Clone)]
struct Watch {
    qconn: quinn::Connection,
    limit: u64,
}

impl Watch {
    fn recv(&self, inner: streams::Recv, scan: fn(u64) -> Scanner) -> Recv {
        Recv {
            inner,
            scan: scan(self.limit),
            qconn: self.qconn.clone(),
        }
    }
}

impl Conn {
    /// Wraps `qconn`; non-DATA frames over `limit` bytes close it.
    pub(crate) fn new(qconn: quinn::Connection, limit: u64) -> Self {
        Conn {
            inner: h3_quinn::Connection::new(qconn.clone()),
            accept: streams::Acceptor::new(qconn.clone()),
            watch: Watch { qconn, limit },
        }
    }
}

impl<B: Buf> quic::Connection<B> for Conn {
    type RecvStream = Recv;
    type OpenStreams = Opener;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Recv, ConnectionErrorIncoming>> {
        let s = ready!(self.accept.poll_uni(cx))?;
        Poll::Ready(Ok(self.watch.recv(s, Scanner::unidirectional)))
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Bidi<B>, ConnectionErrorIncoming>> {
        let (send, recv) = ready!(self.accept.poll_bidi(cx))?;
        Poll::Ready(Ok(Bidi {
            send,
            recv: self.watch.recv(recv, Scanner::request),
        }))
    }

    fn opener(&self) -> Opener {
        Opener {
            inner: quic::Connection::<B>::opener(&self.inner),
        }
    }
}

/// Opens the server's unidirectional streams as `h3-quinn` does (an HTTP/3
/// server opens no bidirectional stream; the trait asks for it).
pub(crate) struct Opener {
    inner: h3_quinn::OpenStreams,
}

macro_rules! open_streams {
    ($t:ty) => {
        impl<B: Buf> quic::OpenStreams<B> for $t {
            type BidiStream = Bidi<B>;
            type SendStream = h3_quinn::SendStream<B>;

            fn poll_open_bidi(
                &mut self,
                _cx: &mut Context<'_>,
            ) -> Poll<Result<Bidi<B>, StreamErrorIncoming>> {
                Poll::Ready(Err(StreamErrorIncoming::Unknown(
                    "an HTTP/3 server opens no bidirectional stream".into(),
                )))
            }

            fn poll_open_send(
                &mut self,
                cx: &mut Context<'_>,
            ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
                quic::OpenStreams::<B>::poll_open_send(&mut self.inner, cx)
            }

            fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
                quic::OpenStreams::<B>::close(&mut self.inner, code, reason)
            }
        }
    };
}

open_streams!(Conn);
open_streams!(Opener);

/// A bidirectional stream: its sending half, a watched receiving half.
pub(crate) struct Bidi<B: Buf> {
    send: streams::Send<B>,
    recv: Recv,
}

impl<B: Buf> quic::BidiStream<B> for Bidi<B> {
    type SendStream = streams::Send<B>;
    type RecvStream = Recv;

    fn split(self) -> (Self::SendStream, Recv) {
        (self.send, self.recv)
    }
}

super::streams::forward_send_stream!(Bidi, send);

impl<B: Buf> quic::RecvStream for Bidi<B> {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        self.recv.poll_data(cx)
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.recv.stop_sending(error_code)
    }

    fn recv_id(&self) -> StreamId {
        self.recv.recv_id()
    }
}

/// The receiving half of a stream, watched by its [`Scanner`].
pub(crate) struct Recv {
    inner: streams::Recv,
    scan: Scanner,
    qconn: quinn::Connection,
}

impl quic::RecvStream for Recv {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let r = ready!(self.inner.poll_data(cx));
        if let Ok(Some(chunk)) = &r {
            if let Err(declared) = self.scan.feed(chunk) {
                tracing::debug!(
                    "HTTP/3 frame of {declared} bytes from {}: closing (H3_EXCESSIVE_LOAD)",
                    self.qconn.remote_address()
                );
                self.qconn
                    .close(quinn::VarInt::from_u32(EXCESSIVE_LOAD), b"frame too large");
                let connection_error = ConnectionErrorIncoming::ApplicationClose {
                    error_code: u64::from(EXCESSIVE_LOAD),
                };
                return Poll::Ready(Err(StreamErrorIncoming::ConnectionErrorIncoming {
                    connection_error,
                }));
            }
        }
        Poll::Ready(r)
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.inner.stop_sending(error_code)
    }

    fn recv_id(&self) -> StreamId {
        self.inner.recv_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ty: u8, len: u64) -> Vec<u8> {
        let mut v = vec![ty];
        v.extend_from_slice(&(len | 0xc000_0000_0000_0000).to_be_bytes());
        v
    }

    #[test]
    fn data_of_any_length_passes_small_frames_pass() {
        let mut s = Scanner::request(100);
        let mut bytes = frame(0x01, 3);
        bytes.extend_from_slice(b"abc");
        bytes.extend(frame(0x00, 1 << 40));
        assert_eq!(s.feed(&bytes), Ok(()));
        assert_eq!(s.at, At::Payload { left: 1 << 40 });
    }

    #[test]
    fn a_large_unknown_frame_is_caught_across_chunks() {
        let mut s = Scanner::request(100);
        let mut bytes = frame(0x01, 2);
        bytes.extend_from_slice(b"hh");
        bytes.extend(frame(0x21, 101));
        let (a, b) = bytes.split_at(7);
        assert_eq!(s.feed(a), Ok(()));
        assert_eq!(s.feed(b), Err(101));
    }

    #[test]
    fn control_streams_are_watched_others_not() {
        let mut c = Scanner::unidirectional(100);
        let mut bytes = vec![0x00];
        bytes.extend(frame(0x04, 1000));
        assert_eq!(c.feed(&bytes), Err(1000));
        let mut q = Scanner::unidirectional(100);
        let mut bytes = vec![0x02];
        bytes.extend(frame(0x04, 1000));
        assert_eq!(q.feed(&bytes), Ok(()));
    }

    #[test]
    fn the_limit_is_four_field_sections_at_least_64_kib() {
        assert_eq!(limit(16 * 1024), 64 * 1024);
        assert_eq!(limit(65536), 4 * 65536);
    }
}
