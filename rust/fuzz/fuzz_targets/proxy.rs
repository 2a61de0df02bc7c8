//! Forwarding headers (`X-Forwarded-For`, `Forwarded`, secure-scheme
//! headers, `SCRIPT_NAME`) and PROXY protocol headers from arbitrary
//! bytes: no panic, and what is accepted is well-formed.
#![no_main]

use _skirr::wire::proxy::{parse_allow_list, ProxyConfig};
use _skirr::wire::proxy_protocol::{parse, Parsed, Versions, MAX_HEADER};
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 6] = [
    "x-forwarded-for",
    "forwarded",
    "x-forwarded-proto",
    "x-forwarded-ssl",
    "script_name",
    "host",
];

fuzz_target!(|data: &[u8]| {
    // PROXY protocol: the whole input as the start of a connection.
    for v in [
        Versions { v1: true, v2: true },
        Versions {
            v1: true,
            v2: false,
        },
        Versions {
            v1: false,
            v2: true,
        },
    ] {
        match parse(data, v) {
            Parsed::Header { len, .. } => {
                assert!(len > 0 && len <= data.len() && len <= MAX_HEADER + 216)
            }
            Parsed::Incomplete => assert!(data.len() < MAX_HEADER),
            Parsed::Invalid(_) => {}
        }
    }
    // Forwarding headers: lines of the input as values of known headers.
    let (trust_all, trusted) = parse_allow_list("127.0.0.1,10.0.0.0/8,::1").expect("valid list");
    let cfg = ProxyConfig {
        trust_all,
        trusted,
        secure_scheme_headers: vec![
            (HeaderName::from_static("x-forwarded-proto"), "https".into()),
            (HeaderName::from_static("x-forwarded-ssl"), "on".into()),
        ],
        script_name: true,
    };
    let mut headers = HeaderMap::new();
    for (i, line) in data.split(|b| *b == b'\n').take(8).enumerate() {
        if let Ok(v) = HeaderValue::from_bytes(line) {
            headers.append(NAMES[i % NAMES.len()], v);
        }
    }
    if let Ok(Some(origin)) = cfg.origin(&headers, Some("127.0.0.1".parse().expect("ip"))) {
        if let Some((host, _)) = origin.client {
            assert!(host.parse::<std::net::IpAddr>().is_ok(), "{host:?}");
        }
    }
    if let Ok(list) = std::str::from_utf8(data) {
        let _ = parse_allow_list(list);
    }
});
