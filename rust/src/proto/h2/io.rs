//! The transport of an HTTP/2 connection as hyper sees it: the connection's
//! [`ConnIo`], with what the client sends scanned frame by frame on its way
//! to h2, for interim responses (see [`interim`](crate::http::interim)).
//!
//! hyper's HTTP/2 server hands the service a request but never its stream
//! id, and a 103 is a HEADERS frame on that stream. So each request's field
//! block is given one more field, [`STREAM_FIELD`], holding its stream id,
//! at the end of the block's last frame (whose length grows by the field's
//! ~25 octets). Where that frame is padded or would outgrow the smallest
//! frame size a peer must accept (16,384, RFC 9113 §4.2), the field comes
//! in a CONTINUATION frame (§6.10) of its own instead, and the END_HEADERS
//! flag moves to it. The field is an HPACK literal
//! without indexing (RFC 7541 §6.2.2), so h2's decoder state is what the
//! client's encoder expects; the service takes it out before anything else
//! reads the request. Its value is `<stream id>.<token>`, the token a random
//! number of the connection's: a client that sends the field itself (or
//! crafts a literal that swallows the server's) cannot name a stream, and
//! its values are taken out too.
//!
//! The scan also watches the client's SETTINGS: a client that shrinks its
//! HPACK dynamic table (`SETTINGS_HEADER_TABLE_SIZE` below 4,096, RFC 7541
//! §4.2) requires a table size update at the start of the next field block
//! the server sends, which h2 writes into its own next block, not into
//! ours; interim responses are turned off on such a connection.
//!
//! Cost: one copy of what the client sends, and a look at each frame
//! header; frame payloads pass untouched.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use http::header::{Entry, HeaderMap, HeaderName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::http::interim::{
    frame_head, hpack_literal, InterimSlot, CONTINUATION, END_HEADERS, HEADERS, MAX_FRAME,
};
use crate::http::io::{ConnIo, Readiness};
use crate::proto::h2::PREFACE;

/// The field carrying a request's stream id from the transport to the
/// service (never seen by the app).
pub(crate) static STREAM_FIELD: HeaderName = HeaderName::from_static("x-skirr-h2-stream");

/// What the field costs in h2's header-list accounting (RFC 9113 §6.5.2:
/// name, value, 32): added to `http2_max_header_list_size`, so that a
/// client's limit is the one configured.
pub(crate) const STREAM_FIELD_COST: u32 = 96;

const SETTINGS: u8 = 0x4;
const PADDED: u8 = 0x8;
const ACK: u8 = 0x1;
const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;

/// The frame scanner: fed the client's bytes in any pieces, it writes
/// them out with each request's field block extended.
#[derive(Debug)]
pub(crate) struct Scan {
    /// Connection preface bytes still to pass (RFC 9113 §3.4).
    preface: usize,
    /// The frame header being gathered, and how much of it is here.
    head: [u8; 9],
    have: usize,
    /// Payload bytes of the current frame still to pass.
    left: usize,
    /// The current frame is SETTINGS (not an ack): its entries are read.
    settings: bool,
    /// A SETTINGS entry being gathered (RFC 9113 §6.5.1: 6 octets).
    entry: [u8; 6],
    entry_have: usize,
    /// Once the current frame's payload has passed, append this: the
    /// stream-id field (its frame's length already counts it), or a whole
    /// CONTINUATION frame holding it.
    mark_after: Vec<u8>,
    /// A new stream whose field block is still open (CONTINUATION frames
    /// to come).
    open_block: Option<u32>,
    /// The highest stream id the client has opened.
    last_stream: u32,
    /// The client shrank its HPACK table.
    pub(crate) shrunk: bool,
    /// The connection's token, in each stream-id field.
    token: u64,
}

impl Scan {
    /// A scanner at the start of a connection (the preface comes first),
    /// marking stream ids with `token`.
    pub(crate) fn new(token: u64) -> Self {
        Scan {
            preface: PREFACE.len(),
            head: [0; 9],
            have: 0,
            left: 0,
            settings: false,
            entry: [0; 6],
            entry_have: 0,
            mark_after: Vec::new(),
            open_block: None,
            last_stream: 0,
            shrunk: false,
            token,
        }
    }

