//! Request field checks shared by the HTTP/2 and HTTP/3 paths: the
//! connection-specific fields RFC 9113 §8.2.2 and RFC 9114 §4.2 forbid,
//! and `content-length` (RFC 9110 §8.6).

use http::HeaderMap;

/// Fields RFC 9113 §8.2.2 and RFC 9114 §4.2 forbid in HTTP/2 and HTTP/3
/// messages (`te` is checked apart: `trailers` is allowed).
pub(crate) fn connection_specific(name: &http::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade"
    )
}

/// Why a request's fields make it malformed (RFC 9114 §4.1.2, §4.2), else
/// its declared `content-length` (`None`: none). Several `content-length`
/// values (fields or a comma list) are one length if all are equal.
///
/// Errors: a connection-specific field, `te` other than `trailers`, a
/// `content-length` that is not a decimal number, or differing ones.
pub(crate) fn check_request(headers: &HeaderMap) -> Result<Option<u64>, &'static str> {
    for name in headers.keys() {
        if connection_specific(name) {
            return Err("connection-specific field");
        }
    }
    for te in headers.get_all(http::header::TE) {
        if !te.as_bytes().eq_ignore_ascii_case(b"trailers") {
            return Err("te other than trailers");
        }
    }
    let mut length = None;
    for value in headers.get_all(http::header::CONTENT_LENGTH) {
        let text = value.to_str().map_err(|_| "content-length not a number")?;
        for part in text.split(',') {
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err("content-length not a number");
            }
            let n: u64 = part.parse().map_err(|_| "content-length not a number")?;
            if length.is_some_and(|l| l != n) {
                return Err("differing content-length values");
            }
            length = Some(n);
        }
    }
    Ok(length)
}

#[cfg(test)]
mod tests {
    use super::check_request;
    use http::{HeaderMap, HeaderName, HeaderValue};

    fn map(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in fields {
            m.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        m
    }

    #[test]
    fn lengths_and_forbidden_fields() {
        assert_eq!(check_request(&map(&[])), Ok(None));
        assert_eq!(check_request(&map(&[("content-length", "5")])), Ok(Some(5)));
        let same = map(&[("content-length", "5"), ("content-length", "5, 5")]);
        assert_eq!(check_request(&same), Ok(Some(5)));
        assert!(check_request(&map(&[("content-length", "5"), ("content-length", "6")])).is_err());
        assert!(check_request(&map(&[("content-length", "+5")])).is_err());
        assert!(check_request(&map(&[("content-length", "abc")])).is_err());
        assert!(check_request(&map(&[("content-length", "")])).is_err());
        assert_eq!(check_request(&map(&[("te", "trailers")])), Ok(None));
        assert!(check_request(&map(&[("te", "gzip")])).is_err());
        for f in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "transfer-encoding",
            "upgrade",
        ] {
            let mut m = HeaderMap::new();
            m.insert(HeaderName::from_static(f), HeaderValue::from_static("x"));
            assert!(check_request(&m).is_err(), "{f}");
        }
    }
}
