//! Response compression (off by default; `compression`): a content coding
//! negotiated from the request's `Accept-Encoding` (RFC 9110 §12.5.3) and
//! applied by the Tokio side, per body frame, so a flushed chunk (an SSE
//! event) reaches the client at once.
//!
//! What is never compressed: HEAD, 1xx/204/304 and other bodiless answers,
//! `206 Partial Content` (its `Content-Range` counts identity bytes, RFC
//! 9110 §14.4), a response the app encoded itself (`Content-Encoding`), one
//! marked `Cache-Control: no-transform`, media that is compressed already
//! (images other than SVG, audio, video, archives) and opaque binary
//! (`application/octet-stream`: downloads, mostly incompressible),
//! `text/event-stream` unless `compression_event_stream`, a body known to
//! be smaller than `compression_min_size`, and a whole body whose encoding
//! would not be smaller. A client that refuses `identity` (`identity;q=0`,
//! or `*;q=0` without naming it) gets the coding whatever the size. A
//! compressed response loses its `Content-Length` when streamed (a whole
//! body gets the compressed length), gains `Vary: Accept-Encoding`, and a
//! strong `ETag` becomes weak (`W/"…"`: the encoded bytes are a different
//! representation, RFC 9110 §8.8.3, as nginx does).

use std::io::Write;

use bytes::Bytes;
use http::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE,
    ETAG, VARY,
};
use http::{HeaderMap, HeaderValue, StatusCode};

use crate::config::{Coding, Compression};

/// The coding for a request's `Accept-Encoding`: the enabled coding with
/// the highest q-value (`*` standing for those not named; q=0 refuses),
/// ties going to the server's order. `None` if the client accepts none.
pub fn negotiate(cfg: &Compression, request: &HeaderMap) -> Option<Coding> {
    let mut named: Vec<(String, f32)> = Vec::new();
    for v in request.get_all(ACCEPT_ENCODING) {
        let Ok(v) = v.to_str() else { continue };
        for item in v.split(',') {
            let mut parts = item.split(';');
            let token = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            if token.is_empty() {
                continue;
            }
            let mut q = 1.0f32;
            for p in parts {
                let p = p.trim();
                if let Some(x) = p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")) {
                    q = x.trim().parse().unwrap_or(0.0);
                }
            }
            named.push((token, q));
        }
    }
    let star = named.iter().find(|(t, _)| t == "*").map(|(_, q)| *q);
    let mut best: Option<(Coding, f32)> = None;
    for &c in &cfg.codings {
        let q = named
            .iter()
            .find(|(t, _)| t == c.token() || (c == Coding::Gzip && t == "x-gzip"))
            .map(|(_, q)| *q)
            .or(star)
            .unwrap_or(0.0);
        if q > 0.0 && best.is_none_or(|(_, bq)| q > bq) {
            best = Some((c, q));
        }
    }
    best.map(|(c, _)| c)
}

/// Whether the request refuses an unencoded response: `identity;q=0`, or
/// `*;q=0` without `identity` named (RFC 9110 §12.5.3).
pub fn identity_refused(request: &HeaderMap) -> bool {
    let mut identity = None;
    let mut star = None;
    for v in request.get_all(ACCEPT_ENCODING) {
        let Ok(v) = v.to_str() else { continue };
        for item in v.split(',') {
            let mut parts = item.split(';');
            let token = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let mut q = 1.0f32;
            for p in parts {
                let p = p.trim();
                if let Some(x) = p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")) {
                    q = x.trim().parse().unwrap_or(0.0);
                }
            }
            match token.as_str() {
                "identity" => identity = Some(q),
                "*" => star = Some(q),
                _ => {}
            }
        }
    }
    identity.or(star).is_some_and(|q| q <= 0.0)
}

/// Media types not worth compressing: compressed already, or opaque
/// binary.
fn precompressed(content_type: &str) -> bool {
    let t = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    (t.starts_with("image/") && t != "image/svg+xml")
        || t.starts_with("audio/")
        || t.starts_with("video/")
        || matches!(
            t.as_str(),
            "application/zip"
                | "application/gzip"
                | "application/x-gzip"
                | "application/zstd"
                | "application/x-bzip2"
                | "application/x-xz"
                | "application/x-7z-compressed"
                | "application/vnd.rar"
                | "font/woff"
                | "font/woff2"
                | "application/octet-stream"
        )
}

