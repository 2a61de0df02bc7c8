//! The field sections of a request stream, checked as their bytes pass to
//! h3 0.0.8 for what h3 lets through (RFC 9114 §4.3): a pseudo-header
//! repeated, one after a regular field, a response pseudo-header
//! (`:status`) in a request, and any pseudo-header in trailers. h3 keeps
//! the last value, does not expose the order, and drops the others, so
//! Skirr reads the field *names* itself. Skirr advertises no QPACK dynamic
//! table, so a valid section names fields by the static table or by
//! literals; a section that uses the dynamic table is h3's error
//! (`QPACK_DECOMPRESSION_FAILED`) and is not looked at here. A literal name
//! is compared with each pseudo-header name as sent plain and as sent
//! Huffman-coded (RFC 7541 Appendix B: one encoding per name), so no
//! Huffman decoder is needed. [`GuardedBidi`] carries the check on the
//! request streams the connection ([`super::guard::Guarded`]) accepts.

use std::task::{Context, Poll};

use ::h3::quic::{self, StreamErrorIncoming, StreamId};
use bytes::{Buf, Bytes};

use super::frame_limit;
use super::guard::varint;

/// HEADERS frames longer than this are not checked (h3 answers a field
/// section over `http2_max_header_list_size` with 431 anyway), bytes.
const MAX_CHECKED: u64 = 256 * 1024;

const HEADERS: u64 = 0x01;

/// A pseudo-header by name, or `None` for a regular field.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pseudo {
    Authority,
    Path,
    Method,
    Scheme,
    Status,
    Protocol,
    /// A name starting with `:` that is none of the above (h3 refuses it).
    Other,
}

impl Pseudo {
    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// The pseudo-headers, plain and Huffman-coded (RFC 7541 Appendix B).
const NAMES: [(Pseudo, &[u8], &[u8]); 6] = [
    (
        Pseudo::Authority,
        b":authority",
        &[0xb8, 0x3b, 0x53, 0x39, 0xec, 0x32, 0x7d, 0x7f],
    ),
    (Pseudo::Method, b":method", &[0xb9, 0x49, 0x53, 0x39, 0xe4]),
    (Pseudo::Path, b":path", &[0xb9, 0x58, 0xd3, 0x3f]),
    (Pseudo::Scheme, b":scheme", &[0xb8, 0x82, 0x4e, 0x5a, 0x4b]),
    (Pseudo::Status, b":status", &[0xb8, 0x84, 0x8d, 0x36, 0xa3]),
    (
        Pseudo::Protocol,
        b":protocol",
        &[0xb9, 0x5d, 0x87, 0x49, 0xc8, 0x7a, 0x3f],
    ),
];

/// The name at `index` of the QPACK static table (RFC 9204 Appendix A).
fn static_name(index: u64) -> Option<Pseudo> {
    match index {
        0 => Some(Pseudo::Authority),
        1 => Some(Pseudo::Path),
        15..=21 => Some(Pseudo::Method),
        22..=23 => Some(Pseudo::Scheme),
        24..=28 | 63..=71 => Some(Pseudo::Status),
        _ => None,
    }
}

/// A literal name: which pseudo-header it is, if any. A Huffman-coded `:`
/// is the 7 bits 1011100.
fn literal_name(name: &[u8], huffman: bool) -> Option<Pseudo> {
    let pseudo = if huffman {
        name.first().is_some_and(|b| b & 0xfe == 0xb8)
    } else {
        name.first() == Some(&b':')
    };
    if !pseudo {
        return None;
    }
    let found = NAMES
        .iter()
        .find(|&&(_, plain, huff)| name == if huffman { huff } else { plain });
    Some(found.map_or(Pseudo::Other, |n| n.0))
}

/// A QPACK prefix integer of `bits` bits at `buf[*pos]` (RFC 9204 §4.1.1);
/// advances `pos` past it.
fn prefix_int(buf: &[u8], pos: &mut usize, bits: u32) -> Option<u64> {
    let mask = ((1u16 << bits) - 1) as u8;
    let mut v = u64::from(*buf.get(*pos)? & mask);
    *pos += 1;
    if v < u64::from(mask) {
        return Some(v);
    }
    let mut shift = 0u32;
    loop {
        let b = *buf.get(*pos)?;
        *pos += 1;
        v = v.checked_add(u64::from(b & 0x7f).checked_shl(shift)?)?;
        if b & 0x80 == 0 {
            return Some(v);
        }
        shift += 7;
        if shift > 56 {
            return None;
        }
    }
}

/// A string literal whose length prefix has `bits` bits and whose Huffman
/// flag is the bit above it: the bytes and whether they are Huffman-coded.
fn string<'a>(buf: &'a [u8], pos: &mut usize, bits: u32) -> Option<(&'a [u8], bool)> {
    let huffman = *buf.get(*pos)? & (1 << bits) != 0;
    let len = usize::try_from(prefix_int(buf, pos, bits)?).ok()?;
    let s = buf.get(*pos..pos.checked_add(len)?)?;
    *pos += len;
    Some((s, huffman))
}

