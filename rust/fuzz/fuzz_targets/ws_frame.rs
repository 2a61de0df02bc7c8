//! The WebSocket read path from arbitrary bytes: framing, fragmentation,
//! UTF-8 checks and permessage-deflate inflation (with and without context
//! takeover), fed in arbitrary pieces; and `Sec-WebSocket-Extensions`
//! negotiation. No panic; every message respects the size limit (after
//! inflation); text is UTF-8; compression round-trips.
#![no_main]

use _skirr::wire::ws_deflate::{Deflater, Inflater};
use _skirr::wire::ws_extension::{negotiate, Agreed, DeflateConfig};
use _skirr::wire::ws_frame::{FrameReader, Incoming};
use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    for takeover in [false, true] {
        let agreed = Agreed {
            server_no_context_takeover: !takeover,
            client_no_context_takeover: !takeover,
            server_max_window_bits: 15,
            client_max_window_bits: 9 + (split % 7),
        };
        for inflater in [None, Some(Inflater::new(&agreed))] {
            let mut r = FrameReader::new(LIMIT, inflater);
            let step = usize::from(split % 17) + 1;
            'feed: for piece in rest.chunks(step) {
                let mut at = 0;
                while at < piece.len() {
                    let (n, res) = r.feed(&piece[at..]);
                    assert!(n <= piece.len() - at);
                    at += n;
                    match res {
                        Ok(Some(Incoming::Text(t))) => {
                            assert!(t.len() <= LIMIT);
                            assert!(std::str::from_utf8(&t).is_ok());
                        }
                        Ok(Some(Incoming::Binary(b))) => assert!(b.len() <= LIMIT),
                        Ok(Some(Incoming::Ping(p) | Incoming::Pong(p))) => assert!(p.len() <= 125),
                        Ok(Some(Incoming::Close(_))) => {}
                        Ok(None) => assert_eq!(at, piece.len()),
                        Err(_) => break 'feed,
                    }
                }
            }
        }
        // Compression round trip of the input itself.
        let mut d = Deflater::new(&agreed, 9 + (split % 7));
        let mut i = Inflater::new(&agreed);
        let mut z = Vec::new();
        assert!(d.compress(rest, &mut z));
        let mut back = Vec::new();
        i.inflate(&z, true, &mut back, rest.len()).expect("own output inflates");
        assert_eq!(back, rest);
    }
    if let Ok(v) = HeaderValue::from_bytes(rest) {
        let mut h = HeaderMap::new();
        h.insert(http::header::SEC_WEBSOCKET_EXTENSIONS, v);
        if let Some((a, header)) = negotiate(&h, DeflateConfig {
                window_bits: 12,
                context_takeover: split & 1 == 0,
            }) {
            assert!(header.starts_with("permessage-deflate"));
            assert!((8..=15).contains(&a.server_max_window_bits));
            assert!((8..=15).contains(&a.client_max_window_bits));
        }
    }
});
