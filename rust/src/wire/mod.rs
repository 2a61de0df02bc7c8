//! Wire-level checks Skirr owns on top of hyper's parser, free of Python so
//! they can be unit-tested and fuzzed on their own (`rust/fuzz/`):
//! [`request`] (target form, `Host`, size limits), [`response`] (what an
//! app's response head allows) and [`handshake`] (the WebSocket opening
//! handshake, RFC 6455 §4.2), and the WebSocket framing ([`ws_frame`]) with
//! permessage-deflate ([`ws_extension`] negotiates, [`ws_deflate`]
//! compresses; RFC 7692).

pub mod handshake;
pub mod proxy;
pub mod proxy_protocol;
pub mod request;
pub mod response;
pub mod ws_deflate;
pub mod ws_extension;
pub mod ws_frame;