/// Calls `each` with the name of each of a field section's lines, in
/// order; `None` where the section cannot be read without a dynamic table
/// (h3 reports that).
fn names(section: &[u8], mut each: impl FnMut(Option<Pseudo>)) -> Option<()> {
    let mut pos = 0;
    // Required Insert Count, then the Base: 0 without a dynamic table.
    if prefix_int(section, &mut pos, 8)? != 0 {
        return None;
    }
    prefix_int(section, &mut pos, 7)?;
    while pos < section.len() {
        let b = section[pos];
        let name = if b & 0x80 != 0 {
            // Indexed field line; T (0x40) set: the static table.
            if b & 0x40 == 0 {
                return None;
            }
            static_name(prefix_int(section, &mut pos, 6)?)
        } else if b & 0x40 != 0 {
            // Literal with name reference; T (0x10): static.
            if b & 0x10 == 0 {
                return None;
            }
            let name = static_name(prefix_int(section, &mut pos, 4)?);
            string(section, &mut pos, 7)?;
            name
        } else if b & 0x20 != 0 {
            // Literal with literal name (H is 0x08, a 3-bit length).
            let (n, huffman) = string(section, &mut pos, 3)?;
            let name = literal_name(n, huffman);
            string(section, &mut pos, 7)?;
            name
        } else {
            // Post-base references: the dynamic table.
            return None;
        };
        each(name);
    }
    Some(())
}

/// Whether a field section breaks RFC 9114 §4.3 in a way h3 lets through:
/// in a request head (`trailers` false) a repeated pseudo-header, one after
/// a regular field, or `:status`; in trailers, any pseudo-header. A
/// section that cannot be read is not (h3 refuses it).
fn malformed(section: &[u8], trailers: bool) -> bool {
    let (mut seen, mut regular, mut bad) = (0u8, false, false);
    let read = names(section, |name| match name {
        None => regular = true,
        Some(_) if trailers || regular => bad = true,
        Some(Pseudo::Status) => bad = true,
        Some(p) if p != Pseudo::Other && seen & p.bit() != 0 => bad = true,
        Some(p) => seen |= p.bit(),
    });
    read.is_some() && bad
}

/// Follows a request stream's frames as they pass to h3, keeping each
/// HEADERS frame's payload (up to [`MAX_CHECKED`]) to check it whole: the
/// first is the request head, later ones trailers.
#[derive(Default)]
pub(crate) struct HeadCheck {
    /// Payload bytes still to pass over (not a HEADERS frame's).
    skip: u64,
    /// A frame header, then a HEADERS frame, read so far.
    pending: Vec<u8>,
    /// The length of the HEADERS frame being kept, header included.
    keep: Option<usize>,
    /// Where its payload starts in `pending`.
    start: usize,
    /// HEADERS frames checked so far.
    sections: u32,
    /// A field section was malformed: the stream's reads fail from then on.
    pub(crate) failed: bool,
}

