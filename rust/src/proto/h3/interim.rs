//! Interim (1xx) responses on an HTTP/3 request stream: `103 Early Hints`
//! and the app's other informational responses, and `100 Continue`.
//!
//! RFC 9114 §4.1 lets a response start with any number of interim
//! responses, each a HEADERS frame before the final response's. h3 0.0.8's
//! `RequestStream::send_response` writes one HEADERS frame with whatever
//! status it is given and keeps no state, so it sends a 1xx as well as the
//! final head. The service queues interim responses in the request's own
//! [`InterimSlot`] as HTTP/1.1 bytes (`http::interim`); [`serve`] takes
//! them while the service runs, turns each back into a status and fields
//! and sends it. The service waits until its interim responses are sent
//! before it returns the final head, so they always precede it.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use super::body::{cancel, write_within, SendHalf};
use crate::http::interim::InterimSlot;

/// Polls `work` (the service) to its end, sending on `send` each interim
/// response queued in `slot` meanwhile. `Err` when one could not be sent
/// (the client stopped the stream, or took no bytes of it for
/// `send_timeout`: the stream is reset with H3_REQUEST_CANCELLED); the
/// caller then drops `work`, which tells the app `http.disconnect`.
pub(crate) async fn serve<F: Future>(
    work: F,
    slot: &InterimSlot,
    send: &mut SendHalf,
    send_timeout: Option<Duration>,
) -> Result<F::Output, String> {
    let mut work = pin!(work);
    loop {
        tokio::select! {
            biased;
            out = &mut work => return Ok(out),
            (bytes, end) = poll_fn(|cx| slot.poll_take(cx)) => {
                // Runs to its end before `work` is polled again: a HEADERS
                // frame is never cut by the final one.
                for (status, headers) in decode_h1(&bytes) {
                    let mut head = Response::new(());
                    *head.status_mut() = status;
                    *head.headers_mut() = headers;
                    match write_within!(send_timeout, send.send_response(head)) {
                        Ok(true) => {}
                        Ok(false) => {
                            let _ = cancel(send);
                            return Err("interim response not accepted in time".into());
                        }
                        Err(e) => return Err(e.to_string()),
                    }
                }
                slot.sent(end);
            }
        }
    }
}

/// The interim responses in `bytes` as `http::interim::encode_h1` wrote
/// them: each a status line, field lines and an empty line. Field names
/// and values came from `http` types, which hold no CR or LF, so lines
/// split unambiguously; anything else is skipped.
fn decode_h1(bytes: &Bytes) -> Vec<(StatusCode, HeaderMap)> {
    let mut out = Vec::new();
    let mut current: Option<(StatusCode, HeaderMap)> = None;
    for line in bytes.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        match current.as_mut() {
            None => {
                // "HTTP/1.1 103 Early Hints"
                let code = line.get(9..12).and_then(|c| StatusCode::from_bytes(c).ok());
                if let Some(code) = code.filter(|_| line.starts_with(b"HTTP/1.1 ")) {
                    current = Some((code, HeaderMap::new()));
                }
            }
            Some(_) if line.is_empty() => out.extend(current.take()),
            Some((_, fields)) => {
                let Some(colon) = line.iter().position(|b| *b == b':') else {
                    continue;
                };
                let value = line[colon + 1..]
                    .strip_prefix(b" ")
                    .unwrap_or(&line[colon + 1..]);
                if let (Ok(n), Ok(v)) = (
                    HeaderName::from_bytes(&line[..colon]),
                    HeaderValue::from_bytes(value),
                ) {
                    fields.append(n, v);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::decode_h1;
    use crate::http::interim::encode_h1;
    use http::{HeaderMap, HeaderValue, StatusCode};

    #[test]
    fn decodes_what_encode_h1_wrote() {
        let mut hints = HeaderMap::new();
        hints.append("link", HeaderValue::from_static("</a.css>; rel=preload"));
        hints.append(
            "link",
            HeaderValue::from_static("</b.js>; rel=preload; x=\"a:b\""),
        );
        let other = (StatusCode::from_u16(150).unwrap(), HeaderMap::new());
        let list = vec![
            (StatusCode::CONTINUE, HeaderMap::new()),
            (StatusCode::EARLY_HINTS, hints),
            other,
        ];
        assert_eq!(decode_h1(&encode_h1(&list)), list);
    }
}