/// Whether a response may be compressed; `len` is its body length when
/// known (a whole body, or the app's `Content-Length`); `must`: the client
/// refused `identity` ([`identity_refused`]), so the size does not matter.
pub fn applies(
    cfg: &Compression,
    head_request: bool,
    status: StatusCode,
    headers: &HeaderMap,
    len: Option<u64>,
    must: bool,
) -> bool {
    if head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || status == StatusCode::PARTIAL_CONTENT
        || headers.contains_key(CONTENT_RANGE)
        || headers.contains_key(CONTENT_ENCODING)
    {
        return false;
    }
    if headers.get_all(CACHE_CONTROL).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.to_ascii_lowercase().contains("no-transform"))
    }) {
        return false;
    }
    if let Some(ct) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) {
        if precompressed(ct) {
            return false;
        }
        if !cfg.event_stream
            && ct
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        {
            return false;
        }
    }
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    must || len.or(declared).is_none_or(|n| n >= cfg.min_size)
}

/// Marks the head as encoded: `Content-Encoding`, `Vary: Accept-Encoding`
/// (added to what the app varies on), no `Content-Length` (hyper sets the
/// compressed one for a whole body).
pub fn mark_headers(headers: &mut HeaderMap, coding: Coding) {
    headers.remove(CONTENT_LENGTH);
    if let Some(tag) = headers.get(ETAG) {
        if !tag.as_bytes().starts_with(b"W/") {
            let mut weak = b"W/".to_vec();
            weak.extend_from_slice(tag.as_bytes());
            if let Ok(v) = HeaderValue::from_bytes(&weak) {
                headers.insert(ETAG, v);
            }
        }
    }
    headers.insert(CONTENT_ENCODING, HeaderValue::from_static(coding.token()));
    let varies = headers.get_all(VARY).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|t| t.trim() == "*" || t.trim().eq_ignore_ascii_case("accept-encoding"))
        })
    });
    if !varies {
        headers.append(VARY, HeaderValue::from_static("Accept-Encoding"));
    }
}

/// A streaming encoder writing into a buffer that each call drains.
pub enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
    Br(Box<brotli::CompressorWriter<Vec<u8>>>),
}

/// gzip level: zlib's default trades ratio for speed as most servers do.
const GZIP_LEVEL: u32 = 6;
/// zstd's default level.
const ZSTD_LEVEL: i32 = 3;
/// brotli quality and window: fast enough for dynamic responses (quality
/// 11, the library's default, is meant for static assets).
const BR_QUALITY: u32 = 4;
const BR_LGWIN: u32 = 20;

impl Encoder {
    /// A fresh encoder for `coding`.
    pub fn new(coding: Coding) -> std::io::Result<Encoder> {
        Ok(match coding {
            Coding::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::new(GZIP_LEVEL),
            )),
            Coding::Zstd => {
                Encoder::Zstd(zstd::stream::write::Encoder::new(Vec::new(), ZSTD_LEVEL)?)
            }
            Coding::Br => Encoder::Br(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                4096,
                BR_QUALITY,
                BR_LGWIN,
            ))),
        })
    }

    /// Compresses `data` and flushes, so the client can decode all of it
    /// now; the bytes to send (possibly empty).
    pub fn chunk(&mut self, data: &[u8]) -> std::io::Result<Bytes> {
        let out = match self {
            Encoder::Gzip(e) => {
                e.write_all(data)?;
                e.flush()?;
                e.get_mut()
            }
            Encoder::Zstd(e) => {
                e.write_all(data)?;
                e.flush()?;
                e.get_mut()
            }
            Encoder::Br(e) => {
                e.write_all(data)?;
                e.flush()?;
                e.get_mut()
            }
        };
        Ok(Bytes::from(std::mem::take(out)))
    }

    /// Ends the coded stream; its last bytes.
    pub fn finish(self) -> std::io::Result<Bytes> {
        Ok(Bytes::from(match self {
            Encoder::Gzip(e) => e.finish()?,
            Encoder::Zstd(e) => e.finish()?,
            Encoder::Br(e) => e.into_inner(),
        }))
    }
}

