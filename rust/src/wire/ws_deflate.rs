//! permessage-deflate's compression (RFC 7692 §7.2): raw DEFLATE through
//! flate2 (zlib-rs), one sync-flushed block run per message with the
//! trailing `00 00 ff ff` removed on send and appended on receive.
//!
//! Memory: a zlib-rs compressor costs ~200 KiB whatever its window (a fixed
//! 128 KiB hash table, plus window and pending buffers), a decompressor
//! 2^bits plus a few KiB. Skirr therefore always answers
//! `server_no_context_takeover` (RFC 7692 §7.1.1.1 allows it unasked) and
//! compresses with one compressor per thread, reset per message; a
//! connection holds only its decompressor, created on the first compressed
//! message and dropped after each one when the client has no context
//! takeover.
//!
//! A message may also end its DEFLATE data with a final block (BFINAL=1,
//! §7.2.3.4, as a sender without sync flush does): the DEFLATE stream ends
//! there, and what follows (the RFC's example adds one `00` octet, which with
//! the appended tail is an empty stored block) starts a new one, as does
//! the next message. The new stream has no window of the old one; a sender
//! that ends its stream has reset its own.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::ws_extension::Agreed;

/// The tail a sync flush ends with, removed from each message (§7.2.1).
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// Why inflating failed.
#[derive(Debug, PartialEq, Eq)]
pub enum InflateError {
    /// The message inflates past the size limit (close 1009).
    TooBig,
    /// Not a valid DEFLATE stream (close 1002... §8.2.3.4: fail).
    Corrupt,
}