impl HeadCheck {
    /// Checks the stream's next bytes; `Err` if a field section is
    /// malformed (a stream error H3_MESSAGE_ERROR).
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<(), ()> {
        let mut i = 0;
        while i < bytes.len() {
            if self.skip == 0 && self.keep.is_none() && self.pending.is_empty() {
                // At a frame's start: a frame header, and a HEADERS frame,
                // that this chunk holds whole are read in place.
                if let Some(n) = self.whole_frame(&bytes[i..])? {
                    i += n;
                    continue;
                }
            }
            if self.skip > 0 {
                let n = (bytes.len() - i).min(usize::try_from(self.skip).unwrap_or(usize::MAX));
                self.skip -= n as u64;
                i += n;
                continue;
            }
            if let Some(end) = self.keep {
                let n = (end - self.pending.len()).min(bytes.len() - i);
                self.pending.extend_from_slice(&bytes[i..i + n]);
                i += n;
                if self.pending.len() == end {
                    self.check()?;
                }
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
            if ty == HEADERS && len <= MAX_CHECKED {
                self.keep = Some(a + b + len as usize);
                self.start = a + b;
                if len == 0 {
                    self.check()?;
                }
            } else {
                // A HEADERS frame too long to check still counts: what
                // follows it is trailers.
                self.sections += u32::from(ty == HEADERS);
                self.skip = len;
                self.pending.clear();
            }
        }
        Ok(())
    }

    /// At a frame's start in `bytes`: if its header is whole there, follows
    /// it (a HEADERS frame is checked, if whole there too, else kept as
    /// [`HeadCheck::feed`] does) and returns the bytes passed over;
    /// `Ok(None)`: the header is cut, the caller goes byte by byte.
    fn whole_frame(&mut self, bytes: &[u8]) -> Result<Option<usize>, ()> {
        let Some((ty, a)) = varint(bytes) else {
            return Ok(None);
        };
        let Some((len, b)) = varint(&bytes[a..]) else {
            return Ok(None);
        };
        let start = a + b;
        if ty != HEADERS || len > MAX_CHECKED {
            self.sections += u32::from(ty == HEADERS);
            self.skip = len;
            return Ok(Some(start));
        }
        let end = start + len as usize;
        match bytes.get(start..end) {
            Some(section) => self.check_section(section).map(|()| Some(end)),
            None => {
                self.pending.extend_from_slice(&bytes[..start]);
                self.keep = Some(end);
                self.start = start;
                Ok(Some(start))
            }
        }
    }

    /// Checks the HEADERS frame kept in `pending`.
    fn check(&mut self) -> Result<(), ()> {
        let pending = std::mem::take(&mut self.pending);
        let checked = self.check_section(&pending[self.start..]);
        self.pending = pending;
        self.pending.clear();
        self.keep = None;
        checked
    }

    /// Checks one field section, the next of the stream.
    fn check_section(&mut self, section: &[u8]) -> Result<(), ()> {
        let bad = malformed(section, self.sections > 0);
        self.sections += 1;
        if bad {
            self.failed = true;
            Err(())
        } else {
            Ok(())
        }
    }
}

/// The stream error a malformed field section is (RFC 9114 §4.1.2).
const MESSAGE_ERROR: u64 = 0x10e;

/// A request stream whose field sections are checked as h3 reads them
/// ([`HeadCheck`]): a malformed request head resets the stream and stops
/// its sending (`H3_MESSAGE_ERROR`), and h3 gets that as the stream's
/// error, so the request never reaches the app.
pub(crate) struct GuardedBidi<B: Buf> {
    inner: frame_limit::Bidi<B>,
    check: HeadCheck,
}

impl<B: Buf> GuardedBidi<B> {
    pub(crate) fn new(inner: frame_limit::Bidi<B>) -> Self {
        GuardedBidi {
            inner,
            check: HeadCheck::default(),
        }
    }
}

/// Reads `stream` through `check`: a malformed field section becomes the
/// stream error h3 sees, at that read and every later one (the caller
/// stops the stream).
fn checked<S: quic::RecvStream<Buf = Bytes>>(
    stream: &mut S,
    check: &mut HeadCheck,
    cx: &mut Context<'_>,
) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
    let message_error = || {
        Poll::Ready(Err(StreamErrorIncoming::StreamTerminated {
            error_code: MESSAGE_ERROR,
        }))
    };
    if check.failed {
        return message_error();
    }
    let got = quic::RecvStream::poll_data(stream, cx);
    if let Poll::Ready(Ok(Some(b))) = &got {
        if check.feed(b).is_err() {
            return message_error();
        }
    }
    got
}

impl<B: Buf> quic::RecvStream for GuardedBidi<B> {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let was = self.check.failed;
        let got = checked(&mut self.inner, &mut self.check, cx);
        if self.check.failed && !was {
            quic::SendStream::<B>::reset(&mut self.inner, MESSAGE_ERROR);
            quic::RecvStream::stop_sending(&mut self.inner, MESSAGE_ERROR);
        }
        got
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.inner.stop_sending(error_code)
    }

    fn recv_id(&self) -> StreamId {
        self.inner.recv_id()
    }
}

