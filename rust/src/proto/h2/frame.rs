//! HTTP/2 framing (RFC 9113 §4.1, §6.2, §6.10) and the HPACK literals
//! (RFC 7541 §5, §6.2.2) Skirr writes past hyper: interim (1xx) responses
//! as HEADERS frames (see `crate::http::interim`) and what
//! [`io`](super::io) adds to the wire.

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, StatusCode};

use crate::http::fields::connection_specific;

/// HTTP/2 frame types and flags used here and by `proto::h2::io` (RFC 9113 §6.2,
/// §6.10).
pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const CONTINUATION: u8 = 0x9;
pub(crate) const END_HEADERS: u8 = 0x4;

/// The largest frame payload every peer accepts (the initial
/// `SETTINGS_MAX_FRAME_SIZE`, RFC 9113 §6.5.2), and so the largest a client
/// may send before it has our SETTINGS.
pub(crate) const MAX_FRAME: usize = 16_384;

/// HPACK static table indexes (RFC 7541 Appendix A).
const STATIC_STATUS: usize = 8;
const STATIC_LINK: usize = 45;

/// An HPACK integer with an `n`-bit prefix after the `flags` bits of its
/// first octet (RFC 7541 §5.1).
pub(crate) fn hpack_int(out: &mut Vec<u8>, flags: u8, n: u32, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// An HPACK string literal, not Huffman-coded (RFC 7541 §5.2).
pub(crate) fn hpack_str(out: &mut Vec<u8>, s: &[u8]) {
    hpack_int(out, 0, 7, s.len());
    out.extend_from_slice(s);
}

/// A literal field without indexing with a new name (RFC 7541 §6.2.2): it
/// changes no decoder's dynamic table.
pub(crate) fn hpack_literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0);
    hpack_str(out, name);
    hpack_str(out, value);
}

/// An HTTP/2 frame header (RFC 9113 §4.1).
pub(crate) fn frame_head(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
}

/// Encodes interim responses as HTTP/2 HEADERS frames on `stream` (RFC
/// 9113 §8.1: any number of 1xx field blocks may precede the final one),
/// a block larger than a frame continued in CONTINUATION frames.
pub(crate) fn encode_h2(stream: u32, responses: &[(StatusCode, HeaderMap)]) -> Bytes {
    let mut out = BytesMut::new();
    for (status, headers) in responses {
        let mut block = Vec::with_capacity(64);
        hpack_int(&mut block, 0, 4, STATIC_STATUS);
        hpack_str(&mut block, status.as_str().as_bytes());
        for (name, value) in headers {
            if connection_specific(name) {
                continue;
            }
            if *name == http::header::LINK {
                hpack_int(&mut block, 0, 4, STATIC_LINK);
                hpack_str(&mut block, value.as_bytes());
            } else {
                hpack_literal(&mut block, name.as_str().as_bytes(), value.as_bytes());
            }
        }
        let mut kind = HEADERS;
        let mut rest = &block[..];
        loop {
            let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME));
            let flags = if tail.is_empty() { END_HEADERS } else { 0 };
            frame_head(&mut out, chunk.len(), kind, flags, stream);
            out.extend_from_slice(chunk);
            if tail.is_empty() {
                break;
            }
            rest = tail;
            kind = CONTINUATION;
        }
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::{encode_h2, hpack_int};
    use http::{HeaderMap, HeaderValue, StatusCode};

    #[test]
    fn hpack_integers_follow_rfc_7541_c1() {
        // C.1.1-C.1.3: 10 and 1337 with a 5-bit prefix, 42 with 8 bits.
        let mut b = Vec::new();
        hpack_int(&mut b, 0, 5, 10);
        hpack_int(&mut b, 0, 5, 1337);
        hpack_int(&mut b, 0, 8, 42);
        assert_eq!(b, [10, 31, 154, 10, 42]);
    }

    #[test]
    fn h2_early_hints_are_one_headers_frame_of_literals() {
        let mut h = HeaderMap::new();
        h.append("link", HeaderValue::from_static("</a.css>; rel=preload"));
        h.append("x-y", HeaderValue::from_static("z"));
        h.append("connection", HeaderValue::from_static("close"));
        let b = encode_h2(5, &[(StatusCode::EARLY_HINTS, h)]);
        let mut block = vec![0x08, 3, b'1', b'0', b'3', 0x0f, 30, 21];
        block.extend_from_slice(b"</a.css>; rel=preload");
        block.extend_from_slice(&[0, 3, b'x', b'-', b'y', 1, b'z']);
        let mut want = vec![0, 0, block.len() as u8, 0x1, 0x4, 0, 0, 0, 5];
        want.extend_from_slice(&block);
        assert_eq!(&b[..], &want[..]);
    }

    #[test]
    fn h2_block_over_a_frame_is_continued() {
        let mut h = HeaderMap::new();
        let v = "x".repeat(20_000);
        h.append("link", HeaderValue::from_str(&v).unwrap());
        let b = encode_h2(1, &[(StatusCode::EARLY_HINTS, h)]);
        let first = u32::from_be_bytes([0, b[0], b[1], b[2]]) as usize;
        assert_eq!((first, b[3], b[4]), (16_384, 0x1, 0));
        let next = &b[9 + first..];
        let second = u32::from_be_bytes([0, next[0], next[1], next[2]]) as usize;
        assert_eq!((next[3], next[4], next.len()), (0x9, 0x4, 9 + second));
    }
}