    /// Passes `data` to `out`, extending each request's field block.
    pub(crate) fn feed(&mut self, mut data: &[u8], out: &mut BytesMut) {
        while !data.is_empty() {
            if self.preface > 0 {
                let n = self.preface.min(data.len());
                out.extend_from_slice(&data[..n]);
                self.preface -= n;
                data = &data[n..];
                continue;
            }
            if self.have == 9 {
                let n = self.left.min(data.len());
                if self.settings {
                    self.settings_bytes(&data[..n]);
                }
                out.extend_from_slice(&data[..n]);
                self.left -= n;
                data = &data[n..];
                if self.left == 0 {
                    self.frame_end(out);
                }
                continue;
            }
            let n = (9 - self.have).min(data.len());
            self.head[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have == 9 {
                self.frame_start(out);
            }
        }
    }

    /// A whole frame header is here: note what it starts, pass it on.
    fn frame_start(&mut self, out: &mut BytesMut) {
        let h = &mut self.head;
        self.left = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
        let (kind, flags) = (h[3], h[4]);
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        // A HEADERS frame on a new client stream (odd id, above every id
        // before; RFC 9113 §5.1.1) opens a request's field block; one on
        // an open stream is trailers, left alone. h2 rejects anything else.
        if kind == HEADERS && stream % 2 == 1 && stream > self.last_stream {
            self.last_stream = stream;
            self.open_block = Some(stream);
        }
        if (kind == HEADERS || kind == CONTINUATION)
            && flags & END_HEADERS != 0
            && self.open_block == Some(stream)
        {
            self.open_block = None;
            let mut field = Vec::with_capacity(64);
            hpack_literal(
                &mut field,
                STREAM_FIELD.as_str().as_bytes(),
                &field_value(stream, self.token),
            );
            // Padding comes last in a frame: the field cannot follow it.
            let padded = kind == HEADERS && flags & PADDED != 0;
            if !padded && self.left + field.len() <= MAX_FRAME {
                let len = (self.left + field.len()) as u32;
                h[..3].copy_from_slice(&len.to_be_bytes()[1..]);
                self.mark_after = field;
            } else {
                h[4] = flags & !END_HEADERS;
                let mut frame = BytesMut::with_capacity(9 + field.len());
                frame_head(&mut frame, field.len(), CONTINUATION, END_HEADERS, stream);
                frame.extend_from_slice(&field);
                self.mark_after = frame.to_vec();
            }
        }
        self.settings = kind == SETTINGS && flags & ACK == 0 && stream == 0;
        self.entry_have = 0;
        out.extend_from_slice(&self.head);
        if self.left == 0 {
            self.frame_end(out);
        }
    }

    /// The current frame's payload has passed whole.
    fn frame_end(&mut self, out: &mut BytesMut) {
        self.have = 0;
        self.settings = false;
        if !self.mark_after.is_empty() {
            out.extend_from_slice(&self.mark_after);
            self.mark_after.clear();
        }
    }

    fn settings_bytes(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let n = (6 - self.entry_have).min(data.len());
            self.entry[self.entry_have..self.entry_have + n].copy_from_slice(&data[..n]);
            self.entry_have += n;
            data = &data[n..];
            if self.entry_have == 6 {
                self.entry_have = 0;
                let e = &self.entry;
                let id = u16::from_be_bytes([e[0], e[1]]);
                let value = u32::from_be_bytes([e[2], e[3], e[4], e[5]]);
                if id == SETTINGS_HEADER_TABLE_SIZE && value < 4096 {
                    self.shrunk = true;
                }
            }
        }
    }
}

/// `n` in decimal, in `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// The stream-id field's value: `<stream>.<token>`.
fn field_value(stream: u32, token: u64) -> Vec<u8> {
    let mut b = [0u8; 20];
    let mut v = Vec::with_capacity(32);
    v.extend_from_slice(decimal(stream.into(), &mut b));
    v.push(b'.');
    v.extend_from_slice(decimal(token, &mut b));
    v
}