thread_local! {
    /// Compressors without context (reset before each message), shared by
    /// every connection of this thread: one per window size. A compressor
    /// costs ~200 KiB with zlib-rs (its hash table alone is 128 KiB), too
    /// much to keep per connection.
    static SHARED: std::cell::RefCell<Vec<(u8, Compress)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Skirr's compressor for one connection.
pub struct Deflater {
    /// Its own state, only with context takeover (kept between messages).
    state: Option<Compress>,
    /// Window bits to compress with; `None` when the client limited the
    /// server's window to 8 bits, which zlib cannot produce for raw
    /// DEFLATE: messages then go uncompressed (allowed, RSV1 is per message).
    bits: Option<u8>,
    takeover: bool,
}

/// Compression level: zlib's default trade-off.
const LEVEL: u32 = 6;

impl Deflater {
    /// A compressor for the agreement; `own_bits` is the window Skirr
    /// prefers (it may always use less than agreed, §7.1.2.1).
    pub fn new(agreed: &Agreed, own_bits: u8) -> Self {
        let bits = own_bits.clamp(9, 15).min(agreed.server_max_window_bits);
        Deflater {
            state: None,
            bits: (bits >= 9).then_some(bits),
            takeover: !agreed.server_no_context_takeover,
        }
    }

    /// Whether messages can be compressed at all.
    pub fn enabled(&self) -> bool {
        self.bits.is_some()
    }

    /// Compresses one whole message into `out` (appended). `false` if this
    /// connection cannot compress (then `out` is unchanged).
    pub fn compress(&mut self, data: &[u8], out: &mut Vec<u8>) -> bool {
        let Some(bits) = self.bits else { return false };
        if self.takeover {
            let c = self.state.get_or_insert_with(|| {
                Compress::new_with_window_bits(Compression::new(LEVEL), false, bits)
            });
            return compress_with(c, data, out);
        }
        SHARED.with(|shared| {
            let Ok(mut pool) = shared.try_borrow_mut() else {
                return false;
            };
            let i = match pool.iter().position(|(b, _)| *b == bits) {
                Some(i) => i,
                None => {
                    pool.push((
                        bits,
                        Compress::new_with_window_bits(Compression::new(LEVEL), false, bits),
                    ));
                    pool.len() - 1
                }
            };
            let c = &mut pool[i].1;
            // No context: every message starts from an empty window.
            c.reset();
            compress_with(c, data, out)
        })
    }
}

fn compress_with(c: &mut Compress, data: &[u8], out: &mut Vec<u8>) -> bool {
    let start = out.len();
    let before_in = c.total_in();
    out.reserve(data.len() / 2 + 64);
    loop {
        let consumed = (c.total_in() - before_in) as usize;
        if out.capacity() - out.len() < 64 {
            out.reserve(out.capacity().max(1024));
        }
        if c.compress_vec(&data[consumed..], out, FlushCompress::Sync)
            .is_err()
        {
            // Cannot happen for a valid state; send the message plain.
            out.truncate(start);
            c.reset();
            return false;
        }
        let done = (c.total_in() - before_in) as usize == data.len();
        // Output space left over means the flush completed (zlib's
        // contract for Z_SYNC_FLUSH).
        if done && out.len() < out.capacity() {
            break;
        }
    }
    if out[start..].ends_with(&TAIL) {
        out.truncate(out.len() - TAIL.len());
    }
    true
}

/// Skirr's decompressor for one connection.
pub struct Inflater {
    state: Option<Decompress>,
    bits: u8,
    takeover: bool,
    /// The message's DEFLATE stream ended at a final block and no byte of
    /// the message came after it: the appended tail is not fed (it would
    /// begin a stored block that the next message's bytes would fill).
    ended: bool,
    /// DEFLATE streams the current message has ended (at most
    /// [`MAX_STREAMS`]).
    streams: usize,
}

/// Final blocks one message may hold. A sender ends a message with one
/// (§7.2.3.4); each starts a new decompressor, so a message of many empty
/// final blocks (2 bytes each) would cost one per 2 bytes: refused as
/// corrupt.
const MAX_STREAMS: usize = 8;

impl Inflater {
    /// A decompressor for the agreement (the client's window, §7.1.2.2).
    pub fn new(agreed: &Agreed) -> Self {
        Inflater {
            state: None,
            // An 8-bit window is read with a 9-bit one (zlib's minimum for
            // raw inflate through flate2); a larger window reads any smaller.
            bits: agreed.client_max_window_bits.clamp(9, 15),
            takeover: !agreed.client_no_context_takeover,
            ended: false,
            streams: 0,
        }
    }

    /// Inflates `input` (part of a compressed message, unmasked), appending
    /// to `out` but never beyond `limit` bytes in total: the output buffer
    /// grows only as the data does, so a small frame that inflates to a huge
    /// message costs at most `limit` bytes before `TooBig`. `last` marks the
    /// end of the message (the removed tail is fed back, §7.2.2).
    pub fn inflate(
        &mut self,
        input: &[u8],
        last: bool,
        out: &mut Vec<u8>,
        limit: usize,
    ) -> Result<(), InflateError> {
        self.feed(input, out, limit)?;
        if last {
            self.streams = 0;
            if !std::mem::take(&mut self.ended) {
                self.feed(&TAIL, out, limit)?;
            }
            if !self.takeover {
                self.state = None;
            }
        }
        Ok(())
    }

    /// Inflates `input` into `out`; past the end of a DEFLATE stream, into a
    /// new one (module docs).
    fn feed(&mut self, input: &[u8], out: &mut Vec<u8>, limit: usize) -> Result<(), InflateError> {
        let mut rest = input;
        while !rest.is_empty() {
            let bits = self.bits;
            let d = self
                .state
                .get_or_insert_with(|| Decompress::new_with_window_bits(false, bits));
            self.ended = false;
            match run_inflate(d, rest, out, limit)? {
                None => return Ok(()),
                // A new stream cannot end before its first byte; were it
                // to, `rest` would not shrink.
                Some(0) => return Err(InflateError::Corrupt),
                Some(_) if self.streams == MAX_STREAMS => return Err(InflateError::Corrupt),
                Some(used) => {
                    self.streams += 1;
                    self.state = None;
                    self.ended = true;
                    rest = &rest[used..];
                }
            }
        }
        Ok(())
    }
}

/// Inflates `input` into `out` (at most `limit` bytes in all): `Some(n)`
/// when the stream ended at a final block after `n` bytes of `input`.
fn run_inflate(
    d: &mut Decompress,
    input: &[u8],
    out: &mut Vec<u8>,
    limit: usize,
) -> Result<Option<usize>, InflateError> {
    let before_in = d.total_in();
    loop {
        let consumed = (d.total_in() - before_in) as usize;
        if out.capacity() == out.len() {
            if out.len() > limit {
                return Err(InflateError::TooBig);
            }
            // Grow geometrically but never past limit + 1 (one byte over
            // is enough to know the message is too big).
            let want = out.len().max(4096).min(limit + 1 - out.len());
            out.reserve_exact(want);
        }
        let room = out.capacity() - out.len();
        let status = d
            .decompress_vec(&input[consumed..], out, FlushDecompress::Sync)
            .map_err(|_| InflateError::Corrupt)?;
        if out.len() > limit {
            return Err(InflateError::TooBig);
        }
        let consumed_all = (d.total_in() - before_in) as usize == input.len();
        let filled = out.capacity() - out.len() == 0 && room > 0;
        match status {
            // A final block: the stream ends after the bytes it took.
            Status::StreamEnd => return Ok(Some((d.total_in() - before_in) as usize)),
            Status::Ok | Status::BufError => {
                if consumed_all && !filled {
                    return Ok(None);
                }
                if !filled && matches!(status, Status::BufError) {
                    // No progress possible with input left: corrupt.
                    return Err(InflateError::Corrupt);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agreed(snct: bool, cnct: bool) -> Agreed {
        Agreed {
            server_no_context_takeover: snct,
            client_no_context_takeover: cnct,
            server_max_window_bits: 15,
            client_max_window_bits: 15,
        }
    }

    #[test]
    fn round_trip_with_and_without_takeover() {
        for (s, c) in [(false, false), (true, true)] {
            let a = agreed(s, c);
            let mut d = Deflater::new(&a, 12);
            let mut i = Inflater::new(&a);
            for n in [0usize, 1, 100, 5000, 300_000] {
                let msg: Vec<u8> = (0..n).map(|k| (k % 251) as u8 ^ (k / 7) as u8).collect();
                let mut z = Vec::new();
                assert!(d.compress(&msg, &mut z));
                let mut back = Vec::new();
                // Fed in pieces, as frames arrive.
                let mid = z.len() / 2;
                i.inflate(&z[..mid], false, &mut back, 1 << 20).unwrap();
                i.inflate(&z[mid..], true, &mut back, 1 << 20).unwrap();
                assert_eq!(back, msg);
            }
        }
    }

    #[test]
    fn limit_holds_while_inflating() {
        let a = agreed(false, false);
        let mut d = Deflater::new(&a, 15);
        let zeros = vec![0u8; 8 << 20];
        let mut z = Vec::new();
        d.compress(&zeros, &mut z);
        assert!(z.len() < 16 * 1024);
        let mut i = Inflater::new(&a);
        let mut out = Vec::new();
        assert_eq!(
            i.inflate(&z, true, &mut out, 1 << 20),
            Err(InflateError::TooBig)
        );
        assert!(out.capacity() <= (1 << 20) + 1, "{}", out.capacity());
    }

    /// RFC 7692 §7.2.3.4's "Hello" in a final block (with its `00` octet
    /// and without), then §7.2.3.1's sync-flushed "Hello", on one
    /// connection: each message reads whole, with and without takeover.
    #[test]
    fn a_final_block_ends_the_stream_and_the_next_message_starts_anew() {
        const FINAL: [u8; 7] = [0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00];
        const SYNC: [u8; 7] = [0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00];
        let with_octet = [&FINAL[..], &[0x00]].concat();
        for cnct in [false, true] {
            let mut i = Inflater::new(&agreed(false, cnct));
            for msg in [&with_octet[..], &FINAL, &SYNC, &FINAL, &with_octet, &SYNC] {
                let mut out = Vec::new();
                // Split as frames may split it.
                i.inflate(&msg[..3], false, &mut out, 100).unwrap();
                i.inflate(&msg[3..], true, &mut out, 100).unwrap();
                assert_eq!(out, b"Hello", "{msg:02x?} cnct={cnct}");
            }
        }
    }

    #[test]
    fn a_message_of_many_final_blocks_is_corrupt() {
        // An empty final block with fixed codes: 03 00.
        let mut i = Inflater::new(&agreed(false, false));
        let mut out = Vec::new();
        let few = [0x03, 0x00].repeat(MAX_STREAMS);
        i.inflate(&few, true, &mut out, 100).unwrap();
        let many = [0x03, 0x00].repeat(MAX_STREAMS + 1);
        assert_eq!(
            i.inflate(&many, true, &mut out, 100),
            Err(InflateError::Corrupt)
        );
    }

    #[test]
    fn bytes_after_a_final_block_must_be_deflate_too() {
        const FINAL: [u8; 7] = [0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00];
        let mut i = Inflater::new(&agreed(false, false));
        let mut out = Vec::new();
        let msg = [&FINAL[..], &[0xff, 0xff]].concat();
        assert_eq!(
            i.inflate(&msg, true, &mut out, 100),
            Err(InflateError::Corrupt)
        );
    }

    #[test]
    fn corrupt_input() {
        let mut i = Inflater::new(&agreed(false, false));
        let mut out = Vec::new();
        assert_eq!(
            i.inflate(&[0xff, 0xff, 0xff, 0xff], true, &mut out, 1000),
            Err(InflateError::Corrupt)
        );
    }

    #[test]
    fn eight_bit_server_window_sends_plain() {
        let mut a = agreed(false, false);
        a.server_max_window_bits = 8;
        let mut d = Deflater::new(&a, 12);
        assert!(!d.enabled());
        let mut z = Vec::new();
        assert!(!d.compress(b"hello", &mut z));
    }
}
