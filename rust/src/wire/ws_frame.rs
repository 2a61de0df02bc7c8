//! WebSocket framing, server side (RFC 6455 §5), with permessage-deflate
//! (RFC 7692) on the message layer: a push parser that turns the client's
//! bytes into messages, and the encoder for Skirr's frames. No I/O, no
//! allocation beyond the message being assembled: it is unit-tested and
//! fuzzed on its own (`rust/fuzz`, target `ws_frame`).
//!
//! The reader checks everything §5 requires of a client's frames (mask,
//! reserved bits and opcodes, control frames short and unfragmented,
//! continuation order, close payloads) and works on payload bytes as they
//! arrive, not once a frame is complete: a text message is validated as
//! UTF-8 incrementally, so an invalid prefix fails at once (§8.1, "fail
//! fast"), and a compressed message is inflated as it arrives, its size
//! checked against the limit while inflating.

use super::ws_deflate::{InflateError, Inflater};

/// Opcodes (§5.2).
pub mod opcode {
    pub const CONTINUATION: u8 = 0x0;
    pub const TEXT: u8 = 0x1;
    pub const BINARY: u8 = 0x2;
    pub const CLOSE: u8 = 0x8;
    pub const PING: u8 = 0x9;
    pub const PONG: u8 = 0xA;
}

/// A complete message or control frame from the client.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming {
    /// A text message; its bytes are valid UTF-8 (checked).
    Text(Vec<u8>),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    /// A close frame: its code and reason, or `None` if it had no payload.
    /// The code is as received (see [`close_code_allowed`]).
    Close(Option<(u16, String)>),
}

/// Why the client's bytes cannot be read on; each fails the connection.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadError {
    /// A protocol violation (close 1002); the text says which.
    Protocol(&'static str),
    /// A text message or close reason that is not UTF-8 (close 1007).
    InvalidUtf8,
    /// A message above the size limit, counted after inflation (1009).
    TooBig,
}

/// Whether a close code may appear in a close frame (§7.4.1, §7.4.2):
/// 1000–1003, 1007–1013 and 3000–4999 (tungstenite's rule, which Autobahn
/// section 7 checks).
pub fn close_code_allowed(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1013 | 3000..=4999)
}