/// A connection's token for its stream-id fields: random (std's SipHash
/// keys, seeded per process from the OS), so a client cannot guess it.
pub(crate) fn new_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// Takes every value of the stream-id field out of a request's fields and
/// returns the stream id of the one that carries the connection's `token`
/// (an odd id, as a client's streams are; RFC 9113 §5.1.1).
pub(crate) fn take_stream_id(headers: &mut HeaderMap, token: u64) -> Option<u32> {
    let Entry::Occupied(e) = headers.entry(&STREAM_FIELD) else {
        return None;
    };
    let (_, values) = e.remove_entry_mult();
    let mut b = [0u8; 20];
    let tail = decimal(token, &mut b);
    let mut found = None;
    for v in values {
        let v = v.as_bytes();
        let Some(id) = v.strip_suffix(tail).and_then(|r| r.strip_suffix(b".")) else {
            continue;
        };
        found = std::str::from_utf8(id)
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .filter(|id| id % 2 == 1);
    }
    found
}

/// An HTTP/2 connection's socket: reads pass through [`Scan`]; writes go
/// to the [`ConnIo`] as they are (which writes interim responses).
pub(crate) struct H2Io<I> {
    io: ConnIo<I>,
    slot: Arc<InterimSlot>,
    scan: Scan,
    /// Scanned bytes not yet handed to h2.
    out: BytesMut,
    /// What one read of the socket fills.
    raw: Box<[u8]>,
}

impl<I> H2Io<I> {
    /// The transport of one HTTP/2 connection whose stream-id fields carry
    /// `token` (see [`new_token`]).
    pub(crate) fn new(io: ConnIo<I>, token: u64) -> Self {
        let slot = Arc::clone(&io.conn.interim);
        H2Io {
            io,
            slot,
            scan: Scan::new(token),
            out: BytesMut::new(),
            raw: vec![0; 16 * 1024].into_boxed_slice(),
        }
    }
}

