//! Checks on the response head an application sends: the body a status
//! allows (RFC 9110 §15.2, §15.3.5, §15.4.5) and the `Content-Length` it
//! declares (RFC 9110 §8.6), so the server can hold the app to it and never
//! put more on the wire than the head announced.

use http::header::{CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, StatusCode};

/// The header fields of every plain-text answer the server makes itself
/// (a refused request, a failed app, a refused WebSocket handshake): UTF-8
/// text, and `Connection: close` (the connection's state is not trusted
/// after the error).
pub fn plain_text_fields(headers: &mut HeaderMap) {
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(CONNECTION, HeaderValue::from_static("close"));
}

/// Whether a response with `status` may carry content at all: not 1xx, 204
/// or 304.
pub fn status_allows_body(status: StatusCode) -> bool {
    !(status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED)
}

/// Parses one `Content-Length` value: `1*DIGIT`, or a list of identical
/// values (`5, 5`), which RFC 9110 §8.6 lets a recipient accept.
fn parse_length(v: &[u8]) -> Option<u64> {
    let mut out = None;
    for part in v.split(|&b| b == b',') {
        let part = part.trim_ascii();
        if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n = part.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
        match out {
            Some(prev) if prev != n => return None,
            _ => out = Some(n),
        }
    }
    out
}

/// The `Content-Length` the response declares: `Ok(None)` if it has none,
/// `Err(reason)` if a value is not a decimal length or values conflict.
pub fn declared_length(headers: &HeaderMap) -> Result<Option<u64>, &'static str> {
    let mut out = None;
    for v in headers.get_all(CONTENT_LENGTH) {
        let n = parse_length(v.as_bytes()).ok_or("invalid Content-Length value")?;
        match out {
            Some(prev) if prev != n => return Err("conflicting Content-Length values"),
            _ => out = Some(n),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                CONTENT_LENGTH,
                HeaderValue::from_str(v).expect("test value"),
            );
        }
        h
    }

    #[test]
    fn lengths() {
        assert_eq!(declared_length(&headers(&[])), Ok(None));
        assert_eq!(declared_length(&headers(&["12"])), Ok(Some(12)));
        assert_eq!(declared_length(&headers(&["5", "5"])), Ok(Some(5)));
        assert_eq!(declared_length(&headers(&["5, 5"])), Ok(Some(5)));
        assert!(declared_length(&headers(&["5", "6"])).is_err());
        for bad in [
            "",
            "-1",
            "+1",
            "1.0",
            "0x10",
            "5, 6",
            "99999999999999999999",
        ] {
            assert!(declared_length(&headers(&[bad])).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn statuses_without_content() {
        for s in [100u16, 101, 204, 304] {
            assert!(!status_allows_body(
                StatusCode::from_u16(s).expect("status")
            ));
        }
        for s in [200u16, 201, 206, 301, 404, 500] {
            assert!(status_allows_body(StatusCode::from_u16(s).expect("status")));
        }
    }
}
