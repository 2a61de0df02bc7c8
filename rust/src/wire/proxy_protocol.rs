//! The PROXY protocol (HAProxy, versions 1 and 2): a header a load balancer
//! sends before the client's bytes, naming the client's address. Parsing is
//! the `ppp` crate's; this module decides what Skirr accepts from it.

use std::net::SocketAddr;

use ppp::{v1, v2, HeaderResult, PartialResult};

/// Largest header accepted (a v1 line is at most 107 bytes; v2 carries
/// TLVs, bounded here).
pub const MAX_HEADER: usize = 4096;

/// Which versions are accepted (Gunicorn's `proxy_protocol`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Versions {
    pub v1: bool,
    pub v2: bool,
}

/// What the bytes received so far hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// More bytes are needed.
    Incomplete,
    /// A header of `len` bytes; `source` is the client (`None` for v2
    /// `LOCAL`, v1 `UNKNOWN` or unix addresses: the connection's own peer
    /// stands).
    Header {
        len: usize,
        source: Option<SocketAddr>,
    },
    /// Not a header this server accepts; the connection is closed.
    Invalid(&'static str),
}

/// Parses the start of a connection's bytes.
pub fn parse(buf: &[u8], accept: Versions) -> Parsed {
    let result = HeaderResult::parse(buf);
    if result.is_incomplete() {
        if buf.len() >= MAX_HEADER {
            return Parsed::Invalid("PROXY protocol header too long");
        }
        return Parsed::Incomplete;
    }
    match result {
        HeaderResult::V1(Ok(h)) if accept.v1 => Parsed::Header {
            len: h.header.len(),
            source: match h.addresses {
                v1::Addresses::Tcp4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
                v1::Addresses::Tcp6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
                v1::Addresses::Unknown => None,
            },
        },
        HeaderResult::V2(Ok(h)) if accept.v2 => Parsed::Header {
            len: h.header.len(),
            source: match (h.command, h.addresses) {
                (v2::Command::Proxy, v2::Addresses::IPv4(a)) => {
                    Some(SocketAddr::from((a.source_address, a.source_port)))
                }
                (v2::Command::Proxy, v2::Addresses::IPv6(a)) => {
                    Some(SocketAddr::from((a.source_address, a.source_port)))
                }
                _ => None,
            },
        },
        HeaderResult::V1(Ok(_)) => Parsed::Invalid("PROXY protocol v1 header not accepted"),
        HeaderResult::V2(Ok(_)) => Parsed::Invalid("PROXY protocol v2 header not accepted"),
        HeaderResult::V1(Err(_)) | HeaderResult::V2(Err(_)) => {
            Parsed::Invalid("invalid PROXY protocol header")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTH: Versions = Versions { v1: true, v2: true };

    #[test]
    fn v1_tcp4_and_incomplete() {
        let line = b"PROXY TCP4 203.0.113.7 10.0.0.1 56324 443\r\nGET / HTTP/1.1\r\n";
        match parse(line, BOTH) {
            Parsed::Header { len, source } => {
                assert_eq!(len, 43);
                assert_eq!(source, Some("203.0.113.7:56324".parse().expect("addr")));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(parse(b"PROXY TCP4 203.0", BOTH), Parsed::Incomplete);
        assert!(matches!(
            parse(
                line,
                Versions {
                    v1: false,
                    v2: true
                }
            ),
            Parsed::Invalid(_)
        ));
    }

    #[test]
    fn v2_proxy_ipv4() {
        let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
        h.extend_from_slice(&[
            0x21, 0x11, 0, 12, 192, 0, 2, 1, 10, 0, 0, 1, 0x1f, 0x90, 0x01, 0xbb,
        ]);
        match parse(&h, BOTH) {
            Parsed::Header { len, source } => {
                assert_eq!(len, 28);
                assert_eq!(source, Some("192.0.2.1:8080".parse().expect("addr")));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(parse(&h[..20], BOTH), Parsed::Incomplete);
    }

    #[test]
    fn plain_http_is_invalid() {
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", BOTH),
            Parsed::Invalid(_)
        ));
    }
}