/// XORs `data` with the 4-byte `mask`, starting at mask offset `off`
/// (§5.3).
pub fn unmask(data: &mut [u8], mask: [u8; 4], off: usize) {
    let m = [
        mask[off % 4],
        mask[(off + 1) % 4],
        mask[(off + 2) % 4],
        mask[(off + 3) % 4],
    ];
    let word = u64::from_ne_bytes([m[0], m[1], m[2], m[3], m[0], m[1], m[2], m[3]]);
    let mut chunks = data.chunks_exact_mut(8);
    for c in &mut chunks {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        c.copy_from_slice(&(u64::from_ne_bytes(b) ^ word).to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= m[i % 4];
    }
}

/// The frame being read.
struct Frame {
    fin: bool,
    opcode: u8,
    mask: [u8; 4],
    /// Payload bytes still to come.
    remaining: u64,
    /// Payload bytes read so far (the mask offset).
    done: usize,
}

/// The data message being assembled.
struct Message {
    text: bool,
    compressed: bool,
    data: Vec<u8>,
    /// `data[..valid]` is known to be UTF-8 (text only).
    valid: usize,
}

/// The client → server half of a connection; see the module docs.
pub struct FrameReader {
    max_message_size: usize,
    inflater: Option<Inflater>,
    /// Header bytes collected so far (at most 14).
    head: [u8; 14],
    head_len: usize,
    frame: Option<Frame>,
    message: Option<Message>,
    /// A control frame's payload (at most 125 bytes).
    control: Vec<u8>,
    /// Masked compressed bytes are unmasked here before inflating.
    scratch: Vec<u8>,
    failed: bool,
}

impl FrameReader {
    /// A reader for messages up to `max_message_size` bytes (after
    /// inflation); `inflater` if permessage-deflate was agreed.
    pub fn new(max_message_size: usize, inflater: Option<Inflater>) -> Self {
        FrameReader {
            max_message_size,
            inflater,
            head: [0; 14],
            head_len: 0,
            frame: None,
            message: None,
            control: Vec::new(),
            scratch: Vec::new(),
            failed: false,
        }
    }

    /// Whether a message is partly received (a memory hint, and for tests).
    pub fn in_message(&self) -> bool {
        self.message.is_some()
    }

    /// Consumes bytes from `input` up to the end of the next complete
    /// message or control frame. Returns how many bytes were consumed and
    /// the frame, if one completed (then the rest of `input` is for the
    /// next call). After an error the reader must not be used again.
    pub fn feed(&mut self, input: &[u8]) -> (usize, Result<Option<Incoming>, ReadError>) {
        if self.failed {
            return (0, Err(ReadError::Protocol("read after an error")));
        }
        let mut used = 0;
        loop {
            if self.frame.is_none() {
                match self.header(&input[used..]) {
                    (n, Ok(true)) => used += n,
                    (n, Ok(false)) => return (used + n, Ok(None)),
                    (n, Err(e)) => {
                        self.failed = true;
                        return (used + n, Err(e));
                    }
                }
            }
            let (n, res) = self.payload(&input[used..]);
            used += n;
            match res {
                Ok(Some(ev)) => return (used, Ok(Some(ev))),
                Ok(None) if used == input.len() => return (used, Ok(None)),
                Ok(None) => {}
                Err(e) => {
                    self.failed = true;
                    return (used, Err(e));
                }
            }
        }
    }

    /// Collects and checks a frame header. `Ok(true)` once `self.frame` is
    /// set; `Ok(false)` if more bytes are needed.
    fn header(&mut self, input: &[u8]) -> (usize, Result<bool, ReadError>) {
        let mut used = 0;
        let need = |h: &[u8], len: usize| -> usize {
            if len < 2 {
                return 2;
            }
            2 + 4
                + match h[1] & 0x7f {
                    126 => 2,
                    127 => 8,
                    _ => 0,
                }
        };
        loop {
            let want = need(&self.head, self.head_len);
            if self.head_len == want {
                break;
            }
            if self.head_len == 2 {
                // Checked as soon as known, before the rest arrives.
                if let Err(e) = self.check_first_two() {
                    return (used, Err(e));
                }
            }
            let take = (want - self.head_len).min(input.len() - used);
            if take == 0 {
                return (used, Ok(false));
            }
            self.head[self.head_len..self.head_len + take]
                .copy_from_slice(&input[used..used + take]);
            self.head_len += take;
            used += take;
        }
        let h = &self.head[..self.head_len];
        let (len, at) = match h[1] & 0x7f {
            126 => (u64::from(u16::from_be_bytes([h[2], h[3]])), 4),
            127 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&h[2..10]);
                (u64::from_be_bytes(b), 10)
            }
            n => (u64::from(n), 2),
        };
        let mask = [h[at], h[at + 1], h[at + 2], h[at + 3]];
        let fin = h[0] & 0x80 != 0;
        let op = h[0] & 0x0f;
        let rsv1 = h[0] & 0x40 != 0;
        self.head_len = 0;
        if len >> 63 != 0 {
            return (
                used,
                Err(ReadError::Protocol("payload length's high bit set")),
            );
        }
        if op >= 0x8 {
            if len > 125 {
                return (
                    used,
                    Err(ReadError::Protocol("control frame over 125 bytes")),
                );
            }
            self.control.clear();
        } else {
            let so_far = self.message.as_ref().map_or(0, |m| m.data.len());
            match (op, &mut self.message) {
                (opcode::CONTINUATION, None) => {
                    return (
                        used,
                        Err(ReadError::Protocol("continuation without a message")),
                    )
                }
                (opcode::CONTINUATION, Some(_)) => {}
                (_, Some(_)) => {
                    return (
                        used,
                        Err(ReadError::Protocol("new message inside a fragmented one")),
                    )
                }
                (_, None) => {
                    if rsv1 && self.inflater.is_none() {
                        return (
                            used,
                            Err(ReadError::Protocol("RSV1 set without permessage-deflate")),
                        );
                    }
                    self.message = Some(Message {
                        text: op == opcode::TEXT,
                        compressed: rsv1,
                        data: Vec::new(),
                        valid: 0,
                    });
                }
            }
            let compressed = self.message.as_ref().is_some_and(|m| m.compressed);
            // Plain data: the frame's length tells at once. Compressed data
            // is limited as it inflates; its wire size by the same limit.
            if len > (self.max_message_size - so_far.min(self.max_message_size)) as u64
                && (!compressed || len > self.max_message_size as u64)
            {
                return (used, Err(ReadError::TooBig));
            }
        }
        self.frame = Some(Frame {
            fin,
            opcode: op,
            mask,
            remaining: len,
            done: 0,
        });
        (used, Ok(true))
    }

    /// The checks the first two header bytes allow (§5.2).
    fn check_first_two(&self) -> Result<(), ReadError> {
        let (b0, b1) = (self.head[0], self.head[1]);
        let op = b0 & 0x0f;
        if b1 & 0x80 == 0 {
            return Err(ReadError::Protocol("unmasked frame from a client"));
        }
        if b0 & 0x30 != 0 {
            return Err(ReadError::Protocol("RSV2 or RSV3 set"));
        }
        if !matches!(op, 0x0..=0x2 | 0x8..=0xA) {
            return Err(ReadError::Protocol("reserved opcode"));
        }
        if op >= 0x8 && b0 & 0x80 == 0 {
            return Err(ReadError::Protocol("fragmented control frame"));
        }
        // RSV1 means "compressed" on a message's first frame only (RFC
        // 7692 §6); whether deflate was agreed is checked with the message.
        if b0 & 0x40 != 0 && (op >= 0x8 || op == opcode::CONTINUATION) {
            return Err(ReadError::Protocol(
                "RSV1 set on a control or continuation frame",
            ));
        }
        Ok(())
    }

    /// Reads payload bytes of the current frame; an event when a message or
    /// control frame completes.
    fn payload(&mut self, input: &[u8]) -> (usize, Result<Option<Incoming>, ReadError>) {
        let Some(f) = self.frame.as_mut() else {
            return (0, Ok(None));
        };
        let take = usize::try_from(f.remaining)
            .unwrap_or(usize::MAX)
            .min(input.len());
        let chunk = &input[..take];
        let (mask, off, op) = (f.mask, f.done, f.opcode);
        f.remaining -= take as u64;
        f.done += take;
        let frame_over = f.remaining == 0;
        let fin = f.fin;
        if op >= 0x8 {
            let start = self.control.len();
            self.control.extend_from_slice(chunk);
            unmask(&mut self.control[start..], mask, off);
            if !frame_over {
                return (take, Ok(None));
            }
            self.frame = None;
            return (take, self.control_frame(op).map(Some));
        }
        let Some(m) = self.message.as_mut() else {
            return (take, Err(ReadError::Protocol("no message")));
        };
        if m.compressed {
            self.scratch.clear();
            self.scratch.extend_from_slice(chunk);
            unmask(&mut self.scratch, mask, off);
            let Some(inf) = self.inflater.as_mut() else {
                return (take, Err(ReadError::Protocol("no inflater")));
            };
            let last = frame_over && fin;
            if let Err(e) = inf.inflate(&self.scratch, last, &mut m.data, self.max_message_size) {
                return (
                    take,
                    Err(match e {
                        InflateError::TooBig => ReadError::TooBig,
                        InflateError::Corrupt => ReadError::Protocol("invalid DEFLATE data"),
                    }),
                );
            }
            if self.scratch.capacity() > 64 * 1024 {
                self.scratch = Vec::new();
            }
        } else {
            let start = m.data.len();
            m.data.extend_from_slice(chunk);
            unmask(&mut m.data[start..], mask, off);
        }
        if m.text {
            // Fail fast: only an incomplete sequence at the end may wait.
            match std::str::from_utf8(&m.data[m.valid..]) {
                Ok(_) => m.valid = m.data.len(),
                Err(e) if e.error_len().is_none() => m.valid += e.valid_up_to(),
                Err(_) => return (take, Err(ReadError::InvalidUtf8)),
            }
        }
        if !frame_over {
            return (take, Ok(None));
        }
        self.frame = None;
        if !fin {
            return (take, Ok(None));
        }
        let Some(m) = self.message.take() else {
            return (take, Err(ReadError::Protocol("no message")));
        };
        if m.text {
            if m.valid != m.data.len() {
                return (take, Err(ReadError::InvalidUtf8));
            }
            return (take, Ok(Some(Incoming::Text(m.data))));
        }
        (take, Ok(Some(Incoming::Binary(m.data))))
    }

    fn control_frame(&mut self, op: u8) -> Result<Incoming, ReadError> {
        let payload = std::mem::take(&mut self.control);
        Ok(match op {
            opcode::PING => Incoming::Ping(payload),
            opcode::PONG => Incoming::Pong(payload),
            _ => match payload.len() {
                0 => Incoming::Close(None),
                1 => return Err(ReadError::Protocol("close frame with a 1-byte payload")),
                _ => {
                    let code = u16::from_be_bytes([payload[0], payload[1]]);
                    let reason = std::str::from_utf8(&payload[2..])
                        .map_err(|_| ReadError::InvalidUtf8)?
                        .to_owned();
                    Incoming::Close(Some((code, reason)))
                }
            },
        })
    }
}

