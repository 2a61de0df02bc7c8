//! Checks on a request head that hyper has parsed but leaves to the server:
//! the request target's form (RFC 9112 §3.2), the `Host` field (RFC 9112
//! §3.2, RFC 9110 §7.2) and Skirr's size limits (Gunicorn's
//! `limit_request_line` and `limit_request_field_size`).
//!
//! hyper itself rejects what its parser cannot frame: invalid methods,
//! targets, versions and field syntax (obs-fold, whitespace before the
//! colon, CR/LF/NUL in values) with 400, too many fields or too large a head
//! with 431, conflicting `Content-Length`s and a `Transfer-Encoding` whose
//! final coding is not chunked with 400 (Skirr adds: 501 for any coding
//! but chunked, 400 for chunked twice); a request carrying both
//! `Content-Length` and `Transfer-Encoding` is read as chunked and the
//! connection is closed after the response (RFC 9112 §6.1).

use http::header::{EXPECT, HOST, TE, TRANSFER_ENCODING, UPGRADE};
use http::request::Parts;
use http::{Method, StatusCode, Uri, Version};

/// Size limits on a request head; `0` disables a limit.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Longest request line (`method SP request-target SP HTTP-version`),
    /// in bytes, without the CRLF. Over it: 414. Gunicorn's default 4094.
    pub request_line: usize,
    /// Longest header field line (`name: value` and its CRLF, as received),
    /// in bytes. Over it: 431. Gunicorn's default 8190.
    pub field_size: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            request_line: 4094,
            field_size: 8190,
        }
    }
}

/// Why a request is answered by the server instead of the app.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The response status (400, 414, 431 or 501).
    pub status: StatusCode,
    /// One line naming the cause; sent as the response body and logged.
    pub reason: &'static str,
}

const fn reject(status: StatusCode, reason: &'static str) -> Rejection {
    Rejection { status, reason }
}

/// A field line over `limit_request_field_size` (431).
pub const FIELD_TOO_LARGE: Rejection = reject(
    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
    "header field too large",
);

/// Length of the request target as it was on the wire.
fn target_len(uri: &Uri) -> usize {
    let pq = uri.path_and_query().map_or(0, |pq| pq.as_str().len());
    match (uri.scheme_str(), uri.authority()) {
        (Some(scheme), Some(auth)) => scheme.len() + 3 + auth.as_str().len() + pq,
        (None, Some(auth)) => auth.as_str().len(),
        _ => pq,
    }
}

/// Fields [`check_head`] saw on its way, so the server looks them up only
/// when they are there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// An `Upgrade` field.
    pub upgrade: bool,
    /// An `Expect` field.
    pub expect: bool,
    /// A `TE` field (whether it asks for trailers is read only then).
    pub te: bool,
}

/// Checks a parsed request head: `Ok` if the app should see it, with the
/// fields seen.
///
/// One pass over the fields serves the size limit, `Transfer-Encoding`,
/// `Host`, and [`Seen`] (a hashed lookup per name cost more than the pass on
/// a typical head); the checks' order of precedence is unchanged: field
/// size, target, transfer coding, `Host`.
pub fn check_head(parts: &Parts, limits: &Limits) -> Result<Seen, Rejection> {
    if limits.request_line > 0 {
        // "HTTP/1.1" and two spaces.
        let line = parts.method.as_str().len() + target_len(&parts.uri) + 10;
        if line > limits.request_line {
            return Err(reject(StatusCode::URI_TOO_LONG, "request line too long"));
        }
    }
    let mut coding = Codings::default();
    let mut seen = Seen::default();
    let mut hosts = 0usize;
    let mut host = None;
    for (name, value) in &parts.headers {
        // `name: value\r\n`, as Gunicorn counts a line (CRLF included).
        // Whitespace around the value, which the parser drops, is counted
        // on the raw bytes by `http::headscan`.
        if limits.field_size > 0 && name.as_str().len() + value.len() + 4 > limits.field_size {
            return Err(FIELD_TOO_LARGE);
        }
        if name == HOST {
            hosts += 1;
            host.get_or_insert(value);
        } else if name == TRANSFER_ENCODING {
            coding.add(value.as_bytes());
        } else if name == UPGRADE {
            seen.upgrade = true;
        } else if name == EXPECT {
            seen.expect = true;
        } else if name == TE {
            seen.te = true;
        }
    }
    // An HTTP/2 extended CONNECT (RFC 8441) opens a WebSocket, not a tunnel.
    let extended = parts.extensions.get::<hyper::ext::Protocol>().is_some();
    check_target(&parts.method, &parts.uri, extended)?;
    coding.check()?;
    check_host(parts.version, hosts, host.map(|h| h.as_bytes()))?;
    Ok(seen)
}

/// The `Transfer-Encoding` values seen, in order: `chunked` is the only
/// transfer coding Skirr implements (RFC 9112 §6.1: 501 for one it does not
/// understand), and it applies once (§7.1). hyper has already rejected a
/// final coding other than `chunked`.
#[derive(Default)]
struct Codings {
    chunked: u32,
    unknown: bool,
}