/// A whole body compressed at once.
pub fn whole(coding: Coding, data: &[u8]) -> std::io::Result<Bytes> {
    let mut e = Encoder::new(coding)?;
    match &mut e {
        Encoder::Gzip(g) => g.write_all(data)?,
        Encoder::Zstd(z) => z.write_all(data)?,
        Encoder::Br(b) => b.write_all(data)?,
    }
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Compression {
        Compression {
            codings: vec![Coding::Zstd, Coding::Br, Coding::Gzip],
            min_size: 500,
            event_stream: false,
        }
    }

    fn ae(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn negotiation_follows_q_values_then_server_order() {
        assert_eq!(negotiate(&cfg(), &ae("gzip, br")), Some(Coding::Br));
        assert_eq!(
            negotiate(&cfg(), &ae("gzip;q=1, br;q=0.5")),
            Some(Coding::Gzip)
        );
        assert_eq!(
            negotiate(&cfg(), &ae("zstd;q=0, br;q=0, gzip")),
            Some(Coding::Gzip)
        );
        assert_eq!(negotiate(&cfg(), &ae("identity")), None);
        assert_eq!(negotiate(&cfg(), &ae("*")), Some(Coding::Zstd));
        assert_eq!(negotiate(&cfg(), &ae("*;q=0")), None);
        assert_eq!(negotiate(&cfg(), &ae("br;q=0, *")), Some(Coding::Zstd));
        assert_eq!(negotiate(&cfg(), &HeaderMap::new()), None);
        assert!(identity_refused(&ae("gzip, identity;q=0")));
        assert!(identity_refused(&ae("gzip, *;q=0")));
        assert!(!identity_refused(&ae("gzip, identity;q=0.5, *;q=0")));
        assert!(!identity_refused(&ae("gzip")));
    }

    #[test]
    fn media_and_statuses_that_are_left_alone() {
        let c = cfg();
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("image/png"));
        assert!(!applies(&c, false, StatusCode::OK, &h, None, false));
        h.insert(CONTENT_TYPE, HeaderValue::from_static("image/svg+xml"));
        assert!(applies(&c, false, StatusCode::OK, &h, None, false));
        assert!(!applies(&c, true, StatusCode::OK, &h, None, false));
        assert!(!applies(
            &c,
            false,
            StatusCode::PARTIAL_CONTENT,
            &h,
            None,
            true
        ));
        assert!(!applies(
            &c,
            false,
            StatusCode::NOT_MODIFIED,
            &h,
            None,
            false
        ));
        assert!(!applies(&c, false, StatusCode::OK, &h, Some(10), false));
        assert!(applies(&c, false, StatusCode::OK, &h, Some(10), true));
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        assert!(!applies(&c, false, StatusCode::OK, &h, None, false));
    }

    #[test]
    fn streamed_chunks_decode_as_they_come() {
        for coding in [Coding::Gzip, Coding::Zstd, Coding::Br] {
            let mut e = Encoder::new(coding).unwrap();
            let a = e.chunk(b"data: one\n\n").unwrap();
            assert!(!a.is_empty(), "{coding:?}: a flushed chunk has output");
            let b = e.chunk(b"data: two\n\n").unwrap();
            let tail = e.finish().unwrap();
            let all = [a, b, tail].concat();
            let mut got = Vec::new();
            match coding {
                Coding::Gzip => {
                    std::io::Read::read_to_end(
                        &mut flate2::read::GzDecoder::new(&all[..]),
                        &mut got,
                    )
                    .unwrap();
                }
                Coding::Zstd => got = zstd::decode_all(&all[..]).unwrap(),
                Coding::Br => {
                    std::io::Read::read_to_end(
                        &mut brotli::Decompressor::new(&all[..], 4096),
                        &mut got,
                    )
                    .unwrap();
                }
            }
            assert_eq!(got, b"data: one\n\ndata: two\n\n");
        }
    }
}