impl<I: AsyncRead + Readiness + Unpin> AsyncRead for H2Io<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(())); // nothing asked for: not an end of stream
        }
        if this.out.is_empty() {
            let mut rb = ReadBuf::new(&mut this.raw[..]);
            match Pin::new(&mut this.io).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {}
                Poll::Pending => {
                    // The connection's task waits here between frames: a
                    // stream's service loading an interim response wakes
                    // it to flush.
                    this.slot.set_flusher(cx.waker());
                    // An idle connection keeps no scanned-bytes buffer.
                    this.out = BytesMut::new();
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            }
            if rb.filled().is_empty() {
                return Poll::Ready(Ok(())); // end of stream
            }
            this.scan.feed(rb.filled(), &mut this.out);
            if this.scan.shrunk && !this.slot.is_off() {
                tracing::debug!("HTTP/2 client shrank its HPACK table: no interim responses");
                this.slot.turn_off();
            }
        }
        let n = this.out.len().min(buf.remaining());
        buf.put_slice(&this.out[..n]);
        this.out.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for H2Io<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRI: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        frame_head(&mut b, payload.len(), kind, flags, stream);
        b.extend_from_slice(payload);
        b.to_vec()
    }

    const TOKEN: u64 = 123_456_789_012;

    fn field(stream: u32) -> Vec<u8> {
        let mut block = Vec::new();
        let value = format!("{stream}.{TOKEN}");
        hpack_literal(&mut block, b"x-skirr-h2-stream", value.as_bytes());
        block
    }

    /// A frame with the stream-id field appended to its payload.
    fn extended(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        frame(kind, flags, stream, &[payload, &field(stream)].concat())
    }

    /// Feeds `input` split at every point (two pieces) and one byte at a
    /// time: the output never depends on how the reads fall.
    fn scan_all_ways(input: &[u8]) -> Vec<u8> {
        let mut whole = BytesMut::new();
        Scan::new(TOKEN).feed(input, &mut whole);
        for cut in 0..=input.len() {
            let mut out = BytesMut::new();
            let mut s = Scan::new(TOKEN);
            s.feed(&input[..cut], &mut out);
            s.feed(&input[cut..], &mut out);
            assert_eq!(out, whole, "cut at {cut}");
        }
        let mut out = BytesMut::new();
        let mut s = Scan::new(TOKEN);
        for b in input {
            s.feed(std::slice::from_ref(b), &mut out);
        }
        assert_eq!(out, whole);
        whole.to_vec()
    }

    #[test]
    fn each_request_block_gets_its_stream_id_trailers_and_data_do_not() {
        let settings = frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]);
        let h1 = frame(HEADERS, END_HEADERS | 0x1, 1, b"abc");
        let h3 = frame(HEADERS, 0, 3, b"de");
        let c3 = frame(CONTINUATION, END_HEADERS, 3, b"f");
        let data = frame(0x0, 0, 3, b"body");
        let trailers = frame(HEADERS, END_HEADERS | 0x1, 3, b"t");
        let input = [PRI, &settings[..], &h1, &h3, &c3, &data, &trailers].concat();
        let want = [
            PRI,
            &settings[..],
            &extended(HEADERS, END_HEADERS | 0x1, 1, b"abc"),
            &h3,
            &extended(CONTINUATION, END_HEADERS, 3, b"f"),
            &data,
            &trailers,
        ]
        .concat();
        assert_eq!(scan_all_ways(&input), want);
    }

    #[test]
    fn a_padded_or_full_frame_is_followed_by_a_continuation() {
        // PADDED: pad length 2, "ab", two octets of padding.
        let padded = frame(HEADERS, END_HEADERS | PADDED, 1, &[2, b'a', b'b', 0, 0]);
        let full = frame(HEADERS, END_HEADERS, 3, &vec![b'x'; MAX_FRAME - 4]);
        let input = [PRI, &padded[..], &full].concat();
        let mut padded_out = padded.clone();
        padded_out[4] = PADDED;
        let mut full_out = full.clone();
        full_out[4] = 0;
        let want = [
            PRI,
            &padded_out[..],
            &frame(CONTINUATION, END_HEADERS, 1, &field(1)),
            &full_out,
            &frame(CONTINUATION, END_HEADERS, 3, &field(3)),
        ]
        .concat();
        assert_eq!(scan_all_ways(&input), want);
    }

    #[test]
    fn a_shrunk_hpack_table_is_noticed_an_ack_is_not() {
        let ack = frame(SETTINGS, ACK, 0, &[]);
        let input = [PRI, &ack[..], &frame(SETTINGS, 0, 0, &[0, 1, 0, 0, 16, 0])].concat();
        let mut s = Scan::new(TOKEN);
        s.feed(&input, &mut BytesMut::new());
        assert!(!s.shrunk, "4096 is the initial size");
        s.feed(
            &frame(SETTINGS, 0, 0, &[0, 4, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0]),
            &mut BytesMut::new(),
        );
        assert!(s.shrunk);
    }

    #[test]
    fn numbers_in_decimal() {
        let mut b = [0; 20];
        assert_eq!(decimal(0, &mut b), b"0");
        assert_eq!(decimal(2_147_483_647, &mut b), b"2147483647");
        assert_eq!(decimal(u64::MAX, &mut b), b"18446744073709551615");
    }

    #[test]
    fn only_a_value_with_the_token_names_a_stream() {
        let mut h = HeaderMap::new();
        h.append(&STREAM_FIELD, "7".parse().unwrap());
        h.append(&STREAM_FIELD, "9.1".parse().unwrap());
        h.append(&STREAM_FIELD, format!("5.{TOKEN}").parse().unwrap());
        h.append(&STREAM_FIELD, "11.x".parse().unwrap());
        assert_eq!(take_stream_id(&mut h, TOKEN), Some(5));
        assert!(h.is_empty());
        // Even ids are the server's, never a request's.
        h.append(&STREAM_FIELD, format!("4.{TOKEN}").parse().unwrap());
        assert_eq!(take_stream_id(&mut h, TOKEN), None);
        h.append(&STREAM_FIELD, "3".parse().unwrap());
        assert_eq!(take_stream_id(&mut h, TOKEN), None);
        assert!(h.is_empty());
    }
}