impl Codings {
    fn add(&mut self, value: &[u8]) {
        if self.unknown {
            return;
        }
        for coding in value.split(|&b| b == b',') {
            let name = coding.split(|&b| b == b';').next().unwrap_or_default();
            let name = name.trim_ascii();
            if name.is_empty() {
                continue;
            }
            if !name.eq_ignore_ascii_case(b"chunked") {
                self.unknown = true;
                return;
            }
            self.chunked += 1;
        }
    }

    fn check(&self) -> Result<(), Rejection> {
        if self.unknown {
            return Err(reject(
                StatusCode::NOT_IMPLEMENTED,
                "transfer coding not implemented (only chunked)",
            ));
        }
        if self.chunked > 1 {
            return Err(reject(
                StatusCode::BAD_REQUEST,
                "chunked transfer coding applied more than once",
            ));
        }
        Ok(())
    }
}

/// The request target's form must suit the method (RFC 9112 §3.2).
fn check_target(method: &Method, uri: &Uri, extended_connect: bool) -> Result<(), Rejection> {
    if method == Method::CONNECT && !extended_connect {
        // An origin server has no tunnel to open (RFC 9110 §9.3.6).
        return Err(reject(
            StatusCode::NOT_IMPLEMENTED,
            "CONNECT is not supported by this server",
        ));
    }
    match (uri.scheme_str(), uri.authority()) {
        (None, Some(_)) => Err(reject(
            StatusCode::BAD_REQUEST,
            "authority-form request target is only valid for CONNECT",
        )),
        (Some(s), _) if !s.eq_ignore_ascii_case("http") && !s.eq_ignore_ascii_case("https") => {
            Err(reject(
                StatusCode::BAD_REQUEST,
                "request target scheme is not http or https",
            ))
        }
        (None, None) if uri.path() == "*" && method != Method::OPTIONS => Err(reject(
            StatusCode::BAD_REQUEST,
            "asterisk-form request target is only valid for OPTIONS",
        )),
        _ => Ok(()),
    }
}

/// Exactly one valid `Host` on HTTP/1.1; at most one, valid, on HTTP/1.0:
/// `hosts` fields were seen, `first` is the first one's value.
fn check_host(version: Version, hosts: usize, first: Option<&[u8]>) -> Result<(), Rejection> {
    match (hosts, first) {
        (0, _) if version >= Version::HTTP_11 => {
            Err(reject(StatusCode::BAD_REQUEST, "missing Host header"))
        }
        (0, _) => Ok(()),
        (2.., _) => Err(reject(StatusCode::BAD_REQUEST, "more than one Host header")),
        (_, Some(h)) if !is_valid_host(h) => {
            Err(reject(StatusCode::BAD_REQUEST, "invalid Host header"))
        }
        _ => Ok(()),
    }
}

/// RFC 3986's `unreserved` and `sub-delims` bytes, one table lookup per
/// byte (a `Host` value is checked on every request).
const UNRESERVED_OR_SUB_DELIM: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let extra = b"-._~!$&'()*+,;=";
    let mut i = 0;
    while i < extra.len() {
        t[extra[i] as usize] = true;
        i += 1;
    }
    t
};

#[inline]
fn is_unreserved_or_sub_delim(b: u8) -> bool {
    UNRESERVED_OR_SUB_DELIM[b as usize]
}

/// `Host = uri-host [ ":" port ]` (RFC 9110 §7.2, RFC 3986 §3.2.2). An
/// empty value is valid (a target without an authority).
pub fn is_valid_host(v: &[u8]) -> bool {
    let (host, port) = if let Some(rest) = v.strip_prefix(b"[") {
        // IP-literal: an IPv6 address or IPvFuture in brackets.
        let Some(end) = rest.iter().position(|&b| b == b']') else {
            return false;
        };
        let inner = &rest[..end];
        let ok = !inner.is_empty()
            && inner
                .iter()
                .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
            || inner.first().is_some_and(|b| b.eq_ignore_ascii_case(&b'v'))
                && inner[1..]
                    .iter()
                    .all(|&b| is_unreserved_or_sub_delim(b) || b == b':');
        if !ok {
            return false;
        }
        match &rest[end + 1..] {
            [] => return true,
            [b':', port @ ..] => (&[][..], port),
            _ => return false,
        }
    } else {
        match v.iter().position(|&b| b == b':') {
            Some(i) => (&v[..i], &v[i + 1..]),
            None => (v, &[][..]),
        }
    };
    is_reg_name(host) && port.len() <= 5 && port.iter().all(u8::is_ascii_digit)
}

