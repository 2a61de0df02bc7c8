//! Arbitrary `Content-Length` values an app might send: parsing never
//! panics, and an accepted length is exactly what every value says.
#![no_main]

use _skirr::wire::response::{declared_length, status_allows_body};
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, HeaderValue, StatusCode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    for part in data.split(|b| *b == b'\n').take(4) {
        if let Ok(v) = HeaderValue::from_bytes(part) {
            headers.append(CONTENT_LENGTH, v);
        }
    }
    if let Ok(Some(n)) = declared_length(&headers) {
        for v in headers.get_all(CONTENT_LENGTH) {
            let s = std::str::from_utf8(v.as_bytes()).expect("digits are ASCII");
            for item in s.split(',') {
                assert_eq!(item.trim().parse::<u64>().ok(), Some(n));
            }
        }
    }
    if data.len() >= 2 {
        let code = u16::from_be_bytes([data[0], data[1]]);
        if let Ok(s) = StatusCode::from_u16(code) {
            let _ = status_allows_body(s);
        }
    }
});
