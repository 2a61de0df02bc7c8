//! `limit_request_field_size` on the field lines as they arrive.
//!
//! hyper's parser hands over a field's value without the whitespace around
//! it, so a check on parsed fields lets a line of 9,000 spaces through.
//! Gunicorn counts the whole line as received, its CRLF included
//! (`len(line) + 2 > limit_request_field_size` rejects; gunicorn 27,
//! `http/message.py`). [`HeadScan`] measures each line of a request head
//! in the bytes hyper reads; the service answers 431 for a head that had a
//! line over the limit (`Activity::take_field_too_long`).
//!
//! It scans from the first byte read while no request is in progress up to
//! the empty line that ends the head, then nothing until the next request:
//! a head read in the same segment as the end of the previous request
//! (pipelining) is not scanned, and falls back to the check on its parsed
//! fields (`wire::request::check_head`), which counts `name: value\r\n`.

/// What one read told the scanner.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Scanned {
    /// A new head started with these bytes (forget the previous verdict).
    pub(crate) started: bool,
    /// A field line over the limit is in this head.
    pub(crate) too_long: bool,
}

/// Measures the lines of one request head (see the module docs).
#[derive(Debug)]
pub(crate) struct HeadScan {
    /// The limit, in bytes including the line's CRLF (> 0).
    limit: usize,
    /// Scanning a head (false: between the end of one head and the next
    /// request's first read).
    active: bool,
    /// Still in the request line (or the empty lines RFC 9112 §2.3 lets a
    /// server ignore before it), which has its own limit.
    request_line: bool,
    /// Bytes of the current line so far.
    line: usize,
    /// The current line began with a CR (so "\r" + "\n" split across two
    /// reads is still an empty line).
    starts_cr: bool,
}

impl HeadScan {
    /// A scanner for `limit` bytes per field line; `None` when the limit
    /// is off (0).
    pub(crate) fn new(limit: usize) -> Option<Self> {
        (limit > 0).then_some(HeadScan {
            limit,
            active: false,
            request_line: true,
            line: 0,
            starts_cr: false,
        })
    }

    /// The head being read has a request line that has ended (a non-empty
    /// line and its LF were seen), so `LineScan` need not look for it.
    pub(crate) fn request_line_ended(&self) -> bool {
        !self.request_line
    }

    /// Bytes read from the socket. `idle`: no request is in progress, so
    /// they start (or continue) a head.
    pub(crate) fn feed(&mut self, bytes: &[u8], idle: bool) -> Scanned {
        let mut out = Scanned::default();
        if !self.active {
            if !idle || bytes.is_empty() {
                return out;
            }
            self.active = true;
            self.request_line = true;
            self.line = 0;
            out.started = true;
        }
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.line == 0 {
                self.starts_cr = rest[0] == b'\r';
            }
            let Some(at) = rest.iter().position(|&b| b == b'\n') else {
                self.line += rest.len();
                break;
            };
            // The line's bytes before its LF.
            let content = self.line + at;
            let len = content + 1;
            let empty = content == 0 || (content == 1 && self.starts_cr);
            self.line = 0;
            rest = &rest[at + 1..];
            if self.request_line {
                self.request_line = empty;
                continue;
            }
            if empty {
                self.active = false;
                return out;
            }
            if len > self.limit {
                out.too_long = true;
            }
        }
        // A line still arriving is over the limit before its LF comes.
        if !self.request_line && self.line + 1 > self.limit {
            out.too_long = true;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(limit: usize, chunks: &[&[u8]]) -> bool {
        let mut s = HeadScan::new(limit).expect("limit > 0");
        chunks.iter().any(|c| s.feed(c, true).too_long)
    }

    #[test]
    fn counts_the_whole_line_with_its_crlf() {
        // "X: " + 5 spaces + "\r\n" = 10 bytes.
        let head = b"GET / HTTP/1.1\r\nX:      \r\n\r\n";
        assert!(!scan(10, &[head]));
        assert!(scan(9, &[head]));
    }

    #[test]
    fn the_request_line_is_not_a_field_line() {
        let head = b"GET /aaaaaaaaaaaaaaaaaaaaaaaaaa HTTP/1.1\r\nX: y\r\n\r\n";
        assert!(!scan(10, &[head]));
    }

    #[test]
    fn lines_split_across_reads() {
        let parts: [&[u8]; 5] = [b"GET / HTTP/1.1\r\nX:", b"    ", b"  \r", b"\n\r", b"\n"];
        assert!(!scan(10, &parts));
        assert!(scan(9, &parts));
    }

    #[test]
    fn stops_at_the_end_of_the_head_and_restarts_when_idle() {
        let mut s = HeadScan::new(10).expect("limit > 0");
        assert!(s.feed(b"POST / HTTP/1.1\r\nA: b\r\n\r\n", true).started);
        // The body, read while the request is in progress: not a head.
        assert_eq!(
            s.feed(b"xxxxxxxxxxxxxxxxxxxxxxxxxx\n", false),
            Scanned::default()
        );
        let next = s.feed(b"GET / HTTP/1.1\r\nLong-name: value\r\n\r\n", true);
        assert!(next.started && next.too_long);
    }

    #[test]
    fn a_line_still_arriving_counts() {
        assert!(scan(10, &[b"GET / HTTP/1.1\r\nX:           "]));
    }
}