/// `reg-name = *( unreserved / pct-encoded / sub-delims )`; also covers
/// IPv4 addresses.
fn is_reg_name(s: &[u8]) -> bool {
    let mut i = 0;
    while i < s.len() {
        let b = s[i];
        if b == b'%' {
            if !(s.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && s.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
            {
                return false;
            }
            i += 3;
            continue;
        }
        if !is_unreserved_or_sub_delim(b) {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(raw: &str) -> Parts {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        req.parse(raw.as_bytes()).expect("test request parses");
        let mut b = http::Request::builder()
            .method(req.method.unwrap_or("GET"))
            .uri(req.path.unwrap_or("/"))
            .version(if req.version == Some(0) {
                Version::HTTP_10
            } else {
                Version::HTTP_11
            });
        for h in req.headers.iter() {
            b = b.header(h.name, h.value);
        }
        b.body(()).expect("test request builds").into_parts().0
    }

    fn status(raw: &str) -> Option<u16> {
        check_head(&parts(raw), &Limits::default())
            .err()
            .map(|r| r.status.as_u16())
    }

    #[test]
    fn reports_the_fields_seen() {
        let seen = |raw: &str| check_head(&parts(raw), &Limits::default()).expect("valid head");
        assert_eq!(seen("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), Seen::default());
        let s =
            seen("GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nExpect: 100-continue\r\n\r\n");
        assert!(s.upgrade && s.expect && !s.te);
        assert!(seen("GET / HTTP/1.1\r\nHost: a\r\nTE: trailers\r\n\r\n").te);
    }

    #[test]
    fn transfer_codings() {
        let te = |v: &str| {
            status(&format!(
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: {v}\r\n\r\n"
            ))
        };
        assert_eq!(te("chunked"), None);
        assert_eq!(te("Chunked"), None);
        assert_eq!(te("gzip, chunked"), Some(501));
        assert_eq!(te("x-custom;q=1 , chunked"), Some(501));
        assert_eq!(te("chunked, chunked"), Some(400));
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Some(400)
        );
    }

    #[test]
    fn host_rules() {
        assert_eq!(status("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), None);
        assert_eq!(status("GET / HTTP/1.1\r\n\r\n"), Some(400));
        assert_eq!(
            status("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
            Some(400)
        );
        assert_eq!(status("GET / HTTP/1.1\r\nHost: a b\r\n\r\n"), Some(400));
        assert_eq!(status("GET / HTTP/1.0\r\n\r\n"), None);
        assert_eq!(status("GET / HTTP/1.0\r\nHost: x@y\r\n\r\n"), Some(400));
    }

    #[test]
    fn host_byte_table_matches_rfc_3986() {
        for b in 0..=255u8 {
            let want = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&b);
            assert_eq!(is_unreserved_or_sub_delim(b), want, "byte {b}");
        }
    }

    #[test]
    fn valid_hosts() {
        for h in [
            "",
            "example.com",
            "example.com:8080",
            "127.0.0.1:80",
            "[::1]",
            "[::1]:8000",
            "[v1.fe80::a+en1]",
            "xn--bcher-kva.example",
            "a%20b",
            "host:",
        ] {
            assert!(is_valid_host(h.as_bytes()), "{h:?} is valid");
        }
        for h in [
            "a b",
            "user@host",
            "host:port",
            "host:123456",
            "[::1",
            "[::1]x",
            "[]",
            "a%2",
            "a%zz",
            "a/b",
            "%",
        ] {
            assert!(!is_valid_host(h.as_bytes()), "{h:?} is invalid");
        }
    }

    #[test]
    fn target_forms() {
        assert_eq!(status("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"), None);
        assert_eq!(status("GET * HTTP/1.1\r\nHost: a\r\n\r\n"), Some(400));
        assert_eq!(status("GET http://a/x?y HTTP/1.1\r\nHost: a\r\n\r\n"), None);
        assert_eq!(
            status("GET ftp://a/x HTTP/1.1\r\nHost: a\r\n\r\n"),
            Some(400)
        );
        assert_eq!(status("GET a:80 HTTP/1.1\r\nHost: a\r\n\r\n"), Some(400));
        assert_eq!(
            status("CONNECT a:80 HTTP/1.1\r\nHost: a\r\n\r\n"),
            Some(501)
        );
    }

    #[test]
    fn limits() {
        let long = "a".repeat(4094);
        assert_eq!(
            status(&format!("GET /{long} HTTP/1.1\r\nHost: a\r\n\r\n")),
            Some(414)
        );
        let ok = "a".repeat(4094 - 15);
        assert_eq!(
            status(&format!("GET /{ok} HTTP/1.1\r\nHost: a\r\n\r\n")),
            None
        );
        let big = "v".repeat(8190);
        assert_eq!(
            status(&format!("GET / HTTP/1.1\r\nHost: a\r\nX: {big}\r\n\r\n")),
            Some(431)
        );
        let fits = "v".repeat(8190 - 5);
        assert_eq!(
            status(&format!("GET / HTTP/1.1\r\nHost: a\r\nX: {fits}\r\n\r\n")),
            None
        );
        let off = Limits {
            request_line: 0,
            field_size: 0,
        };
        let p = parts(&format!(
            "GET /{long} HTTP/1.1\r\nHost: a\r\nX: {big}\r\n\r\n"
        ));
        assert!(check_head(&p, &off).is_ok());
    }
}
