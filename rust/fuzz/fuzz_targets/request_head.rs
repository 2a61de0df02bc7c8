//! Any bytes hyper's parser (httparse) accepts as a request head go through
//! Skirr's head checks and WebSocket handshake validation: no panic, and
//! what is accepted satisfies the rules the checks claim.
#![no_main]

use _skirr::wire::{handshake, request};
use http::header::HOST;
use http::{Method, Request, Uri, Version};
use libfuzzer_sys::fuzz_target;

fn parts(data: &[u8]) -> Option<http::request::Parts> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(_) = req.parse(data).ok()? else {
        return None;
    };
    let mut b = Request::builder()
        .method(Method::from_bytes(req.method?.as_bytes()).ok()?)
        .uri(Uri::try_from(req.path?).ok()?)
        .version(if req.version? == 1 {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        });
    for h in req.headers.iter() {
        b = b.header(h.name, h.value);
    }
    Some(b.body(()).ok()?.into_parts().0)
}

fuzz_target!(|data: &[u8]| {
    let Some(p) = parts(data) else { return };
    let limits = [
        request::Limits::default(),
        request::Limits {
            request_line: 0,
            field_size: 0,
        },
        request::Limits {
            request_line: 16,
            field_size: 16,
        },
    ];
    for l in &limits {
        if request::check_head(&p, l).is_ok() {
            let hosts: Vec<_> = p.headers.get_all(HOST).iter().collect();
            assert!(hosts.len() <= 1);
            if p.version == Version::HTTP_11 {
                assert_eq!(hosts.len(), 1);
            }
            for h in hosts {
                let v = h.as_bytes();
                assert!(!v
                    .iter()
                    .any(|b| b.is_ascii_whitespace() || *b == b'@' || *b == b'/'));
            }
            assert_ne!(p.method, Method::CONNECT);
        }
    }
    if handshake::is_upgrade(&p) {
        if let Ok(accept) = handshake::validate(&p) {
            assert_eq!(accept.len(), 28);
            assert_eq!(p.method, Method::GET);
        }
        for proto in handshake::subprotocols(&p.headers) {
            assert!(!proto.is_empty() && !proto.contains(','));
        }
    }
});