/// Appends one unmasked, final frame (a server's, §5.1) to `out`; `rsv1`
/// marks a compressed message (RFC 7692 §6).
pub fn write_frame(out: &mut Vec<u8>, op: u8, rsv1: bool, payload: &[u8]) {
    out.reserve(payload.len() + 10);
    out.push(0x80 | if rsv1 { 0x40 } else { 0 } | op);
    let n = payload.len();
    if n < 126 {
        out.push(n as u8);
    } else if n <= 0xffff {
        out.push(126);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(n as u64).to_be_bytes());
    }
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ws_deflate::Deflater;
    use crate::wire::ws_extension::Agreed;

    /// A masked client frame.
    fn frame(b0: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        let mut out = vec![b0];
        let n = payload.len();
        if n < 126 {
            out.push(0x80 | n as u8);
        } else if n <= 0xffff {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
        out.extend_from_slice(&mask);
        let mut p = payload.to_vec();
        unmask(&mut p, mask, 0);
        out.extend_from_slice(&p);
        out
    }

    /// Feeds `bytes` one byte at a time (the worst split) and collects.
    fn read_all(r: &mut FrameReader, bytes: &[u8]) -> Result<Vec<Incoming>, ReadError> {
        let mut out = Vec::new();
        for b in bytes {
            let (n, res) = r.feed(std::slice::from_ref(b));
            assert_eq!(n, 1);
            if let Some(ev) = res? {
                out.push(ev);
            }
        }
        Ok(out)
    }

    fn agreed() -> Agreed {
        Agreed {
            server_no_context_takeover: false,
            client_no_context_takeover: false,
            server_max_window_bits: 15,
            client_max_window_bits: 15,
        }
    }

    #[test]
    fn rfc_6455_examples() {
        // §5.7: a masked "Hello", and the same in two fragments.
        let hello = [
            0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
        ];
        let mut r = FrameReader::new(1000, None);
        assert_eq!(
            read_all(&mut r, &hello).unwrap(),
            [Incoming::Text(b"Hello".to_vec())]
        );
        let mut two = frame(0x01, b"Hel");
        two.extend(frame(0x89, b"ping"));
        two.extend(frame(0x80, b"lo"));
        let mut r = FrameReader::new(1000, None);
        assert_eq!(
            read_all(&mut r, &two).unwrap(),
            [
                Incoming::Ping(b"ping".to_vec()),
                Incoming::Text(b"Hello".to_vec())
            ]
        );
    }

    #[test]
    fn whole_buffer_stops_after_each_event() {
        let mut bytes = frame(0x82, b"a");
        bytes.extend(frame(0x82, &[0u8; 70000]));
        let mut r = FrameReader::new(1 << 20, None);
        let (n, ev) = r.feed(&bytes);
        assert_eq!(ev.unwrap(), Some(Incoming::Binary(b"a".to_vec())));
        let (m, ev) = r.feed(&bytes[n..]);
        assert_eq!(n + m, bytes.len());
        assert_eq!(ev.unwrap(), Some(Incoming::Binary(vec![0; 70000])));
    }

    #[test]
    fn protocol_errors() {
        let cases: Vec<Vec<u8>> = vec![
            vec![0x81, 0x00],                                // unmasked
            frame(0xc1, b"x"),                               // RSV1 without deflate
            frame(0xa1, b"x"),                               // RSV2
            frame(0x83, b"x"),                               // reserved opcode
            frame(0x8b, b""),                                // reserved control opcode
            frame(0x09, b""),                                // fragmented ping
            frame(0x89, &[0u8; 126]),                        // long ping
            frame(0x80, b"x"),                               // continuation first
            [frame(0x01, b"a"), frame(0x81, b"b")].concat(), // new message
            frame(0x88, b"x"),                               // 1-byte close
        ];
        for c in cases {
            let mut r = FrameReader::new(1000, None);
            assert!(
                matches!(read_all(&mut r, &c), Err(ReadError::Protocol(_))),
                "{c:x?}"
            );
        }
    }

    #[test]
    fn utf8_fails_fast() {
        // The sequence turns invalid at the second fragment's second byte;
        // feeding stops right there, before the frame is complete.
        let mut bytes = frame(0x01, "κόσμε".as_bytes());
        let second = frame(0x00, &[0xf4, 0x90, 0x80, 0x80, b'a', b'b']);
        bytes.extend_from_slice(&second[..8]);
        let mut r = FrameReader::new(1000, None);
        assert_eq!(read_all(&mut r, &bytes), Err(ReadError::InvalidUtf8));
        // A sequence split across fragments is fine.
        let e = "é".as_bytes();
        let ok = [frame(0x01, &e[..1]), frame(0x80, &e[1..])].concat();
        let mut r = FrameReader::new(1000, None);
        assert_eq!(read_all(&mut r, &ok).unwrap(), [Incoming::Text(e.to_vec())]);
        // An incomplete sequence at the end is not.
        let mut r = FrameReader::new(1000, None);
        assert_eq!(
            read_all(&mut r, &frame(0x81, &e[..1])),
            Err(ReadError::InvalidUtf8)
        );
    }

    #[test]
    fn close_frames() {
        let mut r = FrameReader::new(1000, None);
        let mut p = 1000u16.to_be_bytes().to_vec();
        p.extend_from_slice(b"bye");
        assert_eq!(
            read_all(&mut r, &frame(0x88, &p)).unwrap(),
            [Incoming::Close(Some((1000, "bye".into())))]
        );
        let mut r = FrameReader::new(1000, None);
        assert_eq!(
            read_all(&mut r, &frame(0x88, &[0x03, 0xe8, 0xff])),
            Err(ReadError::InvalidUtf8)
        );
        assert!(close_code_allowed(1000) && close_code_allowed(4999) && close_code_allowed(1012));
        assert!(!close_code_allowed(1005) && !close_code_allowed(1014) && !close_code_allowed(999));
    }

    #[test]
    fn size_limit_plain_and_compressed() {
        let mut r = FrameReader::new(10, None);
        assert_eq!(
            read_all(&mut r, &frame(0x82, &[0; 11])),
            Err(ReadError::TooBig)
        );
        let two = [frame(0x02, &[0; 6]), frame(0x80, &[0; 6])].concat();
        let mut r = FrameReader::new(10, None);
        assert_eq!(read_all(&mut r, &two), Err(ReadError::TooBig));
        // 1 MiB of zeros compresses to ~1 KiB; the limit applies inflated.
        let mut d = Deflater::new(&agreed(), 15);
        let mut z = Vec::new();
        d.compress(&vec![0u8; 1 << 20], &mut z);
        let mut r = FrameReader::new(1000, Some(Inflater::new(&agreed())));
        let (_, res) = r.feed(&frame(0xc2, &z));
        assert_eq!(res, Err(ReadError::TooBig));
        let mut r = FrameReader::new(1 << 20, Some(Inflater::new(&agreed())));
        let (_, res) = r.feed(&frame(0xc2, &z));
        assert_eq!(res.unwrap(), Some(Incoming::Binary(vec![0; 1 << 20])));
    }

    #[test]
    fn compressed_fragments_and_context_takeover() {
        let mut d = Deflater::new(&agreed(), 15);
        let mut r = FrameReader::new(1 << 20, Some(Inflater::new(&agreed())));
        for _ in 0..3 {
            let mut z = Vec::new();
            d.compress(b"Hello, Hello, Hello", &mut z);
            let (a, b) = z.split_at(z.len() / 2);
            let bytes = [frame(0x41, a), frame(0x80, b)].concat();
            assert_eq!(
                read_all(&mut r, &bytes).unwrap(),
                [Incoming::Text(b"Hello, Hello, Hello".to_vec())]
            );
        }
        // RSV1 on a continuation is an error even with deflate.
        let mut r = FrameReader::new(1000, Some(Inflater::new(&agreed())));
        let bytes = [frame(0x41, b""), frame(0xc0, b"")].concat();
        assert!(matches!(
            read_all(&mut r, &bytes),
            Err(ReadError::Protocol(_))
        ));
    }

    #[test]
    fn server_frames() {
        let mut out = Vec::new();
        write_frame(&mut out, opcode::TEXT, false, b"Hello");
        assert_eq!(out, [0x81, 0x05, b'H', b'e', b'l', b'l', b'o']);
        out.clear();
        write_frame(&mut out, opcode::BINARY, true, &[0; 256]);
        assert_eq!(&out[..4], [0xc2, 126, 0x01, 0x00]);
        out.clear();
        write_frame(&mut out, opcode::BINARY, false, &[0; 65536]);
        assert_eq!(&out[..10], [0x82, 127, 0, 0, 0, 0, 0, 1, 0, 0]);
    }

    #[test]
    fn unmask_matches_bytewise_at_any_offset() {
        let mask = [1, 2, 3, 4];
        for off in 0..4 {
            let mut a: Vec<u8> = (0..37).collect();
            let b: Vec<u8> = a
                .iter()
                .enumerate()
                .map(|(i, x)| x ^ mask[(i + off) % 4])
                .collect();
            unmask(&mut a, mask, off);
            assert_eq!(a, b);
        }
    }
}