super::streams::forward_send_stream!(GuardedBidi, inner);

impl<B: Buf> quic::BidiStream<B> for GuardedBidi<B> {
    type SendStream = super::streams::Send<B>;
    type RecvStream = GuardedRecvHalf;

    fn split(self) -> (Self::SendStream, GuardedRecvHalf) {
        let (send, recv) = self.inner.split();
        (
            send,
            GuardedRecvHalf {
                inner: recv,
                check: self.check,
            },
        )
    }
}

/// The receiving half of a request stream, its trailers checked
/// ([`HeadCheck`]): pseudo-header fields in them stop the stream's sending
/// (`H3_MESSAGE_ERROR`) and are the body's error, which the response then
/// answers with a reset ([`super::body`]).
pub(crate) struct GuardedRecvHalf {
    inner: frame_limit::Recv,
    check: HeadCheck,
}

impl quic::RecvStream for GuardedRecvHalf {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let was = self.check.failed;
        let got = checked(&mut self.inner, &mut self.check, cx);
        if self.check.failed && !was {
            self.inner.stop_sending(MESSAGE_ERROR);
        }
        got
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

    /// A field section (prefix 0, 0) of literal-name lines, plain names.
    fn section(names: &[&str]) -> Vec<u8> {
        let mut s = vec![0, 0];
        for n in names {
            assert!(n.len() < 7);
            s.push(0x20 | n.len() as u8);
            s.extend_from_slice(n.as_bytes());
            s.extend_from_slice(&[1, b'v']);
        }
        s
    }

    #[test]
    fn pseudo_headers_once_each_before_regular_fields() {
        assert!(!malformed(&section(&[":path", "x-a"]), false));
        assert!(malformed(&section(&[":path", ":path"]), false));
        assert!(malformed(&section(&["x-a", ":path"]), false));
        assert!(!malformed(&section(&["x-a"]), true));
        assert!(malformed(&section(&[":path"]), true));
        // Static :method GET (17), :path / (1), :status 200 (25).
        assert!(!malformed(&[0, 0, 0xd1, 0xc1], false));
        assert!(malformed(&[0, 0, 0xd1, 0xd9], false));
        assert!(malformed(&[0, 0, 0xd1, 0xd1], false));
        // ":status" Huffman-coded as a literal name (H, length 5).
        let mut s = vec![0, 0, 0x2d, 0xb8, 0x84, 0x8d, 0x36, 0xa3, 1, b'v'];
        assert!(malformed(&s, false));
        s[3] = 0xb9; // some other pseudo-header name: not refused here
        assert!(!malformed(&s, false));
        // A dynamic reference is h3's to refuse.
        assert!(!malformed(&[1, 0, 0x80], false));
    }

    #[test]
    fn frames_are_followed_across_chunks() {
        let mut c = HeadCheck::default();
        let head = section(&[":path", "x-a"]);
        let mut stream = vec![0x01, head.len() as u8];
        stream.extend_from_slice(&head);
        stream.extend_from_slice(&[0x00, 0x03, b'a', b'b', b'c']);
        let trailers = section(&[":path"]);
        stream.extend_from_slice(&[0x01, trailers.len() as u8]);
        stream.extend_from_slice(&trailers);
        let (first, rest) = stream.split_at(4);
        assert_eq!(c.feed(first), Ok(()));
        let (mid, last) = rest.split_at(rest.len() - 2);
        assert_eq!(c.feed(mid), Ok(()));
        assert_eq!(c.feed(last), Err(()));
        // The same stream in one chunk, and byte by byte.
        assert_eq!(HeadCheck::default().feed(&stream), Err(()));
        let mut c = HeadCheck::default();
        let fed: Vec<_> = stream.iter().map(|b| c.feed(&[*b])).collect();
        assert_eq!(fed.last(), Some(&Err(())));
        assert!(fed[..fed.len() - 1].iter().all(Result::is_ok));
        // A well-formed head and body in one chunk pass.
        let mut ok = vec![0x01, head.len() as u8];
        ok.extend_from_slice(&head);
        ok.extend_from_slice(&[0x00, 0x03, b'a', b'b', b'c']);
        assert_eq!(HeadCheck::default().feed(&ok), Ok(()));
    }
}
